//! Absorbed multi-head latent attention on tensor cores (`mla_tile`, and `mla_combine` for
//! context splits): the `mla_attention` op for 16-bit q and caches.
//!
//! Query rows are (token, head) pairs, `t·H + h`: every head and token of a sequence reads the
//! same latent cache rows. A block owns `16·RT` consecutive rows of one sequence (RT row
//! tiles of 16, four warps each) and one split of the context, so each cache tile is read
//! from memory once for all of them. Per tile of [`TILE_SLOTS`] slots, staged `[c | pe]` in
//! shared memory by cp.async [`STAGES`] tiles ahead (zero-filled past the range), the four
//! warps of row tile `r`
//! 1. scores: warp `w` computes the partial sums of `q·[c | pe]ᵀ` for all slots and the 16
//!    rows over its k16 feature steps `w, w + 4, …` (mma m16n8k16, f32 accumulation, four
//!    independent accumulator chains; its q fragments are loaded into registers once a
//!    split) into its own shared array, which reuses q's staging rows;
//! 2. online softmax per row (8 threads a row): the four partials added in warp order,
//!    scaled, masked (causal `s ≤ pos`, or the tree: `s < prefix` or an ancestor bit); the
//!    running max, `p = exp(s − m)` split into two 16-bit values `p_hi + p_lo` (written over
//!    the row's first partial) for the next product, the running sum of the f32 `p`;
//! 3. output: warp `w` owns latent columns `w·L/4 ..` and adds `p_hi · c + p_lo · c` (two
//!    mma) to its accumulators after rescaling them.
//!
//! The splits cut the context at fixed slots (they depend on the context capacity only), and
//! a row's sums never depend on the other rows of its block (a tile past a row's end adds
//! exact zeros and rescales by exactly 1), so a row's result is the same whatever its block
//! size, bucket or step: the greedy tokens of a verify equal those of decoding one token at
//! a time.
//!
//! A split that starts at or past the end of every row of its block returns before reading
//! anything (the graph is captured for the capacity; a replay's live lengths are shorter).
//! Without splits the block writes `R(acc / l)` (0 for a row with no allowed slot); with
//! splits it writes `acc`, `m`, `l` per split in f32 and `mla_combine` folds, per row, the
//! splits that start before the row's end, in split order. The numerics are the
//! interpreter's up to the summation order and `p`'s split (relative error ~2⁻¹⁷ for bf16).

use crate::abi::{assemble, Extent, KernelSource, LaunchSpec, Loc, PRELUDE};
use crate::generic::GENERIC_PRELUDE;
use crate::writer::{emit, f32_lit, Writer};
use crate::Error;
use specc_ir::DType;

/// Cache slots per tile: four n8 mma tiles of every score warp, 16-slot `p` steps of the
/// output product.
pub const TILE_SLOTS: u64 = 32;
/// Query rows per row tile (one mma row tile, four warps).
pub const TILE_ROWS: u64 = 16;
/// Row tiles of one block at most (8 warps, 32 rows): each thread holds its warp's q
/// fragments (36 registers at Kimi's 576 features) beside the output accumulators, which
/// needs more than the 128 registers a thread of a 512-thread block may have.
pub const MAX_BLOCK_ROW_TILES: u64 = 2;
/// Score features (`latent + rope`, padded) at most: a warp holds a quarter of a row
/// tile's q in registers (48 at this bound).
pub const MAX_FEATURES: u64 = 768;
/// Cache tiles in shared memory: one computed while the next ones load.
pub const STAGES: u64 = 3;
/// Shared-memory row padding in elements (16 bytes: `ldmatrix` rows on distinct banks).
const PAD: u64 = 8;
const HELPERS: &str = include_str!("../cuda/attn_mma.cuh");

/// The mask of one launch: causal against `pos[b, t]`, or the tree (`prefix_len[b]` and
/// `ancestors[b, t, words]`).
#[derive(Clone, Copy, Debug)]
pub enum MlaMask {
    Causal,
    Tree {
        prefix_len: Loc,
        prefix_dtype: DType,
        ancestors: Loc,
        words: u64,
    },
}

