//! Kernel choices as values: what codegen's one selection module (`specc_codegen::choose`)
//! decided for each fused group, from the group's shapes and the [`super::Target`]. The
//! kernel generators take a choice and only print CUDA; the engine records every choice
//! (per bucket, per group) so reports and tests read decisions, not kernel names.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The choice for one fused group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KernelChoice {
    Matmul(MatmulChoice),
    Attention(AttentionChoice),
    /// A grouped MoE expert layer (`moe_experts`): dispatch, gate/up, down, combine.
    Moe(MoeChoice),
    /// Absorbed MLA attention on tensor cores: `mla_tile` (or `mla_wgmma`), and
    /// `mla_combine` over its context splits.
    Mla(MlaChoice),
    /// A kernel with nothing to choose (embedding, RMSNorm, the generic element-wise,
    /// movement and tree kernels): the families it launches.
    Fixed {
        families: Vec<String>,
    },
}

/// A matmul group: `[norm] → x·Wᵀ → epilogue`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatmulChoice {
    /// Rows of one launch; `row_tile` of them share one pass over the weights.
    pub rows: u32,
    pub row_tile: u32,
    /// One per matmul launch: one, except for several projections of one x stored apart.
    pub cores: Vec<MatmulCore>,
    pub norm: NormPlacement,
    pub epilogue: EpilogueChoice,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MatmulCore {
    /// The CUDA-core kernel (`gemv`).
    CudaCores(GemvTiling),
    /// The tensor-core kernel (`gemv_mma`).
    TensorCores(MmaTiling),
    /// The CUDA-core kernel over int4 / fp8 weights read as stored and dequantised in
    /// registers (`gemv_q`); `vec` counts weight elements per load.
    Dequant(GemvTiling),
    /// The tiled tensor-core GEMM (`gemm_mma`) for many rows: row and column tiles staged
    /// in shared memory, each weight tile read once per row tile.
    Gemm(GemmTiling),
    /// The sm_90a GEMM (`gemm_wgmma`): the same tiles fed by TMA to warpgroup mma.
    Wgmma(WgmmaTiling),
}

/// Where the RMSNorm of the matmul's input runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NormPlacement {
    /// The group has no norm.
    None,
    /// In the matmul's prologue (each block normalises the rows it reads).
    Prologue,
    /// A separate `rmsnorm` launch into scratch, read by the matmul (un-fused).
    Separate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EpilogueChoice {
    Store,
    ResidualAdd,
    SiluMul,
    /// The lm-head: logits stored (or left in scratch when nothing else reads them).
    Logits,
    /// The lm-head with per-block argmax partials, reduced by an `argmax` launch.
    LogitsArgmax {
        partials_per_row: u32,
    },
    /// The q|k|v projection with RoPE and the KV write: in the matmul's epilogue
    /// (`fused`), or the product into scratch followed by a `rope_kv` launch.
    RopeKv {
        fused: bool,
    },
}

/// Work split of the CUDA-core matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemvTiling {
    /// Column warps per block: each owns `cols_per_warp` output columns.
    pub warps: u32,
    pub cols_per_warp: u32,
    /// Elements per 16-byte weight load.
    pub vec: u32,
    /// K elements of x staged in shared memory at a time.
    pub k_chunk: u32,
    /// Split-K inside the block: the block has `warps · k_warps` warps, and the `k_warps`
    /// warps of one column group share its columns, each taking every `k_warps`-th group
    /// of `32 · vec` elements of K. Their partial sums meet in shared memory and are added
    /// in increasing split order before the epilogue. 1: no split.
    #[serde(default = "one")]
    pub k_warps: u32,
}

fn one() -> u32 {
    1
}

/// Work split of the tensor-core matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmaTiling {
    /// 16-column weight tiles per warp and matrix.
    pub tn: u32,
    /// Warps across N in a block.
    pub wn: u32,
    /// Warps across K in a block (split-K).
    pub wk: u32,
    /// Units of 32 k each warp keeps in flight.
    pub unroll: u32,
    /// Where each warp's x fragments come from.
    pub feed: Feed,
    /// K splits across blocks (grid z). Above 1 each split stores its partial sums to
    /// scratch and the last split to arrive sums them in split order and runs the epilogue.
    pub ks: u32,
}

