//! Row ops over the last axis: `reduce_sum` / `reduce_max`, `argmax`, `topk`, `softmax`,
//! `top_p_threshold`, `top_k_threshold` and `sample` (one block per row), `accept_chain` (one
//! thread per row),
//! and the standalone dense layers `matmul` (one warp per output column) and `rmsnorm`
//! (the [`crate::norm`] family).

use super::{
    c_type, flat_launch, is_float, load, row_launch, row_threads, store, value_type, Kernel,
    TensorArg,
};
use crate::abi::{Dtype, Extent, KernelSource, LaunchSpec, Rows, View};
use crate::norm::{rmsnorm as norm_rmsnorm, RmsNormParams};
use crate::writer::emit;
use crate::Error;
use specc_ir::interp::SAMPLE_BLOCK;
use specc_ir::{DType, ReduceOp};

/// Starts a one-block-per-row kernel: `xr` / `yr` point at row `blockIdx.x` of `x` (rows of
/// `n`) and `out` (rows of `out_row`).
fn row_kernel(
    family: &'static str,
    x: &TensorArg,
    out: &TensorArg,
    out_row: u64,
) -> (Kernel, u64, u32) {
    let n = x.last();
    let nt = row_threads(n);
    let mut k = Kernel::new(family, x.dtype);
    k.ptr("x", x, false);
    k.ptr("y", out, true);
    emit!(k.body, "constexpr int N = {n};");
    emit!(k.body, "constexpr int NT = {nt};");
    k.body.line("const long long row = blockIdx.x;");
    emit!(k.body, "const {}* xr = x + row * N;", c_type(x.dtype));
    emit!(k.body, "{}* yr = y + row * {out_row}ll;", c_type(out.dtype));
    (k, x.numel() / n, nt)
}

/// Sum (f32 for floats, wrapping i64 for ints) or maximum (NaN ignored) of each row.
pub(super) fn reduce(op: ReduceOp, x: &TensorArg, out: &TensorArg) -> KernelSource {
    let d = x.dtype;
    let (mut k, rows, nt) = row_kernel(op.name(), x, out, 1);
    let vt = value_type(d);
    let (init, combine, functor) = match (op, is_float(d)) {
        (ReduceOp::Sum, true) => ("0.0f", "acc + v", "SumF32"),
        (ReduceOp::Max, true) => ("neg_inf()", "fmaxf(acc, v)", "MaxF32"),
        (ReduceOp::Sum, false) => ("0ll", "wadd(acc, v)", "SumI64"),
        (ReduceOp::Max, false) => ("SPECC_I64_MIN", "imax(acc, v)", "MaxI64"),
    };
    let w = &mut k.body;
    emit!(w, "__shared__ {vt} red[NT / 32];");
    emit!(w, "{vt} acc = {init};");
    w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
        emit!(w, "const {vt} v = {};", load(d, "xr[i]"));
        emit!(w, "acc = {combine};");
    });
    emit!(w, "acc = block_reduce(acc, {functor}(), red);");
    w.if_block("threadIdx.x == 0", |w| {
        emit!(w, "yr[0] = {};", store(out.dtype, "acc"));
    });
    k.finish(row_launch(rows, nt))
}

/// The ranking key type and expression of element `xr[i]` (NaN ranks as -inf).
fn rank(d: DType) -> (&'static str, String) {
    (value_type(d), format!("rank_key({})", load(d, "xr[i]")))
}

/// Index of the largest element of each row; ties (and -0 vs +0) to the lower index.
pub(super) fn argmax(x: &TensorArg, out: &TensorArg) -> KernelSource {
    let (mut k, rows, nt) = row_kernel("argmax", x, out, 1);
    let (kt, key) = rank(x.dtype);
    let w = &mut k.body;
    emit!(w, "__shared__ Best<{kt}> red[NT / 32];");
    emit!(w, "Best<{kt}> best = no_best<{kt}>();");
    w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
        emit!(w, "const {kt} v = {key};");
        w.if_block("ranks_before(v, i, best.v, best.i)", |w| {
            w.line("best.v = v;");
            w.line("best.i = i;");
        });
    });
    w.line("best = block_best(best, red);");
    w.if_block("threadIdx.x == 0", |w| w.line("yr[0] = best.i;"));
    k.finish(row_launch(rows, nt))
}