/// One `mla_attention` launch on tensor cores.
#[derive(Clone, Copy, Debug)]
pub struct MlaTileParams {
    pub batch: u64,
    pub tokens: u64,
    pub heads: u64,
    /// `kv_lora_rank` (latent features).
    pub latent: u64,
    /// `qk_rope_head_dim`.
    pub rope: u64,
    /// Cache slots per sequence.
    pub ctx: u64,
    pub scale: f32,
    /// q, caches and output (bf16 or f16).
    pub dtype: DType,
    pub q_lat: Loc,
    pub q_pe: Loc,
    pub c_cache: Loc,
    pub pe_cache: Loc,
    /// Positions `[B, T]` (causal; unused by the tree mask).
    pub pos: Loc,
    pub pos_dtype: DType,
    pub mask: MlaMask,
    pub out: Loc,
    /// Context splits (1: no partials).
    pub splits: u64,
    /// Row tiles of 16 rows one block covers (1 ..= [`MAX_BLOCK_ROW_TILES`]).
    pub block_row_tiles: u64,
    /// Cache tiles in flight in shared memory (2 ..= [`STAGES`]).
    pub stages: u64,
    /// The sm_90a kernel `mla_wgmma` instead of `mla_tile` (its own block shape: the two
    /// fields above are unused; see [`crate::mla_wgmma`]).
    pub wgmma: bool,
    /// Consecutive splits of a row block that `mla_wgmma` runs as one thread-block cluster
    /// and folds in shared memory (1: none; `mla_tile` takes only 1).
    pub cluster: u64,
    /// `mla_wgmma` only: p enters `P · c` as one bf16 value instead of `p_hi + p_lo` (half
    /// the output product's tensor work, p to 8 bits as in FlashAttention). A measurement
    /// variant the split sweep times; plans keep both halves.
    pub p_single: bool,
    /// `mla_wgmma` only: the two warpgroups take turns issuing their products (named
    /// barriers, FlashAttention-3's ping-pong), so one's softmax runs under the other's
    /// mma; the same arithmetic in the same order. A measurement variant the split sweep
    /// times and the parity test checks; plans keep it off.
    pub ping_pong: bool,
    /// f32 `[B, T·H, parts, latent]` and `[B, T·H, parts, 2]` ([`Self::parts`] > 1).
    pub partial_acc: Loc,
    pub partial_ml: Loc,
}

impl MlaTileParams {
    /// `[q | q_pe]` padded to a multiple of 32 features (pairs of k16 score steps, zeros past
    /// `latent + rope`).
    fn k_padded(&self) -> u64 {
        (self.latent + self.rope).next_multiple_of(32)
    }

    /// Slots of each split: the context in `splits` equal ranges of whole tiles.
    pub fn chunk(&self) -> u64 {
        self.ctx
            .div_ceil(self.splits.max(1))
            .next_multiple_of(TILE_SLOTS)
    }

    /// Partials a row leaves for `mla_combine`: one per cluster of splits.
    pub fn parts(&self) -> u64 {
        self.splits.max(1) / self.cluster.max(1)
    }

    /// Slots of each partial: a cluster's splits.
    pub fn part_chunk(&self) -> u64 {
        self.chunk() * self.cluster.max(1)
    }

    /// Row tiles of one sequence (`T·H` rows).
    pub fn row_tiles(&self) -> u64 {
        (self.tokens * self.heads).div_ceil(TILE_ROWS)
    }

    /// Blocks along the rows of one sequence.
    pub fn row_blocks(&self) -> u64 {
        self.row_tiles().div_ceil(self.block_row_tiles.max(1))
    }

    /// Blocks of the tile kernel.
    pub fn blocks(&self) -> u64 {
        self.row_blocks() * self.splits * self.batch
    }

    /// Bytes of the partials (`partial_acc`, `partial_ml`) at `parts` partials a row.
    pub fn partial_bytes(&self, parts: u64) -> (u64, u64) {
        let rows = self.batch * self.tokens * self.heads * parts;
        (4 * rows * self.latent, 8 * rows)
    }

    /// Bytes of the block's q rows `[BR][ST]` (16-bit), which the partial-score arrays
    /// `[4][BR][SST]` (f32) reuse once the warps hold q in registers.
    fn q_region_bytes(&self) -> u64 {
        let rows = TILE_ROWS * self.block_row_tiles;
        (rows * (self.k_padded() + PAD) * 2).max(self.score_bytes())
    }

    /// Bytes of the partial scores of each row tile, `[4][BR][TS + 4]` f32.
    fn score_bytes(&self) -> u64 {
        4 * TILE_ROWS * self.block_row_tiles * (TILE_SLOTS + 4) * 4
    }

    /// Dynamic shared memory of one block.
    pub fn smem_bytes(&self) -> u64 {
        let st = self.k_padded() + PAD;
        let rows = TILE_ROWS * self.block_row_tiles;
        self.q_region_bytes() + self.stages * TILE_SLOTS * st * 2 + 3 * rows * 4 + rows * 8
    }
}