/// Block tile of the tensor-core GEMM (`gemm_mma`): a block computes `bm` rows × `bn`
/// columns (per matrix: the gate/up pair stages `2 · bn` weight rows) over K in steps of
/// `bk`, through a ring of `stages` shared-memory stages; `wm × wn` warps each own a
/// `bm / wm × bn / wn` sub-tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmTiling {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub wm: u32,
    pub wn: u32,
    pub stages: u32,
}

impl GemmTiling {
    pub fn warps(&self) -> u32 {
        self.wm * self.wn
    }

    pub fn threads(&self) -> u32 {
        32 * self.warps()
    }
}

/// Block tile of the sm_90a GEMM (`gemm_wgmma`): a block computes `bm` rows (64 per
/// consumer warpgroup) × `bn` columns per matrix over K in chunks of 64 through a ring of
/// `stages` shared-memory stages that one producer warp fills by TMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WgmmaTiling {
    /// Rows per block: 64 (one consumer warpgroup) or 128 (two).
    pub bm: u32,
    /// Columns per block and matrix: a multiple of 8, `G · bn ≤ 256` (the widest wgmma
    /// covers all `G` weight boxes; `G · bn / 2` accumulator registers per thread).
    pub bn: u32,
    /// Ring stages (at least 2).
    pub stages: u32,
    /// Blocks of one thread-block cluster along the rows (`cluster_m`, consecutive row
    /// tiles of one column tile: each loads `1 / cluster_m` of the weight box and multicasts
    /// it to the others) or along the columns (`cluster_n`: the x box likewise); at least
    /// one of the two is 1.
    #[serde(default = "one")]
    pub cluster_m: u32,
    #[serde(default = "one")]
    pub cluster_n: u32,
    /// The gate/up pair as one wgmma per matrix and k16 step (`bn` columns each) instead of
    /// one `m64n(2·bn)` wgmma over both weight boxes, which lie one after the other in a
    /// stage (the A/B of the fused form; no effect on a single matrix).
    #[serde(default)]
    pub split_mats: bool,
    /// Blocks of a persistent launch (a multiple of `cluster_m`; `cluster_n` is 1): block
    /// (cluster) `b` computes tiles (cluster tiles) `b, b + blocks, ..` in turn, its producer
    /// loading the next tile's chunks while the consumers store the last one. 0: one block
    /// per tile.
    #[serde(default)]
    pub persistent_blocks: u32,
    /// Blocks of one thread-block cluster that split K (1: none): block `r` of the cluster
    /// sums chunks `r · KT / split_k ..` of the tile into its own accumulators; each block
    /// then owns `1 / split_k` of the tile's rows, receives the others' sums for them, adds
    /// all in rank order and runs their epilogue. Neither multicast clusters nor persistent
    /// launches go with it.
    #[serde(default = "one")]
    pub split_k: u32,
    /// The consumers build each stage's descriptors from two made once per block (the ring's
    /// base, the warpgroup index made warp-uniform), stepping the stage and phase instead of
    /// dividing the chunk counter: the same wgmma sequence with fewer instructions before each
    /// batch (the A/B of the main loop's per-chunk arithmetic).
    #[serde(default)]
    pub hoisted_descriptors: bool,
}

impl WgmmaTiling {
    /// The unclustered `bm × bn` tile with `stages` ring stages.
    pub const fn new(bm: u32, bn: u32, stages: u32) -> WgmmaTiling {
        WgmmaTiling {
            bm,
            bn,
            stages,
            cluster_m: 1,
            cluster_n: 1,
            split_mats: false,
            persistent_blocks: 0,
            split_k: 1,
            hoisted_descriptors: false,
        }
    }

    /// Blocks per cluster.
    pub fn cluster(&self) -> u32 {
        self.cluster_m * self.cluster_n
    }

    /// Consumer warpgroups.
    pub fn consumers(&self) -> u32 {
        self.bm / 64
    }

