//! `gemv_mma`: the small-M matmul `y[M, N] = x[M, K] · W[N, K]ᵀ` on tensor cores
//! (`mma.sync.aligned.m16n8k16`, bf16 or f16 operands, f32 accumulation), for row tiles of
//! 2..=64 token rows. Same parameters, fusions, numerics and argmax-partials layout as
//! [`crate::gemv`] (the epilogue code is shared); the plan picks it through [`select`].
//!
//! Operands ("swap AB"): the weight is the A operand, 16 output columns on the m16 side;
//! x is the B operand, the token rows padded to 8 on the n8 side. A lane `(g, t) =
//! (lane / 4, lane % 4)` loads 16 bytes (8 consecutive k) of weight rows `g` and `g + 8`
//! and the same 8 k of token row `g`; two m16n8k16 steps consume them under one K
//! permutation applied to both operands (`cuda/mma.cuh`). A *unit* is 32 k: one 16-byte
//! load per lane per 8-row half tile, so a warp reads 64 contiguous bytes of each of 16
//! weight rows.
//!
//! Work split: a block has `wn × wk` warps. The `wn` warps of one K slice own distinct
//! column ranges of `16 · tn` columns (per matrix) and read the same x bytes (L1 hits);
//! the `wk` warps of one column range split K by units (`unit ≡ wk (mod WK)`) and are
//! reduced in shared memory in a fixed order. Each warp keeps `unroll` units of weights
//! (and of x) in flight: slot `i` is reloaded with the next group's unit right after the
//! two mma steps that consume it. Units past K load as zeros (no memory traffic), so K
//! needs only the 16-byte granularity of [`crate::gemv`].
//!
//! The RoPE + KV-write epilogue ([`crate::qkv_rope`]) loads the weight rows of a permuted
//! column order: half tile `h = 1` holds the rotary partners of the features in `h = 0`, so
//! lane `(g, t)` rotates its accumulators `d` and `d + 2` as one pair (pair stride 8; head
//! and rotary dims must be multiples of 16, else the plan keeps `rope_kv`).
//!
//! The fused RMSNorm is applied to each x fragment after its load (each x element is
//! used by one warp of the block), with the per-row `1/rms` computed up front while the
//! first weight loads are in flight.
//!
//! Kernel family `gemv_mma` (`gemv_mma_rope` with the RoPE epilogue); name dtype: the
//! weight dtype. Here: the work splits, their policy and the kernel's frame; `feed` emits
//! the unit loop (how operands reach the mma steps), `reduce` the split-K reductions,
//! `epilogue` the per-element epilogues.

use crate::abi::{Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec, Loc};
use crate::gemv::{gemv, weight_row, GemvParams, GemvWeights};
use crate::qkv_rope;
use crate::writer::{emit, Writer};
use crate::Error;
use specc_ir::engine::Target;

mod bulk;
mod epilogue;
mod feed;
mod reduce;
mod tma;

const FAMILY: &str = "gemv_mma";
/// Row tiles from this size use the tensor-core kernel (M = 1 stays on CUDA cores).
pub const MMA_MIN_ROWS: u32 = 2;
/// Shared memory for one round of the split-K reduction: a static `__shared__` array, and
/// CUDA caps a block's static shared memory at 48 KiB on every arch (the rest is left to
/// `inv_rms` and the argmax candidates).
const RED_SMEM_MAX: u64 = 40 * 1024;
/// Lane `(g, t)` holds columns `g` and `g + 8` of each 16-column tile: the RoPE
/// epilogue's pair stride ([`crate::qkv_rope`]).
pub const ROPE_PAIR_STRIDE: u32 = 8;
/// The module items: mma, loads and the fused-norm fragment transform.
const MMA_HELPERS: &str = include_str!("../../cuda/mma.cuh");
/// Module items of [`Feed::Bulk`]: mbarriers and bulk copies.
const BULK_HELPERS: &str = include_str!("../../cuda/bulk_copy.cuh");
/// Module items of [`Feed::Tma`]: tensor-map box copies (with [`BULK_HELPERS`]).
const TMA_HELPERS: &str = include_str!("../../cuda/tma.cuh");
/// Module items of [`Feed::Tma`]: `ldmatrix` and the plain m16n8k16 step.
const FRAGMENT_HELPERS: &str = include_str!("../../cuda/attn_mma.cuh");

/// The work split of one kernel (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaTiling {
    /// 16-column weight tiles per warp and matrix.
    pub tn: u32,
    /// Warps across N in a block.
    pub wn: u32,
    /// Warps across K in a block (split-K).
    pub wk: u32,
    /// Units of 32 k each warp keeps in flight.
    pub unroll: u32,
    /// Where each warp's x fragments come from.
    pub feed: Feed,
    /// K splits across blocks (grid z). Above 1 each split stores its partial sums to
    /// [`SplitScratch::partials`] and the last split to arrive sums them in split order
    /// and runs the epilogue.
    pub ks: u32,
}

