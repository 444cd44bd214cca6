//! The grouped MoE: `moe_experts` as four kernels that read each selected expert's weights
//! once for all the tokens routed to it, and nothing of the experts no token selected.
//!
//! 1. `moe_dispatch` (one block, a thread per expert): from the dense gates `[T, E]`, per
//!    expert the count of tokens with a non-zero gate and their (token, gate) pairs, ordered
//!    by expert and then token, in a fixed buffer of `T · top_k` pairs; the list of experts
//!    with at least one token (`used`, increasing); `pidx[t, e]` = the pair of (t, e). The
//!    first pair of each expert and its slot in `used` are exclusive scans over the experts
//!    (warp shuffles and ballots, then the warp totals: two barriers a round of up to 1024
//!    experts). Every write is inside its buffer: a pair past the capacity is dropped
//!    (`pidx` = -1) — impossible when the gates come from a router choosing `top_k` per
//!    token, which is what the capacity is.
//! 2. `moe_gate_up`: grid (row tiles of F, used-expert slots); a block whose slot is past the
//!    used count exits. Each warp owns rows of the expert's gate and up weights and streams
//!    them once per pass over the expert's tokens (passes of up to 8 tokens for float stacks,
//!    4 for quantised; see [`stream`] for the loads in flight); the SwiGLU
//!    `a = R(R(silu(R(g)))·R(u))` is its epilogue, into `act[pair, F]`.
//! 3. `moe_down`: the same over the down weights, `y[pair, H] = R(a · Wd_eᵀ)`.
//! 4. `moe_combine` (one block per token): `out = R(Σ_e gate·y)` over the token's pairs in
//!    increasing expert order, one f32 multiply and add each, as the interpreter. One warp
//!    gathers the pairs (all gates of up to 512 experts loaded at once, compacted in order
//!    by ballots), then the block accumulates.
//!
//! `R` rounds to the output dtype. Each dot product is one warp's sum over a fixed lane
//! stride, whatever the number of tokens sharing the expert, so a token's result does not
//! depend on the batch it is in.
//!
//! The expert stacks are float, or int4 / fp8 read as stored with their scale stacks
//! ([`Stacks`]): a lane loads 16 bytes of a row (32 nibbles, 16 fp8 bytes) and its scale,
//! converts them in registers and feeds every token of the pass; the scale multiplies the
//! load's partial sum once (`s · Σ x·q`, [`stream`]), so each selected expert's stored bytes
//! and scales are streamed once per pass and nothing of the other experts is read.
//! int4 group-32 stacks with bf16 activations can instead run `moe_gate_up` / `moe_down` on
//! tensor cores ([`ExpertMatmul::Int4TensorCores`], [`int4_mma`], tiled as an
//! [`Int4MmaTiling`] says); dispatch and combine are the same for both.

use super::quant::QuantRows;
use super::{c_type, load, store, Kernel, TensorArg};
use crate::abi::{Extent, KernelSource, LaunchSpec, Loc};
use crate::quant::QuantFormat;
use crate::writer::{emit, Writer};
use crate::Error;
use specc_ir::DType;

mod int4_mma;
mod stream;

pub use int4_mma::{Int4MmaGeometry, Int4MmaTiling};

pub use specc_ir::engine::choice::{CoreTiling, ExpertMatmul};

/// Warps of a CUDA-core gate/up or down block: small blocks, many of them, so the last wave
/// is short.
const WARPS: u64 = 4;
/// Blocks of a gate/up or down kernel an SM keeps resident (ptxas holds registers to what
/// they allow): float stacks 4 (128 registers; 16 warps of `U · rows` 16-byte loads in
/// flight, 64 KiB an SM), quantised 3 (168 registers: their per-load partial sums spill at
/// 128 on sm_100a / sm_120 at Kimi's shapes).
const FLOAT_MIN_BLOCKS: u32 = 4;
const QUANT_MIN_BLOCKS: u32 = 3;
/// Tokens of one expert whose activations a warp holds while it streams its rows, by the
/// expert's token count (the smallest size that holds them, else passes of the largest):
/// up to 4 (8 spills at Kimi's shapes within the registers of [`FLOAT_MIN_BLOCKS`]).
const FLOAT_PASSES: [u64; 3] = [1, 2, 4];
const QUANT_PASSES: [u64; 3] = [1, 2, 4];
/// Tokens whose gates a dispatch thread loads at once.
const DISPATCH_TOKENS: u64 = 8;
/// Groups of 32 experts whose gates the combine gather loads at once.
const COMBINE_CHUNKS: u64 = 16;
/// Threads of a combine block, and outputs of the token each thread sums: a token's hidden
/// row is split over `H / (threads · outputs)` blocks (7 at Kimi's 7168), each gathering the
/// token's pairs itself, so one token's combine is not one block's serial chain of loads.
const COMBINE_THREADS: u64 = 256;
const COMBINE_OUTPUTS: u64 = 4;
/// Pairs a token may have (the router's top-k) up to which the combine loads every pair's
/// value of an output before adding any.
const COMBINE_HOISTED_PAIRS: u64 = 16;

