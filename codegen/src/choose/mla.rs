//! MLA attention: the tensor-core tiles (`mla_tile`) for 16-bit q and caches whose dims
//! they take, with their context splits and block shape; else the generic per-row kernel.

use specc_ir::engine::choice::MlaChoice;
use specc_ir::engine::Target;
use specc_kernels_gen::mla_tile::{self, MlaTileParams, MAX_BLOCK_ROW_TILES, STAGES, TILE_SLOTS};

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

/// The tiling of `p` on `target`, or `None` where the tiles do not take it.
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
    let splits = tile_splits(p.ctx);
    let smem = target.smem_per_block as u64;
    let fits = |rt: u64| {
        (2..=STAGES).rev().find_map(|stages| {
            let q = MlaTileParams {
                splits,
                block_row_tiles: rt,
                stages,
                ..*p
            };
            mla_tile::supported(&q, smem).then_some((
                q.blocks(),
                MlaChoice {
                    splits,
                    block_row_tiles: rt,
                    stages,
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
