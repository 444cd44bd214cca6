//! Where the tiled tensor-core GEMM (`gemm_mma`) replaces the GEMV kernels, and its tile;
//! the tile of its sm_90a variant (`gemm_wgmma`, [`wgmma_tile`]).
//!
//! Where it applies is measured (H200, 8B shapes, `kernels-gen/tests/gpu_gemm.rs` timing
//! both kernels, bench/NOTES.md); the tile rules are still predictions from bytes and block
//! counts.

use specc_ir::engine::choice::GemmTiling;
use specc_ir::engine::{Arch, Target};
use specc_kernels_gen::abi::Dtype;
use specc_kernels_gen::gemm_mma::{block_smem_bytes, validate, BK};
use specc_kernels_gen::gemm_wgmma::{self as wgmma, WgmmaTiling};
use specc_kernels_gen::gemv::GemvParams;

/// Launches of at least this many rows use the GEMM, for weights of at least
/// [`GEMM_MIN_COLUMNS`] output columns: there the GEMM's one pass over the weights for all
/// rows beats `gemv_mma` re-reading them per 64-row tile. Below it, and on the narrow
/// projections (o, q|k|v, down) at every row count, `gemv_mma` measured as fast or faster:
/// its register feeds keep more weight bytes in flight per block than the GEMM's mma.sync
/// main loop (the 8B shapes on the H200, bench/NOTES.md, "Tiled GEMM" of session 30).
pub const GEMM_MIN_ROWS: u32 = 128;

/// See [`GEMM_MIN_ROWS`].
pub const GEMM_MIN_COLUMNS: u32 = 8192;

/// The most ring stages: enough weight bytes in flight for the memory-bound tiles of 32
/// rows (7 steps of 32 columns × 128 bytes = 28 KiB per block, about one block per SM),
/// beyond which latency is hidden and shared memory only limits blocks per SM.
pub const MAX_STAGES: u32 = 8;

/// Blocks a launch aims at: at least 8 of every 11 SMs of `target` (the count the
/// `gemv_mma` tensor-map splits measured best at: 96 on the 132-SM H200).
fn min_blocks(target: &Target) -> u64 {
    (target.sms as u64 * 8).div_ceil(11)
}

/// The GEMM's tile for `p` over at most `rows` rows on `target` where the selection picks
/// the GEMM (from [`GEMM_MIN_ROWS`] rows and [`GEMM_MIN_COLUMNS`] columns), else `None`.
pub fn tiling(p: &GemvParams, rows: u32, target: &Target) -> Option<GemmTiling> {
    if rows < GEMM_MIN_ROWS || p.n < GEMM_MIN_COLUMNS {
        return None;
    }
    tile(p, rows, target)
}

/// The GEMM's tile for `p` over at most `rows` rows on `target` (any row count: the
/// kernel's tests and timings use it below the selection's thresholds too), or `None`
/// where the GEMM does not apply (a fused norm or RoPE, operands it does not take, or no
/// ring of 2 stages fits the block's shared memory).
///
/// - `bm`: the rows rounded up to 32, 64 or 128 (one row tile up to 128 rows, so each
///   weight tile is read once), 128 above.
/// - `bn`: the widest of 128, 64, 32, 16 columns whose grid reaches [`min_blocks`] (every
///   SM streams; wider tiles move fewer x bytes per weight byte); 16 where none does.
/// - warps: up to 4 across the columns (16 columns each at least), up to 8 in all.
/// - stages: the most, up to [`MAX_STAGES`], that fit `target.smem_per_block`.
///
/// Batch invariance does not depend on this choice: the kernel's K order is fixed
/// whatever the tile (see `specc_kernels_gen::gemm_mma`), and no split of K is chosen.
pub fn tile(p: &GemvParams, rows: u32, target: &Target) -> Option<GemmTiling> {
    let bm = match rows {
        ..=32 => 32,
        33..=64 => 64,
        _ => 128,
    };
    let row_tiles = rows.div_ceil(bm) as u64;
    let bn = [128u32, 64, 32, 16]
        .into_iter()
        .find(|&bn| row_tiles * p.n.div_ceil(bn) as u64 >= min_blocks(target))
        .unwrap_or(16);
    let wn = (bn / 16).min(4);
    let wm = (bm / 16).min(8 / wn);
    let at = |stages| GemmTiling {
        bm,
        bn,
        bk: BK,
        wm,
        wn,
        stages,
    };
    let t = (2..=MAX_STAGES).rev().map(at).find(|t| {
        validate(p, t).is_ok() && block_smem_bytes(p, t) <= target.smem_per_block as u64
    })?;
    Some(t)
}