/// Scratch buffers of the grouped MoE (arena locations, each 256-byte aligned).
#[derive(Clone, Copy, Debug)]
pub struct MoeScratch {
    /// `i32`: the used count again, in a region no other kernel writes (for benchmarks).
    pub stat: Loc,
    /// `i32[1 + 3E]`: the used count, the used experts, each expert's first pair, its count.
    pub meta: Loc,
    /// `i32[P]`: each pair's token.
    pub pair_token: Loc,
    /// `f32[P]`: each pair's gate.
    pub pair_gate: Loc,
    /// `i32[T · E]`: the pair of (token, expert), where the gate is non-zero.
    pub pair_of: Loc,
    /// `[P, F]` in the output dtype: SwiGLU activations per pair.
    pub act: Loc,
    /// `[P, H]` in the output dtype: each pair's expert output.
    pub y: Loc,
}

/// The shapes the grouped kernels are emitted for.
#[derive(Clone, Copy, Debug)]
pub struct MoeGroupedShape {
    pub tokens: u64,
    pub experts: u64,
    pub hidden: u64,
    pub ffn: u64,
    /// Non-zero gates a token has at most (the router's `top_k`; `experts` when unknown).
    pub top_k: u64,
}

impl MoeGroupedShape {
    /// Pairs the buffers hold.
    pub fn pairs(&self) -> u64 {
        self.tokens * self.top_k.min(self.experts)
    }

    /// Bytes of each [`MoeScratch`] buffer, in field order, for `elem` bytes per activation.
    pub fn scratch_bytes(&self, elem: u64) -> [u64; 6] {
        let p = self.pairs();
        [
            4 * (1 + 3 * self.experts),
            4 * p,
            4 * p,
            4 * self.tokens * self.experts,
            elem * p * self.ffn,
            elem * p * self.hidden,
        ]
    }
}

/// The stacks' names in the kernels (`wg`, `sg`, `wge`, ...).
const NAMES: [&str; 3] = ["g", "u", "d"];

/// Why the grouped kernels do not take a `moe_experts` (the per-token kernel then runs it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unsupported {
    /// Activations (`x`, the output) of a dtype other than f32, bf16 or f16.
    Activations(DType),
    /// Gate, up and down stacks of different dtypes, or weights neither float nor int4 /
    /// fp8.
    Weights(String),
    /// Float weights whose rows do not split into 16-byte loads.
    RowLoads { dtype: DType, hidden: u64, ffn: u64 },
    /// Quantised stacks whose scales or in-features break their format's rules.
    Quant(String),
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unsupported::Activations(d) => write!(f, "{d} activations"),
            Unsupported::Weights(m) | Unsupported::Quant(m) => f.write_str(m),
            Unsupported::RowLoads { dtype, hidden, ffn } => write!(
                f,
                "{dtype} weights of hidden {hidden} / ffn {ffn} do not split into 16-byte row loads"
            ),
        }
    }
}