/// How the warps of a block get their operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feed {
    /// Weights and x fragments loaded from global memory into registers, `unroll` units
    /// ahead (x: 4·MT8 registers per slot); the warps of a block that share x meet in L1.
    Prefetch,
    /// Weights prefetched into registers; x fragments loaded from global memory at use (no
    /// registers held, latency exposed).
    XAtUse,
    /// Weights and x staged by the whole block in shared memory through a ring of `stages`
    /// chunks of `WK · unroll` units (`cp.async`, `stages − 1` chunks in flight, so the bytes
    /// in flight do not cost registers); the fused RMSNorm is applied once per x element
    /// while staging. Each x byte leaves L2 once per block.
    Smem { stages: u32 },
    /// Whole rows (weights of the block's columns, x rows of the tile) staged in shared
    /// memory by the copy engine (`cp.async.bulk`, one copy per row and chunk of `WK ·
    /// unroll` units, completing on a per-stage mbarrier), `stages − 1` chunks ahead. No
    /// fused norm; K must be tiled exactly by the chunks of every split.
    Bulk { stages: u32 },
    /// x rows staged by the copy engine as in [`Feed::Bulk`] (one copy per row and chunk,
    /// shared by every warp of the block), weights prefetched into registers `unroll` units
    /// ahead per warp as in [`Feed::XAtUse`]: no x registers held, so deeper weight
    /// prefetch. Same conditions as [`Feed::Bulk`].
    XBulk { stages: u32 },
    /// Weights and x as 2-D boxes of tensor-map copies into a ring of `stages` chunks of 64 k
    /// (128-byte swizzle), issued by one extra producer warp; the `wn` consumer warps read
    /// fragments with `ldmatrix` (`tma.rs`). Needs `tn = wk = 1`, no fused norm or RoPE,
    /// K / 64 a multiple of `ks`.
    Tma { stages: u32 },
}

impl MmaTiling {
    /// Warps that own accumulators (`wn × wk`).
    pub fn warps(&self) -> u32 {
        self.wn * self.wk
    }

    /// Threads per block: the accumulating warps plus [`Feed::Tma`]'s producer warp.
    pub fn threads(&self) -> u32 {
        32 * (self.warps() + u32::from(matches!(self.feed, Feed::Tma { .. })))
    }
}

/// Where a split-K kernel (`ks > 1`) keeps its cross-block state.
///
/// Invariant: the counters are zero before the launch and zero after it (the last split
/// of each tile resets its counter), so one zeroed region serves every split-K launch
/// that runs after another. The partials need no initial value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitScratch {
    /// `f32[tiles][ks][wn][fragment]`: [`SplitNeeds::partial_bytes`].
    pub partials: Loc,
    /// `i32[tiles]`: [`SplitNeeds::counters`].
    pub counters: Loc,
    /// Output tiles the scratch was sized for: a launch with more traps (never indexes
    /// past the counters).
    pub tiles: u32,
}

/// The scratch a split-K launch needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitNeeds {
    pub partial_bytes: u64,
    /// One `i32` per output tile (column block × row tile).
    pub counters: u32,
}

/// Output tiles (column blocks × row tiles) of a launch over `rows`.
fn output_tiles(p: &GemvParams, t: &MmaTiling, rows: u32) -> u32 {
    partials_per_row(p, t) * rows.div_ceil(p.row_tile)
}

/// The scratch the tiling needs at `rows` rows at most (`None` without split-K).
pub fn split_needs(p: &GemvParams, t: &MmaTiling, rows: u32) -> Option<SplitNeeds> {
    (t.ks > 1).then(|| {
        let tiles = output_tiles(p, t, rows);
        let frag = (t.tn * mats(p) * mt8(p) * 4 * 32) as u64;
        SplitNeeds {
            partial_bytes: tiles as u64 * (t.ks * t.wn) as u64 * frag * 4,
            counters: tiles,
        }
    })
}

/// [`split_needs`] of the kernel [`select`] generates for `target` (`None` for the
/// CUDA-core kernel).
pub fn select_split_needs(p: &GemvParams, rows: u32, target: &Target) -> Option<SplitNeeds> {
    if supports(p) {
        split_needs(p, &tiling(p, target), rows)
    } else {
        None
    }
}

/// Whether the tensor-core kernel applies: 16-bit float weights of x's dtype (the mma
/// operands) and either a row tile of at least [`MMA_MIN_ROWS`], or one row where it streams
/// faster than the CUDA-core kernel ([`one_row_prefers_mma`]).
pub fn supports(p: &GemvParams) -> bool {
    p.w_dtype == p.x.dtype
        && matches!(p.w_dtype, Dtype::BF16 | Dtype::F16)
        && (p.row_tile >= MMA_MIN_ROWS || (p.row_tile == 1 && one_row_prefers_mma(p)))
}

/// At one row (decode) the choice is measured, not derived: the tensor-core kernel for the
/// projections with a residual epilogue and for the normed gate/up pair, the CUDA-core
/// kernel for a normed single projection (q|k|v) and for the lm-head with its argmax
/// partials (measured fastest at the 8B shapes, bench/NOTES.md).
pub fn one_row_prefers_mma(p: &GemvParams) -> bool {
    p.argmax_partials.is_none() && (p.gate_up() || p.norm.is_none())
}

/// The kernel the plan uses for `target`: [`gemv_mma`] with the work split of [`tiling`]
/// where [`supports`] holds, else [`gemv`]. `split` is the scratch [`select_split_needs`]
/// asked for (`None` where it asked none).
pub fn select(
    p: &GemvParams,
    split: Option<SplitScratch>,
    target: &Target,
) -> Result<KernelSource, Error> {
    if supports(p) {
        gemv_mma_split(p, &tiling(p, target), split)
    } else {
        gemv(p)
    }
}

/// [`select`] with K not split across blocks (the plan's fallback where split-K would need
/// more counters than it has).
pub fn select_unsplit(p: &GemvParams, target: &Target) -> Result<KernelSource, Error> {
    if supports(p) {
        let t = MmaTiling {
            ks: 1,
            ..tiling(p, target)
        };
        gemv_mma_split(p, &t, None)
    } else {
        gemv(p)
    }
}

