//! `gemv_mma`: the small-M matmul `y[M, N] = x[M, K] · W[N, K]ᵀ` on tensor cores
//! (`mma.sync.aligned.m16n8k16`, bf16 or f16 operands, f32 accumulation), for row tiles of
//! 2..=64 token rows. Same parameters, fusions, numerics and argmax-partials layout as
//! [`crate::gemv`] (the epilogue code is shared); the build picks it in `specc_codegen::choose::matmul`.
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
//! weight dtype. Here: the resources of a work split and the kernel's frame (which split
//! to use is `specc_codegen::choose::matmul`'s); `feed` emits
//! the unit loop (how operands reach the mma steps), `reduce` the split-K reductions,
//! `epilogue` the per-element epilogues.

use crate::abi::{Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec, Loc};
use crate::gemv::{weight_row, GemvParams, GemvWeights};
use crate::qkv_rope;
use crate::writer::{emit, Writer};
use crate::Error;
pub use specc_ir::engine::choice::{Feed, MmaTiling};

mod bulk;
mod epilogue;
mod feed;
mod reduce;
mod tma;

const FAMILY: &str = "gemv_mma";
/// Shared memory for one round of the split-K reduction: a static `__shared__` array, and
/// CUDA caps a block's static shared memory at 48 KiB on every arch (the rest is left to
/// `inv_rms` and the argmax candidates).
pub const RED_SMEM_MAX: u64 = 40 * 1024;
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

fn mt8(p: &GemvParams) -> u32 {
    p.row_tile.div_ceil(8)
}

/// Weight matrices one x fragment feeds (2 for the gate/up pair).
pub fn mats(p: &GemvParams) -> u32 {
    if p.gate_up() {
        2
    } else {
        1
    }
}

/// Bytes of one round (one weight tile's accumulators) of the split-K reduction.
pub fn red_bytes(p: &GemvParams, t: &MmaTiling) -> u64 {
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
/// device is `specc_codegen::choose::matmul::fits`, which every choice of a staged split
/// asks, and a launch beyond the device's opt-in fails when the runtime loads it.
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

/// The kernel with work split `t` over at most `rows` rows, its split-K scratch (partials,
/// then zeroed counters) taken from `alloc(bytes)`.
pub fn gemv_mma_alloc(
    p: &GemvParams,
    t: &MmaTiling,
    rows: u32,
    mut alloc: impl FnMut(u64) -> Loc,
) -> Result<KernelSource, Error> {
    let split = split_needs(p, t, rows).map(|nd| SplitScratch {
        partials: alloc(nd.partial_bytes),
        counters: alloc(nd.counters as u64 * 4),
        tiles: nd.counters,
    });
    gemv_mma_split(p, t, split)
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
    epilogue::emit(w, p, hoists_rope_cos_sin(p, t));

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

/// Whether the main loop computes the RoPE epilogue's cos / sin while its first loads are
/// in flight ([`epilogue::emit_rope_cos_sin`]): the register feeds at one 8-row fragment.
/// Wider tiles would hold `4 · TN · MT8` more registers across the loop (they spill at 64
/// rows), and the staged feeds issue their first loads from other code.
fn hoists_rope_cos_sin(p: &GemvParams, t: &MmaTiling) -> bool {
    p.rope.is_some() && matches!(t.feed, Feed::Prefetch | Feed::XAtUse) && mt8(p) == 1
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
    use crate::abi::Rows;
    fn params(m: u32, k: u32, n: u32, gate_up: bool, dt: Dtype) -> GemvParams {
        crate::gemv::test_projection(Rows::Tokens, m, k, n, gate_up, dt)
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