/// The expert stacks as the grouped kernels read them: `wg, wu, wd` of a float dtype, or
/// stored int4 / fp8 with their scale stacks `sg, su, sd`, dequantised in registers as
/// `gemv_q` does (`q · scale` rounded once to f32; REFERENCE.md "Weight formats").
pub struct Stacks<'a> {
    /// `wg, wu, wd`.
    w: [&'a TensorArg; 3],
    quant: Option<([&'a TensorArg; 3], [QuantRows; 3])>,
}

impl<'a> Stacks<'a> {
    /// `weights` as `moe_experts` takes them (3 float stacks, or 3 quantised and 3 scales).
    pub fn of(weights: &'a [TensorArg]) -> Result<Stacks<'a>, Unsupported> {
        let (wg, wu, wd) = match weights {
            [wg, wu, wd, ..] => (wg, wu, wd),
            _ => return Err(Unsupported::Weights("fewer than 3 expert stacks".into())),
        };
        if wg.dtype != wu.dtype || wg.dtype != wd.dtype {
            return Err(Unsupported::Weights(format!(
                "stacks of dtypes {} / {} / {}",
                wg.dtype, wu.dtype, wd.dtype
            )));
        }
        let quant = match weights.get(3..6) {
            Some([sg, su, sd]) if QuantFormat::of(wg.dtype).is_some() => {
                let q = |w, s| {
                    QuantRows::of("moe_grouped", w, s)
                        .map_err(|e| Unsupported::Quant(e.to_string()))
                };
                Some(([sg, su, sd], [q(wg, sg)?, q(wu, su)?, q(wd, sd)?]))
            }
            _ if super::is_float(wg.dtype) && weights.len() == 3 => None,
            _ => {
                return Err(Unsupported::Weights(format!(
                    "{} stacks with {} operands",
                    wg.dtype,
                    weights.len()
                )))
            }
        };
        if let Some((_, q)) = &quant {
            if let Some(r) = q
                .iter()
                .find(|r| stream::quant_vec(r.format, r.k).is_none())
            {
                return Err(Unsupported::Quant(format!(
                    "{} rows of {} columns do not split into loads of one scale",
                    r.format.name(),
                    r.k
                )));
            }
        }
        let st = Stacks {
            w: [wg, wu, wd],
            quant,
        };
        let (f, h) = (wg.dims[1], wg.dims[2]);
        // Quantised rows always split into their format's loads (`QuantRows::of` checked K).
        if st.quant.is_none() && (!h.is_multiple_of(st.vec(0)) || !f.is_multiple_of(st.vec(2))) {
            return Err(Unsupported::RowLoads {
                dtype: wg.dtype,
                hidden: h,
                ffn: f,
            });
        }
        Ok(st)
    }

    /// Elements of one weight load of stack `m`'s rows: 16 bytes of a float dtype, or a
    /// quantised load of one scale ([`stream::quant_vec`]).
    fn vec(&self, m: usize) -> u64 {
        match &self.quant {
            None => 16 / self.w[m].elem_bytes().max(1),
            Some((_, q)) => stream::quant_vec(q[m].format, q[m].k).expect("checked by `of`"),
        }
    }

    /// Declares the kernel's pointers to stacks `ms` (`wg`, `wu`, `wd`, and their scales
    /// `sg`, `su`, `sd`).
    fn ptrs(&self, k: &mut Kernel, ms: &[usize]) {
        for &m in ms {
            k.ptr(&format!("w{}", NAMES[m]), self.w[m], false);
            if let Some((s, _)) = &self.quant {
                k.ptr(&format!("s{}", NAMES[m]), s[m], false);
            }
        }
    }

    /// Pointers `w?e` (and `s?e`) to expert `ex`'s matrix of stack `m` (`?` its name).
    fn expert_ptrs(&self, w: &mut Writer, m: usize) {
        let (a, nm) = (self.w[m], NAMES[m]);
        match &self.quant {
            None => emit!(
                w,
                "const {}* w{nm}e = w{nm} + (long long)ex * {};",
                c_type(a.dtype),
                a.dims[1] * a.dims[2]
            ),
            Some((_, q)) => {
                emit!(
                    w,
                    "const unsigned char* w{nm}e = w{nm} + (long long)ex * {};",
                    q[m].matrix_bytes()
                );
                emit!(
                    w,
                    "const auto* s{nm}e = s{nm} + (long long)ex * {};",
                    q[m].matrix_scales()
                );
            }
        }
    }

    /// The quantised format of stack `m` (`None`: float).
    fn format(&self, m: usize) -> Option<QuantFormat> {
        self.quant.as_ref().map(|(_, q)| q[m].format)
    }

    /// Columns of stack `m`'s rows.
    fn k(&self, m: usize) -> u64 {
        self.w[m].dims[2]
    }

    /// The C element type of a float stack.
    fn c_type(&self, m: usize) -> &'static str {
        c_type(self.w[m].dtype)
    }

    /// The C element type of a quantised stack's scales.
    fn scale_c_type(&self, m: usize) -> &'static str {
        self.quant
            .as_ref()
            .map_or("float", |(s, _)| c_type(s[m].dtype))
    }

    /// The resident blocks per SM the launch bounds ask for.
    fn min_blocks(&self) -> u32 {
        if self.quant.is_some() {
            QUANT_MIN_BLOCKS
        } else {
            FLOAT_MIN_BLOCKS
        }
    }

    /// The pass sizes of [`per_pass`] for these stacks.
    fn passes(&self) -> &'static [u64] {
        if self.quant.is_some() {
            &QUANT_PASSES
        } else {
            &FLOAT_PASSES
        }
    }

    /// The dtype in kernel names: the stacks' (`int4g32`, `fp8e4m3`, `bf16`).
    fn dtype(&self) -> DType {
        self.w[0].dtype
    }
}

