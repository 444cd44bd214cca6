//! Attention choices: the CUDA-core split kernel or the tensor-core tiles, their block
//! shape and the number of context splits, from the shapes and the [`Target`].

use specc_ir::engine::choice::{AttentionChoice, AttentionKernel, TileTiling};
use specc_ir::engine::Target;
use specc_kernels_gen::attention::{AttentionParams, THREADS as SPLIT_THREADS};
use specc_kernels_gen::attention_mma::{
    block_smem_bytes, fused_combine_fits, fused_combine_tiles, shapes_supported,
};

use super::matmul::SPLIT_COUNTERS;

/// Static + dynamic shared memory per block the tiles aim at: [`RESIDENT_PER_SM`] blocks of
/// the 4- and 8-warp tilings share the 228 KiB of an sm_90a / sm_100a SM. A target with less
/// per block lowers it ([`smem_budget`]).
const SMEM_BUDGET: u64 = 96 * 1024;

/// Blocks resident per SM the split count assumes: shared memory within [`SMEM_BUDGET`]
/// fits two per SM, and two 4-warp blocks at up to 255 registers per thread fill the 64 K
/// registers of an SM.
const RESIDENT_PER_SM: u32 = 2;

/// The kernel for `p` with `b` sequences of `t` rows each at context `ctx`: the tensor-core
/// tiles where their shapes are supported and a tile fits (measured faster in the step graph
/// for verify and chain steps at the 8B shapes, and 1.7–1.9× faster than the CUDA-core
/// kernel for decode at 1–64 sequences and contexts 1024 / 8192 on the H200, bench/NOTES.md
/// session 34), else the CUDA-core kernel. `None` where neither has a tile.
pub fn choose(
    p: &AttentionParams,
    b: u32,
    t: u32,
    ctx: u32,
    target: &Target,
) -> Option<AttentionChoice> {
    let kernel = kernel(p, target)?;
    let splits = match kernel {
        AttentionKernel::TensorCores(_) if t <= 1 => {
            simt_splits(ctx, b, p.kv_heads, DECODE_TILES_PER_SM * target.sms)
        }
        AttentionKernel::TensorCores(tl) => tile_splits(p, tl, b, t, ctx, target),
        AttentionKernel::CudaCores(_) => simt_splits(ctx, b, p.kv_heads, simt_wave(p, target)),
    };
    let fused_combine = match kernel {
        AttentionKernel::TensorCores(tl) => fused_combine(p, tl, splits, b, t),
        AttentionKernel::CudaCores(_) => false,
    };
    Some(AttentionChoice {
        kernel,
        splits,
        fused_combine,
    })
}

/// Whether the tiles `tl` fold the combine into their last split
/// (`AttentionChoice::fused_combine`) for `b` sequences of `t` tokens: where
/// [`fused_combine_possible`] and [`fused_combine_wanted`].
fn fused_combine(p: &AttentionParams, tl: TileTiling, splits: u32, b: u32, t: u32) -> bool {
    fused_combine_wanted(t) && fused_combine_possible(p, tl, splits, b)
}

/// Whether builds fold the combine for sequences of `t` query tokens: from two tokens (one
/// launch fewer a layer; verify(8) at B = 32 1.1 % faster), not at decode, where the last
/// block is one warp folding every head of its group alone, slower than a combine launch of
/// a block per head (decode B = 1 / 32 2.1 % / 2.5 % slower; H100, bench/NOTES.md session
/// 48). `SPECC_ATTN_FUSED_COMBINE=0` / `=1` in the build's environment: never / always.
pub fn fused_combine_wanted(t: u32) -> bool {
    match std::env::var("SPECC_ATTN_FUSED_COMBINE").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => t > 1,
    }
}

/// Whether the counters of `b` sequences' row ranges fit the arena's [`SPLIT_COUNTERS`] and
/// the split weights of `splits` fit the block's shared memory.
pub fn fused_combine_possible(p: &AttentionParams, tl: TileTiling, splits: u32, b: u32) -> bool {
    let p = AttentionParams {
        splits,
        ..p.clone()
    };
    fused_combine_tiles(&p, tl, b) <= SPLIT_COUNTERS as u64 && fused_combine_fits(&p, tl)
}