/// The `k` best indices of each row, best first: round `j` takes the best element ranked
/// after round `j - 1`'s pick, in the total order (key descending, index ascending).
pub(super) fn topk(kk: u64, x: &TensorArg, out: &TensorArg) -> KernelSource {
    let (mut k, rows, nt) = row_kernel("topk", x, out, kk);
    let (kt, key) = rank(x.dtype);
    let w = &mut k.body;
    emit!(w, "__shared__ Best<{kt}> red[NT / 32];");
    emit!(w, "Best<{kt}> prev = no_best<{kt}>();");
    w.for_block("int j = 0", format_args!("j < {kk}"), "++j", |w| {
        emit!(w, "Best<{kt}> best = no_best<{kt}>();");
        w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
            emit!(w, "const {kt} v = {key};");
            w.if_block(
                "(j == 0 || ranks_before(prev.v, prev.i, v, i)) && ranks_before(v, i, best.v, best.i)",
                |w| {
                    w.line("best.v = v;");
                    w.line("best.i = i;");
                },
            );
        });
        w.line("best = block_best(best, red);");
        w.if_block("threadIdx.x == 0", |w| w.line("yr[j] = best.i;"));
        w.line("prev = best;");
    });
    k.finish(row_launch(rows, nt))
}

/// `exp(x - max) / Σ` per row in f32; a row whose maximum is -inf (or all NaN) gives zeros.
pub(super) fn softmax(x: &TensorArg, out: &TensorArg) -> KernelSource {
    let d = x.dtype;
    let (mut k, rows, nt) = row_kernel("softmax", x, out, x.last());
    let w = &mut k.body;
    w.line("__shared__ float red[NT / 32];");
    w.line("float m = neg_inf();");
    w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
        emit!(w, "m = fmaxf(m, {});", load(d, "xr[i]"));
    });
    w.line("m = block_reduce(m, MaxF32(), red);");
    w.comment("Uniform across the block: every thread holds the same maximum.");
    w.if_block("m == neg_inf()", |w| {
        w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
            w.line("yr[i] = 0.0f;")
        });
        w.line("return;");
    });
    w.line("float z = 0.0f;");
    w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
        emit!(w, "const float v = expf({} - m);", load(d, "xr[i]"));
        w.line("yr[i] = v;");
        w.line("z += v;");
    });
    w.line("z = block_reduce(z, SumF32(), red);");
    w.comment("Each thread divides the values it wrote itself.");
    w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
        w.line("yr[i] = yr[i] / z;")
    });
    k.finish(row_launch(rows, nt))
}

/// The nucleus threshold of each row: with `w` = the positive elements (others 0), `Z = Σ w`
/// and `S(t) = Σ_{w > t} w`, the smallest `t ≥ 0` with `S(t) < p · Z` (0 when `p · Z = 0` or the row's `p ≥ 1`),
/// found by bisection over the bit patterns of non-negative floats, which order like their
/// values: 31 rounds of one block-wide sum each. Any fixed summation order keeps `S`
/// monotone in `t` (rounding is monotone), so the bisection finds exactly the threshold of
/// the sums it computes; those are f32 block trees, the interpreter's are f64.
pub(super) fn top_p_threshold(x: &TensorArg, p: &TensorArg, out: &TensorArg) -> KernelSource {
    let (mut k, rows, nt) = row_kernel("top_p_threshold", x, out, 1);
    k.ptr("ps", p, false);
    let w = &mut k.body;
    w.line("__shared__ float red[NT / 32];");
    w.line("const float p = ps[row];");
    w.comment("Uniform across the block: a row that keeps every token leaves at once.");
    w.if_block("!(p < 1.0f)", |w| {
        w.if_block("threadIdx.x == 0", |w| w.line("yr[0] = 0.0f;"));
        w.line("return;");
    });
    w.line("float z = 0.0f;");
    w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
        w.line("const float v = xr[i];");
        w.line("z += v > 0.0f ? v : 0.0f;");
    });
    w.line("z = block_reduce(z, SumF32(), red);");
    w.line("const float target = p * z;");
    w.comment("Uniform across the block (like the bounds below): every thread leaves.");
    w.if_block("!(target > 0.0f)", |w| {
        w.if_block("threadIdx.x == 0", |w| w.line("yr[0] = 0.0f;"));
        w.line("return;");
    });
    w.comment("Invariant: S(hi) < target (S(+inf) = 0), and S(t) >= target for t < lo.");
    w.line("unsigned int lo = 0u, hi = 0x7f800000u;");
    w.while_block("lo < hi", |w| {
        w.line("const unsigned int mid = lo + ((hi - lo) >> 1);");
        w.line("const float t = __uint_as_float(mid);");
        w.line("float s = 0.0f;");
        w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
            w.line("const float v = xr[i];");
            w.line("s += v > t ? v : 0.0f;");
        });
        w.line("s = block_reduce(s, SumF32(), red);");
        w.if_else(
            "s < target",
            |w| w.line("hi = mid;"),
            |w| w.line("lo = mid + 1u;"),
        );
    });
    w.if_block("threadIdx.x == 0", |w| {
        w.line("yr[0] = __uint_as_float(lo);")
    });
    k.finish(row_launch(rows, nt))
}