/// Whether the grouped kernels take these operands (`weights` as `moe_experts`: 3 float
/// stacks, or 3 int4 / fp8 stacks and their scales), else why not.
pub fn supported(x: &TensorArg, weights: &[TensorArg], out: &TensorArg) -> Result<(), Unsupported> {
    for a in [x, out] {
        if !super::is_float(a.dtype) {
            return Err(Unsupported::Activations(a.dtype));
        }
    }
    Stacks::of(weights).map(|_| ())
}

/// Whether the tensor-core int4 kernels tiled as `tl` take these operands, else why not:
/// bf16 activations, int4 group-32 stacks with bf16 scales, hidden and ffn multiples of the
/// stage's columns (whole ring stages of the in-features; whole warp tiles of 16 gate/up and
/// 32 down rows), a tiling the emitters take.
pub fn int4_tensor_cores(
    x: &TensorArg,
    weights: &[TensorArg],
    out: &TensorArg,
    tl: Int4MmaTiling,
) -> Result<(), Unsupported> {
    supported(x, weights, out)?;
    if !tl.valid() {
        return Err(Unsupported::Quant(format!(
            "tensor-core tiling {} (groups 4 / 8 / 16, stages 2..8, warps 4 / 8)",
            tl.name()
        )));
    }
    for a in [x, out] {
        if a.dtype != DType::BF16 {
            return Err(Unsupported::Activations(a.dtype));
        }
    }
    let st = Stacks::of(weights)?;
    if st.format(0) != Some(QuantFormat::Int4 { group: 32 }) {
        return Err(Unsupported::Weights(format!(
            "{} stacks (int4 group 32 only)",
            st.dtype()
        )));
    }
    if let Some((s, _)) = &st.quant {
        if let Some(a) = s.iter().find(|a| a.dtype != DType::BF16) {
            return Err(Unsupported::Quant(format!("{} int4 scales", a.dtype)));
        }
    }
    let (f, h) = (st.w[0].dims[1], st.w[0].dims[2]);
    let cols = tl.stage_cols();
    if !h.is_multiple_of(cols) || !f.is_multiple_of(cols) {
        return Err(Unsupported::Quant(format!(
            "hidden {h} / ffn {f} not multiples of {cols} (tensor-core stages)"
        )));
    }
    Ok(())
}

/// The four kernels (see the module docs), `moe_gate_up` / `moe_down` multiplying as
/// `matmul` says. Operands as `moe_experts`: `x [.., H]`, `gates [.., E]`, `weights` =
/// `wg`/`wu` `[E, F, H]`, `wd [E, H, F]` (and their scale stacks when stored int4 / fp8).
pub fn moe_grouped(
    shape: MoeGroupedShape,
    matmul: ExpertMatmul,
    x: &TensorArg,
    gates: &TensorArg,
    weights: &[TensorArg],
    out: &TensorArg,
    s: &MoeScratch,
) -> Result<Vec<KernelSource>, Error> {
    supported(x, weights, out)
        .map_err(|e| Error::param("moe_grouped", "weights", e.to_string()))?;
    let st = Stacks::of(weights).expect("checked by supported");
    let (gu, dn) = match matmul {
        ExpertMatmul::CudaCores(tl) => {
            if !tl.valid() {
                return Err(Error::param(
                    "moe_grouped",
                    "matmul",
                    format!(
                        "CUDA-core tiling {} is not one the emitters take",
                        tl.name()
                    ),
                ));
            }
            (
                gate_up(shape, tl, x, &st, out, s),
                down(shape, tl, &st, out, s),
            )
        }
        ExpertMatmul::Int4TensorCores(tl) => {
            int4_tensor_cores(x, weights, out, tl)
                .map_err(|e| Error::param("moe_grouped", "weights", e.to_string()))?;
            (
                int4_mma::gate_up(shape, tl, x, &st, out, s),
                int4_mma::down(shape, tl, &st, out, s),
            )
        }
    };
    Ok(vec![
        dispatch(shape, gates, s),
        gu,
        dn,
        combine(shape, gates, out, s),
    ])
}

fn scratch_arg(loc: Loc, dtype: specc_ir::DType, n: u64) -> TensorArg {
    TensorArg::new(loc, dtype, &[n])
}