/// The largest row tile whose q/k/v projection carries RoPE + KV write in its epilogue.
/// Above it the epilogue's per-pair f64 sincos (late positions) sits on each warp's tail
/// and the two-kernel path is faster inside the step graph, although the fused kernel alone
/// times faster at early positions (measured at the 8B shapes, bench/NOTES.md).
pub const ROPE_FUSED_MAX_ROWS: u32 = 1;

/// The largest row tile whose matmul applies the RMSNorm of its input itself (the
/// [`GemvParams::norm`] prologue). Above it the plan normalises x once with `rmsnorm` and
/// the matmul reads the result: every block of a wide tile would otherwise first read all
/// of its rows to compute their RMS (a serial chain of L2 round trips per warp) and scale
/// each x fragment per warp, which costs far more than the separate norm. Row tiles above
/// it also take the x-staged splits of [`wide_tiling`]; at 8 rows the fused split stays
/// faster (measured at the 8B shapes, bench/NOTES.md).
pub const NORM_FUSED_MAX_ROWS: u32 = 8;

/// Whether the kernel [`select`] picks for `p` can carry the RoPE + KV-write epilogue of
/// heads of `head_dim` with `rotary_dim` rotated features (the plan falls back to the
/// two-kernel path otherwise). Row tiles above [`ROPE_FUSED_MAX_ROWS`] keep the two
/// kernels. No device fact enters: the pair stride depends only on which kernel
/// [`supports`] picks.
pub fn select_carries_rope(p: &GemvParams, head_dim: u32, rotary_dim: u32) -> bool {
    if p.row_tile > ROPE_FUSED_MAX_ROWS {
        return false;
    }
    let stride = if supports(p) { ROPE_PAIR_STRIDE } else { 1 };
    qkv_rope::fusable(head_dim, rotary_dim, stride)
}

/// Argmax partials per row of the kernel [`select`] generates for `target`.
pub fn select_partials_per_row(p: &GemvParams, target: &Target) -> u32 {
    if supports(p) {
        partials_per_row(p, &tiling(p, target))
    } else {
        p.partials_per_row()
    }
}

fn mt8(p: &GemvParams) -> u32 {
    p.row_tile.div_ceil(8)
}

fn mats(p: &GemvParams) -> u32 {
    if p.gate_up() {
        2
    } else {
        1
    }
}

/// Bytes of one round (one weight tile's accumulators) of the split-K reduction.
fn red_bytes(p: &GemvParams, t: &MmaTiling) -> u64 {
    (t.wk as u64 - 1) * t.wn as u64 * mt8(p) as u64 * 4 * 32 * 4
}

/// Dynamic shared memory of the staged operand ring ([`Feed::Smem`]): per unit of 32 k, 64
/// bytes of each weight row of the block (`G · 16 · TN · WN` rows) and of each x row of
/// the tile padded to 8; 0 for the register feeds.
fn staged_bytes(p: &GemvParams, t: &MmaTiling) -> u64 {
    let rows = (mats(p) * 16 * t.tn * t.wn + mt8(p) * 8) as u64;
    let units = t.wk * t.unroll;
    match t.feed {
        Feed::Smem { stages } => stages as u64 * units as u64 * rows * 64,
        Feed::Bulk { stages } => stages as u64 * rows * bulk::row_stride_bytes(units) as u64,
        Feed::XBulk { stages } => {
            stages as u64 * (mt8(p) * 8) as u64 * bulk::row_stride_bytes(units) as u64
        }
        Feed::Tma { stages } => tma::ring_bytes(p, t, stages),
        _ => 0,
    }
}

/// The work split for `target`: the one [`select`] uses.
///
/// Up to [`NORM_FUSED_MAX_ROWS`] (8) rows: each x fragment feeds two weight tiles (gate and
/// up, or two column tiles), halving the x traffic per weight byte, except with few columns,
/// where one tile per warp doubles the blocks. `wn` (warps sharing x) grows while there are
/// still ≥ 2 blocks per SM of `target`; `wk` fills the block to 8 warps; K is not split
/// across blocks. Split-K across blocks, and wider splits that are faster as one kernel
/// alone, were slower in the step graph (measured at the 8B shapes, bench/NOTES.md).
///
/// Above 8 rows x traffic dominates (each weight byte meets M/8 x bytes): [`wide_tiling`],
/// within `target`'s shared memory per block.
pub fn tiling(p: &GemvParams, target: &Target) -> MmaTiling {
    let g = mats(p);
    if p.row_tile > NORM_FUSED_MAX_ROWS {
        return wide_tiling(p, target);
    }
    // From here on a row tile is one 8-row x fragment.
    let units = p.k.div_ceil(32);
    let tiles = p.n.div_ceil(16) as u64;
    let two_per_sm = 2 * target.sms as u64;
    let few_columns = tiles.div_ceil(2) < two_per_sm;
    let tn = if g == 2 || few_columns { 1 } else { 2 };
    let warp_tiles = tiles.div_ceil(tn as u64);
    let wn = [4u32, 2, 1]
        .into_iter()
        .find(|&wn| warp_tiles.div_ceil(wn as u64) >= two_per_sm)
        .unwrap_or(1);
    let mut t = MmaTiling {
        tn,
        wn,
        wk: (8 / wn).min(units).max(1),
        unroll: 4,
        feed: Feed::Prefetch,
        ks: 1,
    };
    while t.wk > 1 && red_bytes(p, &t) > RED_SMEM_MAX {
        t.wk /= 2;
    }
    t
}

/// Row tiles of a launch over a fixed row count (1 where rows vary with the bucket).
fn fixed_row_tiles(p: &GemvParams) -> u64 {
    match p.rows {
        crate::abi::Rows::Fixed(r) => r.div_ceil(p.row_tile).max(1) as u64,
        _ => 1,
    }
}