    /// Threads per block: the consumer warpgroups and the producer warp.
    pub fn threads(&self) -> u32 {
        128 * self.consumers() + 32
    }
}

/// How the warps of a tensor-core matmul block get their operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Feed {
    /// Weights and x fragments loaded from global memory into registers, `unroll` units
    /// ahead (x: 4·MT8 registers per slot); the warps of a block that share x meet in L1.
    Prefetch,
    /// Weights prefetched into registers; x fragments loaded from global memory at use (no
    /// registers held, latency exposed).
    XAtUse,
    /// Weights and x staged by the whole block in shared memory through a ring of `stages`
    /// chunks of `WK · unroll` units (`cp.async`, `stages − 1` chunks in flight, so the bytes
    /// in flight do not cost registers); the fused RMSNorm is applied once per x element
    /// while staging. Each x byte leaves L2 once per block.
    Smem { stages: u32 },
    /// Whole rows (weights of the block's columns, x rows of the tile) staged in shared
    /// memory by the copy engine (`cp.async.bulk`, one copy per row and chunk of `WK ·
    /// unroll` units, completing on a per-stage mbarrier), `stages − 1` chunks ahead. No
    /// fused norm; K must be tiled exactly by the chunks of every split.
    Bulk { stages: u32 },
    /// x rows staged by the copy engine as in [`Feed::Bulk`] (one copy per row and chunk,
    /// shared by every warp of the block), weights prefetched into registers `unroll` units
    /// ahead per warp as in [`Feed::XAtUse`]: no x registers held, so deeper weight
    /// prefetch. Same conditions as [`Feed::Bulk`].
    XBulk { stages: u32 },
    /// Weights and x as 2-D boxes of tensor-map copies into a ring of `stages` chunks of 64 k
    /// (128-byte swizzle), issued by one extra producer warp; the `wn` consumer warps read
    /// fragments with `ldmatrix`. Needs `tn = wk = 1`, no fused norm or RoPE, K / 64 a
    /// multiple of `ks`.
    Tma { stages: u32 },
}

impl MmaTiling {
    /// Warps that own accumulators (`wn × wk`).
    pub fn warps(&self) -> u32 {
        self.wn * self.wk
    }

    /// Threads per block: the accumulating warps plus [`Feed::Tma`]'s producer warp.
    pub fn threads(&self) -> u32 {
        32 * (self.warps() + u32::from(matches!(self.feed, Feed::Tma { .. })))
    }
}

/// An attention group: a split kernel over context splits, then the combine kernel (or
/// the combine folded into the split kernel's last block of each row range).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttentionChoice {
    pub kernel: AttentionKernel,
    /// Context splits (blocks per (sequence, KV head) along the context).
    pub splits: u32,
    /// The last split to finish of each (sequence, KV head, row block) folds the partials
    /// itself (one launch instead of two; `attn_tile` only).
    #[serde(default)]
    pub fused_combine: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttentionKernel {
    /// `attn_split` on CUDA cores.
    CudaCores(AttnTiling),
    /// `attn_tile` on tensor cores.
    TensorCores(TileTiling),
}

/// Block shape of the CUDA-core attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttnTiling {
    pub rows_per_block: u32,
    pub tile_slots: u32,
}

/// Block shape of the tensor-core attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileTiling {
    /// Warps per block; the block holds `16 · warps` rows.
    pub warps: u32,
    /// Cache slots per K/V tile (a multiple of 16).
    pub tile_slots: u32,
    /// `P·V` as `P_hi·V + P_lo·V` with `P_hi = round(p)`, `P_lo = round(p − P_hi)`: p
    /// to ~2⁻¹⁷ relative, as the interpreter's f32 (one more mma per P·V step). Without
    /// it p is rounded once to the 16-bit type (FlashAttention's numerics, ≤ 2⁻⁹ relative
    /// per weight: a few bf16 ulps of the output at peaked softmaxes).
    pub split_p: bool,
    /// Warps sharing each 16-row group, each taking `tile_slots / slot_warps` slots of every
    /// tile with its own online softmax, merged in shared memory before the partials are
    /// written (0 and 1: one warp a row group). For one-token decode, where a row group is
    /// a whole block's work.
    #[serde(default)]
    pub slot_warps: u32,
}

