//! MLA attention: on sm_90a the warpgroup kernel (`mla_wgmma`) where it takes the dims
//! (bf16, DeepSeek-V3 / Kimi-K2's 512 + 64), else the tensor-core tiles (`mla_tile`) for
//! 16-bit q and caches whose dims they take, with their context splits and block shape; else
//! the generic per-row kernel.

use specc_ir::engine::choice::MlaChoice;
use specc_ir::engine::{Arch, Target};
use specc_kernels_gen::mla_tile::{self, MlaTileParams, MAX_BLOCK_ROW_TILES, STAGES, TILE_SLOTS};
use specc_kernels_gen::mla_wgmma;

/// Slots per split at least: four tiles, so that staging a block's q rows (as many bytes as
/// two tiles at 64 rows) stays a small part of what a split reads.
const MIN_SPLIT_SLOTS: u64 = 4 * TILE_SLOTS;
/// Context splits at most: at 8192 slots, 32 splits of 256 slots. Fewer splits than 64
/// halve the f32 partials `mla_combine` reads (`rows · splits · latent`) and let wider blocks
/// share each cache tile, at no cost at one decode token; 16 lose at one token (the split
/// sweep `gpu_parity_mla --ignored mla_tile_split_sweep`, bench/NOTES.md).
const MAX_SPLITS: u64 = 32;

/// Context splits at `ctx` slots of capacity. They depend on the capacity alone, never on
/// the bucket (batch, tokens) or the block shape, so every graph of an engine cuts a row's
/// context at the same slots and folds the same partials in the same order: a row's result
/// is bitwise the same in every bucket (the batch invariance greedy exactness needs). At 8192
/// slots: 32 splits of 256.
pub fn tile_splits(ctx: u64) -> u64 {
    ctx.div_ceil(MIN_SPLIT_SLOTS).clamp(1, MAX_SPLITS)
}

/// Whether builds may choose `mla_wgmma`: on unless `SPECC_MLA_WGMMA=0` is in the
/// environment of the build (the A/B against `mla_tile` is that one flag).
pub fn wgmma_enabled() -> bool {
    !std::env::var("SPECC_MLA_WGMMA").is_ok_and(|v| v == "0")
}

/// Whether `mla_wgmma` folds its splits in thread-block clusters: off unless
/// `SPECC_MLA_CLUSTER=1` is in the environment of the build. Off because on sm_90a the fold
/// costs more than the `mla_combine` traffic it saves: peers' shared memory reads slowly,
/// and clusters of eight one-SM blocks leave SMs idle (bench/NOTES.md, session 42).
pub fn cluster_enabled() -> bool {
    std::env::var("SPECC_MLA_CLUSTER").is_ok_and(|v| v == "1")
}

/// The `mla_wgmma` choice for `p` on `target`: sm_90a only, the dims it takes (which do not
/// depend on the bucket, so every graph of an engine picks the same kernel and a row's
/// result stays the same in every bucket), the capacity's splits; with
/// [`cluster_enabled`], folded in clusters of up to 8 ([`mla_wgmma::cluster_for`], from the
/// splits alone: the same fold in every bucket).
pub fn wgmma_tiling(p: &MlaTileParams, target: &Target) -> Option<MlaChoice> {
    let splits = tile_splits(p.ctx);
    let cluster = if cluster_enabled() {
        mla_wgmma::cluster_for(splits)
    } else {
        1
    };
    let q = MlaTileParams {
        splits,
        cluster,
        ..*p
    };
    (target.archs == [Arch::Sm90a] && mla_wgmma::supported(&q, target.smem_per_block as u64))
        .then_some(MlaChoice {
            splits: q.splits,
            block_row_tiles: mla_wgmma::BLOCK_ROWS / mla_tile::TILE_ROWS,
            stages: 2,
            wgmma: true,
            cluster,
        })
}

/// The tiling of `p` on `target`, or `None` where the tiles do not take it: `mla_wgmma`
/// where [`wgmma_tiling`] takes it (and [`wgmma_enabled`]), else `mla_tile`'s.
///
/// Row tiles per block: each cache tile is staged once per block, so a block takes as many
/// of its sequence's row tiles as it can (2 or 1: whole warp groups of 16 rows) while the
/// launch still has blocks for three quarters of the SMs — at decode with one 64-head token,
/// 1 (128 blocks at 8192 slots); from 2 tokens or at batch 8, 2. A block's row count never
/// changes a row's result (tiles past a row's end add exact zeros, and every block sums a
/// row's scores in the same chains), so this is free to depend on the bucket.
/// Stages: three cache tiles in shared memory (two loading while one is computed) where
/// they fit, else two.
pub fn tiling(p: &MlaTileParams, target: &Target) -> Option<MlaChoice> {
    if let Some(t) = wgmma_enabled().then(|| wgmma_tiling(p, target)).flatten() {
        return Some(t);
    }
    tile_tiling(p, target)
}