fn meta_ptrs(k: &mut Kernel, s: &MoeScratch, e: u64, mutable: bool) {
    use specc_ir::DType::I32;
    k.ptr("meta", &scratch_arg(s.meta, I32, 1 + 3 * e), mutable);
    let w = &mut k.body;
    let cv = if mutable { "" } else { "const " };
    emit!(w, "{cv}int* used = meta + 1;");
    emit!(w, "{cv}int* first = meta + 1 + {e};");
    emit!(w, "{cv}int* count = meta + 1 + 2 * {e};");
}

/// Threads of the dispatch block: one per expert, up to 1024 (more experts take rounds).
fn dispatch_threads(e: u64) -> u32 {
    e.next_multiple_of(32).clamp(32, 1024) as u32
}

/// The token loop of a dispatch thread (expert `ex`): the gates of `TB` tokens are loaded
/// before any is used, so their loads overlap; `body` sees token `t0 + b` and its gate `g`
/// (0 past `T`), in increasing token order.
fn per_token_chunk(w: &mut Writer, gates: &TensorArg, body: &dyn Fn(&mut Writer)) {
    w.for_block("int t0 = 0", "t0 < T", "t0 += TB", |w| {
        w.line("float gv[TB];");
        w.for_unrolled("b", 0, "TB", |w| {
            emit!(
                w,
                "gv[b] = t0 + b < T ? {} : 0.0f;",
                load(gates.dtype, "gates[(long long)(t0 + b) * E + ex]")
            );
        });
        w.for_unrolled("b", 0, "TB", |w| {
            w.line("const float g = gv[b];");
            body(w);
        });
    });
}

fn dispatch(sh: MoeGroupedShape, gates: &TensorArg, s: &MoeScratch) -> KernelSource {
    use specc_ir::DType::{F32, I32};
    let (t, e, p) = (sh.tokens, sh.experts, sh.pairs());
    let nt = dispatch_threads(e);
    let mut k = Kernel::new("moe_dispatch", gates.dtype);
    k.ptr("gates", gates, false);
    meta_ptrs(&mut k, s, e, true);
    k.ptr("pair_token", &scratch_arg(s.pair_token, I32, p), true);
    k.ptr("pair_gate", &scratch_arg(s.pair_gate, F32, p), true);
    k.ptr("pair_of", &scratch_arg(s.pair_of, I32, t * e), true);
    k.ptr("stat", &scratch_arg(s.stat, I32, 1), true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int T = {t}, E = {e}, P = {p}, NT = {nt}, NW = NT / 32, TB = {};",
        t.clamp(1, DISPATCH_TOKENS)
    );
    w.line("__shared__ int n_of[E], at[E];");
    w.line("__shared__ int wn[NW], wu[NW];");
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    w.comment("Thread ex % NT counts expert ex's tokens; only it reads n_of[ex] and at[ex].");
    w.for_block("int ex = threadIdx.x", "ex < E", "ex += NT", |w| {
        w.line("int n = 0;");
        per_token_chunk(w, gates, &|w| w.line("n += g != 0.0f;"));
        w.line("n_of[ex] = n;");
    });
    w.comment("Exclusive scans over the experts in increasing order, NT a round: of the counts");
    w.comment("(at) and of the used flags (the slot in used). A warp scans by shuffles and a");
    w.comment("ballot, adds the totals of the warps before it and of the earlier rounds.");
    w.line("int carry = 0, ucarry = 0;");
    w.for_block("int r0 = 0", "r0 < E", "r0 += NT", |w| {
        w.line("const int ex = r0 + threadIdx.x;");
        w.line("const int n = ex < E ? n_of[ex] : 0;");
        w.line("int inc = n;");
        w.for_unrolled("o", 0, "5", |w| {
            w.line("const int v = __shfl_up_sync(0xffffffffu, inc, 1 << o);");
            w.line("if (lane >= (1 << o)) inc += v;");
        });
        w.line("const unsigned ub = __ballot_sync(0xffffffffu, n > 0);");
        w.line("if (lane == 31) wn[warp] = inc;");
        w.line("if (lane == 0) wu[warp] = __popc(ub);");
        w.line("__syncthreads();");
        w.line("int base = carry, ubase = ucarry;");
        w.for_block("int q = 0", "q < NW", "++q", |w| {
            w.line("const int nq = wn[q], uq = wu[q];");
            w.if_block("q < warp", |w| {
                w.line("base += nq;");
                w.line("ubase += uq;");
            });
            w.line("carry += nq;");
            w.line("ucarry += uq;");
        });
        w.if_block("ex < E", |w| {
            w.line("at[ex] = base + inc - n;");
            w.line("if (n > 0) used[ubase + __popc(ub & ((1u << lane) - 1u))] = ex;");
        });
        w.line("__syncthreads();  // wn and wu are read before the next round writes them");
    });
    w.if_block("threadIdx.x == 0", |w| {
        w.line("meta[0] = ucarry;");
        w.line("stat[0] = ucarry;");
    });
    w.for_block("int ex = threadIdx.x", "ex < E", "ex += NT", |w| {
        w.line("int q = at[ex];");
        w.line("first[ex] = q;");
        w.line("count[ex] = q >= P ? 0 : (n_of[ex] < P - q ? n_of[ex] : P - q);");
        per_token_chunk(w, gates, &|w| {
            w.if_block("g != 0.0f", |w| {
                w.line("const int tk = t0 + b;");
                w.if_else(
                    "q < P",
                    |w| {
                        w.line("pair_token[q] = tk;");
                        w.line("pair_gate[q] = g;");
                        w.line("pair_of[(long long)tk * E + ex] = q;");
                    },
                    |w| w.line("pair_of[(long long)tk * E + ex] = -1;"),
                );
                w.line("++q;");
            });
        });
    });
    k.finish(LaunchSpec {
        grid: [Extent::Fixed(1); 3],
        block: [nt, 1, 1],
        smem_bytes: 0,
    })
}