impl TileTiling {
    /// Warps a row group's slots are split over (at least 1).
    pub fn slot_groups(&self) -> u32 {
        self.slot_warps.max(1)
    }

    pub fn rows(&self) -> u32 {
        16 * self.warps / self.slot_groups()
    }

    pub fn threads(&self) -> u32 {
        32 * self.warps
    }
}

/// A grouped MoE expert layer: each selected expert's weights read once for all the tokens
/// routed to it, `tokens` the launch's rows (tokens of the bucket) over `experts` stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeChoice {
    pub tokens: u64,
    pub experts: u64,
    pub matmul: ExpertMatmul,
}

/// How the grouped kernels' expert matmuls multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpertMatmul {
    /// One f32 FMA per weight and token on the CUDA cores (every stack the grouped kernels
    /// take), streamed as the value says.
    CudaCores(CoreTiling),
    /// int4 group-32 stacks with bf16 scales and bf16 activations on tensor cores
    /// (`mma.m16n8k16` bf16, f32 accumulation), tiled as the value says.
    Int4TensorCores(Int4MmaTiling),
}

/// How the CUDA-core expert kernels stream the weights: each gate/up warp owns `gate_up_rows`
/// rows of `Wg` and as many of `Wu`, each down warp `down_rows` rows of `Wd`; a lane issues
/// the 16-byte loads of `unroll` steps of 32 loads a row (a trip) before consuming any.
/// `pipelined`: a warp issues its next trip's loads before it consumes the current trip's
/// (two register buffers), so its loads stay in flight while it unpacks and multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CoreTiling {
    pub gate_up_rows: u32,
    pub down_rows: u32,
    pub unroll: u32,
    pub pipelined: bool,
}

impl CoreTiling {
    /// What the grouped kernels use unless told otherwise.
    pub const DEFAULT: CoreTiling = CoreTiling::new(2, 4, 2, false);
    /// [`CoreTiling::DEFAULT`] with its trips pipelined and scales held as stored until
    /// used (int4 stacks' choice on sm_90a).
    pub const PIPELINED: CoreTiling = CoreTiling::new(2, 4, 2, true);
    /// Every tiling the device benchmark times (`kimi_bandwidth`). Others measured slower at
    /// Kimi's shapes or spilled (bench/NOTES.md, session 51).
    pub const VARIANTS: [CoreTiling; 2] = [Self::DEFAULT, Self::PIPELINED];

    pub const fn new(gate_up_rows: u32, down_rows: u32, unroll: u32, pipelined: bool) -> Self {
        CoreTiling {
            gate_up_rows,
            down_rows,
            unroll,
            pipelined,
        }
    }

    /// `g2d4u2` for 2 gate/up rows, 4 down rows, 2 steps a trip; `-p` pipelined.
    pub fn name(&self) -> String {
        let n = format!("g{}d{}u{}", self.gate_up_rows, self.down_rows, self.unroll);
        if self.pipelined {
            n + "-p"
        } else {
            n
        }
    }

    /// Whether the emitters take it: 1 to 8 rows a warp, 1 to 4 steps a trip.
    pub fn valid(&self) -> bool {
        (1..=8).contains(&self.gate_up_rows)
            && (1..=8).contains(&self.down_rows)
            && (1..=4).contains(&self.unroll)
    }
}

impl ExpertMatmul {
    /// The CUDA cores with the default tiling.
    pub const CUDA_CORES: ExpertMatmul = ExpertMatmul::CudaCores(CoreTiling::DEFAULT);
}