/// Blocks of 8 warps the row tiles above 8 aim at: at least 8 of every 11 SMs of `target`
/// busy (96 on the 132-SM H200, where 96–128 blocks beat both fewer, wider blocks and
/// split-K across blocks; bench/NOTES.md). The tensor-map splits aim at the same count.
fn wide_min_blocks(target: &Target) -> u64 {
    (target.sms as u64 * 8).div_ceil(11)
}

/// Above 8 rows: each x fragment is loaded by every warp that uses it, so a block should
/// cover as many weight columns as possible (`16 · TN · WN · G` share one x read through
/// L1) while the grid keeps at least [`wide_min_blocks`] blocks; the remaining warps of the
/// 8 split K inside the block, and x is prefetched with the weights (measured fastest at the
/// 8B shapes, also against deeper prefetch, split-K and operands staged in shared memory;
/// bench/NOTES.md).
///
/// Those register splits are the last resort: where the tensor-map feed applies (x
/// normalised, K in 64-k chunks, a block's ring fits `target.smem_per_block`) it is used
/// (`wide_tma_tiling`), then the x-staged splits (`wide_xbulk_tiling`).
pub fn wide_tiling(p: &GemvParams, target: &Target) -> MmaTiling {
    if let Some(t) = wide_tma_tiling(p, target) {
        return t;
    }
    if let Some(t) = wide_xbulk_tiling(p, target) {
        return t;
    }
    let g = mats(p);
    let tiles = p.n.div_ceil(16) as u64;
    let row_tiles = fixed_row_tiles(p);
    let min_blocks = wide_min_blocks(target);
    // (tn, wn) by columns per block, widest first; gate/up pairs its two matrices already.
    let splits: &[(u32, u32)] = if g == 2 {
        &[(1, 8), (1, 4), (1, 2), (1, 1)]
    } else {
        &[(2, 8), (2, 4), (2, 2), (1, 2), (1, 1)]
    };
    let (tn, wn) = splits
        .iter()
        .copied()
        .find(|&(tn, wn)| tiles.div_ceil((tn * wn) as u64) * row_tiles >= min_blocks)
        .unwrap_or((1, 1));
    let wk = (8 / wn).min(p.k.div_ceil(32)).max(1);
    let mut t = MmaTiling {
        tn,
        wn,
        wk,
        // Warps that own all of K keep 3 units in flight, K-split warps 2 (measured fastest
        // at the 8B shapes, bench/NOTES.md).
        unroll: if wk == 1 { 3 } else { 2 },
        feed: Feed::Prefetch,
        ks: 1,
    };
    while t.wk > 1 && red_bytes(p, &t) > RED_SMEM_MAX {
        t.wk /= 2;
    }
    t
}

/// Whether `t` is valid for `p` and its block fits `target`'s shared memory (static +
/// dynamic): the candidates of the staged splits.
pub fn fits(p: &GemvParams, t: &MmaTiling, target: &Target) -> bool {
    validate(p, t).is_ok() && block_smem_bytes(p, t) <= target.smem_per_block as u64
}

/// Above 8 rows where x arrives normalised and K is whole 64-k chunks: weights and x as
/// tensor-map boxes ([`Feed::Tma`]), 8 consumer warps (4 for gate/up: 128 weight rows per
/// stage either way), 4 stages (fewer where `target`'s blocks have less shared memory), K
/// split across the fewest blocks (1, 2, 4, 8) that reach [`wide_min_blocks`] (measured
/// fastest at the 8B shapes, bench/NOTES.md). `None` where no such split fits (the x-staged
/// splits then).
fn wide_tma_tiling(p: &GemvParams, target: &Target) -> Option<MmaTiling> {
    let row_tiles = fixed_row_tiles(p);
    let split = |ks, stages| MmaTiling {
        tn: 1,
        wn: 8 / mats(p),
        wk: 1,
        unroll: 1,
        feed: Feed::Tma { stages },
        ks,
    };
    let stages = (2..=4).rev().find(|&s| fits(p, &split(1, s), target))?;
    let valid: Vec<MmaTiling> = [1, 2, 4, 8]
        .into_iter()
        .map(|ks| split(ks, stages))
        .filter(|t| fits(p, t, target))
        .collect();
    let blocks = |t: &MmaTiling| p.n.div_ceil(16 * t.wn) as u64 * row_tiles * t.ks as u64;
    let min_blocks = wide_min_blocks(target);
    valid
        .iter()
        .copied()
        .find(|t| blocks(t) >= min_blocks)
        .or(valid.last().copied())
}