/// The most ring stages of `gemm_wgmma`: 4–6 stages of 64 k keep 100+ KiB of weights and
/// x in flight per SM, past the latency of HBM at its bandwidth.
pub const WGMMA_MAX_STAGES: u32 = 6;

/// The rows and weight columns from which the wgmma GEMM replaces the kernels above on
/// sm_90a: from 128 rows it timed fastest of the three on the 8B shapes (all but `down` at
/// exactly 128 rows, within 10 %); at 64 rows a whole verify step ran no faster with it, at
/// 32 it loses (one 64-row tile). Figures: bench/NOTES.md, session 33, calls A and B.
pub const WGMMA_MIN_ROWS: u32 = 128;

/// See [`WGMMA_MIN_ROWS`].
pub const WGMMA_MIN_COLUMNS: u32 = 4096;

/// [`WGMMA_MIN_ROWS`], or `SPECC_WGMMA_MIN_ROWS` from the build's environment (the A/B of the
/// wgmma GEMM, its K split included, against `gemv_mma` at decode's 32–64 rows).
pub fn wgmma_min_rows() -> u32 {
    std::env::var("SPECC_WGMMA_MIN_ROWS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(WGMMA_MIN_ROWS)
}

/// Whether builds may choose the wgmma GEMM: on unless `SPECC_WGMMA=0` is in the
/// environment of the build (the A/B against `gemm_mma` is that one flag).
pub fn wgmma_enabled() -> bool {
    !std::env::var("SPECC_WGMMA").is_ok_and(|v| v == "0")
}

/// Blocks a wgmma launch aims at: [`min_blocks`], or `SPECC_WGMMA_MIN_BLOCKS` from the
/// build's environment (the A/B of wider column tiles on fewer SMs against narrower ones
/// re-reading the rows through L2).
fn wgmma_min_blocks(target: &Target) -> u64 {
    std::env::var("SPECC_WGMMA_MIN_BLOCKS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| min_blocks(target))
}

/// The wgmma GEMM's tile for `p` over at most `rows` rows where the thresholds
/// ([`WGMMA_MIN_ROWS`], [`WGMMA_MIN_COLUMNS`]) hold, else `None`.
pub fn wgmma_tiling(p: &GemvParams, rows: u32, target: &Target) -> Option<WgmmaTiling> {
    if rows < wgmma_min_rows() || p.n < WGMMA_MIN_COLUMNS {
        return None;
    }
    wgmma_tile(p, rows, target)
}

/// The wgmma GEMM's tile for `p` over at most `rows` rows on `target` (any row count: its
/// tests and timings use it below the thresholds too), or `None` where it does not apply:
/// a target that is not sm_90a only (wgmma exists on sm_90a alone; the other archs keep
/// `gemm_mma`), operands it does not take, or no ring of 2 stages in shared memory.
///
/// - `bm`: 64 rows (one consumer warpgroup) up to 64 rows, else 128 (two): 64-row tiles
///   above 64 rows, faster alone, made whole verify steps slower (bench/NOTES.md, session 45).
/// - `bn`: [`wave_columns`] (by default) or, with `SPECC_WGMMA_WAVES=0` in the build's
///   environment, the widest of 256, 128, 64, 32, 16 columns whose grid reaches
///   [`wgmma_min_blocks`] (16 where none does); either way `G · bn ≤ 256` (one wgmma per
///   matrix), at most 128 with a residual epilogue (whose loads do not fit beside 128
///   accumulators in the 168 registers ptxas gives the threads of a 288-thread block), and
///   at most N rounded up to 8.
/// - bf16 only: with f16 operands ptxas serialises the mma batches of this loop (its
///   C7514 "wgmma serialized" note, checked by `kernels-gen/tests/compile_gemm.rs`), so f16
///   keeps `gemm_mma`.
/// - stages: the most, up to [`WGMMA_MAX_STAGES`], that fit `target.smem_per_block`.
/// - cluster: [`wgmma_cluster`].
pub fn wgmma_tile(p: &GemvParams, rows: u32, target: &Target) -> Option<WgmmaTiling> {
    if target.archs != [Arch::Sm90a] || p.w_dtype != Dtype::BF16 {
        return None;
    }
    let bm = if rows <= 64 { 64 } else { 128 };
    let row_tiles = rows.div_ceil(bm) as u64;
    let g = wgmma::mats(p);
    let widest = if p.residual.is_some() {
        wgmma::MAX_MMA_N / 2
    } else {
        wgmma::MAX_MMA_N
    };
    if wgmma_waves_enabled() && wgmma_split_k_enabled() {
        if let Some(t) = split_k_tile(p, bm, row_tiles, widest / g, target) {
            return Some(t);
        }
    }
    let bn = if wgmma_waves_enabled() {
        wave_columns(p, bm, row_tiles, widest / g, target)
    } else {
        [256u32, 128, 64, 32, 16]
            .into_iter()
            .filter(|&bn| g * bn <= widest)
            .find(|&bn| row_tiles * p.n.div_ceil(bn) as u64 >= wgmma_min_blocks(target))
            .unwrap_or(16)
    }
    .min(p.n.next_multiple_of(8));
    let mut t = wgmma_ring(p, bm, bn, target)?;
    t.split_mats = wgmma_split_mats();
    t.hoisted_descriptors = wgmma_hoisted_descriptors();
    if wgmma_clusters_enabled() {
        t = wgmma_cluster(p, rows, t);
    }
    if wgmma_persistent_enabled() {
        t.persistent_blocks = persistent_blocks(p, rows, &t, target);
    }
    Some(t)
}

/// Whether builds issue the gate/up pair as one wgmma per matrix: only with
/// `SPECC_WGMMA_SPLIT_MATS=1` in the environment of the build (the A/B of the one wgmma over
/// both weight boxes).
pub fn wgmma_split_mats() -> bool {
    std::env::var("SPECC_WGMMA_SPLIT_MATS").is_ok_and(|v| v == "1")
}

/// Whether builds generate the wgmma main loop with descriptors made once per block and the
/// ring's stage and phase stepped (`WgmmaTiling::hoisted_descriptors`): on unless
/// `SPECC_WGMMA_HOIST=0` is in the environment of the build. Measured (bench/NOTES.md,
/// session 48, H100, alternating): whole verify(8) steps 5.6 % faster at B = 32 (11.09
/// against 11.75 ms) and 3.1 % at B = 64 (18.53 against 19.12).
pub fn wgmma_hoisted_descriptors() -> bool {
    !std::env::var("SPECC_WGMMA_HOIST").is_ok_and(|v| v == "0")
}

/// Whether builds make wgmma launches persistent ([`persistent_blocks`]): on unless
/// `SPECC_WGMMA_PERSISTENT=0` is in the environment of the build (the A/B).
pub fn wgmma_persistent_enabled() -> bool {
    !std::env::var("SPECC_WGMMA_PERSISTENT").is_ok_and(|v| v == "0")
}

/// Blocks of a persistent launch of tile `t` over at most `rows` rows: one per SM (whole
/// clusters of 2) where the one-block grid would take between one and two waves, else 0
/// (one block per tile). Persistent blocks overlap a tile's epilogue and the next tile's
/// first copies, which a block per tile cannot (one block fills an SM's shared memory).
/// Persistent launches timed faster at about two tiles a block and slower at about four
/// (bench/NOTES.md, session 46), so more than two tiles a block stay one block per tile, as
/// do single waves (nothing to overlap; the one-block grid also prefetches its first weight
/// boxes into L2), clusters of 4 (whose co-resident count depends on how the GPCs' SMs divide
/// by 4) and column clusters.
pub fn persistent_blocks(p: &GemvParams, rows: u32, t: &WgmmaTiling, target: &Target) -> u32 {
    if t.cluster_n != 1 || t.cluster_m > 2 {
        return 0;
    }
    let cm = t.cluster_m;
    let units = rows.div_ceil(t.bm).div_ceil(cm) * wgmma::partials_per_row(p, t);
    let slots = target.sms / cm;
    if units <= slots || units > 2 * slots {
        return 0;
    }
    slots * cm
}

/// Whether builds may split K over a cluster ([`split_k_tile`]): only with
/// `SPECC_WGMMA_SPLIT_K=1` in the environment of the build. Measured (bench/NOTES.md,
/// session 47, H100): whole verify(8) steps 0.6 % faster at B = 32 and 15 % slower at B = 16
/// with the splits this rule picks, so the selection leaves K unsplit.
pub fn wgmma_split_k_enabled() -> bool {
    std::env::var("SPECC_WGMMA_SPLIT_K").is_ok_and(|v| v == "1")
}

/// A split K must cost at most this fraction (numerator, denominator) of the best unsplit
/// tile: the model leaves out the split's cluster barriers and its blocks' extra ring fills.
pub const SPLIT_K_GAIN: (u64, u64) = (9, 10);

/// The tile with K split over a cluster of 2 or 4 blocks where that loads fewer box bytes
/// into the busiest SM than every unsplit column tile (by [`SPLIT_K_GAIN`]), else `None`. The cost of `(bn, s)`
/// extends [`wave_columns`]'s to the chunks a block runs: `⌈blocks · s / SMs⌉` waves ×
/// (`(bm + G · bn)` box rows × `⌈KT / s⌉` chunks + the `(s − 1)` slots of `bm / s × G·bn` f32
/// partial sums each block receives, in 128-byte rows). Where few row tiles leave few column
/// tiles of a wide `bn` per SM (`down` and `o` at 128–256 rows: 128 columns split 4 or 2
/// ways instead of 64- or 32-column tiles re-reading x across the whole K), the split loads
/// a third fewer bytes; from about one wave of wide unsplit tiles (512 rows) it never wins.
pub fn split_k_tile(
    p: &GemvParams,
    bm: u32,
    row_tiles: u64,
    widest: u32,
    target: &Target,
) -> Option<WgmmaTiling> {
    let g = wgmma::mats(p) as u64;
    let sms = (target.sms as u64).max(1);
    let kt = p.k.div_ceil(wgmma::BK) as u64;
    let cost = |bn: u32, s: u32| {
        let blocks = row_tiles * p.n.div_ceil(bn) as u64 * s as u64;
        let box_rows = bm as u64 + g * bn as u64;
        let slot_rows = (s as u64 - 1) * (bm / s) as u64 * g * bn as u64 * 4 / 128;
        blocks.div_ceil(sms) * (box_rows * kt.div_ceil(s as u64) + slot_rows)
    };
    let unsplit = (2..=widest / 16)
        .map(|i| cost(16 * i, 1))
        .min()
        .unwrap_or(u64::MAX);
    let mut splits: Vec<(u32, u32)> = [2u32, 4]
        .into_iter()
        .flat_map(|s| (2..=widest / 16).map(move |i| (16 * i, s)))
        .filter(|&(bn, s)| {
            cost(bn, s) * SPLIT_K_GAIN.1 < unsplit * SPLIT_K_GAIN.0 && bn <= p.n.next_multiple_of(8)
        })
        .collect();
    splits.sort_by_key(|&(bn, s)| (cost(bn, s), std::cmp::Reverse(bn), s));
    splits.into_iter().find_map(|(bn, split_k)| {
        let t = WgmmaTiling {
            split_k,
            split_mats: wgmma_split_mats(),
            hoisted_descriptors: wgmma_hoisted_descriptors(),
            ..wgmma_ring(p, bm, bn, target)?
        };
        wgmma::validate(p, &t).is_ok().then_some(t)
    })
}

/// Whether builds choose the wgmma column tile by waves ([`wave_columns`]): on unless
/// `SPECC_WGMMA_WAVES=0` is in the environment of the build (the A/B against the widest
/// tile reaching [`wgmma_min_blocks`]).
pub fn wgmma_waves_enabled() -> bool {
    !std::env::var("SPECC_WGMMA_WAVES").is_ok_and(|v| v == "0")
}

/// The column tile, a multiple of 16 from 32 to `widest`, that moves the fewest bytes into
/// the busiest SM: `⌈blocks / SMs⌉` waves × the `bm + G · bn` box rows each block loads per
/// K chunk (the wider of equals). A grid of 1.7 waves pays for two, and one short of the
/// SMs leaves their share of the streaming unused: so q|k|v takes 96 columns at 256 rows
/// (128 blocks) rather than 128 (96 blocks), and gate/up 112 (128 column tiles, whole
/// waves) rather than 128 (112 tiles, 3.4 waves at 512 rows). The timings behind it:
/// bench/NOTES.md, session 46.
pub fn wave_columns(p: &GemvParams, bm: u32, row_tiles: u64, widest: u32, target: &Target) -> u32 {
    let g = wgmma::mats(p) as u64;
    let sms = (target.sms as u64).max(1);
    let busiest = |bn: u32| {
        let blocks = row_tiles * p.n.div_ceil(bn) as u64;
        blocks.div_ceil(sms) * (bm as u64 + g * bn as u64)
    };
    (2..=widest / 16)
        .map(|i| 16 * i)
        .min_by_key(|&bn| (busiest(bn), std::cmp::Reverse(bn)))
        .unwrap_or(16)
}

/// Whether builds may run wgmma tiles as clusters: on unless `SPECC_WGMMA_CLUSTER=0` is in
/// the environment of the build (the A/B of the multicast boxes is that one flag).
pub fn wgmma_clusters_enabled() -> bool {
    !std::env::var("SPECC_WGMMA_CLUSTER").is_ok_and(|v| v == "0")
}

/// Row tiles from which a tile whose weight boxes are at least twice its x box runs as a
/// cluster of 4 (see [`wgmma_cluster`]).
pub const CLUSTER_MIN_ROW_TILES: u32 = 4;

/// `t` as a cluster of row tiles sharing its weight boxes by TMA multicast (each block loads
/// `1 / cluster_m` of them for all), where the weight boxes are larger than the x box
/// (`G · bn > bm`): 4 blocks where they are at least twice it and the row tiles are a
/// multiple of 4 (at least [`CLUSTER_MIN_ROW_TILES`]), else 2 where the row tiles are even
/// and the slices whole 8-row groups. Only there did sharing time faster; sharing x among
/// column tiles, or boxes no larger than x, timed equal or slower (bench/NOTES.md, sessions
/// 45 and 46).
pub fn wgmma_cluster(p: &GemvParams, rows: u32, t: WgmmaTiling) -> WgmmaTiling {
    let row_tiles = rows.div_ceil(t.bm);
    let weight_rows = wgmma::mats(p) * t.bn;
    if weight_rows <= t.bm || row_tiles < 2 {
        return t;
    }
    let mut sizes = Vec::new();
    if weight_rows >= 2 * t.bm && row_tiles >= CLUSTER_MIN_ROW_TILES && row_tiles.is_multiple_of(4)
    {
        sizes.push(4);
    }
    if row_tiles.is_multiple_of(2) {
        sizes.push(2);
    }
    sizes
        .into_iter()
        .map(|cluster_m| WgmmaTiling { cluster_m, ..t })
        .find(|c| wgmma::validate(p, c).is_ok())
        .unwrap_or(t)
}

/// The `bm × bn` wgmma tile with the most ring stages, up to [`WGMMA_MAX_STAGES`], that fit
/// `target.smem_per_block`, or `None` where the tile is invalid for `p` or no 2 stages fit
/// (also the tile sweep of the kernel's timing test).
pub fn wgmma_ring(p: &GemvParams, bm: u32, bn: u32, target: &Target) -> Option<WgmmaTiling> {
    (2..=WGMMA_MAX_STAGES)
        .rev()
        .map(|stages| WgmmaTiling::new(bm, bn, stages))
        .find(|t| {
            wgmma::validate(p, t).is_ok()
                && wgmma::block_smem_bytes(p, t) <= target.smem_per_block as u64
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (K, N, gate|up) of the Llama-3.1-8B projections and odd shapes the tiles must take.
    const SHAPES: [(u32, u32, bool); 8] = [
        (4096, 6144, false),
        (4096, 4096, false),
        (4096, 14336, true),
        (14336, 4096, false),
        (4096, 128256, false),
        (136, 40, false),
        (8, 8, true),
        (1000, 520, true),
    ];
    use specc_kernels_gen::abi::Loc;
    use specc_kernels_gen::gemm_mma::gemm_mma;
    use specc_kernels_gen::gemv::RmsNormPrologue;

    fn params(k: u32, n: u32, gate_up: bool) -> GemvParams {
        super::super::test_params(64, k, n, gate_up, Dtype::BF16)
    }

    fn hopper() -> Target {
        Target::for_archs(&[Arch::Sm90a])
    }

    /// The 8B shapes: one row tile up to 128 rows, the widest column tile that keeps 96
    /// blocks on the H200, 4 × 2 or 2 × 4 warps.
    #[test]
    fn tiles_at_the_8b_shapes() {
        let h = hopper();
        let pick = |k, n, gu, rows| {
            let t = tile(&params(k, n, gu), rows, &h).unwrap();
            (t.bm, t.bn, t.wm, t.wn)
        };
        // o / down at 32 rows: 128 column tiles of 32.
        assert_eq!(pick(4096, 4096, false, 32), (32, 32, 2, 2));
        assert_eq!(pick(14336, 4096, false, 32), (32, 32, 2, 2));
        // q|k|v: 96 tiles of 64.
        assert_eq!(pick(4096, 6144, false, 32), (32, 64, 2, 4));
        // gate/up: 112 tiles of 128 per matrix.
        assert_eq!(pick(4096, 14336, true, 32), (32, 128, 2, 4));
        assert_eq!(pick(4096, 14336, true, 64), (64, 128, 2, 4));
        // 256 rows: two row tiles of 128.
        assert_eq!(pick(4096, 4096, false, 256), (128, 64, 2, 4));
        assert_eq!(pick(4096, 14336, true, 256), (128, 128, 2, 4));
        assert_eq!(pick(4096, 128256, false, 1024), (128, 128, 2, 4));
    }

    #[test]
    fn below_the_thresholds_or_with_fusions_the_gemv_stays() {
        let h = hopper();
        let gate_up = params(4096, 14336, true);
        assert!(tiling(&gate_up, GEMM_MIN_ROWS - 1, &h).is_none());
        assert!(tiling(&gate_up, GEMM_MIN_ROWS, &h).is_some());
        assert!(tiling(&params(4096, 128256, false), 256, &h).is_some());
        // o / down / q|k|v: measured faster on gemv_mma at every row count.
        for n in [4096, 6144] {
            assert!(tiling(&params(4096, n, false), 1024, &h).is_none(), "N={n}");
        }
        let p = params(4096, 4096, false);
        let mut normed = p.clone();
        normed.norm = Some(RmsNormPrologue {
            weight: Loc::table(1),
            dtype: Dtype::BF16,
            eps: 1e-5,
        });
        assert!(tile(&normed, 64, &h).is_none());
        let mut f32_x = p.clone();
        f32_x.x.dtype = Dtype::F32;
        assert!(tile(&f32_x, 64, &h).is_none());
        assert!(tile(&params(4100, 4096, false), 64, &h).is_none(), "K % 8");
    }

    /// Every tile fits its target's shared memory (sm_120's 99 KiB too, with fewer
    /// stages) and generates, at every row count and shape, odd ones included.
    #[test]
    fn tiles_fit_and_generate() {
        let h = hopper();
        let sm120 = Target {
            smem_per_block: Arch::Sm120.max_smem_per_block(),
            ..h.clone()
        };
        let shapes = SHAPES;
        for target in [&h, &sm120] {
            for rows in [32, 33, 64, 100, 128, 256, 1024] {
                for (k, n, gu) in shapes {
                    let p = params(k, n, gu);
                    let t = tile(&p, rows, target).unwrap();
                    let label = format!("rows={rows} K={k} N={n} {t:?}");
                    assert!(t.bm >= rows.min(128), "{label}");
                    assert!(t.warps() <= 8 && t.stages >= 2, "{label}");
                    assert!(
                        block_smem_bytes(&p, &t) <= target.smem_per_block as u64,
                        "{label}"
                    );
                    gemm_mma(&p, &t).unwrap_or_else(|e| panic!("{label}: {e}"));
                }
            }
        }
    }

    /// The split rule's picks (whether builds use them is `SPECC_WGMMA_SPLIT_K`): `o` and
    /// `down` (a residual epilogue: at most 128 columns) split 4 ways at 128 rows and 2 at
    /// 256, unsplit from 512 (one wave of wide tiles); gate/up never (enough column tiles);
    /// every pick valid, its partial sums within the ring.
    #[test]
    fn split_k_tiles_where_few_column_tiles_cover_the_sms() {
        let h = hopper();
        for k in [4096, 14336] {
            let mut p = params(k, 4096, false);
            p.residual = p.out;
            let pick = |rows: u32| {
                split_k_tile(&p, 128, rows.div_ceil(128) as u64, 128, &h).map(|t| (t.bn, t.split_k))
            };
            assert_eq!(pick(128), Some((128, 4)), "K={k}");
            assert_eq!(pick(256), Some((128, 2)), "K={k}");
            assert_eq!(pick(512), None, "K={k}");
            for rows in [128, 256] {
                let t = split_k_tile(&p, 128, rows / 128, 128, &h).unwrap();
                wgmma::validate(&p, &t).unwrap();
                assert!(
                    wgmma::split_slot_bytes(&p, &t) * (t.split_k as u64 - 1)
                        <= t.stages as u64 * wgmma::stage_bytes(&p, &t)
                );
            }
        }
        let gate_up = params(4096, 14336, true);
        for row_tiles in [1, 2, 4] {
            assert_eq!(split_k_tile(&gate_up, 128, row_tiles, 128, &h), None);
        }
    }

    /// wgmma tiles: sm_90a only; one warpgroup up to 64 rows; the column tile that loads
    /// the fewest bytes into the busiest SM; every tile fits and generates, odd shapes
    /// included.
    #[test]
    fn wgmma_tiles_are_sm90a_only_and_fit() {
        let h = hopper();
        let pick = |k, n, gu, rows| {
            let t = wgmma_tile(&params(k, n, gu), rows, &h).unwrap();
            (t.bm, t.bn)
        };
        let split = |k, n, gu, rows| wgmma_tile(&params(k, n, gu), rows, &h).unwrap().split_k;
        if wgmma_waves_enabled() && wgmma_split_k_enabled() {
            // o and down: 128 columns, K split 4 / 2 ways up to 256 rows (128 blocks), then
            // unsplit (one wave at 512 rows), instead of 32- or 64-column tiles re-reading x.
            for k in [4096, 14336] {
                assert_eq!(pick(k, 4096, false, 128), (128, 128));
                assert_eq!(split(k, 4096, false, 128), 4);
                assert_eq!(pick(k, 4096, false, 256), (128, 128));
                assert_eq!(split(k, 4096, false, 256), 2);
                let mut down = params(k, 4096, false);
                down.residual = down.out;
                let t = wgmma_tile(&down, 512, &h).unwrap();
                assert_eq!((t.bn, t.split_k), (128, 1), "512 rows: one wave unsplit");
            }
            // q|k|v: 192 columns split 2 ways at 256 rows; 512 rows unsplit.
            assert_eq!(pick(4096, 6144, false, 256), (128, 192));
            assert_eq!(split(4096, 6144, false, 256), 2);
            assert_eq!(pick(4096, 6144, false, 512), (128, 192));
            assert_eq!(split(4096, 6144, false, 512), 1);
            // gate/up and the lm-head: enough column tiles, never split.
            for rows in [128, 256, 512, 1024] {
                assert_eq!(split(4096, 14336, true, rows), 1);
                assert_eq!(split(4096, 128256, false, rows), 1);
            }
        }
        if wgmma_waves_enabled() && !wgmma_split_k_enabled() {
            // o: 128 blocks of 32 / 64 / 128 columns, one wave.
            assert_eq!(pick(4096, 4096, false, 64), (64, 32));
            assert_eq!(pick(4096, 4096, false, 128), (128, 32));
            assert_eq!(pick(4096, 4096, false, 256), (128, 64));
            assert_eq!(pick(4096, 4096, false, 512), (128, 128));
            // q|k|v: 128 blocks (48 / 96 / 192 columns) rather than 96.
            assert_eq!(pick(4096, 6144, false, 64), (64, 48));
            assert_eq!(pick(4096, 6144, false, 256), (128, 96));
            assert_eq!(pick(4096, 6144, false, 512), (128, 192));
        }
        if wgmma_waves_enabled() {
            // gate/up: 128 column tiles of 112 (whole waves) rather than 112 of 128.
            assert_eq!(pick(4096, 14336, true, 64), (64, 112));
            assert_eq!(pick(4096, 14336, true, 128), (128, 112));
            assert_eq!(pick(4096, 14336, true, 512), (128, 112));
            assert_eq!(pick(4096, 14336, true, 1024), (128, 128));
            assert_eq!(pick(4096, 128256, false, 1024), (128, 256));
        } else {
            assert_eq!(pick(4096, 4096, false, 64), (64, 32));
            assert_eq!(pick(4096, 6144, false, 64), (64, 64));
            assert_eq!(pick(4096, 14336, true, 64), (64, 128));
            assert_eq!(pick(4096, 14336, true, 256), (128, 128));
            assert_eq!(pick(4096, 128256, false, 1024), (128, 256));
        }
        let cluster = |k, n, gu, rows| {
            let t = wgmma_tile(&params(k, n, gu), rows, &h).unwrap();
            (t.cluster_m, t.cluster_n)
        };
        if wgmma_clusters_enabled() {
            assert_eq!(
                cluster(4096, 14336, true, 1024),
                (4, 1),
                "gate/up shares weights"
            );
            assert_eq!(cluster(4096, 14336, true, 128), (1, 1), "1 row tile");
            assert_eq!(cluster(4096, 14336, true, 256), (2, 1), "2 row tiles");
            assert_eq!(cluster(4096, 14336, true, 640), (1, 1), "5 row tiles");
            if wgmma_waves_enabled() {
                assert_eq!(
                    cluster(4096, 14336, true, 512),
                    (2, 1),
                    "224 weight rows: slices of 28 rows are not whole 8-row groups"
                );
                assert_eq!(
                    cluster(4096, 6144, false, 256),
                    (1, 1),
                    "96 columns or split"
                );
                assert_eq!(cluster(4096, 6144, false, 512), (2, 1), "192 columns");
            }
            assert_eq!(cluster(4096, 128256, false, 768), (2, 1), "6 row tiles");
            assert_eq!(cluster(4096, 128256, false, 640), (1, 1), "5 row tiles");
            assert_eq!(cluster(4096, 128256, false, 1024), (4, 1));
            assert_eq!(cluster(4096, 4096, false, 512), (1, 1), "x box as large");
        }
        let blocks = |k, n, gu, rows| {
            let t = wgmma_tile(&params(k, n, gu), rows, &h).unwrap();
            t.persistent_blocks
        };
        if wgmma_persistent_enabled() && wgmma_clusters_enabled() {
            assert_eq!(
                blocks(4096, 14336, true, 256),
                132,
                "66 clusters of 2, 1.9 waves"
            );
            assert_eq!(blocks(4096, 14336, true, 512), 0, "3.9 waves");
            assert_eq!(blocks(4096, 4096, false, 256), 0, "128 tiles: one wave");
            assert_eq!(blocks(4096, 14336, true, 1024), 0, "clusters of 4");
        }
        let mut residual = params(4096, 4096, false);
        residual.residual = residual.out;
        assert_eq!(wgmma_tile(&residual, 1024, &h).unwrap().bn, 128);
        let mut f16 = params(4096, 4096, false);
        f16.w_dtype = Dtype::F16;
        f16.x.dtype = Dtype::F16;
        assert!(wgmma_tile(&f16, 256, &h).is_none(), "f16 keeps gemm_mma");
        for archs in [
            &[Arch::Sm100a][..],
            &[Arch::Sm120],
            &[Arch::Sm90a, Arch::Sm100a],
        ] {
            let t = Target::for_archs(archs);
            assert!(wgmma_tile(&params(4096, 4096, false), 256, &t).is_none());
        }
        let wide = params(4096, 14336, true);
        assert!(wgmma_tiling(&wide, WGMMA_MIN_ROWS - 1, &h).is_none());
        assert!(wgmma_tiling(&wide, WGMMA_MIN_ROWS, &h).is_some());
        let shapes = SHAPES;
        for rows in [32, 33, 64, 100, 128, 256, 1024] {
            for (k, n, gu) in shapes {
                let p = params(k, n, gu);
                let t = wgmma_tile(&p, rows, &h).unwrap();
                let label = format!("rows={rows} K={k} N={n} {t:?}");
                assert!(t.stages >= 2, "{label}");
                assert!(
                    wgmma::block_smem_bytes(&p, &t) <= h.smem_per_block as u64,
                    "{label}"
                );
                wgmma::gemm_wgmma(&p, &t).unwrap_or_else(|e| panic!("{label}: {e}"));
            }
        }
    }
}