/// How the tensor-core int4 expert kernels stream the weights: a ring of `stages` stages
/// per warp, each `groups` groups of 32 columns of the warp's 32 rows, `warps` warps a
/// block. Its geometry (stage bytes, shared memory, residency) is the kernel generator's
/// (`specc_kernels_gen::generic::moe_grouped::Int4MmaGeometry`).
///
/// `interleave`: the block's warps share one tile of 32 rows and take every `warps`-th
/// stage of it (warp `w` stages `w, w + warps, …`), so at any time the block reads `warps`
/// adjacent runs of each row (256 contiguous bytes at 4 groups × 4 warps instead of 64),
/// and a block covers 32 rows instead of `32 · warps` (4× the blocks, each `warps`× shorter);
/// the warps' partial sums meet in shared memory, added in warp order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Int4MmaTiling {
    /// Groups of 32 columns a stage: 4, 8 or 16 (64, 128 or 256 contiguous bytes of each
    /// row per stage, and 8, 16 or 32 bytes of its scales).
    pub groups: u32,
    /// Ring stages a warp (at least 2): `stages − 1` in flight while one is consumed.
    pub stages: u32,
    /// Warps a block: 4 or 8.
    pub warps: u32,
    /// The block's warps share their rows and interleave the stages.
    pub interleave: bool,
}

impl Int4MmaTiling {
    /// Stages of 64 bytes a row, 4 deep, 4 warps (36 KiB a block).
    pub const G4_S4_W4: Int4MmaTiling = Int4MmaTiling::new(4, 4, 4);
    /// `g4s4w4` with the warps interleaving the stages of one row tile.
    pub const G4_S4_W4_I: Int4MmaTiling = Self::G4_S4_W4.interleaved();
    /// Every tiling the device benchmark times (`kimi_bandwidth`).
    pub const VARIANTS: [Int4MmaTiling; 2] = [Self::G4_S4_W4, Self::G4_S4_W4_I];

    pub const fn new(groups: u32, stages: u32, warps: u32) -> Int4MmaTiling {
        Int4MmaTiling {
            groups,
            stages,
            warps,
            interleave: false,
        }
    }

    /// This tiling with the block's warps interleaving the stages of one row tile.
    pub const fn interleaved(self) -> Int4MmaTiling {
        Int4MmaTiling {
            interleave: true,
            ..self
        }
    }

    /// `g8s4w4` for 8 groups, 4 stages, 4 warps; `g4s4w4-i` interleaved.
    pub fn name(&self) -> String {
        let n = format!("g{}s{}w{}", self.groups, self.stages, self.warps);
        if self.interleave {
            n + "-i"
        } else {
            n
        }
    }

    /// Whether the emitters take it: 4, 8 or 16 groups, 2 to 8 stages, 4 or 8 warps.
    pub fn valid(&self) -> bool {
        matches!(self.groups, 4 | 8 | 16)
            && (2..=8).contains(&self.stages)
            && matches!(self.warps, 4 | 8)
    }

    /// Warps a row tile's stages are spread over: `warps` when interleaved, else 1.
    pub fn k_warps(&self) -> u64 {
        if self.interleave {
            self.warps as u64
        } else {
            1
        }
    }
}

/// The tensor-core MLA attention's work split: `splits` blocks along the context (folded by
/// `mla_combine` when above one), `block_row_tiles` row tiles of 16 (token, head) rows per
/// block sharing each cache tile, `stages` cache tiles in shared memory. With `wgmma` the
/// kernel is `mla_wgmma` (sm_90a: blocks of 64 rows on two warpgroups, TMA-fed, two
/// stages), whose shape is fixed: `block_row_tiles` 4 and `stages` 2 record it; its
/// `cluster` consecutive splits of a row block run as one thread-block cluster that folds
/// their partials in shared memory, so `mla_combine` (launched when `splits / cluster`
/// exceeds one) folds `splits / cluster` partials a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlaChoice {
    pub splits: u64,
    pub block_row_tiles: u64,
    pub stages: u64,
    #[serde(default)]
    pub wgmma: bool,
    #[serde(default = "one_u64")]
    pub cluster: u64,
}

fn one_u64() -> u64 {
    1
}

impl MlaChoice {
    /// Partials a row leaves for `mla_combine`: one per cluster of splits.
    pub fn parts(&self) -> u64 {
        self.splits / self.cluster.max(1)
    }
}