/// The `k`-th largest element of each row (the row's own `k`; −inf when `k < 1` or
/// `k ≥ N`): with `C(t) = #{x > t}` (NaN never counts, so it ranks as −inf), the least `t`
/// with `C(t) < k`, found by bisection over the keys of the floats from −inf to +inf in
/// value order (sign bit flipped for positives, every bit for negatives): 32 rounds of one
/// block-wide count each. `C` is monotone in `t` and only drops at elements, so the answer
/// is exactly the interpreter's element; −0 comes out as +0.
pub(super) fn top_k_threshold(x: &TensorArg, kk: &TensorArg, out: &TensorArg) -> KernelSource {
    let (mut k, rows, nt) = row_kernel("top_k_threshold", x, out, 1);
    k.ptr("ks", kk, false);
    let w = &mut k.body;
    w.line("__shared__ float red[NT / 32];");
    w.line("const long long kr = (long long)ks[row];");
    w.comment("Uniform across the block: a row that keeps every token leaves at once.");
    w.if_block("kr < 1 || kr >= N", |w| {
        w.if_block("threadIdx.x == 0", |w| w.line("yr[0] = neg_inf();"));
        w.line("return;");
    });
    w.line("const float want = (float)kr;");
    w.comment("Keys of -inf and +inf; invariant: C(key hi) < k, and C(t) >= k below key lo.");
    w.line("unsigned int lo = 0x007fffffu, hi = 0xff800000u;");
    w.while_block("lo < hi", |w| {
        w.line("const unsigned int mid = lo + ((hi - lo) >> 1);");
        w.line("const float t = __uint_as_float(mid & 0x80000000u ? mid ^ 0x80000000u : ~mid);");
        w.line("float c = 0.0f;");
        w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
            w.line("c += xr[i] > t ? 1.0f : 0.0f;");
        });
        w.line("c = block_reduce(c, SumF32(), red);");
        w.if_else(
            "c < want",
            |w| w.line("hi = mid;"),
            |w| w.line("lo = mid + 1u;"),
        );
    });
    w.if_block("threadIdx.x == 0", |w| {
        w.line("yr[0] = __uint_as_float(lo & 0x80000000u ? lo ^ 0x80000000u : ~lo) + 0.0f;")
    });
    k.finish(row_launch(rows, nt))
}

/// Largest row length `sample` handles: 4096 blocks of the running sum (32 KiB of shared
/// memory for their sums and maxima).
const SAMPLE_MAX_V: u64 = 4096 * SAMPLE_BLOCK as u64;
/// Threads of a `sample` block: one per block of the running sum, 256 at a time.
const SAMPLE_THREADS: u32 = 256;

/// Inverse-CDF sampling per row, one block a row, bit-exact with the interpreter's blocked
/// running sum (`sample_row` in `cuda/generic.cuh`).
pub(super) fn sample(
    probs: &TensorArg,
    u: &TensorArg,
    out: &TensorArg,
) -> Result<KernelSource, Error> {
    let v = probs.last();
    if v > SAMPLE_MAX_V {
        return Err(Error::param(
            "sample",
            "dims",
            format!("rows of {v} probabilities exceed {SAMPLE_MAX_V}"),
        ));
    }
    let blocks = v.div_ceil(SAMPLE_BLOCK as u64).max(1);
    let rows = u.numel();
    let mut k = Kernel::new("sample", probs.dtype);
    k.ptr("p", probs, false);
    k.ptr("u", u, false);
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(w, "constexpr int V = {v};");
    emit!(w, "__shared__ float sums[{blocks}], maxs[{blocks}], thr;");
    w.line("__shared__ int first;");
    w.line("const long long row = blockIdx.x;");
    emit!(
        w,
        "const int i = sample_row<{SAMPLE_THREADS}, {SAMPLE_BLOCK}>(p + row * V, V, u[row], sums, maxs, &first, &thr);"
    );
    w.if_block("threadIdx.x == 0", |w| w.line("y[row] = i;"));
    Ok(k.finish(row_launch(rows, SAMPLE_THREADS)))
}