/// `mla_tile`'s tiling of `p` on `target`, or `None` where it does not take it.
pub fn tile_tiling(p: &MlaTileParams, target: &Target) -> Option<MlaChoice> {
    let splits = tile_splits(p.ctx);
    let smem = target.smem_per_block as u64;
    let fits = |rt: u64| {
        (2..=STAGES).rev().find_map(|stages| {
            let q = MlaTileParams {
                splits,
                block_row_tiles: rt,
                stages,
                cluster: 1,
                ..*p
            };
            mla_tile::supported(&q, smem).then_some((
                q.blocks(),
                MlaChoice {
                    splits,
                    block_row_tiles: rt,
                    stages,
                    wgmma: false,
                    cluster: 1,
                },
            ))
        })
    };
    let most = p.row_tiles().min(MAX_BLOCK_ROW_TILES);
    let candidates: Vec<(u64, MlaChoice)> = [2u64, 1]
        .into_iter()
        .filter(|&rt| rt <= most || rt == 1)
        .filter_map(fits)
        .collect();
    let busy = (target.sms as u64 * 3).div_ceil(4);
    candidates
        .iter()
        .find(|(blocks, _)| *blocks >= busy)
        .or(candidates.last())
        .map(|(_, t)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use specc_ir::DType;
    use specc_kernels_gen::abi::Loc;
    use specc_kernels_gen::mla_tile::MlaMask;

    fn params(batch: u64, tokens: u64, heads: u64, latent: u64, rope: u64) -> MlaTileParams {
        MlaTileParams {
            batch,
            tokens,
            heads,
            latent,
            rope,
            ctx: 8192,
            scale: 0.1,
            dtype: DType::BF16,
            q_lat: Loc::table(0),
            q_pe: Loc::table(1),
            c_cache: Loc::table(2),
            pe_cache: Loc::table(3),
            pos: Loc::table(4),
            pos_dtype: DType::I32,
            mask: MlaMask::Causal,
            out: Loc::arena(0),
            splits: 1,
            block_row_tiles: 1,
            stages: 2,
            wgmma: false,
            cluster: 1,
            p_single: false,
            ping_pong: false,
            partial_acc: Loc::arena(0),
            partial_ml: Loc::arena(0),
        }
    }

    /// On sm_90a the Kimi-K2 dims take `mla_wgmma` in every bucket, with the capacity's
    /// splits (a row's result must not depend on the bucket); other archs, dims it does not
    /// take and f16 keep `mla_tile`.
    #[test]
    fn wgmma_is_chosen_by_dims_and_arch_alone() {
        let h = Target::for_archs(&[Arch::Sm90a]);
        for (b, t) in [(1, 1), (8, 1), (1, 8), (3, 2), (64, 1)] {
            let c = wgmma_tiling(&params(b, t, 64, 512, 64), &h).unwrap();
            assert!(c.wgmma);
            assert_eq!(c.splits, tile_splits(8192));
            assert_eq!(c.cluster, 1, "the cluster fold is opt-in");
            assert_eq!(c.parts(), 32);
        }
        let tile_only = [
            params(1, 1, 64, 512, 64),
            params(1, 1, 4, 32, 8),
            params(1, 1, 64, 96, 64),
            MlaTileParams {
                dtype: DType::F16,
                ..params(1, 1, 64, 512, 64)
            },
        ];
        for arch in [Arch::Sm100a, Arch::Sm120] {
            let t = Target::for_archs(&[arch]);
            assert!(wgmma_tiling(&tile_only[0], &t).is_none(), "{arch}");
            assert!(!tiling(&tile_only[0], &t).unwrap().wgmma, "{arch}");
        }
        for p in &tile_only[1..] {
            assert!(wgmma_tiling(p, &h).is_none(), "{p:?}");
        }
        // Both archs at once: only what every one of them runs.
        let both = Target::for_archs(&[Arch::Sm90a, Arch::Sm100a]);
        assert!(wgmma_tiling(&tile_only[0], &both).is_none());
    }
}
