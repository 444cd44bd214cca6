//! The grouped MoE: `moe_experts` as four kernels that read each selected expert's weights
//! once for all the tokens routed to it, and nothing of the experts no token selected.
//!
//! 1. `moe_dispatch` (one block): from the dense gates `[T, E]`, per expert the count of
//!    tokens with a non-zero gate and their (token, gate) pairs, ordered by expert and then
//!    token, in a fixed buffer of `T · top_k` pairs; the list of experts with at least one
//!    token (`used`, increasing); `pidx[t, e]` = the pair of (t, e). Every write is inside
//!    its buffer: a pair past the capacity is dropped (`pidx` = -1) — impossible when the
//!    gates come from a router choosing `top_k` per token, which is what the capacity is.
//! 2. `moe_gate_up`: grid (row tiles of F, used-expert slots); a block whose slot is past the
//!    used count exits. Each warp owns rows of the expert's gate and up weights and streams
//!    them once per chunk of [`TOKENS_PER_PASS`] of the expert's tokens; the SwiGLU
//!    `a = R(R(silu(R(g)))·R(u))` is its epilogue, into `act[pair, F]`.
//! 3. `moe_down`: the same over the down weights, `y[pair, H] = R(a · Wd_eᵀ)`.
//! 4. `moe_combine` (one block per token): `out = R(Σ_e gate·y)` over the token's pairs in
//!    increasing expert order, one f32 multiply and add each, as the interpreter.
//!
//! `R` rounds to the output dtype. Each dot product is one warp's sum over a fixed lane
//! stride, whatever the number of tokens sharing the expert, so a token's result does not
//! depend on the batch it is in.

use super::{c_type, load, store, Kernel, TensorArg};
use crate::abi::{Extent, KernelSource, LaunchSpec, Loc};
use crate::writer::emit;
use crate::Error;

/// Warps of a gate/up or down block.
const WARPS: u64 = 8;
/// Weight rows each warp owns (gate and up rows count once).
const ROWS_PER_WARP: u64 = 4;
/// Tokens of one expert whose activations a warp holds while it streams a weight row.
pub const TOKENS_PER_PASS: u64 = 4;
/// Threads of the dispatch block.
const DISPATCH_THREADS: u32 = 512;

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

/// Elements of one 16-byte weight load of `w`.
fn vec_of(w: &TensorArg) -> u64 {
    16 / w.elem_bytes().max(1)
}

/// Whether the grouped kernels take these operands: float weights whose rows split into
/// 16-byte loads (`hidden` and `ffn` multiples of one load) and activations of 2 or 4 bytes.
pub fn supported(x: &TensorArg, wg: &TensorArg, wd: &TensorArg, out: &TensorArg) -> bool {
    let (f, h) = (wg.dims[1], wg.dims[2]);
    let float = |a: &TensorArg| super::is_float(a.dtype);
    [x, wg, wd, out].into_iter().all(float)
        && wg.dtype == wd.dtype
        && h.is_multiple_of(vec_of(wg))
        && f.is_multiple_of(vec_of(wd))
}

