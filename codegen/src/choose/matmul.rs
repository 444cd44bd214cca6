//! Matmul choices: CUDA or tensor cores, the work split, where the norm runs, and whether
//! the q|k|v projection carries RoPE + the KV write. Every rule here is a measured choice
//! (bench/NOTES.md); the device facts come from the [`Target`] only.

use specc_ir::engine::choice::{EpilogueChoice, Feed, MatmulCore, MmaTiling, NormPlacement};
use specc_ir::engine::{Arch, Target};
use specc_kernels_gen::abi::Dtype;
use specc_kernels_gen::gemv::GemvParams;
use specc_kernels_gen::gemv_mma::{
    block_smem_bytes, mats, red_bytes, split_needs, validate, RED_SMEM_MAX, ROPE_PAIR_STRIDE,
};
use specc_kernels_gen::gemv_quant::{quant_tiling, QuantWeights};
use specc_kernels_gen::qkv_rope;

/// Split-K tile counters reserved in every arena: one per output tile of a launch whose
/// tiling splits K across blocks. A split needing more (long prefill row counts) is
/// chosen without K split across blocks (enough blocks come from the row tiles).
pub const SPLIT_COUNTERS: u32 = 512;

/// The kernel and work split for `p` over at most `rows` rows on `target`: the tiled GEMM
/// where [`super::gemm::tiling`] gives it a tile (from [`super::gemm::GEMM_MIN_ROWS`] rows on
/// wide weights),
/// else the tensor-core GEMV with [`tiling`] where [`supports`] holds, else the CUDA-core
/// kernel. The sm_90a wgmma GEMM ([`super::gemm::wgmma_tiling`], `MatmulCore::Wgmma`) comes
/// first where [`super::gemm::wgmma_enabled`].
pub fn core(p: &GemvParams, rows: u32, target: &Target) -> MatmulCore {
    if !supports(p) {
        return MatmulCore::CudaCores(p.tiling());
    }
    if super::gemm::wgmma_enabled() {
        if let Some(t) = super::gemm::wgmma_tiling(p, rows, target) {
            return MatmulCore::Wgmma(t);
        }
    }
    if let Some(t) = super::gemm::tiling(p, rows, target) {
        return MatmulCore::Gemm(t);
    }
    let mut t = tiling(p, target);
    if split_needs(p, &t, rows).is_some_and(|n| n.counters > SPLIT_COUNTERS) {
        t.ks = 1;
    }
    MatmulCore::TensorCores(t)
}

/// The kernel for `p` over weights stored as `q` (int4 groups, fp8 blocks): the CUDA-core
/// `gemv_q`, which reads every stored weight byte and scale once per row tile of up to 64
/// rows (decode, verify and tree row counts alike) and dequantises in registers. The
/// tensor-core kernel takes 16-bit weights only.
pub fn quant_core(p: &GemvParams, q: &QuantWeights) -> MatmulCore {
    MatmulCore::Dequant(quant_tiling(p, q))
}

/// Where the RMSNorm of a matmul's input runs at `row_tile` rows: in the prologue up to
/// [`NORM_FUSED_MAX_ROWS`], else as a separate launch.
pub fn norm_placement(has_norm: bool, row_tile: u32) -> NormPlacement {
    match (has_norm, row_tile > NORM_FUSED_MAX_ROWS) {
        (false, _) => NormPlacement::None,
        (true, false) => NormPlacement::Prologue,
        (true, true) => NormPlacement::Separate,
    }
}

/// The q|k|v epilogue: RoPE + KV write fused when the kernel for `p` can carry it for heads
/// of `head_dim` with `rotary_dim` rotated features and no per-head norm, at most
/// [`ROPE_FUSED_MAX_ROWS`] rows; else the product into scratch and `rope_kv`. No device fact
/// enters: the pair stride depends only on which kernel [`supports`] picks.
///
/// Quantised weights (`quantised`) never carry it: `gemv_q` has no RoPE epilogue.
pub fn rope_epilogue(
    p: &GemvParams,
    head_dim: u32,
    rotary_dim: u32,
    head_norm: bool,
    quantised: bool,
) -> EpilogueChoice {
    if quantised {
        return EpilogueChoice::RopeKv { fused: false };
    }
    let stride = if supports(p) { ROPE_PAIR_STRIDE } else { 1 };
    let fused = !head_norm
        && p.row_tile <= ROPE_FUSED_MAX_ROWS
        && qkv_rope::fusable(head_dim, rotary_dim, stride);
    EpilogueChoice::RopeKv { fused }
}

