//! The tensor-core GEMV (`gemv_mma`) on the GPU against the IR interpreter: row counts
//! 2..=64 (ragged row tiles included), K not a multiple of 32, N not a multiple of 16,
//! every fused epilogue (store, cast f32, residual in place, SwiGLU, argmax partials with
//! and without logits), the RMSNorm prologue, f16 operands and explicit work splits.
//! Needs `--features cuda` and a device; skips with a message without a driver or NVRTC.

#![cfg(feature = "cuda")]

mod common;
mod gemv_check;
mod gpu;

use gemv_check::{check_gemv, GemvCase, Kernel, BASE, BF};
use gpu::Gpu;
use specc_kernels_gen::abi::Dtype;
use specc_kernels_gen::gemv_mma::{Feed, MmaTiling};

const MMA: GemvCase = GemvCase {
    kernel: Kernel::Mma(None),
    ..BASE
};

/// `rows` token rows in one tile (B = 1, T = rows).
fn rows(m: u32) -> GemvCase {
    GemvCase {
        b: 1,
        t: m,
        row_tile: m,
        ..MMA
    }
}

/// An explicit work split: `(tn, wn, wk, unroll, ks)` and the operand feed.
fn tiled(split: (u32, u32, u32, u32, u32), feed: Feed) -> Kernel {
    Kernel::Mma(Some(common::mma_split(split, feed)))
}

#[test]
fn gemv_mma_row_counts_and_epilogues() {
    let Some(gpu) = Gpu::new() else { return };
    for m in [1, 2, 3, 8, 9, 16, 33, 64] {
        let c = rows(m);
        check_gemv(&gpu, c);
        check_gemv(
            &gpu,
            GemvCase {
                norm: true,
                k: 360,
                n: 500,
                ..c
            },
        );
        check_gemv(
            &gpu,
            GemvCase {
                norm: true,
                gate_up: true,
                n: 352,
                ..c
            },
        );
        check_gemv(
            &gpu,
            GemvCase {
                residual: true,
                n: 136,
                k: 352,
                ..c
            },
        );
        check_gemv(
            &gpu,
            GemvCase {
                argmax: true,
                out: None,
                norm: true,
                n: 1000,
                ..c
            },
        );
        check_gemv(
            &gpu,
            GemvCase {
                argmax: true,
                out: Some(Dtype::F32),
                n: 520,
                k: 200,
                ..c
            },
        );
    }
}

