//! The unit loops of [`super::Feed::Bulk`] (weight and x rows staged by the copy engine) and
//! [`super::Feed::XBulk`] (x rows staged, weights prefetched into registers).
//!
//! The block stages chunks of `CH = WK · U` units (32 k each) of its `G · RB` weight rows
//! (`Bulk` only) and its `MTP` x rows in a ring of `NS` stages, `NS − 1` chunks ahead. Each
//! staged row is one `cp.async.bulk` of `CH · 64` contiguous bytes (the block's threads issue
//! them row by row), all of a stage completing on the stage's mbarrier: the bytes in flight
//! cost no registers and no per-piece index math. Measured at the 8B shapes and M = 64
//! (bench/NOTES.md): staging x this way while each warp prefetches its weights
//! 8 units deep (`XBulk`) is the fastest feed; staging the weights too (`Bulk`) is slower than
//! register prefetch, as the copy engine then handles one 256–512-byte copy per weight row
//! and chunk.
//!
//! Layout: stage `s`, row `row` starts at byte `s · STAGE + row · RSTR`; `RSTR ≡ 64 (mod 128)`
//! so the 16-byte reads of a quarter warp (rows `g`, `g + 1`, 4 lanes `t` each) fall in
//! distinct banks. Rows past N and past the tile are copied from the last valid row
//! (clamped: every copy reads inside its tensor, and each stage always expects the same
//! byte count); their products land only in columns / rows the epilogue never stores.
//! K is covered exactly by whole chunks ([`chunks_cover_k`]), so no chunk reads past a row.
//!
//! Invariant of the ring: chunk `n` lives in stage `n % NS` and completes phase
//! `(n / NS) & 1` of `full[n % NS]`; it is issued at iteration `n − NS + 1`, after the
//! barrier that follows every warp's reads of that stage in iteration `n − NS`.

use super::{feed, for_each_acc, MmaTiling};
use crate::gemv::{weight_row, GemvParams};
use crate::writer::{emit, Writer};

/// Whether whole chunks of `units_per_chunk` units tile every K split exactly: K a
/// multiple of 32 and the units a multiple of `ks · units_per_chunk`.
pub(super) fn chunks_cover_k(k: u32, ks: u32, units_per_chunk: u32) -> bool {
    k.is_multiple_of(32) && (k / 32).is_multiple_of(ks * units_per_chunk)
}

/// Bytes of one staged row (`CH · 64` rounded to `≡ 64 (mod 128)`).
pub(super) fn row_stride_bytes(units_per_chunk: u32) -> u32 {
    units_per_chunk * 64
        + if units_per_chunk.is_multiple_of(2) {
            64
        } else {
            0
        }
}

/// [`super::Feed::Bulk`]: weight rows and x rows from the ring.
pub(super) fn emit_bulk_main_loop(w: &mut Writer, p: &GemvParams, stages: u32, mma: &str) {
    emit_ring_setup(w, p, stages, true);
    emit_chunk_loop(w, p, true, |w| {
        w.line("uint4 wa[AT][2];");
        w.for_unrolled("tn", 0, "TN", |w| {
            w.for_unrolled("gm", 0, "G", |w| {
                w.for_unrolled("h", 0, 2, |w| {
                    w.line("wa[tn * G + gm][h] = *reinterpret_cast<const uint4*>(st + (gm * RB + wn * 16 * TN + 16 * tn + 8 * h + g) * RSTR + jb);");
                });
            });
        });
        emit_x_fragments(w, mma, "wa[a][0], wa[a][1]");
    });
}