/// Argmax partials per row of the kernel `core` (the grid's x extent).
pub fn partials_per_row(p: &GemvParams, core: &MatmulCore) -> u32 {
    match core {
        MatmulCore::CudaCores(t) => p.n.div_ceil(t.warps * t.cols_per_warp),
        MatmulCore::TensorCores(t) => specc_kernels_gen::gemv_mma::partials_per_row(p, t),
        MatmulCore::Dequant(t) => specc_kernels_gen::gemv_quant::partials_per_row(p, t),
        MatmulCore::Gemm(t) => specc_kernels_gen::gemm_mma::partials_per_row(p, t),
        MatmulCore::Wgmma(t) => specc_kernels_gen::gemm_wgmma::partials_per_row(p, t),
    }
}

/// Row tiles from this size use the tensor-core kernel (M = 1 stays on CUDA cores).
pub const MMA_MIN_ROWS: u32 = 2;

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
/// `SPECC_GEMV_ONE_ROW=cuda` in the build's environment puts every one-row matmul on CUDA
/// cores (the A/B of this rule on GPUs other than the H100 it was measured on).
pub fn one_row_prefers_mma(p: &GemvParams) -> bool {
    let all_cuda = std::env::var("SPECC_GEMV_ONE_ROW").is_ok_and(|v| v == "cuda");
    !all_cuda && p.argmax_partials.is_none() && (p.gate_up() || p.norm.is_none())
}

/// The largest row tile whose q/k/v projection carries RoPE + KV write in its epilogue: the
/// row tiles of the register-fed tensor-core splits ([`NORM_FUSED_MAX_ROWS`]), which compute
/// each pair's cos / sin while their first weight loads are in flight. Wider tiles take the
/// staged feeds, whose epilogue would compute them after the last mma; those keep GEMV +
/// `rope_kv` (bench/NOTES.md).
pub const ROPE_FUSED_MAX_ROWS: u32 = NORM_FUSED_MAX_ROWS;

/// The largest row tile whose matmul applies the RMSNorm of its input itself (the
/// `GemvParams::norm` prologue). Above it the plan normalises x once with `rmsnorm` and
/// the matmul reads the result: every block of a wide tile would otherwise first read all
/// of its rows to compute their RMS (a serial chain of L2 round trips per warp) and scale
/// each x fragment per warp, which costs far more than the separate norm. Row tiles above
/// it also take the x-staged splits of [`wide_tiling`]; at 8 rows the fused split stays
/// faster (measured at the 8B shapes, bench/NOTES.md).
pub const NORM_FUSED_MAX_ROWS: u32 = 8;

/// The work split for `target`: the one [`core`] uses.
///
/// Up to [`NORM_FUSED_MAX_ROWS`] (8) rows: each x fragment feeds two weight tiles (gate and
/// up, or two column tiles), halving the x traffic per weight byte, except with few columns,
/// where one tile per warp doubles the blocks. `wn` (warps sharing x) grows while there are
/// still ≥ 2 blocks per SM of `target`; `wk` fills the block to 8 warps; K is not split
/// across blocks. A warp keeps 2 weight units in flight at one row on sm_90a (faster decode
/// steps there; more rows measured mixed) and 4 otherwise (not measured on other archs,
/// where the fused q|k|v + RoPE kernel spills with 2). Split-K across blocks, and wider
/// splits that are faster as one kernel alone, were slower in the step graph (all measured
/// in bench/NOTES.md).
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
        unroll: narrow_unroll().unwrap_or(if p.row_tile == 1 && target.archs == [Arch::Sm90a] {
            2
        } else {
            4
        }),
        feed: Feed::Prefetch,
        ks: 1,
    };
    while t.wk > 1 && red_bytes(p, &t) > RED_SMEM_MAX {
        t.wk /= 2;
    }
    t
}

