//! The reductions of split-K: across the warps of a block (shared memory) and across
//! blocks (partials in scratch, the last split of a tile sums them in split order).

use super::{for_each_acc, SplitScratch};
use crate::last_arrival::emit_last_arrival;
use crate::writer::{emit, Writer};

/// Split-K inside the block: warps `wk > 0` hand their sums to warp `wk = 0` of their
/// column range through shared memory, one weight tile per round, in `wk` order (the sum
/// does not depend on timing).
pub(super) fn emit_warp_reduction(w: &mut Writer) {
    w.comment("split-K: warps wk > 0 hand their sums to warp wk = 0, one weight tile per round, in wk order");
    w.for_unrolled("a", 0, "AT", |w| {
        w.if_block("wk > 0", |w| {
            w.for_unrolled("mt", 0, "MT8", |w| {
                w.for_unrolled("d", 0, 4, |w| {
                    w.line("red[(wk - 1) * WN + wn][mt * 4 + d][lane] = acc[a][mt][d];");
                });
            });
        });
        w.line("__syncthreads();");
        w.if_block("wk == 0", |w| {
            w.for_block("int j = 0", "j < WK - 1", "++j", |w| {
                w.for_unrolled("mt", 0, "MT8", |w| {
                    w.for_unrolled("d", 0, 4, |w| {
                        w.line("acc[a][mt][d] += red[j * WN + wn][mt * 4 + d][lane];");
                    });
                });
            });
        });
        w.line("__syncthreads();");
    });
}

/// Split-K across blocks: warp wk = 0 of every split stores its sums, the last split of
/// the tile to arrive (one counter per tile) resets the counter and reloads the sums of
/// all splits in split order (the result does not depend on arrival order), then runs the
/// epilogue; the other blocks are done.
pub(super) fn emit_split_k_fixup(w: &mut Writer, sc: SplitScratch) {
    w.comment("split-K: publish this split's sums; the last split of the tile finishes it");
    w.line("constexpr int FRAG = AT * MT8 * 4 * 32;  // floats of one warp's accumulators");
    w.line("__shared__ int split_last;");
    emit!(w, "float* part = {};", sc.partials.ptr_as("float", true));
    emit!(w, "int* cnt = {};", sc.counters.ptr_as("int", true));
    w.line("const long long tile = (long long)blockIdx.y * gridDim.x + blockIdx.x;");
    emit!(
        w,
        "if (tile >= {}) __trap();  // more tiles than the scratch holds",
        sc.tiles
    );
    w.line("float* mine = part + ((tile * KS + blockIdx.z) * WN + wn) * FRAG;");
    w.if_block("wk == 0", |w| {
        for_each_acc(w, |w| {
            w.line("__stcg(mine + ((a * MT8 + mt) * 4 + d) * 32 + lane, acc[a][mt][d]);");
        });
    });
    emit_last_arrival(w, "KS");
    w.if_block("wk == 0", |w| {
        w.line("const float* all = part + (tile * KS * WN + wn) * FRAG;");
        for_each_acc(w, |w| {
            w.line("float s = 0.0f;");
            w.for_block("int j = 0", "j < KS", "++j", |w| {
                w.line("s += __ldcg(all + j * WN * FRAG + ((a * MT8 + mt) * 4 + d) * 32 + lane);");
            });
            w.line("acc[a][mt][d] = s;");
        });
    });
}
