//! MLA attention: the tensor-core tiles (`mla_tile`) for 16-bit q and caches whose dims
//! they take, with their context splits; else the generic per-row kernel.

use specc_ir::engine::Target;
use specc_kernels_gen::mla_tile::{self, MlaTileParams, TILE_SLOTS};

/// Slots per split at least: two tiles.
const MIN_SPLIT_SLOTS: u64 = 2 * TILE_SLOTS;
/// Context splits at most: the f32 partials hold `rows · splits · latent` values.
const MAX_SPLITS: u64 = 8;

/// The splits of the tiles for `p` on `target`, or `None` where the tiles do not take it.
/// They depend on the context capacity alone, never on the bucket (batch, tokens), so every
/// graph of an engine cuts a row's context at the same slots and its sums are the same (the
/// batch invariance greedy exactness needs); at 8192 slots that is 8 splits of 1024.
pub fn tile_splits(p: &MlaTileParams, target: &Target) -> Option<u64> {
    if !mla_tile::supported(p, target.smem_per_block as u64) {
        return None;
    }
    Some(p.ctx.div_ceil(MIN_SPLIT_SLOTS).clamp(1, MAX_SPLITS))
}