impl fmt::Display for ExpertMatmul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExpertMatmul::CudaCores(t) if *t == CoreTiling::DEFAULT => write!(f, "cuda-cores"),
            ExpertMatmul::CudaCores(t) => write!(f, "cuda-cores {}", t.name()),
            ExpertMatmul::Int4TensorCores(t) => write!(f, "int4 mma {}", t.name()),
        }
    }
}

impl fmt::Display for Feed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Feed::Prefetch => write!(f, "prefetch"),
            Feed::XAtUse => write!(f, "x-at-use"),
            Feed::Smem { stages } => write!(f, "smem/{stages}"),
            Feed::Bulk { stages } => write!(f, "bulk/{stages}"),
            Feed::XBulk { stages } => write!(f, "xbulk/{stages}"),
            Feed::Tma { stages } => write!(f, "tma/{stages}"),
        }
    }
}

impl fmt::Display for MatmulCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatmulCore::CudaCores(t) => {
                write!(f, "gemv w{} c{} kc{}", t.warps, t.cols_per_warp, t.k_chunk)?;
                if t.k_warps > 1 {
                    write!(f, " kw{}", t.k_warps)?;
                }
                Ok(())
            }
            MatmulCore::TensorCores(t) => write!(
                f,
                "gemv_mma tn{} wn{} wk{} u{} {} ks{}",
                t.tn, t.wn, t.wk, t.unroll, t.feed, t.ks
            ),
            MatmulCore::Dequant(t) => {
                write!(
                    f,
                    "gemv_q w{} c{} v{} kc{}",
                    t.warps, t.cols_per_warp, t.vec, t.k_chunk
                )
            }
            MatmulCore::Gemm(t) => write!(
                f,
                "gemm_mma {}x{}x{} w{}x{} s{}",
                t.bm, t.bn, t.bk, t.wm, t.wn, t.stages
            ),
            MatmulCore::Wgmma(t) => {
                write!(f, "gemm_wgmma {}x{} s{}", t.bm, t.bn, t.stages)?;
                match (t.cluster_m, t.cluster_n) {
                    (1, 1) => {}
                    (m, n) => write!(f, " cluster {m}x{n}")?,
                }
                if t.split_mats {
                    write!(f, " split")?;
                }
                if t.persistent_blocks > 0 {
                    write!(f, " persistent/{}", t.persistent_blocks)?;
                }
                if t.split_k > 1 {
                    write!(f, " split-k {}", t.split_k)?;
                }
                if t.hoisted_descriptors {
                    write!(f, " hoisted")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for EpilogueChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EpilogueChoice::Store => write!(f, "store"),
            EpilogueChoice::ResidualAdd => write!(f, "residual"),
            EpilogueChoice::SiluMul => write!(f, "silu*mul"),
            EpilogueChoice::Logits => write!(f, "logits"),
            EpilogueChoice::LogitsArgmax { partials_per_row } => {
                write!(f, "argmax/{partials_per_row} + argmax")
            }
            EpilogueChoice::RopeKv { fused: true } => write!(f, "rope+kv"),
            EpilogueChoice::RopeKv { fused: false } => write!(f, "store + rope_kv"),
        }
    }
}