/// Grid of a grouped matmul over `rows` weight rows, `rw` per warp, `warps` a block: row
/// tiles × used-expert slots.
fn grouped_launch(rows: u64, rw: u64, warps: u64, sh: MoeGroupedShape) -> LaunchSpec {
    let slots = sh.experts.min(sh.pairs()).max(1);
    LaunchSpec {
        grid: [
            Extent::Fixed(rows.div_ceil(warps * rw) as u32),
            Extent::Fixed(slots as u32),
            Extent::Fixed(1),
        ],
        block: [(32 * warps) as u32, 1, 1],
        smem_bytes: 0,
    }
}

/// The prologue of a grouped matmul block: its expert `ex`, its pairs `p0 .. p0 + n` and
/// its warp's first row `j0` (rows `j0 .. j0 + RW`, `U` steps a trip); blocks past the used
/// count exit. Whether the last row tile overruns `rows` is returned (the loads must then
/// check rows).
fn grouped_prologue(
    k: &mut Kernel,
    s: &MoeScratch,
    e: u64,
    rows: u64,
    [rw, unroll]: [u64; 2],
    vec: u64,
) -> bool {
    meta_ptrs(k, s, e, false);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int RW = {rw}, V = {vec}, U = {unroll}, ROWS = {rows};"
    );
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    w.comment("Uniform across the block: the used count is one value.");
    w.line("if ((int)blockIdx.y >= meta[0]) return;");
    w.line("const int ex = used[blockIdx.y];");
    w.line("const int p0 = first[ex], n = count[ex];");
    w.line("const int j0 = (blockIdx.x * (blockDim.x >> 5) + warp) * RW;");
    !rows.is_multiple_of(WARPS * rw)
}

/// The chunk loop `body` (which reads the constant `TB`) once per pass size of `sizes`
/// (increasing): an expert with `n` tokens runs the smallest size that holds them (no idle
/// accumulators at decode), else passes of the largest. Every size computes each token's
/// sums the same way.
fn per_pass(w: &mut Writer, sizes: &[u64], body: &dyn Fn(&mut Writer)) {
    match sizes {
        [] => {}
        [last] => {
            emit!(w, "constexpr int TB = {last};");
            body(w);
        }
        [first, rest @ ..] => w.if_else(
            format_args!("n <= {first}"),
            |w| {
                emit!(w, "constexpr int TB = {first};");
                body(w);
            },
            |w| per_pass(w, rest, body),
        ),
    }
}