/// Above 8 rows where x arrives normalised and whole chunks tile K: x rows staged by the
/// copy engine in 2 stages, weights prefetched into registers ([`Feed::XBulk`]), one
/// 16-column tile per warp. The first of these that reaches [`wide_min_blocks`] blocks (and
/// fits; where none does, small models, the fitting one with the most blocks): 8 warps
/// across N owning all of K 8 units deep; the same with K split across 2 or 4 blocks where
/// each split keeps more than 64 units (long K); 4 × 2 warps 8 units deep; 2 × 4 warps 4
/// units deep; K split across blocks with 8-unit chunks where the 16-unit ones exceed the
/// block's shared memory (each the fastest of its sweep at the 8B shapes, bench/NOTES.md).
/// Only splits whose block fits `target.smem_per_block` (static + dynamic) are candidates:
/// at M = 64 the 16-unit rings need 139 KiB.
fn wide_xbulk_tiling(p: &GemvParams, target: &Target) -> Option<MmaTiling> {
    let tiles = p.n.div_ceil(16) as u64;
    let row_tiles = fixed_row_tiles(p);
    let blocks = |wn: u32, ks: u32| tiles.div_ceil(wn as u64) * row_tiles * ks as u64;
    let split = |wn, wk, unroll, ks| MmaTiling {
        tn: 1,
        wn,
        wk,
        unroll,
        feed: Feed::XBulk { stages: 2 },
        ks,
    };
    let units = p.k / 32;
    let mut candidates = vec![split(8, 1, 8, 1)];
    candidates.extend(
        [2, 4]
            .into_iter()
            .filter(|&ks| units / ks > 64)
            .map(|ks| split(8, 1, 8, ks)),
    );
    candidates.extend([split(4, 2, 8, 1), split(2, 4, 4, 1)]);
    // Where the 16-unit chunks above do not fit (a 99 KiB block at 64 rows): K split across
    // blocks with 8-unit chunks (74 KiB).
    candidates.extend(
        [2, 4]
            .into_iter()
            .filter(|&ks| units / ks <= 64)
            .map(|ks| split(8, 1, 8, ks)),
    );
    let valid: Vec<MmaTiling> = candidates
        .into_iter()
        .filter(|t| fits(p, t, target))
        .collect();
    let most_blocks = valid.iter().copied().max_by_key(|t| blocks(t.wn, t.ks));
    let min_blocks = wide_min_blocks(target);
    valid
        .into_iter()
        .find(|t| blocks(t.wn, t.ks) >= min_blocks)
        .or(most_blocks)
}

/// Shared memory one block of the kernel uses, static and dynamic, with 1 KiB of slack for
/// the compiler's own and alignment.
pub fn block_smem_bytes(p: &GemvParams, t: &MmaTiling) -> u64 {
    let inv_rms = if p.norm.is_some() {
        p.row_tile as u64 * 4
    } else {
        0
    };
    let cand = if p.argmax_partials.is_some() {
        (t.wn * mt8(p) * 8 * 8) as u64
    } else {
        0
    };
    let barriers = match t.feed {
        Feed::Bulk { stages } | Feed::XBulk { stages } => stages as u64 * 8,
        Feed::Tma { stages } => stages as u64 * 16,
        _ => 0,
    };
    staged_bytes(p, t) + red_bytes(p, t) + inv_rms + cand + barriers + 1024
}

/// Argmax partials each row gets (the grid's x extent).
pub fn partials_per_row(p: &GemvParams, t: &MmaTiling) -> u32 {
    p.n.div_ceil(16 * t.tn * t.wn)
}

/// Whether `t` is a valid work split for `p` (what [`gemv_mma_split`] checks first). No
/// device fact enters: whether the block's shared memory ([`block_smem_bytes`]) fits a
/// device is [`fits`], which every choice of a staged split asks, and a launch beyond the
/// device's opt-in fails when the runtime loads it.
pub fn validate(p: &GemvParams, t: &MmaTiling) -> Result<(), Error> {
    p.validate()?;
    let err = |field, reason: &str| Err(Error::param(FAMILY, field, reason));
    // Any row tile works (M = 1 pads to 8 like the rest); `supports` decides where the
    // plan uses it.
    if p.w_dtype != p.x.dtype || !matches!(p.w_dtype, Dtype::BF16 | Dtype::F16) {
        return err("w_dtype", "needs bf16 or f16 weights of x's dtype");
    }
    if !p.x.aligned(16) {
        return err("x", "rows must be 16-byte aligned");
    }
    if matches!(t.feed, Feed::Smem { stages } | Feed::Bulk { stages } | Feed::XBulk { stages } | Feed::Tma { stages } if stages < 2)
    {
        return err("tiling", "a staged ring needs at least 2 stages");
    }
    if let Feed::Bulk { .. } | Feed::XBulk { .. } = t.feed {
        if p.norm.is_some() {
            return err(
                "norm",
                "the bulk-copy feeds stage x as stored: no fused norm",
            );
        }
        if !bulk::chunks_cover_k(p.k, t.ks, t.wk * t.unroll) {
            return err(
                "k",
                "the bulk-copy feeds need K / 32 to be a multiple of ks · wk · unroll",
            );
        }
    }
    if let Feed::Tma { .. } = t.feed {
        if p.norm.is_some() {
            return err(
                "norm",
                "the tensor-map feed copies x as stored: no fused norm",
            );
        }
        if let Some(why) = tma::unsupported(p, t) {
            return err("tiling", why);
        }
    }
    if t.tn == 0 || t.wn == 0 || t.wk == 0 || t.unroll == 0 || t.ks == 0 || t.threads() > 1024 {
        return err(
            "tiling",
            "tn, wn, wk, unroll, ks positive and at most 32 warps",
        );
    }
    if red_bytes(p, t) > RED_SMEM_MAX {
        return err(
            "tiling",
            "split-K reduction exceeds its shared memory budget",
        );
    }
    if block_smem_bytes(p, t) > u32::MAX as u64 {
        return err(
            "tiling",
            "shared memory beyond a launch's 32-bit byte count",
        );
    }
    if let Some(r) = &p.rope {
        r.validate(FAMILY, p.n, ROPE_PAIR_STRIDE)?;
    }
    Ok(())
}

/// Generates the kernel with the [`tiling`] for `target` (an error where it splits K
/// across blocks: use [`select`] with scratch).
pub fn gemv_mma(p: &GemvParams, target: &Target) -> Result<KernelSource, Error> {
    gemv_mma_split(p, &tiling(p, target), None)
}

