//! The last-arrival gate of kernels whose blocks each publish a part of one result (split-K
//! partial sums, attention's context splits) and whose last block to finish completes it.

use crate::writer::{emit, Writer};

/// After every thread's stores of its part: publishes them (`__threadfence`), counts the
/// block once on `cnt[tile]`, and lets only the `parts`-th arrival on (`split_last`), which
/// resets the counter and fences again before it reads the others' parts. The kernel
/// declares `__shared__ int split_last`, `int* cnt` and `tile` before it.
/// Invariant: every block of the launch reaches the gate exactly once (no early return
/// before it), so the counters are zero again after every launch.
pub(crate) fn emit_last_arrival(w: &mut Writer, parts: &str) {
    w.line("__threadfence();");
    w.line("__syncthreads();");
    w.if_block("threadIdx.x == 0", |w| {
        w.line("const int arrived = atomicAdd(cnt + tile, 1);");
        emit!(w, "split_last = arrived == {parts} - 1;");
        w.comment("every split has counted: back to zero for the next launch");
        w.line("if (split_last) cnt[tile] = 0;");
    });
    w.line("__syncthreads();");
    w.line("if (!split_last) return;");
    w.line("__threadfence();");
}