fn gate_up(
    sh: MoeGroupedShape,
    tl: CoreTiling,
    x: &TensorArg,
    st: &Stacks,
    out: &TensorArg,
    s: &MoeScratch,
) -> KernelSource {
    use specc_ir::DType::I32;
    let (e, f, h, p) = (sh.experts, sh.ffn, sh.hidden, sh.pairs());
    let xt = c_type(x.dtype);
    let r = |v: &str| format!("to_f32({})", store(out.dtype, v));
    let mut k = Kernel::new("moe_gate_up", st.dtype());
    k.ptr("x", x, false);
    st.ptrs(&mut k, &[0, 1]);
    k.ptr("pair_token", &scratch_arg(s.pair_token, I32, p), false);
    k.ptr("act", &TensorArg::new(s.act, out.dtype, &[p, f]), true);
    let (rw, unroll) = (tl.gate_up_rows as u64, tl.unroll as u64);
    let guard_rows = grouped_prologue(&mut k, s, e, f, [rw, unroll], st.vec(0));
    let w = &mut k.body;
    st.expert_ptrs(w, 0);
    st.expert_ptrs(w, 1);
    per_pass(w, st.passes(), &|w| {
        w.for_block("int c0 = 0", "c0 < n", "c0 += TB", |w| {
            w.line("const int nb = n - c0 < TB ? n - c0 : TB;");
            emit!(w, "const {xt}* xrow[TB];");
            w.for_unrolled("b", 0, "TB", |w| {
                emit!(
                    w,
                    "xrow[b] = x + (long long)pair_token[p0 + c0 + (b < nb ? b : 0)] * {h};"
                );
            });
            w.line("float acc0[RW][TB] = {}, acc1[RW][TB] = {};");
            stream::stream_rows(w, st, &[0, 1], h, xt, guard_rows, (unroll, tl.pipelined));
            w.for_unrolled("r", 0, "RW", |w| {
                w.for_unrolled("b", 0, "TB", |w| {
                    w.line("const float sg = warp_sum(acc0[r][b]), su = warp_sum(acc1[r][b]);");
                    w.if_block("lane == 0 && b < nb && j0 + r < ROWS", |w| {
                        emit!(w, "const float g = {};", r("sg"));
                        emit!(w, "const float u = {};", r("su"));
                        emit!(w, "const float sl = {};", r("silu_f32(g)"));
                        emit!(
                            w,
                            "act[(long long)(p0 + c0 + b) * {f} + j0 + r] = {};",
                            store(out.dtype, "__fmul_rn(sl, u)")
                        );
                    });
                });
            });
        });
    });
    k.finish_bounded(grouped_launch(f, rw, WARPS, sh), Some(st.min_blocks()))
}

fn down(
    sh: MoeGroupedShape,
    tl: CoreTiling,
    st: &Stacks,
    out: &TensorArg,
    s: &MoeScratch,
) -> KernelSource {
    let (e, f, h, p) = (sh.experts, sh.ffn, sh.hidden, sh.pairs());
    let ot = c_type(out.dtype);
    let mut k = Kernel::new("moe_down", st.dtype());
    st.ptrs(&mut k, &[2]);
    k.ptr("act", &TensorArg::new(s.act, out.dtype, &[p, f]), false);
    k.ptr("y", &TensorArg::new(s.y, out.dtype, &[p, h]), true);
    let (rw, unroll) = (tl.down_rows as u64, tl.unroll as u64);
    let guard_rows = grouped_prologue(&mut k, s, e, h, [rw, unroll], st.vec(2));
    let w = &mut k.body;
    st.expert_ptrs(w, 2);
    per_pass(w, st.passes(), &|w| {
        w.for_block("int c0 = 0", "c0 < n", "c0 += TB", |w| {
            w.line("const int nb = n - c0 < TB ? n - c0 : TB;");
            emit!(w, "const {ot}* xrow[TB];");
            w.for_unrolled("b", 0, "TB", |w| {
                emit!(
                    w,
                    "xrow[b] = act + (long long)(p0 + c0 + (b < nb ? b : 0)) * {f};"
                );
            });
            w.line("float acc0[RW][TB] = {};");
            stream::stream_rows(w, st, &[2], f, ot, guard_rows, (unroll, tl.pipelined));
            w.for_unrolled("r", 0, "RW", |w| {
                w.for_unrolled("b", 0, "TB", |w| {
                    w.line("const float sd = warp_sum(acc0[r][b]);");
                    w.if_block("lane == 0 && b < nb && j0 + r < ROWS", |w| {
                        emit!(
                            w,
                            "y[(long long)(p0 + c0 + b) * {h} + j0 + r] = {};",
                            store(out.dtype, "sd")
                        );
                    });
                });
            });
        });
    });
    k.finish_bounded(grouped_launch(h, rw, WARPS, sh), Some(st.min_blocks()))
}