#[test]
fn gemv_mma_row_tiles_dtypes_and_tilings() {
    let Some(gpu) = Gpu::new() else { return };
    let cases = [
        // 33 rows in tiles of 16: three tiles, the last with one row.
        GemvCase {
            b: 3,
            t: 11,
            row_tile: 16,
            norm: true,
            ..MMA
        },
        // 9 rows in tiles of 2 (odd remainder), residual in place.
        GemvCase {
            b: 9,
            t: 1,
            row_tile: 2,
            residual: true,
            ..MMA
        },
        // f16 operands, f32 output.
        GemvCase {
            x_dtype: Dtype::F16,
            w_dtype: Dtype::F16,
            out: Some(Dtype::F32),
            norm: true,
            ..MMA
        },
        // f16 gate/up.
        GemvCase {
            x_dtype: Dtype::F16,
            w_dtype: Dtype::F16,
            out: Some(Dtype::F16),
            gate_up: true,
            n: 200,
            ..MMA
        },
        // explicit splits: 4 column warps, odd split-K, two weight tiles per warp, one unit.
        GemvCase {
            argmax: true,
            out: None,
            norm: true,
            n: 3000,
            k: 1000,
            kernel: Kernel::Mma(Some(MmaTiling {
                tn: 2,
                wn: 4,
                wk: 3,
                unroll: 1,
                feed: Feed::Prefetch,
                ks: 1,
            })),
            ..MMA
        },
        GemvCase {
            residual: true,
            n: 1000,
            k: 1064,
            b: 1,
            t: 40,
            row_tile: 40,
            kernel: Kernel::Mma(Some(MmaTiling {
                tn: 3,
                wn: 1,
                wk: 5,
                unroll: 3,
                feed: Feed::XAtUse,
                ks: 1,
            })),
            ..MMA
        },
        // Llama-3.1-8B widths at verify-of-8 and B = 8 × T = 8 (row tile 64).
        GemvCase {
            b: 1,
            t: 8,
            k: 4096,
            n: 6144,
            norm: true,
            ..MMA
        },
        GemvCase {
            b: 1,
            t: 8,
            k: 4096,
            n: 2048,
            norm: true,
            gate_up: true,
            ..MMA
        },
        GemvCase {
            b: 8,
            t: 8,
            k: 14336,
            n: 1024,
            row_tile: 64,
            residual: true,
            ..MMA
        },
        GemvCase {
            b: 2,
            t: 8,
            k: 4096,
            n: 20000,
            row_tile: 16,
            argmax: true,
            out: None,
            norm: true,
            ..MMA
        },
        // Split-K across blocks: odd K per split, argmax partials, two row tiles (the
        // counters are per column block and row tile), gate/up, fused norm.
        GemvCase {
            b: 2,
            t: 20,
            k: 1000,
            n: 700,
            row_tile: 24,
            argmax: true,
            out: None,
            norm: true,
            kernel: Kernel::Mma(Some(MmaTiling {
                tn: 2,
                wn: 4,
                wk: 2,
                unroll: 2,
                feed: Feed::XAtUse,
                ks: 3,
            })),
            ..MMA
        },
        GemvCase {
            b: 1,
            t: 33,
            k: 2048,
            n: 520,
            row_tile: 33,
            gate_up: true,
            norm: true,
            kernel: Kernel::Mma(Some(MmaTiling {
                tn: 1,
                wn: 4,
                wk: 2,
                unroll: 2,
                feed: Feed::Prefetch,
                ks: 5,
            })),
            ..MMA
        },
        // Llama-3.1-8B qkv and o at a 64-node tree verify (default wide tiling, split-K).
        GemvCase {
            b: 1,
            t: 64,
            k: 4096,
            n: 6144,
            row_tile: 64,
            norm: true,
            ..MMA
        },
        GemvCase {
            b: 1,
            t: 64,
            k: 4096,
            n: 4096,
            row_tile: 64,
            residual: true,
            ..MMA
        },
    ];
    for c in cases {
        check_gemv(&gpu, c);
    }
}

/// Both kernels agree with the interpreter on the same fixture (a guard that the shared
/// epilogue code means the same thing in both).
#[test]
fn gemv_simt_and_mma_share_epilogues() {
    let Some(gpu) = Gpu::new() else { return };
    for kernel in [Kernel::Simt, Kernel::Mma(None)] {
        check_gemv(
            &gpu,
            GemvCase {
                norm: true,
                gate_up: true,
                residual: false,
                out: Some(BF),
                kernel,
                ..BASE
            },
        );
    }
}

/// Operands staged in shared memory (`Feed::Smem`): the fused norm applied while staging,
/// ragged row tiles, K past the last whole unit, chunks past the split's end, split-K
/// across blocks, argmax partials, gate/up, f16.
#[test]
fn gemv_mma_staged_operands() {
    let Some(gpu) = Gpu::new() else { return };
    let cases = [
        GemvCase {
            k: 1000,
            n: 520,
            norm: true,
            gate_up: true,
            kernel: tiled((1, 4, 2, 2, 1), Feed::Smem { stages: 3 }),
            ..rows(40)
        },
        GemvCase {
            b: 3,
            t: 20,
            row_tile: 24,
            k: 1064,
            n: 1000,
            norm: true,
            argmax: true,
            out: None,
            kernel: tiled((2, 2, 4, 3, 3), Feed::Smem { stages: 2 }),
            ..MMA
        },
        GemvCase {
            k: 4096,
            n: 4096,
            residual: true,
            kernel: tiled((4, 2, 1, 1, 2), Feed::Smem { stages: 6 }),
            ..rows(64)
        },
        GemvCase {
            k: 360,
            n: 500,
            x_dtype: Dtype::F16,
            w_dtype: Dtype::F16,
            out: Some(Dtype::F32),
            norm: true,
            kernel: tiled((2, 8, 1, 2, 1), Feed::Smem { stages: 4 }),
            ..rows(9)
        },
        GemvCase {
            k: 4096,
            n: 6144,
            norm: true,
            kernel: tiled((2, 4, 2, 1, 1), Feed::Smem { stages: 4 }),
            ..rows(64)
        },
    ];
    for c in cases {
        check_gemv(&gpu, c);
    }
}

