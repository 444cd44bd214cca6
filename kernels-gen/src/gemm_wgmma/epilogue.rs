//! The epilogue of `gemm_wgmma` (consumer threads only): the shared GEMV epilogue per
//! output element (store, cast, residual, SwiGLU) and the argmax partials of each row over
//! the block's columns.

use crate::gemv::{emit_epilogue_value, GemvParams};
use crate::writer::{emit, Writer};

/// 8-column groups whose residuals are loaded together before their stores: 16 values in
/// flight per thread, without doubling the accumulators' registers at `BN = 256`.
const RES_GROUPS: u32 = 4;

/// Declares `m` (row in the tile), `n` (column), `row` (global row) and `live` of the
/// accumulator `(j, d)`: in the m64nN layout thread `(wq, g, t)` of warpgroup `wg` holds
/// row `64 wg + 16 wq + g + 8 (d >> 1)` and column `8 j + 2 t + (d & 1)` in
/// `acc[gm][4 j + d]`.
fn emit_element_place(w: &mut Writer) {
    w.line("const int m = 64 * wg + 16 * wq + g + 8 * (d >> 1);");
    w.line("const int n = n0 + 8 * j + 2 * t + (d & 1);");
    w.line("const long long row = m0 + m;");
    w.line("const bool live = row < M && n < N;");
}

/// `body` once per accumulator `(j, d)` of the 8-column groups `jb + jj`, `jj < RG` (those
/// below `BN / 8`), with the element's place in scope.
fn for_each_in_batch(w: &mut Writer, body: impl Fn(&mut Writer)) {
    w.for_unrolled("jj", 0, "RG", |w| {
        w.line("const int j = jb + jj;");
        w.if_block("j < BN / 8", |w| {
            w.for_unrolled("d", 0, 4, |w| {
                emit_element_place(w);
                body(w);
            });
        });
    });
}

pub(super) fn emit(w: &mut Writer, p: &GemvParams) {
    w.line("const int wq = warp & 3;  // warp of the warpgroup: 16 of its 64 rows");
    w.line("const int g = lane >> 2;");
    w.line("const int t = lane & 3;");
    let argmax = p.argmax_partials;
    if argmax.is_some() {
        w.comment("the best (value, column) of the thread's rows g and g + 8");
        w.line("float best_v[2] = {neg_inf(), neg_inf()};");
        w.line("int best_i[2] = {0x7fffffff, 0x7fffffff};");
    }
    let up = p.gate_up().then_some("acc[1][4 * j + d]");
    let element = |w: &mut Writer, res: Option<&str>| {
        emit_epilogue_value(w, p, "acc[0][4 * j + d]", up, res);
        if argmax.is_some() {
            w.line("const int h = d >> 1;");
            w.if_block("live && argmax_better(v, n, best_v[h], best_i[h])", |w| {
                w.line("best_v[h] = v;");
                w.line("best_i[h] = n;");
            });
        }
    };
    match p.residual {
        Some(r) => {
            // The stores go to the residual's buffer (in place): loads issued first, per
            // batch of groups, so they are in flight together.
            emit!(w, "constexpr int RG = {RES_GROUPS};");
            w.line("#pragma unroll");
            w.for_block("int jb = 0", "jb < BN / 8", "jb += RG", |w| {
                w.line("float resv[RG][4];");
                for_each_in_batch(w, |w| {
                    emit!(
                        w,
                        "resv[jj][d] = live ? to_f32(({})[row * {} + n]) : 0.0f;",
                        r.loc.ptr(r.dtype, false),
                        r.row_stride
                    );
                });
                for_each_in_batch(w, |w| element(w, Some("resv[jj][d]")));
            });
        }
        None => w.for_unrolled("j", 0, "BN / 8", |w| {
            w.for_unrolled("d", 0, 4, |w| {
                emit_element_place(w);
                element(w, None);
            });
        }),
    }
    let Some(part) = argmax else { return };
    w.comment("the quad holds every column of the block for its rows: its best is the block's");
    w.for_unrolled("h", 0, 2, |w| {
        w.line("const ArgmaxPair b = quad_row_argmax(ArgmaxPair{best_v[h], best_i[h]});");
        w.line("const long long row = m0 + 64 * wg + 16 * wq + g + 8 * h;");
        emit!(
            w,
            "if (t == 0 && row < M) ({})[row * CT + ct] = b;",
            part.ptr_as("ArgmaxPair", true)
        );
    });
}