/// The kernel with the [`tiling`] for `target` over at most `rows` rows, its split-K
/// scratch (partials, then zeroed counters) taken from `alloc(bytes)`.
pub fn gemv_mma_alloc(
    p: &GemvParams,
    rows: u32,
    target: &Target,
    mut alloc: impl FnMut(u64) -> Loc,
) -> Result<KernelSource, Error> {
    let t = tiling(p, target);
    let split = split_needs(p, &t, rows).map(|nd| SplitScratch {
        partials: alloc(nd.partial_bytes),
        counters: alloc(nd.counters as u64 * 4),
        tiles: nd.counters,
    });
    gemv_mma_split(p, &t, split)
}

/// Generates the kernel with an explicit work split without split-K scratch.
pub fn gemv_mma_tiled(p: &GemvParams, t: &MmaTiling) -> Result<KernelSource, Error> {
    gemv_mma_split(p, t, None)
}

/// Generates the kernel with an explicit work split (benchmarks sweep it); `split` is
/// required exactly when `t.ks > 1`.
pub fn gemv_mma_split(
    p: &GemvParams,
    t: &MmaTiling,
    split: Option<SplitScratch>,
) -> Result<KernelSource, Error> {
    validate(p, t)?;
    if (t.ks > 1) != split.is_some() {
        return Err(Error::param(
            FAMILY,
            "split",
            "split-K scratch is required exactly when ks > 1",
        ));
    }
    let (xt, wt) = (p.x.dtype.c_type(), p.w_dtype.c_type());
    let g = mats(p);
    let family = if p.rope.is_some() {
        "gemv_mma_rope"
    } else {
        FAMILY
    };
    let mut kb = KernelBuilder::new(family, p.w_dtype);
    let tma_feed = matches!(t.feed, Feed::Tma { .. });
    let bulk_feed = tma_feed || matches!(t.feed, Feed::Bulk { .. } | Feed::XBulk { .. });
    if bulk_feed || matches!(t.feed, Feed::Smem { .. }) {
        kb.items.line(crate::CP_ASYNC_ITEMS.trim_end());
    }
    if bulk_feed {
        kb.items.line(BULK_HELPERS.trim_end());
    }
    if tma_feed {
        kb.items.line(TMA_HELPERS.trim_end());
        kb.items.line(FRAGMENT_HELPERS.trim_end());
    }
    kb.items.line(MMA_HELPERS.trim_end());
    if let Some(r) = &p.rope {
        qkv_rope::emit_items(&mut kb.items, r, ROPE_PAIR_STRIDE);
    }
    let w = &mut kb.body;

    emit!(w, "constexpr int K = {};", p.k);
    emit!(w, "constexpr int N = {};", p.n);
    emit!(w, "constexpr int MT = {};  // row tile", p.row_tile);
    emit!(w, "constexpr int MT8 = {};  // 8-row x fragments", mt8(p));
    emit!(
        w,
        "constexpr int TN = {};  // 16-column tiles per warp",
        t.tn
    );
    emit!(w, "constexpr int G = {g};  // matrices: 2 for gate and up");
    w.line("constexpr int AT = TN * G;  // weight tiles per warp");
    emit!(w, "constexpr int WN = {};  // warps across N", t.wn);
    emit!(
        w,
        "constexpr int WK = {};  // warps across K (split-K)",
        t.wk
    );
    w.line("constexpr int NW = WN * WK;");
    emit!(
        w,
        "constexpr int U = {};  // units in flight per warp",
        t.unroll
    );
    w.line("constexpr int UNITS = (K + 31) / 32;  // units of 32 k");
    emit!(w, "constexpr int KS = {};  // K splits across blocks", t.ks);
    w.line("constexpr int UPS = (UNITS + KS - 1) / KS;  // units per split");
    w.line("const int ub = blockIdx.z * UPS;  // this split's units: [ub, ue)");
    w.line("const int ue = min(UNITS, ub + UPS);");
    emit!(w, "constexpr int VW = {};", 16 / p.x.dtype.size());
    if p.norm.is_some() {
        w.line("__shared__ float inv_rms[MT];");
    }
    if t.wk > 1 {
        w.line("__shared__ float red[(WK - 1) * WN][MT8 * 4][32];");
    }
    if p.argmax_partials.is_some() {
        w.line("__shared__ ArgmaxPair cand[WN][MT8 * 8];");
    }
    w.line("const int lane = threadIdx.x & 31;");
    w.line("const int warp = threadIdx.x >> 5;");
    w.line("const int g = lane >> 2;");
    w.line("const int t = lane & 3;");
    w.line("const int wn = warp % WN;");
    w.line("const int wk = warp / WN;");
    w.line("const int m0 = blockIdx.y * MT;");
    emit!(w, "const int mr = min(MT, {} - m0);", p.rows.expr());
    w.line("const int nb = (blockIdx.x * WN + wn) * (16 * TN);  // the warp's first column");
    emit!(w, "const {xt}* x = {};", p.x.loc.ptr(p.x.dtype, false));
    let (w0, w1) = match p.weights {
        GemvWeights::Single(l) => (l, None),
        GemvWeights::GateUp { gate, up } => (gate, Some(up)),
    };
    emit!(w, "const {wt}* w0 = {};", w0.ptr(p.w_dtype, false));
    if let Some(up) = w1 {
        emit!(w, "const {wt}* w1 = {};", up.ptr(p.w_dtype, false));
    }
    w.comment("this lane's 8 k of token row g and of weight row nb + g (rows beyond the tile or N are never loaded)");
    emit!(
        w,
        "const {xt}* xg = x + (long long)(m0 + g) * {} + 8 * t;",
        p.x.row_stride
    );
    if p.rope.is_some() {
        w.comment("weight rows of the q|k|v features slots nb + 16 * tn + 8 * h + g compute");
        w.line("long long wrow[TN][2];");
        w.for_unrolled("tn", 0, "TN", |w| {
            w.for_unrolled("h", 0, 2, |w| {
                emit!(
                    w,
                    "wrow[tn][h] = (long long){} * K + 8 * t;",
                    weight_row(p, "min(nb + 16 * tn + 8 * h + g, N - 1)")
                );
            });
        });
    } else {
        w.line("const long long wrow = (long long)(nb + g) * K + 8 * t;");
    }
    if let Some(nm) = &p.norm {
        emit!(
            w,
            "const {}* nw = {};",
            nm.dtype.c_type(),
            nm.weight.ptr(nm.dtype, false)
        );
    }
    let mma = match p.w_dtype {
        Dtype::F16 => "mma_k32_f16",
        _ => "mma_k32_bf16",
    };
    match t.feed {
        Feed::Smem { stages } => feed::emit_smem_main_loop(w, p, stages, mma),
        Feed::Bulk { stages } => bulk::emit_bulk_main_loop(w, p, stages, mma),
        Feed::XBulk { stages } => bulk::emit_xbulk_main_loop(w, p, t, stages, mma),
        Feed::Tma { stages } => {
            let k16 = match p.w_dtype {
                Dtype::F16 => "mma16816_f16",
                _ => "mma16816_bf16",
            };
            tma::emit_tma_main_loop(w, p, t, stages, k16)
        }
        Feed::Prefetch | Feed::XAtUse => feed::emit_register_main_loop(w, p, t, mma),
    }

    if t.wk > 1 {
        reduce::emit_warp_reduction(w);
    }

    if let Some(sc) = split {
        reduce::emit_split_k_fixup(w, sc);
    }
    epilogue::emit(w, p);

    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(partials_per_row(p, t)),
            p.rows.extent(1, p.row_tile),
            Extent::Fixed(t.ks),
        ],
        block: [t.threads(), 1, 1],
        smem_bytes: staged_bytes(p, t) as u32,
    };
    Ok(kb.finish(launch))
}

