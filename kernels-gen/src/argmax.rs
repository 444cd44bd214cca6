//! `argmax`: index of the largest value of each row, ties to the lowest index, written as
//! i32. One block per row. Input is either the values themselves or the `ArgmaxPair`
//! partials a fused GEMV epilogue wrote ([`crate::gemv::GemvParams::argmax_partials`]).
//!
//! NaN never compares greater, so it is never chosen; a row with no comparable value yields
//! index 0. Kernel name dtype: the values' dtype (`f32` for partials).

use crate::abi::{
    pick_vec, Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec, Loc, Rows, View,
};
use crate::writer::emit;
use crate::Error;

const FAMILY: &str = "argmax";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgmaxInput {
    /// `[rows, n]` values.
    Values { x: View, n: u32 },
    /// `ArgmaxPair[rows, count]`.
    Partials { loc: Loc, count: u32 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ArgmaxParams {
    pub rows: Rows,
    pub input: ArgmaxInput,
    /// `i32[rows]`, element `r` at `r · row_stride`.
    pub out: View,
}

pub fn argmax(p: &ArgmaxParams) -> Result<KernelSource, Error> {
    if p.out.dtype != Dtype::I32 {
        return Err(Error::param(FAMILY, "out", "must be i32"));
    }
    let (dtype, n) = match p.input {
        ArgmaxInput::Values { x, n } => (x.dtype, n),
        ArgmaxInput::Partials { count, .. } => (Dtype::F32, count),
    };
    if n == 0 || !dtype.is_float() {
        return Err(Error::param(
            FAMILY,
            "input",
            "needs a positive length of float values",
        ));
    }
    let nt: u32 = if n >= 32768 {
        1024
    } else if n >= 2048 {
        256
    } else {
        32
    };
    let mut kb = KernelBuilder::new(FAMILY, dtype);
    let w = &mut kb.body;
    emit!(w, "constexpr int N = {n};");
    emit!(w, "constexpr int NT = {nt};");
    w.line("__shared__ ArgmaxPair red[NT / 32];");
    w.line("const int r = blockIdx.x;");
    w.line("ArgmaxPair best = {neg_inf(), 0x7fffffff};");
    match p.input {
        ArgmaxInput::Values { x, .. } => {
            let vw = pick_vec(n as u64, &[x], &[]);
            emit!(w, "constexpr int VW = {vw};");
            emit!(
                w,
                "const {}* xr = {} + (long long)r * {};",
                x.dtype.c_type(),
                x.loc.ptr(x.dtype, false),
                x.row_stride
            );
            w.for_block("int i = threadIdx.x * VW", "i < N", "i += NT * VW", |w| {
                w.line("float v[VW];");
                w.line("ld_vec<VW>(xr + i, v);");
                w.for_unrolled("e", 0, "VW", |w| {
                    w.if_block("argmax_better(v[e], i + e, best.v, best.i)", |w| {
                        w.line("best.v = v[e];");
                        w.line("best.i = i + e;");
                    });
                });
            });
        }
        ArgmaxInput::Partials { loc, .. } => {
            emit!(
                w,
                "const ArgmaxPair* pr = {} + (long long)r * N;",
                loc.ptr_as("ArgmaxPair", false)
            );
            w.for_block("int i = threadIdx.x", "i < N", "i += NT", |w| {
                w.line("const ArgmaxPair a = pr[i];");
                w.line("if (argmax_better(a.v, a.i, best.v, best.i)) best = a;");
            });
        }
    }
    w.line("best = block_argmax(best, red);");
    emit!(
        w,
        "if (threadIdx.x == 0) ({})[(long long)r * {}] = best.i == 0x7fffffff ? 0 : best.i;",
        p.out.loc.ptr(Dtype::I32, true),
        p.out.row_stride
    );
    let launch = LaunchSpec {
        grid: [p.rows.extent(1, 1), Extent::Fixed(1), Extent::Fixed(1)],
        block: [nt, 1, 1],
        smem_bytes: 0,
    };
    Ok(kb.finish(launch))
}