fn combine(
    sh: MoeGroupedShape,
    gates: &TensorArg,
    out: &TensorArg,
    s: &MoeScratch,
) -> KernelSource {
    use specc_ir::DType::I32;
    let (t, e, h, p) = (sh.tokens, sh.experts, sh.hidden, sh.pairs());
    let kmax = sh.top_k.min(e);
    let mut k = Kernel::new("moe_combine", out.dtype);
    k.ptr("gates", gates, false);
    k.ptr("pair_of", &scratch_arg(s.pair_of, I32, t * e), false);
    k.ptr("yp", &TensorArg::new(s.y, out.dtype, &[p, h]), false);
    k.ptr("out", out, true);
    let w = &mut k.body;
    emit!(w, "constexpr int E = {e}, KM = {kmax}, P = {p};");
    emit!(w, "constexpr long long H = {h};");
    emit!(
        w,
        "constexpr int CH = {};",
        e.div_ceil(32).min(COMBINE_CHUNKS)
    );
    w.line("__shared__ float g_of[KM];");
    w.line("__shared__ int q_of[KM];");
    w.line("__shared__ int nk;");
    w.line("const long long tk = blockIdx.x;");
    w.comment("Warp 0 gathers the token's first KM pairs in increasing expert order: CH groups");
    w.comment("of 32 experts loaded at once, each compacted by a ballot (slot = pairs before it).");
    w.if_block("threadIdx.x < 32", |w| {
        w.line("const int lane = threadIdx.x;");
        w.line("int m = 0;");
        w.for_block("int e0 = 0", "e0 < E", "e0 += 32 * CH", |w| {
            w.line("float gv[CH];");
            w.line("int qv[CH];");
            w.for_unrolled("c", 0, "CH", |w| {
                w.line("const int ex = e0 + c * 32 + lane;");
                emit!(
                    w,
                    "gv[c] = ex < E ? {} : 0.0f;",
                    load(gates.dtype, "gates[tk * E + ex]")
                );
            });
            w.for_unrolled("c", 0, "CH", |w| {
                w.line("const int ex = e0 + c * 32 + lane;");
                w.line("qv[c] = ex < E && gv[c] != 0.0f ? pair_of[tk * E + ex] : -1;");
            });
            w.for_unrolled("c", 0, "CH", |w| {
                w.line("const bool ok = qv[c] >= 0 && qv[c] < P;");
                w.line("const unsigned b = __ballot_sync(0xffffffffu, ok);");
                w.line("const int slot = m + __popc(b & ((1u << lane) - 1u));");
                w.if_block("ok && slot < KM", |w| {
                    w.line("g_of[slot] = gv[c];");
                    w.line("q_of[slot] = qv[c];");
                });
                w.line("m += __popc(b);");
            });
        });
        w.line("if (lane == 0) nk = m < KM ? m : KM;");
    });
    w.line("__syncthreads();");
    emit!(
        w,
        "const long long i_end = (blockIdx.y + 1) * {} < H ? (blockIdx.y + 1) * {} : H;",
        COMBINE_THREADS * COMBINE_OUTPUTS,
        COMBINE_THREADS * COMBINE_OUTPUTS
    );
    w.for_block(
        format!(
            "long long i = blockIdx.y * {} + threadIdx.x",
            COMBINE_THREADS * COMBINE_OUTPUTS
        ),
        "i < i_end",
        "i += blockDim.x",
        |w| {
            w.line("float acc = 0.0f;");
            if kmax <= COMBINE_HOISTED_PAIRS {
                w.comment("Every pair's value loaded before the first add (they overlap), then");
                w.comment("added in pair order: one multiply and add a pair, as a loop over them.");
                w.line("float yv[KM];");
                w.for_unrolled("j", 0, "KM", |w| {
                    emit!(
                        w,
                        "yv[j] = j < nk ? {} : 0.0f;",
                        load(out.dtype, "yp[(long long)q_of[j] * H + i]")
                    );
                });
                w.for_unrolled("j", 0, "KM", |w| {
                    w.line("if (j < nk) acc = __fadd_rn(acc, __fmul_rn(g_of[j], yv[j]));");
                });
            } else {
                w.for_block("int j = 0", "j < nk", "++j", |w| {
                    emit!(
                        w,
                        "acc = __fadd_rn(acc, __fmul_rn(g_of[j], {}));",
                        load(out.dtype, "yp[(long long)q_of[j] * H + i]")
                    );
                });
            }
            emit!(w, "out[tk * H + i] = {};", store(out.dtype, "acc"));
        },
    );
    k.finish(LaunchSpec {
        grid: [
            Extent::Fixed(t as u32),
            Extent::Fixed(h.div_ceil(COMBINE_THREADS * COMBINE_OUTPUTS) as u32),
            Extent::Fixed(1),
        ],
        block: [COMBINE_THREADS as u32, 1, 1],
        smem_bytes: 0,
    })
}