/// `body` once per accumulator `acc[a][mt][d]` (unrolled loops over `a`, `mt`, `d`).
pub(super) fn for_each_acc(w: &mut Writer, body: impl Fn(&mut Writer)) {
    w.for_unrolled("a", 0, "AT", |w| {
        w.for_unrolled("mt", 0, "MT8", |w| {
            w.for_unrolled("d", 0, 4, |w| body(w));
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{Loc, Rows, View};
    use specc_ir::engine::Arch;

    /// The H200-class build target (132 SMs, 227 KiB per block).
    fn hopper() -> Target {
        Target::for_archs(&[Arch::Sm90a])
    }

    fn params(m: u32, k: u32, n: u32, gate_up: bool, dt: Dtype) -> GemvParams {
        GemvParams {
            rows: Rows::Tokens,
            row_tile: m,
            k,
            n,
            x: View::new(Loc::arena(0), dt, k as u64),
            weights: if gate_up {
                GemvWeights::gate_up_concat(Loc::table(0), n, k, dt)
            } else {
                GemvWeights::Single(Loc::table(0))
            },
            w_dtype: dt,
            norm: None,
            residual: None,
            out: Some(View::new(Loc::arena(1 << 20), dt, n as u64)),
            argmax_partials: None,
            rope: None,
        }
    }

    #[test]
    fn select_uses_tensor_cores_for_several_rows_of_16_bit_operands() {
        let name = |p: &GemvParams| select(p, None, &hopper()).unwrap().name;
        assert!(name(&params(8, 256, 512, false, Dtype::BF16)).starts_with("gemv_mma_bf16_"));
        assert!(name(&params(2, 256, 512, true, Dtype::F16)).starts_with("gemv_mma_f16_"));
        // One row: tensor cores for a plain (or residual) projection, CUDA cores for a normed
        // single projection and for argmax partials (measured; see `one_row_prefers_mma`).
        assert!(name(&params(1, 256, 512, false, Dtype::BF16)).starts_with("gemv_mma_bf16_"));
        let mut normed = params(1, 256, 512, false, Dtype::BF16);
        normed.norm = Some(crate::gemv::RmsNormPrologue {
            weight: Loc::table(2),
            dtype: Dtype::BF16,
            eps: 1e-5,
        });
        assert!(name(&normed).starts_with("gemv_bf16_"));
        let mut lm_head = params(1, 256, 512, false, Dtype::BF16);
        lm_head.argmax_partials = Some(Loc::arena(1 << 22));
        assert!(name(&lm_head).starts_with("gemv_bf16_"));
        assert!(name(&params(8, 256, 512, false, Dtype::F32)).starts_with("gemv_f32_"));
        let mut mixed = params(8, 256, 512, false, Dtype::BF16);
        mixed.x.dtype = Dtype::F32;
        assert!(!supports(&mixed));
        assert!(gemv_mma(&mixed, &hopper()).is_err());
    }

    /// The row policy (measured, see [`NORM_FUSED_MAX_ROWS`]): up to 8 rows the register
    /// prefetch split with the norm fused; from 9 rows (verify of 16 tokens, DFlash blocks) the
    /// tensor-map split that the 64-row verify uses, at the 8B shapes.
    #[test]
    fn row_tiles_above_8_take_the_tensor_map_split() {
        for (k, n, gu) in [
            (4096, 6144, false),
            (4096, 14336, true),
            (14336, 4096, false),
        ] {
            for m in [1, 2, 8] {
                let t = tiling(&params(m, k, n, gu, Dtype::BF16), &hopper());
                assert_eq!(t.feed, Feed::Prefetch, "M={m} K={k} N={n}");
            }
            for m in [9, 16, 32, 64] {
                let t = tiling(&params(m, k, n, gu, Dtype::BF16), &hopper());
                assert!(
                    matches!(t.feed, Feed::Tma { stages: 4 }),
                    "M={m} K={k} N={n}: {t:?}"
                );
            }
        }
    }

    /// Every default tiling covers N with its grid, fits its reduction in shared memory and
    /// its block in 8 warps, for the Llama-3.1-8B shapes and odd ones at every row tile.
    #[test]
    fn default_tilings_cover_n_and_fit() {
        let shapes = [
            (4096, 6144, false),
            (4096, 4096, false),
            (4096, 14336, true),
            (14336, 4096, false),
            (4096, 128256, false),
            (136, 40, false),
            (8, 8, true),
        ];
        for m in 1..=64 {
            for (k, n, gu) in shapes {
                let p = params(m, k, n, gu, Dtype::BF16);
                let t = tiling(&p, &hopper());
                let label = format!("M={m} K={k} N={n} {t:?}");
                assert!(t.warps() <= 8 && t.wk >= 1, "{label}");
                assert!(red_bytes(&p, &t) <= RED_SMEM_MAX, "{label}");
                assert!(partials_per_row(&p, &t) * 16 * t.tn * t.wn >= n, "{label}");
                let split = split_needs(&p, &t, m).map(|nd| SplitScratch {
                    partials: Loc::arena(1 << 24),
                    counters: Loc::arena(1 << 23),
                    tiles: nd.counters,
                });
                let k = gemv_mma_split(&p, &t, split).unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_eq!(k.launch.threads(), t.threads(), "{label}");
                assert!(fits(&p, &t, &hopper()), "{label}");
            }
        }
    }

    /// The tensor-map defaults at the 8B shapes and 64 rows (x normalised beforehand): the
    /// measured H200 choices, which also fit sm_120's 99 KiB; where
    /// K is not whole 64-k chunks or no ring fits, a split of another feed.
    #[test]
    fn wide_defaults_fit_the_block_budget() {
        let hopper = hopper();
        // The same SMs with sm_120's 99 KiB per block: only the budget differs.
        let sm120 = Target {
            smem_per_block: Arch::Sm120.max_smem_per_block(),
            ..hopper.clone()
        };
        // (wn, ks, stages) within 227 KiB and within 99 KiB.
        let shapes = [
            ("qkv", 4096, 6144, false, (8, 2, 4), (8, 2, 4)),
            ("o", 4096, 4096, false, (8, 4, 4), (8, 4, 4)),
            ("gate_up", 4096, 14336, true, (4, 1, 4), (4, 1, 4)),
            ("down", 14336, 4096, false, (8, 4, 4), (8, 4, 4)),
            ("lm_head", 4096, 128256, false, (8, 1, 4), (8, 1, 4)),
        ];
        for (label, k, n, gu, on_hopper, on_sm120) in shapes {
            let p = params(64, k, n, gu, Dtype::BF16);
            for (target, want) in [(&hopper, on_hopper), (&sm120, on_sm120)] {
                let budget = target.smem_per_block;
                let t = tiling(&p, target);
                let Feed::Tma { stages } = t.feed else {
                    panic!("{label}: {t:?}")
                };
                assert_eq!((t.wn, t.ks, stages), want, "{label} within {budget}");
                assert_eq!((t.tn, t.wk), (1, 1), "{label}");
                assert!(block_smem_bytes(&p, &t) <= budget as u64, "{label}: {t:?}");
            }
        }
        let small = Target {
            smem_per_block: 48 * 1024,
            ..hopper.clone()
        };
        for (k, target) in [(4128, &hopper), (4096, &small)] {
            let budget = target.smem_per_block;
            let p = params(64, k, 4096, false, Dtype::BF16);
            let t = tiling(&p, target);
            assert!(
                !matches!(t.feed, Feed::Tma { .. }),
                "K={k} within {budget}: {t:?}"
            );
            assert!(validate(&p, &t).is_ok() && block_smem_bytes(&p, &t) <= budget as u64);
        }
    }

    /// The block-count heuristics aim at the target's SMs: with half the H200's, the q|k|v
    /// projection at 8 rows already has 2 blocks per SM with two column tiles per warp, and
    /// the 64-row down projection reaches its block count with K split 2 ways, not 4.
    #[test]
    fn tilings_follow_the_targets_sms() {
        let half = Target {
            sms: 66,
            ..hopper()
        };
        let qkv = params(8, 4096, 6144, false, Dtype::BF16);
        assert_eq!(tiling(&qkv, &hopper()).tn, 1);
        assert_eq!(tiling(&qkv, &half).tn, 2);
        let down = params(64, 14336, 4096, false, Dtype::BF16);
        assert_eq!(tiling(&down, &hopper()).ks, 4);
        assert_eq!(tiling(&down, &half).ks, 2);
    }

    #[test]
    fn explicit_tilings_are_validated() {
        let p = params(64, 4096, 4096, false, Dtype::BF16);
        let bad = MmaTiling {
            tn: 2,
            wn: 4,
            wk: 8,
            unroll: 2,
            feed: Feed::XAtUse,
            ks: 1,
        };
        assert!(gemv_mma_tiled(&p, &bad).is_err(), "reduction over budget");
        let zero = MmaTiling { unroll: 0, ..bad };
        assert!(gemv_mma_tiled(&p, &zero).is_err());
        assert!(gemv_mma_tiled(&p, &MmaTiling { wn: 1, ..bad }).is_ok());
    }
}