/// Whether the kernel takes these shapes: 16-bit q and caches of one type, the latent dims a
/// multiple of 32 (four warps of whole 8-column mma tiles), the rope dims of 8
/// (16-byte loads), at most [`MAX_FEATURES`] score features, 1 to [`MAX_BLOCK_ROW_TILES`]
/// row tiles and 2 to [`STAGES`] stages a block, a block within `smem_limit` bytes of shared
/// memory, and slot offsets `ctx · (latent + rope)` in 32 bits.
pub fn supported(p: &MlaTileParams, smem_limit: u64) -> bool {
    matches!(p.dtype, DType::BF16 | DType::F16)
        && p.latent.is_multiple_of(32)
        && p.latent > 0
        && p.rope.is_multiple_of(8)
        && (1..=MAX_BLOCK_ROW_TILES).contains(&p.block_row_tiles)
        && (2..=STAGES).contains(&p.stages)
        && p.cluster == 1
        && p.smem_bytes() <= smem_limit
        && p.tokens * p.heads > 0
        && p.ctx * (p.latent + p.rope) < 1 << 31
        && p.k_padded() <= MAX_FEATURES
}

pub(crate) fn c_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        _ => "bf16",
    }
}

/// The kernels of `p`: `mla_tile` (or `mla_wgmma` when `p.wgmma`), then `mla_combine` when
/// `p.parts() > 1`.
pub fn mla_tile(p: &MlaTileParams) -> Result<Vec<KernelSource>, Error> {
    if p.wgmma {
        let mut out = vec![crate::mla_wgmma::tile(p)?];
        if p.parts() > 1 {
            out.push(combine(p));
        }
        return Ok(out);
    }
    if !supported(p, u64::MAX) {
        return Err(Error::param(
            "mla_tile",
            "dims",
            format!(
                "{} latent {} + rope {}, {} row tiles and {} stages a block: not a tensor-core shape",
                p.dtype, p.latent, p.rope, p.block_row_tiles, p.stages
            ),
        ));
    }
    let mut out = vec![tile(p)];
    if p.splits > 1 {
        out.push(combine(p));
    }
    Ok(out)
}

pub(crate) fn prelude() -> String {
    format!("{PRELUDE}\n{GENERIC_PRELUDE}")
}

/// The launch's dims as constants: `T`, `H`, `L`, `R`, `CTX` and `ROWS = T·H` (a sequence's
/// query rows).
pub(crate) fn emit_dims(w: &mut Writer, p: &MlaTileParams) {
    emit!(
        w,
        "constexpr long long T = {}, H = {}, L = {}, R = {}, CTX = {}, ROWS = T * H;",
        p.tokens,
        p.heads,
        p.latent,
        p.rope,
        p.ctx
    );
}

/// The mask's pointers and per-sequence constants (`bi` is the sequence).
pub(crate) fn mask_setup(w: &mut Writer, p: &MlaTileParams) {
    match p.mask {
        MlaMask::Causal => {
            let pt = crate::generic::c_type(p.pos_dtype);
            emit!(w, "const {pt}* pos = {};", p.pos.ptr_as(pt, false));
        }
        MlaMask::Tree {
            prefix_len,
            prefix_dtype,
            ancestors,
            words,
        } => {
            let pt = crate::generic::c_type(prefix_dtype);
            emit!(w, "const {pt}* pl = {};", prefix_len.ptr_as(pt, false));
            emit!(
                w,
                "const long long* anc = {};",
                ancestors.ptr_as("long long", false)
            );
            emit!(w, "constexpr long long W = {words};");
            w.line("const long long prefix = to_i64(pl[bi]);");
            w.line("const long long nodes = T < 64 * W ? T : 64 * W;");
        }
    }
}

/// `e = ` the end of row `gr`'s allowed slots (every allowed slot is below it).
pub(crate) fn row_end(w: &mut Writer, p: &MlaTileParams) {
    match p.mask {
        MlaMask::Causal => {
            w.line("const long long pv = to_i64(pos[bi * T + gr / H]);");
            w.line("e = pv < 0 ? 0 : (pv + 1 < CTX ? pv + 1 : CTX);");
        }
        MlaMask::Tree { .. } => {
            w.line("const long long reach = (prefix > 0 ? prefix : 0) + nodes;");
            w.line("e = reach < CTX ? reach : CTX;");
        }
    }
}