impl fmt::Display for KernelChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelChoice::Matmul(m) => {
                if m.norm == NormPlacement::Separate {
                    write!(f, "rmsnorm + ")?;
                }
                let cores: Vec<String> = m.cores.iter().map(|c| c.to_string()).collect();
                write!(f, "{} m{}/{}", cores.join(" | "), m.rows, m.row_tile)?;
                if m.norm == NormPlacement::Prologue {
                    write!(f, " norm")?;
                }
                write!(f, " → {}", m.epilogue)
            }
            KernelChoice::Attention(a) => match a.kernel {
                AttentionKernel::CudaCores(t) => write!(
                    f,
                    "attn_split r{} s{} splits {} + attn_combine",
                    t.rows_per_block, t.tile_slots, a.splits
                ),
                AttentionKernel::TensorCores(t) => write!(
                    f,
                    "attn_tile w{}{} s{}{} splits {}{}",
                    t.warps,
                    if t.slot_groups() > 1 {
                        format!(" ({} slot warps)", t.slot_groups())
                    } else {
                        String::new()
                    },
                    t.tile_slots,
                    if t.split_p { " split-p" } else { "" },
                    a.splits,
                    if a.fused_combine {
                        ", combine fused"
                    } else {
                        " + attn_combine"
                    }
                ),
            },
            KernelChoice::Moe(m) => write!(
                f,
                "moe_dispatch + moe_gate_up | moe_down {} t{} e{} + moe_combine",
                m.matmul, m.tokens, m.experts
            ),
            KernelChoice::Mla(m) => {
                if m.wgmma {
                    write!(f, "mla_wgmma splits {}", m.splits)?;
                    if m.cluster > 1 {
                        write!(f, " cluster {}", m.cluster)?;
                    }
                } else {
                    write!(
                        f,
                        "mla_tile r{} s{} splits {}",
                        m.block_row_tiles, m.stages, m.splits
                    )?;
                }
                if m.parts() > 1 {
                    write!(f, " + mla_combine")?;
                }
                Ok(())
            }
            KernelChoice::Fixed { families } => write!(f, "{}", families.join(" + ")),
        }
    }
}

impl KernelChoice {
    /// The kernel families the choice launches, in launch order.
    pub fn families(&self) -> Vec<&str> {
        match self {
            KernelChoice::Matmul(m) => {
                let mut v = Vec::new();
                if m.norm == NormPlacement::Separate {
                    v.push("rmsnorm");
                }
                let rope = m.epilogue == EpilogueChoice::RopeKv { fused: true };
                v.extend(m.cores.iter().map(|c| match (c, rope) {
                    (MatmulCore::CudaCores(_), false) => "gemv",
                    (MatmulCore::CudaCores(_), true) => "gemv_rope",
                    (MatmulCore::TensorCores(_), false) => "gemv_mma",
                    (MatmulCore::TensorCores(_), true) => "gemv_mma_rope",
                    // Never fused with RoPE (the choice keeps `rope_kv` for it).
                    (MatmulCore::Dequant(_), _) => "gemv_q",
                    // Never fused with RoPE either (its rows exceed the fused epilogue's).
                    (MatmulCore::Gemm(_), _) => "gemm_mma",
                    (MatmulCore::Wgmma(_), _) => "gemm_wgmma",
                }));
                match m.epilogue {
                    EpilogueChoice::LogitsArgmax { .. } => v.push("argmax"),
                    EpilogueChoice::RopeKv { fused: false } => v.push("rope_kv"),
                    _ => {}
                }
                v
            }
            KernelChoice::Attention(a) => {
                let mut v = vec![match a.kernel {
                    AttentionKernel::CudaCores(_) => "attn_split",
                    AttentionKernel::TensorCores(_) => "attn_tile",
                }];
                if !a.fused_combine {
                    v.push("attn_combine");
                }
                v
            }
            KernelChoice::Moe(_) => vec!["moe_dispatch", "moe_gate_up", "moe_down", "moe_combine"],
            KernelChoice::Mla(m) => {
                let mut v = vec![if m.wgmma { "mla_wgmma" } else { "mla_tile" }];
                if m.parts() > 1 {
                    v.push("mla_combine");
                }
                v
            }
            KernelChoice::Fixed { families } => families.iter().map(String::as_str).collect(),
        }
    }

    pub fn matmul(&self) -> Option<&MatmulChoice> {
        match self {
            KernelChoice::Matmul(m) => Some(m),
            _ => None,
        }
    }

    pub fn attention(&self) -> Option<&AttentionChoice> {
        match self {
            KernelChoice::Attention(a) => Some(a),
            _ => None,
        }
    }

    pub fn moe(&self) -> Option<&MoeChoice> {
        match self {
            KernelChoice::Moe(m) => Some(m),
            _ => None,
        }
    }

