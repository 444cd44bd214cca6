//! The unit loop of [`super::Feed::Tma`]: weights and x reach shared memory as 2-D boxes of
//! tensor-map copies (`cp.async.bulk.tensor.2d`, 128-byte swizzle), one producer warp keeps
//! `NS` chunks of 64 k in flight, and `WN` consumer warps read their fragments with
//! `ldmatrix`. Nothing in flight costs registers and one instruction moves a whole
//! `16·WN`-row weight box, so an SM keeps far more weight bytes in flight than the register
//! prefetch of [`super::Feed::XBulk`]; measured faster than the x-staged feed at every 8B
//! shape at M = 64 (bench/NOTES.md).
//!
//! Stage `s` (1024-byte aligned, [`crate::tensor_map::BOX_SMEM_ALIGN`]): the block's `RB`
//! rows of each of the `G` weights, then the tile's `MTP` x rows, each row the 128 bytes of
//! one 64-k chunk with piece `c` at `c ^ (row % 8)` (the swizzle). `ldmatrix` rows of one
//! 8×8 matrix are 8 consecutive rows of one logical piece: 8 distinct physical pieces, so
//! every fragment load is bank-conflict free. Fragments are in the standard m16n8k16
//! layout, so the accumulators mean what they mean for the other feeds (lane `(g, t)`:
//! columns `g`, `g + 8`, rows `2t`, `2t + 1` of each 8-row tile) and the epilogues are shared.
//!
//! Ring invariant: chunk `n` lives in stage `n % NS`; it completes phase `(n / NS) & 1` of
//! `full[n % NS]` (the producer's arrival with its byte count, then the copies), and its
//! stage is released by phase `(n / NS) & 1` of `empty[n % NS]` (one arrival per consumer
//! warp after its last read), which the producer awaits before it issues chunk `n + NS`.
//! The producer warp (`warp == WN`, so `wk == 1`) runs no epilogue code; it stays resident
//! for the block-wide barriers of the split-K fix-up and the argmax partials.

use super::MmaTiling;
use crate::abi::{Loc, TensorMap};
use crate::gemv::{GemvParams, GemvWeights};
use crate::writer::{emit, Writer};

/// k per chunk: one 128-byte box row of 16-bit elements.
pub(super) const CHUNK_K: u32 = 64;

/// Weight rows per matrix a block stages: 16 per consumer warp.
pub(super) fn block_rows(t: &MmaTiling) -> u32 {
    16 * t.wn
}

/// x rows per box: the row tile padded to 8.
fn x_box_rows(p: &GemvParams) -> u32 {
    p.row_tile.div_ceil(8) * 8
}

/// Bytes of one ring stage.
pub(super) fn stage_bytes(p: &GemvParams, t: &MmaTiling) -> u64 {
    let g = if p.gate_up() { 2 } else { 1 };
    ((g * block_rows(t) + x_box_rows(p)) * 128) as u64
}

/// Dynamic shared memory: the ring plus the slack that aligns it to 1024 bytes.
pub(super) fn ring_bytes(p: &GemvParams, t: &MmaTiling, stages: u32) -> u64 {
    stages as u64 * stage_bytes(p, t) + crate::tensor_map::BOX_SMEM_ALIGN as u64
}

/// The tensor maps the kernel reads: x, then the weight(s).
pub(super) fn maps(p: &GemvParams, t: &MmaTiling) -> (Loc, Loc, Option<Loc>) {
    let x = TensorMap::of(
        p.x.loc,
        p.x.dtype,
        p.k,
        p.rows,
        p.x.row_stride,
        x_box_rows(p),
    );
    let w = |loc| {
        TensorMap::of(
            loc,
            p.w_dtype,
            p.k,
            crate::abi::Rows::Fixed(p.n),
            p.k as u64,
            block_rows(t),
        )
    };
    match p.weights {
        GemvWeights::Single(l) => (x, w(l), None),
        GemvWeights::GateUp { gate, up } => (x, w(gate), Some(w(up))),
    }
}

/// Why `t` cannot run `p` with this feed (beyond the checks shared with the other feeds).
pub(super) fn unsupported(p: &GemvParams, t: &MmaTiling) -> Option<&'static str> {
    if t.tn != 1 || t.wk != 1 {
        return Some("the tensor-map feed needs tn = 1 and wk = 1 (one producer warp)");
    }
    if p.rope.is_some() {
        return Some("the tensor-map feed has no RoPE epilogue");
    }
    if !p.k.is_multiple_of(CHUNK_K) || !(p.k / CHUNK_K).is_multiple_of(t.ks) {
        return Some("the tensor-map feed needs K / 64 to be a multiple of ks");
    }
    if block_rows(t) > 256 || x_box_rows(p) > 256 {
        return Some("the tensor-map feed reads at most 256 rows per box");
    }
    let (x, w, up) = maps(p, t);
    for m in [Some(x), Some(w), up].into_iter().flatten() {
        if let Loc::TensorMap(m) = m {
            if m.check().is_err() {
                return Some("the tensor-map feed needs 16-byte aligned tensors and row strides");
            }
        }
    }
    None
}

