//! `rmsnorm`: `y = round(round(x · r) · w)` with `r = 1/sqrt(mean(x²) + eps)` (f32 mean),
//! over units of `dim` elements: one unit per row, or one per head (`heads > 1`, Qwen3's
//! q_norm/k_norm after the head reshape: unit `(row, h)` is columns `h·dim ..`).
//!
//! A unit is handled by one warp when `dim <= 1024` (4 units per block), else by a block of
//! 256 threads; either way x is read once into registers with vector loads.
//!
//! Kernel name dtype: x's dtype.

use crate::abi::{
    pick_vec, Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec, Loc, Rows, View,
};
use crate::writer::{emit, f32_lit, Writer};
use crate::Error;

const FAMILY: &str = "rmsnorm";

#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormParams {
    pub rows: Rows,
    /// Units per row (1, or the head count for a per-head norm).
    pub heads: u32,
    /// Elements per unit (the normalised length).
    pub dim: u32,
    /// Unit `(r, h)` starts at column `h · dim` of row `r`.
    pub x: View,
    /// The result (its dtype may differ from x's: a fused cast after rounding to x's).
    pub out: View,
    /// `[dim]` weight.
    pub weight: Loc,
    pub w_dtype: Dtype,
    pub eps: f32,
}

pub fn rmsnorm(p: &RmsNormParams) -> Result<KernelSource, Error> {
    if p.dim == 0 || p.heads == 0 {
        return Err(Error::param(FAMILY, "dim/heads", "must be positive"));
    }
    if !(p.x.dtype.is_float() && p.out.dtype.is_float() && p.w_dtype.is_float()) {
        return Err(Error::param(
            FAMILY,
            "dtype",
            "x, out and weight must be float types",
        ));
    }
    if !p.eps.is_finite() || p.eps < 0.0 {
        return Err(Error::param(FAMILY, "eps", "must be finite and >= 0"));
    }
    let vw = pick_vec(p.dim as u64, &[p.x, p.out], &[(p.weight, p.w_dtype)]);
    let warp_mode = p.dim <= 1024;
    let group = if warp_mode { 32 } else { 256 };
    let chunks = p.dim.div_ceil(group * vw);
    let (xt, ot) = (p.x.dtype.c_type(), p.out.dtype.c_type());

    let mut kb = KernelBuilder::new(FAMILY, p.x.dtype);
    let w = &mut kb.body;
    emit!(w, "constexpr int D = {};", p.dim);
    emit!(w, "constexpr int VW = {vw};");
    emit!(w, "constexpr int G = {group};  // threads per unit");
    emit!(w, "constexpr int NC = {chunks};  // vectors per thread");
    w.line("const int r = blockIdx.y;");
    if warp_mode {
        w.line("const int tid = threadIdx.x & 31;");
        w.line("const int h = blockIdx.x * 4 + (threadIdx.x >> 5);");
        emit!(w, "if (h >= {}) return;", p.heads);
    } else {
        w.line("__shared__ float red[G / 32];");
        w.line("const int tid = threadIdx.x;");
        w.line("const int h = blockIdx.x;");
    }
    emit!(
        w,
        "const {xt}* xr = {} + (long long)r * {} + h * D;",
        p.x.loc.ptr(p.x.dtype, false),
        p.x.row_stride
    );
    emit!(
        w,
        "{ot}* yr = {} + (long long)r * {} + h * D;",
        p.out.loc.ptr(p.out.dtype, true),
        p.out.row_stride
    );
    emit!(
        w,
        "const {}* wt = {};",
        p.w_dtype.c_type(),
        p.weight.ptr(p.w_dtype, false)
    );
    let reduce = if warp_mode {
        "ss = warp_sum(ss);"
    } else {
        "ss = block_sum(ss, red);"
    };
    emit_unit(w, xt, reduce, p.eps);

    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(if warp_mode {
                p.heads.div_ceil(4)
            } else {
                p.heads
            }),
            p.rows.extent(1, 1),
            Extent::Fixed(1),
        ],
        block: [if warp_mode { 128 } else { group }, 1, 1],
        smem_bytes: 0,
    };
    Ok(kb.finish(launch))
}

/// The RMSNorm of one unit of `D` elements by `G` threads (`tid` among them), `NC` vectors of
/// `VW` elements a thread, from `xr` to `yr` with the weight `wt` (all in scope); `reduce`
/// sums `ss` over the `G` threads. `xt` is x's C type, the rounding of both products.
pub(crate) fn emit_unit(w: &mut Writer, xt: &str, reduce: &str, eps: f32) {
    w.line("float v[NC][VW];");
    w.line("float ss = 0.0f;");
    w.for_unrolled("ci", 0, "NC", |w| {
        w.line("const int i = (ci * G + tid) * VW;");
        w.if_block("i < D", |w| {
            w.line("ld_vec<VW>(xr + i, v[ci]);");
            w.for_unrolled("e", 0, "VW", |w| {
                w.line("ss = fmaf(v[ci][e], v[ci][e], ss);")
            });
        });
    });
    w.line(reduce);
    emit!(
        w,
        "const float inv = 1.0f / sqrtf(ss / float(D) + {});",
        f32_lit(eps)
    );
    w.for_unrolled("ci", 0, "NC", |w| {
        w.line("const int i = (ci * G + tid) * VW;");
        w.if_block("i < D", |w| {
            w.line("float g[VW];");
            w.line("ld_vec<VW>(wt + i, g);");
            w.for_unrolled("e", 0, "VW", |w| {
                emit!(
                    w,
                    "v[ci][e] = round_to<{xt}>(round_to<{xt}>(v[ci][e] * inv) * g[e]);"
                );
            });
            w.line("st_vec<VW>(yr + i, v[ci]);");
        });
    });
}
