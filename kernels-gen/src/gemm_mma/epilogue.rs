//! The epilogue of `gemm_mma`: the shared GEMV epilogue per output element (store, cast,
//! residual, SwiGLU) and the argmax partials of each row over the block's columns.

use crate::gemv::{emit_epilogue_value, GemvParams};
use crate::writer::{emit, Writer};

/// `body` once per accumulator `(mi, ni, d)` with `m` (row in the tile), `n` (column),
/// `row` (global row) and `live` in scope: lane `(g, t)` holds rows `g + 8 · (d >> 1)` of
/// fragment `mi` and column `2t + (d & 1)` of fragment `ni`.
fn for_each_element(w: &mut Writer, body: impl Fn(&mut Writer)) {
    w.for_unrolled("mi", 0, "MI", |w| {
        w.for_unrolled("ni", 0, "NI", |w| {
            w.for_unrolled("d", 0, 4, |w| {
                w.line("const int m = wm0 + 16 * mi + g + 8 * (d >> 1);");
                w.line("const int n = n0 + wn0 + 8 * ni + 2 * t + (d & 1);");
                w.line("const long long row = m0 + m;");
                w.line("const bool live = row < M && n < N;");
                body(w);
            });
        });
    });
}

pub(super) fn emit(w: &mut Writer, p: &GemvParams) {
    if let Some(r) = p.residual {
        // Every residual load is issued before the first store: the stores go to the same
        // buffer (in place), so the compiler could not move a later load above an earlier
        // store and each element would wait a full round trip.
        w.comment("residuals first (independent loads in flight together), then the stores");
        w.line("float resv[MI][NI][4];");
        for_each_element(w, |w| {
            emit!(
                w,
                "resv[mi][ni][d] = live ? to_f32(({})[row * {} + n]) : 0.0f;",
                r.loc.ptr(r.dtype, false),
                r.row_stride
            );
        });
    }
    let argmax = p.argmax_partials;
    if argmax.is_some() {
        w.comment("the best (value, column) of rows g and g + 8 of each fragment");
        w.line("float best_v[MI][2];");
        w.line("int best_i[MI][2];");
        w.for_unrolled("mi", 0, "MI", |w| {
            w.line("best_v[mi][0] = best_v[mi][1] = neg_inf();");
            w.line("best_i[mi][0] = best_i[mi][1] = 0x7fffffff;");
        });
    }
    let up = p.gate_up().then_some("acc[1][mi][ni][d]");
    let res = p.residual.map(|_| "resv[mi][ni][d]");
    for_each_element(w, |w| {
        emit_epilogue_value(w, p, "acc[0][mi][ni][d]", up, res);
        if argmax.is_some() {
            w.line("const int h = d >> 1;");
            w.if_block(
                "live && argmax_better(v, n, best_v[mi][h], best_i[mi][h])",
                |w| {
                    w.line("best_v[mi][h] = v;");
                    w.line("best_i[mi][h] = n;");
                },
            );
        }
    });
    let Some(part) = argmax else { return };
    w.comment("best of the warp's columns per row (the quad), then of the block's WN warps");
    w.line("__shared__ ArgmaxPair cand[WN][BM];");
    w.for_unrolled("mi", 0, "MI", |w| {
        w.for_unrolled("h", 0, 2, |w| {
            w.line(
                "const ArgmaxPair b = quad_row_argmax(ArgmaxPair{best_v[mi][h], best_i[mi][h]});",
            );
            w.line("if (t == 0) cand[warp % WN][wm0 + 16 * mi + g + 8 * h] = b;");
        });
    });
    w.line("__syncthreads();");
    w.for_block(
        "int m = threadIdx.x",
        "m < BM && m0 + m < M",
        "m += NT",
        |w| {
            w.line("ArgmaxPair b = cand[0][m];");
            w.for_block("int j = 1", "j < WN", "++j", |w| {
                w.line("const ArgmaxPair a = cand[j][m];");
                w.line("if (argmax_better(a.v, a.i, b.v, b.i)) b = a;");
            });
            emit!(
                w,
                "({})[(long long)(m0 + m) * gridDim.y + blockIdx.y] = b;",
                part.ptr_as("ArgmaxPair", true)
            );
        },
    );
}