/// The kernel of [`choose`], without the splits.
pub fn kernel(p: &AttentionParams, target: &Target) -> Option<AttentionKernel> {
    match tiling(p, target).filter(|_| uses_tiles_shape(p)) {
        Some(tl) => Some(AttentionKernel::TensorCores(tl)),
        None => p.tiling().map(AttentionKernel::CudaCores),
    }
}

/// Whether [`choose`] picks the tensor-core tiles for `p` on `target`.
pub fn uses_tiles(p: &AttentionParams, target: &Target) -> bool {
    matches!(kernel(p, target), Some(AttentionKernel::TensorCores(_)))
}

fn uses_tiles_shape(p: &AttentionParams) -> bool {
    shapes_supported(p)
}

/// Decode tiles (one warp a block) a SM the split count of one-token attention assumes:
/// [`simt_splits`]' waves with 6 blocks a SM chose the fastest split, or one within 5 %,
/// for 32 and 64 sequences at contexts 1024 and 8192 and 8 at 8192 (3, 3, 3, 3, 12), and
/// one 16 % slower for 8 sequences at 1024 (12 splits: 21.1 µs against 17.1 at 6),
/// kernel_bench batch_splits on the H200 (bench/NOTES.md, session 34).
const DECODE_TILES_PER_SM: u32 = 6;

/// Context splits of the tiles chosen for `p` on `target` (1 where none fits).
pub fn splits(p: &AttentionParams, b: u32, t: u32, ctx: u32, target: &Target) -> u32 {
    tiling(p, target).map_or(1, |tl| tile_splits(p, tl, b, t, ctx, target))
}

/// Slots a context split costs besides its own: a block's start and its partial's share of
/// the combine cost about two 64-slot tiles (the fit to the H200's table of decode splits at
/// 1–64 sequences, bench/NOTES.md, session 34).
const SPLIT_OVERHEAD_SLOTS: u64 = 128;

/// Context splits of `attn_split` for `b` sequences of `kv_heads` KV heads at context `ctx`
/// when `wave` blocks run at once: the count (each split ≥ 64 slots, 64 at most) with the
/// least estimated time, waves of blocks × (slots per split + [`SPLIT_OVERHEAD_SLOTS`]); the
/// fewest splits on a tie. A block streams its slots one tile after another at a latency-bound
/// rate, so time falls with more blocks in flight until a wave is full, and a wave only
/// partly filled costs a whole one.
pub fn simt_splits(ctx: u32, b: u32, kv_heads: u32, wave: u32) -> u32 {
    let blocks = u64::from((b * kv_heads).max(1));
    let most = ctx.div_ceil(64).clamp(1, 64);
    (1..=most)
        .min_by_key(|&s| {
            let waves = (blocks * u64::from(s)).div_ceil(u64::from(wave.max(1)));
            waves * (u64::from(ctx.div_ceil(s)) + SPLIT_OVERHEAD_SLOTS)
        })
        .unwrap_or(1)
}

/// Blocks of `attn_split` for `p` that run at once on `target`: as many per SM as its shared
/// memory holds (an SM has 1 KiB more than one block may use, and each block reserves 1 KiB)
/// and 2048 threads allow.
pub fn simt_wave(p: &AttentionParams, target: &Target) -> u32 {
    let smem = p.block_smem_bytes().unwrap_or(48 * 1024) + 1024;
    let per_sm = u64::from(target.smem_per_block) + 1024;
    let resident = (per_sm / smem).clamp(1, u64::from(2048 / SPLIT_THREADS)) as u32;
    resident * target.sms
}

/// The shared memory a block of the tiles chosen for `target` may use: [`SMEM_BUDGET`], or
/// less where `target`'s blocks have less.
fn smem_budget(target: &Target) -> u64 {
    SMEM_BUDGET.min(target.smem_per_block as u64)
}

fn group(p: &AttentionParams) -> u32 {
    p.q_heads / p.kv_heads.max(1)
}