/// Scores: warp `wq` sums all TS slots of the row tile's 16 rows, from its q fragments in
/// registers, over its k16 feature steps `wq, wq + 4, …` (four independent accumulator chains of KS / 4
/// mma) into its own partial array.
fn k_split_scores(w: &mut Writer, mma: &str) {
    w.line("float sc[TS / 8][4];");
    w.for_unrolled("n", 0, "TS / 8", |w| {
        w.line("sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;");
    });
    w.for_unrolled("j", 0, "QS", |w| {
        w.line("const int ks = wq + 4 * j;");
        w.if_block("ks < KS", |w| {
            w.for_unrolled("h", 0, "TS / 16", |w| {
                w.line("unsigned b[4];");
                w.line("ldmatrix_x4(b, kt + k_frag + h * 16 * ST + ks * 16);");
                emit!(w, "{mma}(sc[2 * h], qf[j], b[0], b[1]);");
                emit!(w, "{mma}(sc[2 * h + 1], qf[j], b[2], b[3]);");
            });
        });
    });
    w.for_unrolled("n", 0, "TS / 8", |w| {
        w.line("float* d = st_p + g * SST + 8 * n + 2 * tq;");
        w.line("*reinterpret_cast<float2*>(d) = make_float2(sc[n][0], sc[n][1]);");
        w.line("*reinterpret_cast<float2*>(d + 8 * SST) = make_float2(sc[n][2], sc[n][3]);");
    });
}

