//! The epilogue of `gemv_mma`: the shared GEMV epilogue per output element (store, cast,
//! residual, SwiGLU, argmax candidates), or RoPE + KV write for the q|k|v projection.

use super::ROPE_PAIR_STRIDE;
use crate::gemv::{emit_epilogue_value, GemvParams};
use crate::qkv_rope;
use crate::writer::{emit, Writer};

/// Warp wk = 0 of each column range runs the shared epilogue on its accumulators: lane
/// `(g, t)` owns rows `8·mt + 2t + {0, 1}` of columns `nb + 16·tn + g + {0, 8}`
/// (the m16n8 D layout, transposed). `rope_hoisted`: the main loop has computed the RoPE
/// pairs' cosines and sines into `rcs` / `rsn` ([`emit_rope_cos_sin`]).
pub(super) fn emit(w: &mut Writer, p: &GemvParams, rope_hoisted: bool) {
    let argmax = p.argmax_partials;
    if let Some(r) = &p.rope {
        let xt = p.x.dtype.c_type();
        w.comment("RoPE epilogue: lane (g, t) owns rows 8 * mt + 2 * t + r of slots nb + 16 * tn + g and + 8 (acc d = r, r + 2)");
        w.if_block("wk == 0", |w| {
            w.for_unrolled("tn", 0, "TN", |w| {
                w.for_unrolled("mt", 0, "MT8", |w| {
                    w.for_unrolled("r", 0, 2, |w| {
                        emit_rope_pair_coords(w);
                        qkv_rope::emit_pair_epilogue(
                            w,
                            r,
                            xt,
                            ("acc[tn][mt][r]", "acc[tn][mt][r + 2]"),
                            ROPE_PAIR_STRIDE,
                            rope_hoisted.then_some(("rcs[tn][mt][r]", "rsn[tn][mt][r]")),
                        );
                    });
                });
            });
        });
        return;
    }
    w.if_block("wk == 0", |w| {
        if argmax.is_some() {
            w.line("ArgmaxPair best[MT8][2];");
            w.for_unrolled("mt", 0, "MT8", |w| {
                w.line("best[mt][0] = best[mt][1] = ArgmaxPair{neg_inf(), 0x7fffffff};");
            });
        }
        let element = |w: &mut Writer| {
            w.line("const int m = 8 * mt + 2 * t + (d & 1);");
            w.line("const int n = nb + 16 * tn + g + 8 * (d >> 1);");
            w.line("const long long row = m0 + m;");
            w.line("const bool live = m < mr && n < N;");
        };
        if let Some(r) = p.residual {
            // Every residual load is issued before the first store: the stores go to the same
            // buffer (in place), so the compiler could not move a later load above an earlier
            // store, and each of the lane's elements would wait a full L2 round trip.
            w.comment("residuals first (independent loads in flight together), then the stores");
            w.line("float resv[TN][MT8][4];");
            w.for_unrolled("tn", 0, "TN", |w| {
                w.for_unrolled("mt", 0, "MT8", |w| {
                    w.for_unrolled("d", 0, 4, |w| {
                        element(w);
                        emit!(
                            w,
                            "resv[tn][mt][d] = live ? to_f32(({})[row * {} + n]) : 0.0f;",
                            r.loc.ptr(r.dtype, false),
                            r.row_stride
                        );
                    });
                });
            });
        }
        let res = p.residual.map(|_| "resv[tn][mt][d]");
        w.for_unrolled("tn", 0, "TN", |w| {
            w.for_unrolled("mt", 0, "MT8", |w| {
                w.for_unrolled("d", 0, 4, |w| {
                    element(w);
                    let up = p.gate_up().then_some("acc[tn * G + 1][mt][d]");
                    emit_epilogue_value(w, p, "acc[tn * G][mt][d]", up, res);
                    if argmax.is_some() {
                        w.line("ArgmaxPair& b = best[mt][d & 1];");
                        w.if_block("live && argmax_better(v, n, b.v, b.i)", |w| {
                            w.line("b = ArgmaxPair{v, n};");
                        });
                    }
                });
            });
        });
        if argmax.is_some() {
            w.comment("best of the warp's columns for each row, lanes g = 0 publish");
            w.for_unrolled("mt", 0, "MT8", |w| {
                w.for_unrolled("par", 0, 2, |w| {
                    w.line("const ArgmaxPair b = quad_column_argmax(best[mt][par]);");
                    w.line("if (g == 0) cand[wn][8 * mt + 2 * t + par] = b;");
                });
            });
        }
    });
    if let Some(part) = argmax {
        w.comment("argmax partial of this block for each row over its WN column ranges");
        w.line("__syncthreads();");
        w.for_block("int m = threadIdx.x", "m < mr", "m += NW * 32", |w| {
            w.line("ArgmaxPair best = cand[0][m];");
            w.for_block("int j = 1", "j < WN", "++j", |w| {
                w.line("const ArgmaxPair a = cand[j][m];");
                w.line("if (argmax_better(a.v, a.i, best.v, best.i)) best = a;");
            });
            emit!(
                w,
                "({})[(long long)(m0 + m) * gridDim.x + blockIdx.x] = best;",
                part.ptr_as("ArgmaxPair", true)
            );
        });
    }
}

/// Declares `m`, `col`, `row` and `live` of the RoPE pair `(tn, mt, r)` of lane `(g, t)`.
fn emit_rope_pair_coords(w: &mut Writer) {
    w.line("const int m = 8 * mt + 2 * t + r;");
    w.line("const int col = nb + 16 * tn + g;");
    w.line("const long long row = m0 + m;");
    w.line("const bool live = m < mr && col < N;");
}

/// Declares `rcs[TN][MT8][2]` and `rsn[TN][MT8][2]` and, in warps wk = 0 (the ones that run
/// the epilogue), fills them with the rounded cosine and sine of each RoPE pair the lane
/// stores. The register feeds at one 8-row fragment emit this once their first loads are
/// issued (after the fused norm's barrier), so the f64 `sincos` runs while those loads are in
/// flight rather than after the last mma.
pub(super) fn emit_rope_cos_sin(w: &mut Writer, p: &GemvParams) {
    let Some(r) = &p.rope else { return };
    let xt = p.x.dtype.c_type();
    w.comment("RoPE cos / sin of the epilogue's pairs, while the first weight loads are in flight");
    w.line("float rcs[TN][MT8][2], rsn[TN][MT8][2];");
    w.if_block("wk == 0", |w| {
        w.for_unrolled("tn", 0, "TN", |w| {
            w.for_unrolled("mt", 0, "MT8", |w| {
                w.for_unrolled("r", 0, 2, |w| {
                    w.scope(|w| {
                        emit_rope_pair_coords(w);
                        qkv_rope::emit_pair_cos_sin(w, r, xt, "rcs[tn][mt][r]", "rsn[tn][mt][r]");
                    });
                });
            });
        });
    });
}