/// Warps per block: 4 (64 rows), fewer where one sequence has fewer rows. Tiles: the
/// largest of 64, 32, 16 slots within [`smem_budget`] of `target`; `None` where none fits.
pub fn tiling(p: &AttentionParams, target: &Target) -> Option<TileTiling> {
    let budget = smem_budget(target);
    let rows = p.max_t.saturating_mul(group(p).max(1));
    let warps = rows.div_ceil(16).clamp(1, 4);
    let one_warp_slots = (warps == 1).then(one_warp_tile_slots).flatten();
    let slot_warps = if warps == 1 { slot_warps() } else { 1 };
    [64u32, 32, 16]
        .into_iter()
        .filter(|&s| one_warp_slots.is_none_or(|w| s == w) && s >= 16 * slot_warps)
        .map(|tile_slots| TileTiling {
            warps: warps * slot_warps,
            tile_slots,
            split_p: true,
            slot_warps,
        })
        .find(|&t| block_smem_bytes(p, t) <= budget)
}

/// `SPECC_ATTN_SLOT_WARPS=4` in the build's environment: one-warp blocks (decode) become
/// blocks of 4 warps splitting each tile's slots, their softmax states merged at the end
/// (the A/B of a decode block's serial mma chain; `TileTiling::slot_warps`). Not yet timed
/// on a device. (2 slot warps with the folded combine spill on sm_90a.)
fn slot_warps() -> u32 {
    std::env::var("SPECC_ATTN_SLOT_WARPS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|s| [1, 4].contains(s))
        .unwrap_or(1)
}

/// `SPECC_ATTN_ONE_WARP_SLOTS=16|32|64` in the build's environment: the tile of one-warp
/// blocks (decode) instead of the largest that fits (the A/B of more, smaller blocks a SM:
/// a 64-slot block of the 8B shape holds 74 KB, three a SM).
fn one_warp_tile_slots() -> Option<u32> {
    std::env::var("SPECC_ATTN_ONE_WARP_SLOTS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|s| [16, 32, 64].contains(s))
}

/// Context splits of the tiles `tl` for `b` sequences of `t` rows each at context `ctx` on
/// `target`: as many as one wave of resident blocks holds (`target.sms · RESIDENT_PER_SM`
/// over the blocks of one split), at most one per 64 slots and 64 in all (the counts
/// measured fastest for trees of 32–128 nodes, bench/NOTES.md).
pub fn tile_splits(
    p: &AttentionParams,
    tl: TileTiling,
    b: u32,
    t: u32,
    ctx: u32,
    target: &Target,
) -> u32 {
    let rows = t.max(1).saturating_mul(group(p));
    let per_split = b.max(1) * p.kv_heads * rows.div_ceil(tl.rows());
    let fill = (target.sms * RESIDENT_PER_SM / per_split.max(1)).max(1);
    fill.min(ctx.div_ceil(64)).clamp(1, 64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use specc_ir::engine::Arch;
    use specc_kernels_gen::abi::{Dtype, Loc, View};
    use specc_kernels_gen::attention::AttnMask;

    fn llama_8b(max_t: u32) -> AttentionParams {
        AttentionParams {
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            head_dim_v: 128,
            q: View::new(Loc::arena(0), Dtype::BF16, 32 * 128),
            k_cache: Loc::table(0),
            v_cache: Loc::table(1),
            cache_dtype: Dtype::BF16,
            pos: Loc::arena(1 << 20),
            pos_dtype: Dtype::I32,
            mask: AttnMask::Causal,
            out: View::new(Loc::arena(2 << 20), Dtype::BF16, 32 * 128),
            scale: 0.088,
            max_t,
            splits: 1,
            scratch: Loc::arena(3 << 20),
        }
    }

    /// The fused combine's counters (one per sequence, KV head and row block) cover the 8B
    /// shape's decode and verify(8) up to 64 sequences, and no more; its split weights fit
    /// every split count the choice makes at contexts 1024 and 8192.
    #[test]
    fn fused_combine_covers_the_buckets_its_counters_hold() {
        let h = Target::for_archs(&[Arch::Sm90a]);
        for t in [1, 8] {
            let p = llama_8b(t);
            let tl = tiling(&p, &h).unwrap();
            for ctx in [1024, 8192] {
                for b in [1, 8, 32, 64] {
                    let c = choose(&p, b, t, ctx, &h).unwrap();
                    assert!(
                        fused_combine_possible(&p, tl, c.splits, b),
                        "t={t} b={b} ctx={ctx} splits={}",
                        c.splits
                    );
                }
            }
            assert!(!fused_combine_possible(&p, tl, 4, 65), "t={t}");
        }
    }
}