fn tile(p: &MlaTileParams) -> KernelSource {
    let ct = c_type(p.dtype);
    let mma = if p.dtype == DType::F16 {
        "mma16816_f16"
    } else {
        "mma16816_bf16"
    };
    let kp = p.k_padded();
    let ncolw = p.latent / 4;
    let mut items = Writer::new();
    items.line(crate::CP_ASYNC_ITEMS.trim_end());
    items.line(HELPERS.trim_end());
    let mut w = Writer::at_depth(1);
    emit_dims(&mut w, p);
    emit!(
        w,
        "constexpr int TS = {TILE_SLOTS}, KP = {kp}, ST = KP + {PAD}, SST = TS + 4, S = {};",
        p.splits
    );
    emit!(
        w,
        "constexpr int RT = {}, BR = 16 * RT, NST = {};  // row tiles, rows, stages of a block",
        p.block_row_tiles,
        p.stages
    );
    emit!(
        w,
        "constexpr int NCOLW = {ncolw}, NTP = NCOLW / 8;  // latent columns / mma tiles per warp"
    );
    w.line("constexpr int KS = KP / 16, QS = (KS + 3) / 4;  // k16 steps: of a score, of a warp");
    w.line("constexpr int NP = 4;  // partial-score arrays a row tile sums");
    emit!(w, "const float scale = {};", f32_lit(p.scale));
    w.line("extern __shared__ __align__(16) unsigned char smem[];");
    emit!(w, "{ct}* qs = reinterpret_cast<{ct}*>(smem);  // [BR][ST]");
    emit!(
        w,
        "{ct}* cs = reinterpret_cast<{ct}*>(smem + {});  // [NST][TS][ST]: c | pe | 0",
        p.q_region_bytes()
    );
    w.comment("[NP][BR][SST] f32 partial scores, one array a chain of k16 steps (c, c + 4, ...);");
    w.comment("after the softmax each row of the first holds p_hi[TS] | p_lo[TS].");
    w.comment("(over q's rows, which every warp has read into registers before tile 0's barrier)");
    w.line("float* ss = reinterpret_cast<float*>(smem);");
    w.line("float* m_r = reinterpret_cast<float*>(cs + NST * TS * ST);");
    emit!(w, "{ct}* ps = reinterpret_cast<{ct}*>(ss);");
    w.line("constexpr int PST = 2 * SST;  // a row of ps, in 16-bit elements");
    w.line("float* l_r = m_r + BR;");
    w.line("float* a_r = l_r + BR;");
    w.line("long long* end_r = reinterpret_cast<long long*>(a_r + BR);");
    emit!(w, "const {ct}* ql = {};", p.q_lat.ptr_as(ct, false));
    emit!(w, "const {ct}* qp = {};", p.q_pe.ptr_as(ct, false));
    emit!(w, "const {ct}* kc = {};", p.c_cache.ptr_as(ct, false));
    emit!(w, "const {ct}* kp = {};", p.pe_cache.ptr_as(ct, false));
    emit!(w, "{ct}* y = {};", p.out.ptr_as(ct, true));
    w.line("const long long split = blockIdx.y, bi = blockIdx.z;");
    w.line("const long long row0 = (long long)blockIdx.x * BR;  // the block's first row");
    w.line("const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;");
    w.line("const int g = lane >> 2, tq = lane & 3;");
    w.line("const int rt = warp >> 2, wq = warp & 3, ltid = tid & 127;  // row tile, its warp");
    mask_setup(&mut w, p);
    w.comment("Per row: the end of its allowed slots (the block's range is their maximum).");
    w.if_block("tid < BR", |w| {
        w.line("const long long gr = row0 + tid;");
        w.line("long long e = 0;");
        w.if_block("gr < ROWS", |w| row_end(w, p));
        w.line("end_r[tid] = e;");
        w.line("m_r[tid] = neg_inf();");
        w.line("l_r[tid] = 0.0f;");
    });
    w.line("__syncthreads();");
    w.line("long long len = 0;");
    w.line("for (int r = 0; r < BR; ++r) len = end_r[r] > len ? end_r[r] : len;");
    w.comment("This split's slots: a fixed range of whole tiles (so a row's sums never depend on");
    w.comment("the other rows of its block or bucket), cut at the block's longest row.");
    emit!(w, "constexpr long long CHUNK = {};", p.chunk());
    w.comment("(32-bit slot arithmetic: `supported` keeps ctx · (L + R) below 2³¹.)");
    w.line("const int s_begin = (int)(split * CHUNK);");
    if p.splits > 1 {
        w.comment("No row of the block reaches this split: `mla_combine` reads none of it.");
        w.line("if (s_begin >= len) return;");
    }
    w.line("const int s_end = (int)(s_begin + CHUNK < len ? s_begin + CHUNK : len);");
    w.line("const int ntiles = s_end > s_begin ? (s_end - s_begin + TS - 1) / TS : 0;");
    w.comment("q rows: q_lat | q_pe | 0, 16-byte copies (the first cp.async group).");
    w.for_block("int i = tid", "i < BR * (KP / 8)", "i += blockDim.x", |w| {
        w.line("const int row = i / (KP / 8), kv = (i % (KP / 8)) * 8;");
        w.line("const long long gr = row0 + row;");
        w.line("const bool in = gr < ROWS;");
        emit!(w, "const {ct}* src = ql;");
        w.line("bool ok = false;");
        w.if_else(
            "kv < L",
            |w| {
                w.line("src = ql + (bi * ROWS + gr) * L + kv;");
                w.line("ok = in;");
            },
            |w| {
                w.if_block("kv < L + R", |w| {
                    w.line("src = qp + (bi * ROWS + gr) * R + (kv - L);");
                    w.line("ok = in;");
                });
            },
        );
        w.line("cp_async16(qs + row * ST + kv, ok ? src : ql, ok);");
    });
    w.line("cp_async_commit();");
    w.comment("Cache tile `it` of the split into stage `buf` (zero past the range): warp `w`");
    w.comment("copies slots w, w + 4·RT, ..., lane `l` the row's 16-byte chunks l, l + 32, ...,");
    w.comment("so a copy costs an add on the slot's two row pointers.");
    emit!(
        w,
        "const {ct}* kc_b = kc + bi * CTX * L;  // this sequence's caches"
    );
    emit!(w, "const {ct}* kp_b = kp + bi * CTX * R;");
    w.block_semi("auto load_tile = [&](int buf, int it)", |w| {
        w.line("const int s0 = s_begin + it * TS;");
        w.for_block("int j = warp", "j < TS", "j += 4 * RT", |w| {
            w.line("const int s = s0 + j;");
            w.line("const bool in = s < s_end;");
            emit!(w, "const {ct}* crow = kc_b + (in ? s : 0) * (int)L;");
            emit!(w, "const {ct}* prow = kp_b + (in ? s : 0) * (int)R;");
            emit!(w, "{ct}* drow = cs + (buf * TS + j) * ST;");
            w.for_unrolled("q", 0, "(KP / 8 + 31) / 32", |w| {
                w.line("const int kv = (lane + 32 * q) * 8;");
                w.if_block("kv < KP", |w| {
                    emit!(w, "const {ct}* src = kc;");
                    w.line("bool ok = false;");
                    w.if_else(
                        "kv < L",
                        |w| {
                            w.line("src = crow + kv;");
                            w.line("ok = in;");
                        },
                        |w| {
                            w.if_block("kv < L + R", |w| {
                                w.line("src = prow + (kv - L);");
                                w.line("ok = in;");
                            });
                        },
                    );
                    w.line("cp_async16(drow + kv, src, ok);");
                });
            });
        });
    });
    w.comment("One cp.async group per stage, empty past the last tile (uniform group counts).");
    w.for_block("int st = 0", "st < NST - 1", "++st", |w| {
        w.line("if (st < ntiles) load_tile(st, st);");
        w.line("cp_async_commit();");
    });
    w.line("const int rbase = rt * 16;  // this warp's rows in the block's per-row arrays");
    emit!(w, "const {ct}* qt = qs + rbase * ST;");
    w.line("float* st_s = ss + rbase * SST;");
    w.line("float* st_p = ss + (wq * BR + rbase) * SST;  // this warp's partial scores");
    w.comment("Lane offsets of the A fragment (16 q rows × 16 features) and of the B fragments");
    w.comment("of 16 slots × 16 features (two n8 tiles) in the staged tiles.");
    w.line("const int q_frag = ((lane & 7) + 8 * ((lane >> 3) & 1)) * ST + 8 * (lane >> 4);");
    w.line("const int k_frag = ((lane & 7) + 8 * (lane >> 4)) * ST + 8 * ((lane >> 3) & 1);");
    w.comment("The q fragments of this warp's k16 steps, held for the whole split (q landed:");
    w.comment("only the NST − 1 cache groups may still be pending).");
    w.line("cp_async_wait<NST - 1>();");
    w.line("__syncthreads();");
    w.line("unsigned qf[QS][4];");
    w.for_unrolled("j", 0, "QS", |w| {
        w.line("const int ks = wq + 4 * j;");
        w.line("if (ks < KS) ldmatrix_x4(qf[j], qt + q_frag + ks * 16);");
    });
    emit!(w, "{ct}* pt = ps + rbase * PST;");
    w.line("float acc[NTP + 1][4];");
    w.for_unrolled("n", 0, "NTP + 1", |w| {
        w.line("acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;");
    });
    w.for_block("int it = 0", "it < ntiles", "++it", |w| {
        w.comment("Tile `it` (and q) landed for every thread; every warp is done with tile");
        w.comment("`it − 1`, whose stage the next load refills, and with the scores.");
        w.line("cp_async_wait<NST - 2>();");
        w.line("__syncthreads();");
        w.line("if (it + NST - 1 < ntiles) load_tile((it + NST - 1) % NST, it + NST - 1);");
        w.line("cp_async_commit();");
        emit!(w, "const {ct}* kt = cs + (it % NST) * TS * ST;");
        w.line("const int s0 = s_begin + it * TS;");
        k_split_scores(w, mma);
        w.line("__syncthreads();");
        w.comment("Online softmax: 8 consecutive threads of the row tile per row, 4 slots each.");
        w.scope(|w| {
            w.line("const int row = ltid >> 3, part = ltid & 7;");
            w.line("float v[TS / 8], mx = neg_inf();");
            w.comment("The four chains' partial sums in chain order, scaled, masked (causal `s ≤");
            w.comment("pos`, or the tree: `s < prefix` or an ancestor bit).");
            w.line("const int col0 = part * (TS / 8);");
            w.line("float4 sum4 = *reinterpret_cast<const float4*>(st_s + row * SST + col0);");
            w.for_unrolled("q", 1, "NP", |w| {
                w.line("const float4 o = *reinterpret_cast<const float4*>(st_s + (q * BR + row) * SST + col0);");
                w.line("sum4.x += o.x; sum4.y += o.y; sum4.z += o.z; sum4.w += o.w;");
            });
            w.line("const float sums[4] = {sum4.x, sum4.y, sum4.z, sum4.w};");
            w.line("const int row_end = (int)end_r[rbase + row];");
            w.for_unrolled("c", 0, "TS / 8", |w| {
                w.line("const float sum = sums[c];");
                w.line("const int s = s0 + col0 + c;");
                w.line("bool ok = s < s_end && s < row_end;");
                if let MlaMask::Tree { .. } = p.mask {
                    w.line("const long long u = s - prefix;");
                    w.if_block("ok && u >= 0", |w| {
                        w.line("const long long gr = row0 + rbase + row;");
                        w.line("const long long* aw = anc + (bi * T + gr / H) * W;");
                        w.line(
                            "ok = u < nodes && (((unsigned long long)aw[u >> 6] >> (u & 63)) & 1ull);",
                        );
                    });
                }
                w.line("v[c] = ok ? __fmul_rn(sum, scale) : neg_inf();");
                w.line("mx = fmaxf(mx, v[c]);");
            });
            w.line("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));");
            w.line("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));");
            w.line("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));");
            w.line("const float m_old = m_r[rbase + row], m_new = fmaxf(m_old, mx);");
            w.line("float sum = 0.0f;");
            w.comment("The row's 8 threads are one warp's lanes: all scores are read before any");
            w.comment("thread overwrites the row with p = p_hi + p_lo (two 16-bit halves, so the");
            w.comment("product with the cache keeps p to ~16 bits more than one 16-bit value).");
            w.line("__syncwarp();");
            w.for_unrolled("c", 0, "TS / 8", |w| {
                w.line("const float pv = v[c] == neg_inf() ? 0.0f : expf(v[c] - m_new);");
                emit!(w, "const {ct} hi = from_f32<{ct}>(pv);");
                emit!(w, "pt[row * PST + part * (TS / 8) + c] = hi;");
                emit!(
                    w,
                    "pt[row * PST + TS + part * (TS / 8) + c] = from_f32<{ct}>(pv - to_f32(hi));"
                );
                w.line("sum += pv;");
            });
            w.line("sum += __shfl_xor_sync(0xffffffffu, sum, 1);");
            w.line("sum += __shfl_xor_sync(0xffffffffu, sum, 2);");
            w.line("sum += __shfl_xor_sync(0xffffffffu, sum, 4);");
            w.line("__syncwarp();");
            w.if_block("part == 0", |w| {
                w.line("const float alpha = m_old == neg_inf() ? 0.0f : expf(m_old - m_new);");
                w.line("a_r[rbase + row] = alpha;");
                w.line("l_r[rbase + row] = __fmaf_rn(l_r[rbase + row], alpha, sum);");
                w.line("m_r[rbase + row] = m_new;");
            });
        });
        w.line("__syncthreads();");
        w.comment("acc = alpha·acc + p·c over this warp's latent columns.");
        w.line("const float al0 = a_r[rbase + g], al1 = a_r[rbase + g + 8];");
        w.for_unrolled("n", 0, "NTP", |w| {
            w.line("acc[n][0] *= al0; acc[n][1] *= al0; acc[n][2] *= al1; acc[n][3] *= al1;");
        });
        w.for_unrolled("k2", 0, "TS / 16", |w| {
            w.line("unsigned pa[4], pl[4];");
            w.line(
                "const int pr = ((lane & 7) + 8 * ((lane >> 3) & 1)) * PST + k2 * 16 + 8 * (lane >> 4);",
            );
            w.line("ldmatrix_x4(pa, pt + pr);");
            w.line("ldmatrix_x4(pl, pt + pr + TS);");
            w.for_unrolled("n2", 0, "(NTP + 1) / 2", |w| {
                w.line("unsigned vb[4];");
                w.line(
                    "ldmatrix_x4_trans(vb, kt + (k2 * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * ST + wq * NCOLW + n2 * 16 + 8 * (lane >> 4));",
                );
                emit!(w, "{mma}(acc[2 * n2], pa, vb[0], vb[1]);");
                emit!(w, "{mma}(acc[2 * n2], pl, vb[0], vb[1]);");
                w.if_block("2 * n2 + 1 < NTP", |w| {
                    emit!(w, "{mma}(acc[2 * n2 + 1], pa, vb[2], vb[3]);");
                    emit!(w, "{mma}(acc[2 * n2 + 1], pl, vb[2], vb[3]);");
                });
            });
        });
    });
    w.line("cp_async_wait<0>();");
    if p.splits == 1 {
        w.for_unrolled("hf", 0, "2", |w| {
            w.line("const int row = g + 8 * hf;");
            w.line("const long long gr = row0 + rbase + row;");
            w.if_block("gr < ROWS", |w| {
                w.line("const float l = l_r[rbase + row];");
                w.for_unrolled("n", 0, "NTP", |w| {
                    w.line("const long long col = wq * NCOLW + n * 8 + 2 * tq;");
                    w.line("const float v0 = l > 0.0f ? acc[n][2 * hf] / l : 0.0f;");
                    w.line("const float v1 = l > 0.0f ? acc[n][2 * hf + 1] / l : 0.0f;");
                    emit!(w, "y[(bi * ROWS + gr) * L + col] = from_f32<{ct}>(v0);");
                    emit!(w, "y[(bi * ROWS + gr) * L + col + 1] = from_f32<{ct}>(v1);");
                });
            });
        });
    } else {
        emit!(w, "float* po = {};", p.partial_acc.ptr_as("float", true));
        emit!(w, "float* pml = {};", p.partial_ml.ptr_as("float", true));
        w.for_unrolled("hf", 0, "2", |w| {
            w.line("const int row = g + 8 * hf;");
            w.line("const long long gr = row0 + rbase + row;");
            w.if_block("gr < ROWS", |w| {
                w.line("float* pr = po + ((bi * ROWS + gr) * S + split) * L;");
                w.for_unrolled("n", 0, "NTP", |w| {
                    w.line("const long long col = wq * NCOLW + n * 8 + 2 * tq;");
                    w.line(
                        "*reinterpret_cast<float2*>(pr + col) = make_float2(acc[n][2 * hf], acc[n][2 * hf + 1]);",
                    );
                });
            });
        });
        w.if_block("tid < BR && row0 + tid < ROWS", |w| {
            w.line("float* q = pml + ((bi * ROWS + row0 + tid) * S + split) * 2;");
            w.line("q[0] = m_r[tid];");
            w.line("q[1] = l_r[tid];");
        });
    }
    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(p.row_blocks() as u32),
            Extent::Fixed(p.splits as u32),
            Extent::Fixed(p.batch as u32),
        ],
        block: [(128 * p.block_row_tiles) as u32, 1, 1],
        smem_bytes: p.smem_bytes() as u32,
    };
    assemble(
        "mla_tile",
        p.dtype.to_string().as_str(),
        &items.finish(),
        "",
        &w.finish(),
        launch,
        &prelude(),
    )
}