/// Per row `b`: the number of leading `i < K` with `draft[b, i] == target[b, i]`.
pub(super) fn accept_chain(draft: &TensorArg, target: &TensorArg, out: &TensorArg) -> KernelSource {
    let (b, kk) = (draft.dims[0], draft.dims[1]);
    let mut k = Kernel::new("accept_chain", draft.dtype);
    k.ptr("d", draft, false);
    k.ptr("t", target, false);
    k.ptr("y", out, true);
    k.grid_stride(b, |w| {
        w.line("int n = 0;");
        w.for_block("int i = 0", format_args!("i < {kk}"), "++i", |w| {
            emit!(
                w,
                "if ({} != {}) break;",
                load(draft.dtype, &format!("d[e * {kk}ll + i]")),
                load(target.dtype, &format!("t[e * {}ll + i]", kk + 1))
            );
            w.line("++n;");
        });
        w.line("y[e] = n;");
    });
    k.finish(flat_launch(b))
}

/// Rows of `matmul` one warp accumulates at a time.
const MATMUL_ROWS: u64 = 8;
/// Warps (output columns) per `matmul` block.
const MATMUL_WARPS: u64 = 4;

/// `y[m, n] = R(Σ_k x[m, k] · w[n, k])` with f32 accumulation (plain float weights).
pub(super) fn matmul(x: &TensorArg, wt: &TensorArg, out: &TensorArg) -> KernelSource {
    let (n, kd) = (wt.dims[0], wt.dims[1]);
    let m = x.numel() / kd;
    let mut k = Kernel::new("matmul", wt.dtype);
    k.ptr("x", x, false);
    k.ptr("w", wt, false);
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int M = {m}, N = {n}, K = {kd}, MT = {MATMUL_ROWS};"
    );
    w.line("const int lane = threadIdx.x & 31;");
    emit!(
        w,
        "const long long col = (long long)blockIdx.x * {MATMUL_WARPS} + (threadIdx.x >> 5);"
    );
    w.comment("Whole warps leave together; nothing below synchronises the block.");
    w.if_block("col >= N", |w| w.line("return;"));
    w.line("const long long m0 = (long long)blockIdx.y * MT;");
    w.line("float acc[MT];");
    w.for_unrolled("r", 0, "MT", |w| w.line("acc[r] = 0.0f;"));
    w.for_block("int k = lane", "k < K", "k += 32", |w| {
        emit!(w, "const float wv = {};", load(wt.dtype, "w[col * K + k]"));
        w.for_unrolled("r", 0, "MT", |w| {
            w.if_block("m0 + r < M", |w| {
                emit!(
                    w,
                    "acc[r] = fmaf({}, wv, acc[r]);",
                    load(x.dtype, "x[(m0 + r) * K + k]")
                );
            });
        });
    });
    w.for_unrolled("r", 0, "MT", |w| {
        w.line("const float s = warp_sum(acc[r]);");
        w.if_block("lane == 0 && m0 + r < M", |w| {
            emit!(w, "y[(m0 + r) * N + col] = {};", store(out.dtype, "s"));
        });
    });
    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(n.div_ceil(MATMUL_WARPS) as u32),
            Extent::Fixed(m.div_ceil(MATMUL_ROWS) as u32),
            Extent::Fixed(1),
        ],
        block: [32 * MATMUL_WARPS as u32, 1, 1],
        smem_bytes: 0,
    };
    k.finish(launch)
}

/// The kernels-gen dtype of a float IR dtype.
fn float_dtype(d: DType) -> Option<Dtype> {
    match d {
        DType::BF16 => Some(Dtype::BF16),
        DType::F16 => Some(Dtype::F16),
        DType::F32 => Some(Dtype::F32),
        _ => None,
    }
}

/// `rmsnorm` over the last axis: the [`crate::norm`] family with one unit per row, which
/// rounds in the interpreter's (HF's) order `R(R(x · inv) · w)`.
pub(super) fn rmsnorm(
    eps: f64,
    x: &TensorArg,
    weight: &TensorArg,
    out: &TensorArg,
) -> Result<KernelSource, Error> {
    let (Some(xd), Some(wd)) = (float_dtype(x.dtype), float_dtype(weight.dtype)) else {
        return Err(Error::param(
            "rmsnorm",
            "dtype",
            "input and weight must be float types",
        ));
    };
    let dim = x.last();
    norm_rmsnorm(&RmsNormParams {
        rows: Rows::Fixed((x.numel() / dim) as u32),
        heads: 1,
        dim: dim as u32,
        x: View::new(x.loc, xd, dim),
        out: View::new(out.loc, xd, dim),
        weight: weight.loc,
        w_dtype: wd,
        eps: eps as f32,
    })
}