/// [`super::Feed::XBulk`]: x rows from the ring, weights prefetched into registers `U`
/// units ahead per warp as in the register feeds (slot `i` holds unit `c0 + wk + i · WK`
/// and reloads with the unit one chunk later right after its mma steps, so weight loads
/// stay in flight across the ring's barriers).
pub(super) fn emit_xbulk_main_loop(
    w: &mut Writer,
    p: &GemvParams,
    t: &MmaTiling,
    stages: u32,
    mma: &str,
) {
    emit_ring_setup(w, p, stages, false);
    w.line("uint4 wa[U][AT][2];  // weight rows g, g + 8 of each tile");
    w.comment("first group: units ub + wk + i * WK");
    w.for_unrolled("i", 0, "U", |w| {
        feed::emit_load(w, p, t, "ub + wk + i * WK")
    });
    emit_chunk_loop(w, p, false, |w| {
        emit_x_fragments(w, mma, "wa[i][a][0], wa[i][a][1]");
        feed::emit_load(w, p, t, "c0 + wk + WK * (U + i)");
    });
}

/// Zeroes the accumulators and loops over the split's chunks: advances the ring, then runs
/// `unit` for each of the warp's `U` units of the chunk (`i`, and `jb`: the lane's byte
/// offset of that unit in a staged row).
fn emit_chunk_loop(w: &mut Writer, p: &GemvParams, with_weights: bool, unit: impl Fn(&mut Writer)) {
    w.line("float acc[AT][MT8][4];");
    for_each_acc(w, |w| w.line("acc[a][mt][d] = 0.0f;"));
    w.line("#pragma unroll 1");
    w.for_block("int c0 = ub, n = 0", "c0 < ue", "c0 += CH, ++n", |w| {
        emit_ring_advance(w, p, with_weights);
        w.for_unrolled("i", 0, "U", |w| {
            w.line("const int jb = (wk + i * WK) * 64 + 16 * t;  // this lane's bytes of its chunk unit");
            unit(w);
        });
    });
}

/// The mma steps of chunk unit `jb` over every x fragment of the stage `st`.
fn emit_x_fragments(w: &mut Writer, mma: &str, weights: &str) {
    w.for_unrolled("mt", 0, "MT8", |w| {
        w.line("const uint4 xf = *reinterpret_cast<const uint4*>(st + (WROWS + 8 * mt + g) * RSTR + jb);");
        w.for_unrolled("a", 0, "AT", |w| {
            emit!(w, "{mma}(acc[a][mt], {weights}, xf);");
        });
    });
}

/// The ring's constants, barriers and first `NS − 1` chunks; `with_weights`: the block's
/// weight rows are staged before the x rows (`WROWS` of them), else x rows only.
fn emit_ring_setup(w: &mut Writer, p: &GemvParams, stages: u32, with_weights: bool) {
    let (xt, stride) = (p.x.dtype.c_type(), p.x.row_stride);
    w.comment("x rows are clamped to the tile's last one: a tile without rows copies nothing (block-uniform; every K split of it returns alike, so split-K counters stay zero)");
    w.line("if (mr <= 0) return;");
    emit!(w, "constexpr int NS = {stages};  // ring stages");
    w.line("constexpr int CH = WK * U;  // units per chunk");
    w.line("constexpr int MTP = MT8 * 8;  // staged x rows");
    w.line("constexpr int RB = WN * 16 * TN;  // weight rows per matrix of the block");
    if with_weights {
        w.line("constexpr int WROWS = G * RB;  // staged weight rows (before the x rows)");
    } else {
        w.line("constexpr int WROWS = 0;  // weights are not staged");
    }
    w.line("constexpr int ROWS = WROWS + MTP;  // staged rows per chunk");
    w.line("constexpr int RSTR = CH * 64 + (CH % 2 == 0 ? 64 : 0);  // bytes per staged row, = 64 (mod 128)");
    w.line("constexpr int STAGE = ROWS * RSTR;  // bytes per stage");
    w.line("constexpr unsigned STAGE_TX = ROWS * CH * 64;  // bytes copied per stage");
    w.line("extern __shared__ __align__(128) unsigned char smem[];");
    w.line("__shared__ __align__(8) unsigned long long full[NS];");
    w.line("const int cb = blockIdx.x * RB;  // the block's first column");
    emit!(
        w,
        "const {xt}* xg0 = x + (long long)m0 * {stride};  // the tile's first x row"
    );
    w.if_block("threadIdx.x == 0", |w| {
        w.for_unrolled("s", 0, "NS", |w| w.line("mbar_init(&full[s], 1);"));
    });
    w.line("__syncthreads();");
    w.comment("chunks 0 .. NS - 2");
    w.for_unrolled("s", 0, "NS - 1", |w| {
        w.if_block("ub + s * CH < ue", |w| {
            emit_stage(w, p, "ub + s * CH", "s", with_weights)
        });
    });
}