    pub fn mla(&self) -> Option<&MlaChoice> {
        match self {
            KernelChoice::Mla(m) => Some(m),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wgmma matmul choice prints, names its families and survives the engine's serde.
    #[test]
    fn wgmma_choices_print_and_round_trip() {
        let c = KernelChoice::Matmul(MatmulChoice {
            rows: 256,
            row_tile: 64,
            cores: vec![MatmulCore::Wgmma(WgmmaTiling::new(128, 256, 4))],
            norm: NormPlacement::None,
            epilogue: EpilogueChoice::LogitsArgmax {
                partials_per_row: 502,
            },
        });
        assert_eq!(
            c.to_string(),
            "gemm_wgmma 128x256 s4 m256/64 → argmax/502 + argmax"
        );
        assert_eq!(c.families(), ["gemm_wgmma", "argmax"]);
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<KernelChoice>(&json).unwrap(), c);
        let legacy = json.replace(",\"cluster_m\":1,\"cluster_n\":1", "");
        assert_ne!(legacy, json);
        assert_eq!(serde_json::from_str::<KernelChoice>(&legacy).unwrap(), c);
        let mut clustered = c.clone();
        if let KernelChoice::Matmul(m) = &mut clustered {
            m.cores[0] = MatmulCore::Wgmma(WgmmaTiling {
                cluster_m: 2,
                ..WgmmaTiling::new(128, 128, 4)
            });
        }
        assert!(clustered
            .to_string()
            .starts_with("gemm_wgmma 128x128 s4 cluster 2x1 "));
    }

    /// The grouped MoE and MLA choices print what was chosen, name their families and
    /// survive the engine's serde.
    #[test]
    fn moe_and_mla_choices_print_and_round_trip() {
        let moe = KernelChoice::Moe(MoeChoice {
            tokens: 8,
            experts: 384,
            matmul: ExpertMatmul::Int4TensorCores(Int4MmaTiling::G4_S4_W4_I),
        });
        assert_eq!(
            moe.to_string(),
            "moe_dispatch + moe_gate_up | moe_down int4 mma g4s4w4-i t8 e384 + moe_combine"
        );
        assert_eq!(
            moe.families(),
            ["moe_dispatch", "moe_gate_up", "moe_down", "moe_combine"]
        );
        let mla = KernelChoice::Mla(MlaChoice {
            splits: 64,
            block_row_tiles: 2,
            stages: 3,
            wgmma: false,
            cluster: 1,
        });
        assert_eq!(mla.to_string(), "mla_tile r2 s3 splits 64 + mla_combine");
        assert_eq!(mla.families(), ["mla_tile", "mla_combine"]);
        let one = KernelChoice::Mla(MlaChoice {
            splits: 1,
            block_row_tiles: 1,
            stages: 2,
            wgmma: false,
            cluster: 1,
        });
        assert_eq!(one.families(), ["mla_tile"]);
        let wgc = MlaChoice {
            splits: 32,
            block_row_tiles: 4,
            stages: 2,
            wgmma: true,
            cluster: 1,
        };
        let wg = KernelChoice::Mla(wgc);
        assert_eq!(wg.to_string(), "mla_wgmma splits 32 + mla_combine");
        assert_eq!(wg.families(), ["mla_wgmma", "mla_combine"]);
        let clustered = KernelChoice::Mla(MlaChoice { cluster: 8, ..wgc });
        assert_eq!(
            clustered.to_string(),
            "mla_wgmma splits 32 cluster 8 + mla_combine"
        );
        let whole = KernelChoice::Mla(MlaChoice {
            splits: 8,
            cluster: 8,
            ..wgc
        });
        assert_eq!(whole.to_string(), "mla_wgmma splits 8 cluster 8");
        assert_eq!(whole.families(), ["mla_wgmma"]);
        // Engines written before clusters read as cluster 1.
        let old = r#"{"Mla":{"splits":32,"block_row_tiles":4,"stages":2,"wgmma":true}}"#;
        assert_eq!(serde_json::from_str::<KernelChoice>(old).unwrap(), wg);
        for c in [moe, mla, one, wg, clustered, whole] {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<KernelChoice>(&json).unwrap(), c);
        }
    }
}