/// `SPECC_GEMV_UNROLL` from the build's environment: the weight units a warp keeps in flight
/// in the splits of up to [`NORM_FUSED_MAX_ROWS`] rows instead of [`tiling`]'s (the A/B of
/// deeper streams on GPUs of more bandwidth than the H100 the choice was measured on).
fn narrow_unroll() -> Option<u32> {
    std::env::var("SPECC_GEMV_UNROLL")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&u| (1..=8).contains(&u))
}

/// Row tiles of a launch over a fixed row count (1 where rows vary with the bucket).
fn fixed_row_tiles(p: &GemvParams) -> u64 {
    match p.rows {
        specc_kernels_gen::abi::Rows::Fixed(r) => r.div_ceil(p.row_tile).max(1) as u64,
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

#[cfg(test)]
mod tests {
    use super::*;
    use specc_ir::engine::Arch;
    use specc_kernels_gen::abi::Loc;
    use specc_kernels_gen::gemv_mma::{gemv_mma_split, partials_per_row, SplitScratch};

    /// The H200-class build target (132 SMs, 227 KiB per block).
    fn hopper() -> Target {
        Target::for_archs(&[Arch::Sm90a])
    }

    fn params(m: u32, k: u32, n: u32, gate_up: bool, dt: Dtype) -> GemvParams {
        super::super::test_params(m, k, n, gate_up, dt)
    }

    #[test]
    fn tensor_cores_for_several_rows_of_16_bit_operands() {
        let mma =
            |p: &GemvParams| matches!(core(p, p.row_tile, &hopper()), MatmulCore::TensorCores(_));
        assert!(mma(&params(8, 256, 512, false, Dtype::BF16)));
        assert!(mma(&params(2, 256, 512, true, Dtype::F16)));
        // One row: tensor cores for a plain (or residual) projection, CUDA cores for a normed
        // single projection and for argmax partials (measured; see `one_row_prefers_mma`).
        let all_cuda = std::env::var("SPECC_GEMV_ONE_ROW").is_ok_and(|v| v == "cuda");
        assert_eq!(mma(&params(1, 256, 512, false, Dtype::BF16)), !all_cuda);
        let mut normed = params(1, 256, 512, false, Dtype::BF16);
        normed.norm = Some(specc_kernels_gen::gemv::RmsNormPrologue {
            weight: Loc::table(2),
            dtype: Dtype::BF16,
            eps: 1e-5,
        });
        assert!(!mma(&normed));
        let mut lm_head = params(1, 256, 512, false, Dtype::BF16);
        lm_head.argmax_partials = Some(Loc::arena(1 << 22));
        assert!(!mma(&lm_head));
        assert!(!mma(&params(8, 256, 512, false, Dtype::F32)));
        let mut mixed = params(8, 256, 512, false, Dtype::BF16);
        mixed.x.dtype = Dtype::F32;
        assert!(!supports(&mixed));
        assert!(!mma(&mixed));
        // Off sm_90a, from `GEMM_MIN_ROWS` rows in the launch on `GEMM_MIN_COLUMNS` columns:
        // the tiled GEMM; narrower weights stay on the GEMV at any row count.
        let blackwell = Target::for_archs(&[Arch::Sm100a]);
        let rows = super::super::gemm::GEMM_MIN_ROWS;
        let wide = params(64, 256, 16384, false, Dtype::BF16);
        assert!(matches!(core(&wide, rows, &blackwell), MatmulCore::Gemm(_)));
        assert!(matches!(
            core(&wide, rows - 1, &blackwell),
            MatmulCore::TensorCores(_)
        ));
        let narrow = params(64, 256, 4096, false, Dtype::BF16);
        assert!(matches!(
            core(&narrow, 1024, &blackwell),
            MatmulCore::TensorCores(_)
        ));
        // On sm_90a (unless `SPECC_WGMMA=0`): wgmma from `WGMMA_MIN_ROWS` rows on
        // `WGMMA_MIN_COLUMNS` columns.
        if super::super::gemm::wgmma_enabled() {
            let rows = super::super::gemm::WGMMA_MIN_ROWS;
            assert!(matches!(core(&wide, rows, &hopper()), MatmulCore::Wgmma(_)));
            assert!(matches!(
                core(&narrow, rows, &hopper()),
                MatmulCore::Wgmma(_)
            ));
            assert!(!matches!(
                core(&wide, rows - 1, &hopper()),
                MatmulCore::Wgmma(_)
            ));
        }
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
}