/// The shapes both copy-engine feeds run, one kernel each: gate/up over a ragged 40-row tile
/// and N past the last whole block; 3 sequences of 20 rows in 24-row tiles with argmax
/// partials; a residual 64-row tile at the 8B o shape; f16 operands with an f32 output.
fn copy_engine_cases(kernels: [Kernel; 4]) -> [GemvCase; 4] {
    let [gate_up, argmax, residual, f16] = kernels;
    [
        GemvCase {
            k: 1024,
            n: 520,
            gate_up: true,
            kernel: gate_up,
            ..rows(40)
        },
        GemvCase {
            b: 3,
            t: 20,
            row_tile: 24,
            k: 1536,
            n: 1000,
            argmax: true,
            out: None,
            kernel: argmax,
            ..MMA
        },
        GemvCase {
            k: 4096,
            n: 4096,
            residual: true,
            kernel: residual,
            ..rows(64)
        },
        GemvCase {
            k: 384,
            n: 500,
            x_dtype: Dtype::F16,
            w_dtype: Dtype::F16,
            out: Some(Dtype::F32),
            kernel: f16,
            ..rows(9)
        },
    ]
}

/// Rows staged by the copy engine (`Feed::Bulk`): x rows past the tile and weight rows past
/// N clamped, several row tiles, split-K across blocks, every epilogue; and the 8B q|k|v shape.
#[test]
fn gemv_mma_bulk_operands() {
    let Some(gpu) = Gpu::new() else { return };
    let bulk = |stages| Feed::Bulk { stages };
    let cases = copy_engine_cases([
        tiled((1, 4, 2, 2, 1), bulk(2)),
        tiled((2, 2, 4, 1, 3), bulk(2)),
        tiled((2, 2, 4, 1, 2), bulk(4)),
        tiled((2, 8, 1, 3, 1), bulk(3)),
    ]);
    let qkv = GemvCase {
        k: 4096,
        n: 6144,
        kernel: tiled((1, 2, 4, 2, 1), bulk(2)),
        ..rows(64)
    };
    for c in cases.into_iter().chain([qkv]) {
        check_gemv(&gpu, c);
    }
}

/// x rows staged by the copy engine, weights prefetched into registers (`Feed::XBulk`): the
/// ring wraps several times, split-K across blocks, every epilogue.
#[test]
fn gemv_mma_xbulk_operands() {
    let Some(gpu) = Gpu::new() else { return };
    let xbulk = |stages| Feed::XBulk { stages };
    for c in copy_engine_cases([
        tiled((1, 4, 2, 4, 1), xbulk(2)),
        tiled((2, 2, 4, 4, 3), xbulk(2)),
        tiled((1, 8, 1, 8, 2), xbulk(3)),
        tiled((2, 8, 1, 4, 1), xbulk(3)),
    ]) {
        check_gemv(&gpu, c);
    }
}

/// Weights and x as tensor-map boxes (`Feed::Tma`): weight rows past N and x rows past the
/// tokens read as zeros, the ring wraps, split-K across blocks, every epilogue; and the 8B
/// q|k|v shape at 64 rows as the plan splits it.
#[test]
fn gemv_mma_tma_operands() {
    let Some(gpu) = Gpu::new() else { return };
    let tma = |stages| Feed::Tma { stages };
    let cases = copy_engine_cases([
        tiled((1, 4, 1, 1, 2), tma(3)),
        tiled((1, 8, 1, 1, 3), tma(2)),
        tiled((1, 8, 1, 1, 4), tma(4)),
        tiled((1, 2, 1, 1, 1), tma(4)),
    ]);
    let qkv = GemvCase {
        k: 4096,
        n: 6144,
        kernel: tiled((1, 8, 1, 1, 4), tma(4)),
        ..rows(64)
    };
    for c in cases.into_iter().chain([qkv]) {
        check_gemv(&gpu, c);
    }
}