/// Top of iteration `n` (chunk `c0`): waits for chunk `n`, then (after a barrier: every warp
/// is done with the stage of chunk `n − 1`) refills that stage with chunk `n + NS − 1`;
/// `st` is chunk `n`'s stage.
fn emit_ring_advance(w: &mut Writer, p: &GemvParams, with_weights: bool) {
    w.line("const int s = n % NS;");
    w.line("mbar_wait(&full[s], (n / NS) & 1);  // chunk n has landed");
    w.line("__syncthreads();  // every warp is done with chunk n - 1's stage");
    w.scope(|w| {
        w.line("const int cn = c0 + (NS - 1) * CH;");
        w.if_block("cn < ue", |w| {
            emit_stage(w, p, "cn", "(n + NS - 1) % NS", with_weights)
        });
    });
    w.line("const unsigned char* st = smem + s * STAGE;");
}

/// Issues the copies of chunk `c0` into stage `s`: thread 0 arrives expecting the stage's
/// bytes, thread `row` copies staged row `row` (the `WROWS` weight rows of the block's
/// columns, permuted for the RoPE epilogue, then x rows of the tile; both clamped to their
/// last valid row). `weights`: whether to emit the weight branch (dead when `WROWS = 0`).
fn emit_stage(w: &mut Writer, p: &GemvParams, c0: &str, s: &str, weights: bool) {
    let stride = p.x.row_stride;
    let wrow = weight_row(p, "min(cb + row % RB, N - 1)");
    w.scope(|w| {
        emit!(w, "const int sx = {s};");
        w.line("if (threadIdx.x == 0) mbar_arrive_expect_tx(&full[sx], STAGE_TX);");
        w.for_block(
            "int row = threadIdx.x",
            "row < ROWS",
            "row += NW * 32",
            |w| {
                w.line("const void* src;");
                let x_row = |w: &mut Writer| {
                    w.line("const int r = min(row - WROWS, mr - 1);");
                    emit!(w, "src = xg0 + (long long)r * {stride} + ({c0}) * 32;");
                };
                if weights {
                    w.if_else(
                        "row < WROWS",
                        |w| {
                            emit!(
                                w,
                                "const long long off = (long long){wrow} * K + ({c0}) * 32;"
                            );
                            if p.gate_up() {
                                w.line("src = (row < RB ? w0 : w1) + off;");
                            } else {
                                w.line("src = w0 + off;");
                            }
                        },
                        x_row,
                    );
                } else {
                    x_row(w);
                }
                w.line("bulk_copy_g2s(smem + sx * STAGE + row * RSTR, src, CH * 64, &full[sx]);");
            },
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_rows_are_bank_conflict_free_and_chunks_tile_k() {
        for ch in 1..=16 {
            assert_eq!(row_stride_bytes(ch) % 128, 64, "CH = {ch}");
            assert!(row_stride_bytes(ch) >= ch * 64);
        }
        assert!(chunks_cover_k(4096, 2, 8));
        assert!(chunks_cover_k(14336, 2, 8));
        assert!(!chunks_cover_k(4096, 3, 8));
        assert!(!chunks_cover_k(1000, 1, 1));
    }
}