/// Columns of the latent one combine block writes (one a thread).
const COMBINE_COLS: u64 = 128;
/// Splits whose partials one combine thread loads before folding them, at most: at 32
/// (the most splits codegen plans) every load of a row is in flight at once, one L2 round
/// trip for the maxima and one for the partials.
const COMBINE_BATCH: u64 = 32;

/// One block per query row and 128 latent columns: over the partials (a split's, or a
/// cluster of splits' for `mla_wgmma`) that start before the row's end (the only ones the
/// tile kernel wrote for it), in order,
/// `y = R(Σ_s e^(m_s − M)·acc_s / Σ_s e^(m_s − M)·l_s)`, 0 where no split saw an allowed slot.
/// The order and the set of partials depend on the row alone, never on the bucket.
fn combine(p: &MlaTileParams) -> KernelSource {
    let ct = c_type(p.dtype);
    let mut w = Writer::at_depth(1);
    emit!(
        w,
        "constexpr long long T = {}, H = {}, L = {}, CTX = {}, ROWS = T * H, S = {}, CHUNK = {};",
        p.tokens,
        p.heads,
        p.latent,
        p.ctx,
        p.parts(),
        p.part_chunk()
    );
    emit!(
        w,
        "const float* po = {};",
        p.partial_acc.ptr_as("float", false)
    );
    emit!(
        w,
        "const float* pml = {};",
        p.partial_ml.ptr_as("float", false)
    );
    emit!(w, "{ct}* y = {};", p.out.ptr_as(ct, true));
    w.line("const long long row = blockIdx.x, bi = row / ROWS, gr = row % ROWS;");
    mask_setup(&mut w, p);
    w.line("long long e = 0;");
    row_end(&mut w, p);
    w.line("const long long live = (e + CHUNK - 1) / CHUNK < S ? (e + CHUNK - 1) / CHUNK : S;");
    w.line("const float* ml = pml + row * S * 2;");
    emit!(
        w,
        "const long long i = (long long)blockIdx.y * {COMBINE_COLS} + threadIdx.x;"
    );
    w.line("const float* pa = po + row * S * L + (i < L ? i : 0);");
    w.comment("Splits in batches of CB: a batch's loads are all issued before its folds (each");
    w.comment("fold would otherwise wait out an L2 round trip); the folds keep split order.");
    emit!(
        w,
        "constexpr int CB = {};",
        p.parts().clamp(1, COMBINE_BATCH)
    );
    w.line("float mx = neg_inf();");
    w.for_block("long long s0 = 0", "s0 < live", "s0 += CB", |w| {
        w.line("float mv[CB];");
        w.for_unrolled("j", 0, "CB", |w| {
            w.line("mv[j] = s0 + j < live ? ml[2 * (s0 + j)] : neg_inf();");
        });
        w.for_unrolled("j", 0, "CB", |w| w.line("mx = fmaxf(mx, mv[j]);"));
    });
    w.line("float den = 0.0f, num = 0.0f;");
    w.for_block("long long s0 = 0", "s0 < live", "s0 += CB", |w| {
        w.line("float mv[CB], lv[CB], av[CB];");
        w.for_unrolled("j", 0, "CB", |w| {
            w.line("const bool in = s0 + j < live;");
            w.line("mv[j] = in ? ml[2 * (s0 + j)] : neg_inf();");
            w.line("lv[j] = in ? ml[2 * (s0 + j) + 1] : 0.0f;");
            w.line("av[j] = in ? pa[(s0 + j) * L] : 0.0f;");
        });
        w.for_unrolled("j", 0, "CB", |w| {
            w.if_block("mv[j] != neg_inf()", |w| {
                w.line("const float f = expf(mv[j] - mx);");
                w.line("den = __fmaf_rn(f, lv[j], den);");
                w.line("num = __fmaf_rn(f, av[j], num);");
            });
        });
    });
    w.if_block("i < L", |w| {
        emit!(
            w,
            "y[row * L + i] = from_f32<{ct}>(den > 0.0f ? num / den : 0.0f);"
        );
    });
    let rows = p.batch * p.tokens * p.heads;
    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(rows as u32),
            Extent::Fixed(p.latent.div_ceil(COMBINE_COLS) as u32),
            Extent::Fixed(1),
        ],
        block: [COMBINE_COLS as u32, 1, 1],
        smem_bytes: 0,
    };
    assemble(
        "mla_combine",
        p.dtype.to_string().as_str(),
        "",
        "",
        &w.finish(),
        launch,
        &prelude(),
    )
}