/// The four kernels (see the module docs). Operands as `moe_experts`: `x [.., H]`, `gates
/// [.., E]`, `wg`/`wu` `[E, F, H]`, `wd [E, H, F]`.
#[allow(clippy::too_many_arguments)]
pub fn moe_grouped(
    shape: MoeGroupedShape,
    x: &TensorArg,
    gates: &TensorArg,
    wg: &TensorArg,
    wu: &TensorArg,
    wd: &TensorArg,
    out: &TensorArg,
    s: &MoeScratch,
) -> Result<Vec<KernelSource>, Error> {
    if !supported(x, wg, wd, out) || wu.dtype != wg.dtype {
        return Err(Error::param(
            "moe_grouped",
            "dims",
            format!(
                "weights {}{:?} / {}{:?} do not split into 16-byte row loads",
                wg.dtype, wg.dims, wd.dtype, wd.dims
            ),
        ));
    }
    Ok(vec![
        dispatch(shape, gates, s),
        gate_up(shape, x, wg, wu, out, s),
        down(shape, wd, out, s),
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

fn dispatch(sh: MoeGroupedShape, gates: &TensorArg, s: &MoeScratch) -> KernelSource {
    use specc_ir::DType::{F32, I32};
    let (t, e, p) = (sh.tokens, sh.experts, sh.pairs());
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
        "constexpr int T = {t}, E = {e}, P = {p}, NT = {DISPATCH_THREADS};"
    );
    w.line("__shared__ int n_of[E], at[E];");
    w.for_block("int ex = threadIdx.x", "ex < E", "ex += NT", |w| {
        w.line("int n = 0;");
        emit!(
            w,
            "for (int tk = 0; tk < T; ++tk) n += {} != 0.0f;",
            load(gates.dtype, "gates[(long long)tk * E + ex]")
        );
        w.line("n_of[ex] = n;");
    });
    w.line("__syncthreads();");
    w.comment("Sequential prefix over the experts (E steps) in thread 0.");
    w.if_block("threadIdx.x == 0", |w| {
        w.line("int run = 0, nu = 0;");
        w.for_block("int ex = 0", "ex < E", "++ex", |w| {
            w.line("at[ex] = run;");
            w.line("if (n_of[ex] > 0) used[nu++] = ex;");
            w.line("run += n_of[ex];");
        });
        w.line("meta[0] = nu;");
        w.line("stat[0] = nu;");
    });
    w.line("__syncthreads();");
    w.for_block("int ex = threadIdx.x", "ex < E", "ex += NT", |w| {
        w.line("int q = at[ex];");
        w.line("first[ex] = q;");
        w.line("count[ex] = q >= P ? 0 : (n_of[ex] < P - q ? n_of[ex] : P - q);");
        w.for_block("int tk = 0", "tk < T", "++tk", |w| {
            emit!(
                w,
                "const float g = {};",
                load(gates.dtype, "gates[(long long)tk * E + ex]")
            );
            w.if_block("g != 0.0f", |w| {
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
        block: [DISPATCH_THREADS, 1, 1],
        smem_bytes: 0,
    })
}

/// Grid of a grouped matmul over `rows` weight rows: row tiles × used-expert slots.
fn grouped_launch(rows: u64, sh: MoeGroupedShape) -> LaunchSpec {
    let slots = sh.experts.min(sh.pairs()).max(1);
    LaunchSpec {
        grid: [
            Extent::Fixed(rows.div_ceil(WARPS * ROWS_PER_WARP) as u32),
            Extent::Fixed(slots as u32),
            Extent::Fixed(1),
        ],
        block: [(32 * WARPS) as u32, 1, 1],
        smem_bytes: 0,
    }
}

/// The prologue of a grouped matmul block: its expert `ex`, its pairs `p0 .. p0 + n` and
/// its warp's first row `j0` (rows `j0 .. j0 + RW`); blocks past the used count exit.
fn grouped_prologue(k: &mut Kernel, s: &MoeScratch, e: u64, rows: u64, vec: u64) {
    meta_ptrs(k, s, e, false);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int RW = {ROWS_PER_WARP}, V = {vec}, ROWS = {rows};"
    );
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    w.comment("Uniform across the block: the used count is one value.");
    w.line("if ((int)blockIdx.y >= meta[0]) return;");
    w.line("const int ex = used[blockIdx.y];");
    w.line("const int p0 = first[ex], n = count[ex];");
    w.line("const int j0 = (blockIdx.x * (blockDim.x >> 5) + warp) * RW;");
}

/// The chunk loop `body` (which reads the constant `TB`) twice: with one token per pass for
/// an expert only one token chose (decode: no idle accumulators), else with
/// [`TOKENS_PER_PASS`]. Both compute each token's sums the same way.
fn per_pass(w: &mut crate::writer::Writer, body: impl Fn(&mut crate::writer::Writer)) {
    w.if_else(
        "n == 1",
        |w| {
            w.line("constexpr int TB = 1;");
            body(w);
        },
        |w| {
            emit!(w, "constexpr int TB = {TOKENS_PER_PASS};");
            body(w);
        },
    );
}

/// `acc[r][b] += Σ_i x_b[i] · w_r[i]` over this lane's 16-byte steps of a row of `k_dim`,
/// for the `RW` rows of `mats` (weight pointer names) and the chunk's `TB` activations
/// (`xrow(b)` is the C++ pointer to activation `b`'s row, valid where `b < nb`).
fn stream_rows(w: &mut crate::writer::Writer, mats: &[&str], k_dim: u64, xt: &str, wt: &str) {
    emit!(w, "constexpr long long K = {k_dim};");
    w.for_block("long long i = lane * V", "i < K", "i += 32 * V", |w| {
        w.line("float xv[TB][V];");
        w.for_unrolled("b", 0, "TB", |w| {
            w.if_else(
                "b < nb",
                |w| emit!(w, "ld_vec<V, {xt}>(xrow[b] + i, xv[b]);"),
                |w| w.line("for (int v = 0; v < V; ++v) xv[b][v] = 0.0f;"),
            );
        });
        w.for_unrolled("r", 0, "RW", |w| {
            w.if_block("j0 + r < ROWS", |w| {
                for (m, name) in mats.iter().enumerate() {
                    emit!(w, "float w{m}[V];");
                    emit!(
                        w,
                        "ld_stream_vec<V, {wt}>({name} + (long long)(j0 + r) * K + i, w{m});"
                    );
                    w.for_unrolled("b", 0, "TB", |w| {
                        w.for_unrolled("v", 0, "V", |w| {
                            emit!(w, "acc{m}[r][b] = fmaf(xv[b][v], w{m}[v], acc{m}[r][b]);");
                        });
                    });
                }
            });
        });
    });
}

fn gate_up(
    sh: MoeGroupedShape,
    x: &TensorArg,
    wg: &TensorArg,
    wu: &TensorArg,
    out: &TensorArg,
    s: &MoeScratch,
) -> KernelSource {
    use specc_ir::DType::I32;
    let (e, f, h, p) = (sh.experts, sh.ffn, sh.hidden, sh.pairs());
    let (xt, wt) = (c_type(x.dtype), c_type(wg.dtype));
    let r = |v: &str| format!("to_f32({})", store(out.dtype, v));
    let mut k = Kernel::new("moe_gate_up", wg.dtype);
    k.ptr("x", x, false);
    k.ptr("wg", wg, false);
    k.ptr("wu", wu, false);
    k.ptr("pair_token", &scratch_arg(s.pair_token, I32, p), false);
    k.ptr("act", &TensorArg::new(s.act, out.dtype, &[p, f]), true);
    grouped_prologue(&mut k, s, e, f, vec_of(wg));
    let w = &mut k.body;
    emit!(w, "const {wt}* wge = wg + (long long)ex * {f} * {h};");
    emit!(w, "const {wt}* wue = wu + (long long)ex * {f} * {h};");
    per_pass(w, |w| {
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
            stream_rows(w, &["wge", "wue"], h, xt, wt);
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
    k.finish(grouped_launch(f, sh))
}

fn down(sh: MoeGroupedShape, wd: &TensorArg, out: &TensorArg, s: &MoeScratch) -> KernelSource {
    let (e, f, h, p) = (sh.experts, sh.ffn, sh.hidden, sh.pairs());
    let (wt, ot) = (c_type(wd.dtype), c_type(out.dtype));
    let mut k = Kernel::new("moe_down", wd.dtype);
    k.ptr("wd", wd, false);
    k.ptr("act", &TensorArg::new(s.act, out.dtype, &[p, f]), false);
    k.ptr("y", &TensorArg::new(s.y, out.dtype, &[p, h]), true);
    grouped_prologue(&mut k, s, e, h, vec_of(wd));
    let w = &mut k.body;
    emit!(w, "const {wt}* wde = wd + (long long)ex * {h} * {f};");
    per_pass(w, |w| {
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
            stream_rows(w, &["wde"], f, ot, wt);
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
    k.finish(grouped_launch(h, sh))
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
    w.line("__shared__ float g_of[KM];");
    w.line("__shared__ int q_of[KM];");
    w.line("__shared__ int nk;");
    w.line("const long long tk = blockIdx.x;");
    w.comment("The token's pairs in increasing expert order, gathered by thread 0.");
    w.if_block("threadIdx.x == 0", |w| {
        w.line("int m = 0;");
        w.for_block("int ex = 0", "ex < E && m < KM", "++ex", |w| {
            emit!(
                w,
                "const float g = {};",
                load(gates.dtype, "gates[tk * E + ex]")
            );
            w.line("const int q = g != 0.0f ? pair_of[tk * E + ex] : -1;");
            w.if_block("q >= 0 && q < P", |w| {
                w.line("g_of[m] = g;");
                w.line("q_of[m] = q;");
                w.line("++m;");
            });
        });
        w.line("nk = m;");
    });
    w.line("__syncthreads();");
    w.for_block(
        "long long i = threadIdx.x",
        "i < H",
        "i += blockDim.x",
        |w| {
            w.line("float acc = 0.0f;");
            w.for_block("int j = 0", "j < nk", "++j", |w| {
                emit!(
                    w,
                    "acc = __fadd_rn(acc, __fmul_rn(g_of[j], {}));",
                    load(out.dtype, "yp[(long long)q_of[j] * H + i]")
                );
            });
            emit!(w, "out[tk * H + i] = {};", store(out.dtype, "acc"));
        },
    );
    k.finish(LaunchSpec {
        grid: [Extent::Fixed(t as u32), Extent::Fixed(1), Extent::Fixed(1)],
        block: [256, 1, 1],
        smem_bytes: 0,
    })
}