/// The main loop: ring setup, the producer warp's copies and the consumer warps' mma steps;
/// leaves `acc[AT][MT8][4]` as the other feeds do (zero in the producer warp).
pub(super) fn emit_tma_main_loop(
    w: &mut Writer,
    p: &GemvParams,
    t: &MmaTiling,
    stages: u32,
    mma: &str,
) {
    let (x, w0, w1) = maps(p, t);
    emit!(w, "constexpr int NS = {stages};  // ring stages");
    emit!(
        w,
        "constexpr int RB = {};  // weight rows per matrix of the block",
        block_rows(t)
    );
    emit!(
        w,
        "constexpr int MTP = {};  // x rows per box",
        x_box_rows(p)
    );
    w.line("constexpr unsigned WBOX = RB * 128, STAGE = G * WBOX + MTP * 128;  // bytes");
    w.line("constexpr int CPS = K / 64 / KS;  // chunks of 64 k per split");
    w.line("float acc[AT][MT8][4];");
    super::for_each_acc(w, |w| w.line("acc[a][mt][d] = 0.0f;"));
    w.comment("a tile without rows copies nothing (block-uniform; every K split of it returns alike, so split-K counters stay zero)");
    w.line("if (mr <= 0) return;");
    w.line("extern __shared__ unsigned char smem_raw[];");
    w.line("unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // swizzled boxes: 1024-aligned");
    w.line("__shared__ __align__(8) unsigned long long full[NS], empty[NS];");
    w.if_block("threadIdx.x == 0", |w| {
        w.for_unrolled("s", 0, "NS", |w| {
            w.line("mbar_init(&full[s], 1);");
            w.line("mbar_init(&empty[s], WN);");
        });
    });
    w.line("__syncthreads();");
    w.line("const int kc0 = blockIdx.z * CPS;");
    w.if_else(
        "warp == WN",
        |w| {
            w.comment("producer: chunk n into stage n % NS once its previous chunk was released");
            emit!(w, "const void* xmap = {};", x.ptr_as("void", false));
            emit!(w, "const void* wmap0 = {};", w0.ptr_as("void", false));
            if let Some(up) = w1 {
                emit!(w, "const void* wmap1 = {};", up.ptr_as("void", false));
            }
            w.if_block("lane == 0", |w| {
                w.line("#pragma unroll 1");
                w.for_block("int n = 0", "n < CPS", "++n", |w| {
                    w.line("const int s = n % NS;");
                    w.line("if (n >= NS) mbar_wait(&empty[s], (n / NS - 1) & 1);");
                    w.line("mbar_arrive_expect_tx(&full[s], STAGE);");
                    w.line("unsigned char* st = smem + s * STAGE;");
                    w.line("const int kx = (kc0 + n) * 64;");
                    w.line("tma_load_2d(st, wmap0, kx, blockIdx.x * RB, &full[s]);");
                    if w1.is_some() {
                        w.line("tma_load_2d(st + WBOX, wmap1, kx, blockIdx.x * RB, &full[s]);");
                    }
                    w.line("tma_load_2d(st + G * WBOX, xmap, kx, m0, &full[s]);");
                });
            });
        },
        |w| {
            w.comment("consumers: lane l addresses row l % 8 of ldmatrix matrix j = l / 8");
            w.line("const int j = lane >> 3, r8 = lane & 7;");
            w.line("const int arow = 16 * wn + 8 * (j & 1) + r8;  // weight rows: matrices (rows 0-7 | 8-15) x (k lo | hi)");
            w.line("#pragma unroll 1");
            w.for_block("int n = 0", "n < CPS", "++n", |w| {
                w.line("const int s = n % NS;");
                w.line("mbar_wait(&full[s], (n / NS) & 1);");
                w.line("const unsigned char* st = smem + s * STAGE;");
                w.for_unrolled("kp", 0, 2, |w| {
                    w.comment("two k16 steps (pieces 4 kp .. 4 kp + 3): every fragment load first, then the mma steps (the loads' latency overlaps)");
                    w.line("unsigned af[G][2][4], bf[MT8][4];  // bf[mt]: b0, b1 of k16 step 2 kp, then of 2 kp + 1");
                    w.for_unrolled("gm", 0, "G", |w| {
                        w.for_unrolled("h", 0, 2, |w| {
                            w.line("const int pc = 4 * kp + 2 * h + (j >> 1);");
                            w.line("ldmatrix_x4(af[gm][h], st + gm * WBOX + arow * 128 + ((pc ^ (arow & 7)) << 4));");
                        });
                    });
                    w.for_unrolled("mt", 0, "MT8", |w| {
                        w.line("const int xr = 8 * mt + r8;");
                        w.line("ldmatrix_x4(bf[mt], st + G * WBOX + xr * 128 + (((4 * kp + j) ^ (xr & 7)) << 4));");
                    });
                    w.for_unrolled("mt", 0, "MT8", |w| {
                        w.for_unrolled("gm", 0, "G", |w| {
                            emit!(w, "{mma}(acc[gm][mt], af[gm][0], bf[mt][0], bf[mt][1]);");
                            emit!(w, "{mma}(acc[gm][mt], af[gm][1], bf[mt][2], bf[mt][3]);");
                        });
                    });
                });
                w.line("__syncwarp();");
                w.line("if (lane == 0) mbar_arrive(&empty[s]);  // this warp is done with the stage");
            });
        },
    );
}
