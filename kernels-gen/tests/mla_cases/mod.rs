//! `mla_tile` launches as codegen plans them (`specc_codegen::choose::mla::tiling`): q, the
//! caches, positions and the tree mask in the buffer table, output and split partials in the
//! arena. Shared by the NVRTC compile test and the GPU parity test.

#![allow(dead_code)]

use specc_codegen::choose::mla::tiling;
use specc_ir::engine::choice::MlaChoice;
use specc_ir::DType;
use specc_kernels_gen::abi::{KernelSource, Loc};
use specc_kernels_gen::mla_tile::{mla_tile, MlaMask, MlaTileParams};
use specc_kernels_gen::Target;

/// Model dims of a case: heads, latent (`kv_lora_rank`), rope dims.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub heads: u64,
    pub latent: u64,
    pub rope: u64,
}

/// Kimi-K2: 64 heads attending one 512 + 64 latent cache.
pub const KIMI: Dims = Dims {
    heads: 64,
    latent: 512,
    rope: 64,
};
/// The DeepSeek-V3 test fixtures (`tests/fixtures/deepseek_v3_*`).
pub const FIXTURE: Dims = Dims {
    heads: 4,
    latent: 32,
    rope: 8,
};

/// Buffer-table slots of the inputs.
pub const Q_LAT: u32 = 0;
pub const Q_PE: u32 = 1;
pub const C_CACHE: u32 = 2;
pub const PE_CACHE: u32 = 3;
pub const POS: u32 = 4;
pub const PREFIX: u32 = 5;
pub const ANC: u32 = 6;

/// One planned launch: its params, kernels, and the bytes of the table's buffers and arena.
pub struct Planned {
    pub p: MlaTileParams,
    pub kernels: Vec<KernelSource>,
    pub buf_bytes: Vec<u64>,
    pub arena_bytes: u64,
}

/// Plans `dims` at `(batch, tokens, ctx)` (bf16; `tree`: the tree mask, one word) for
/// `target`, or `None` where the tiles do not take it.
pub fn plan(
    dims: Dims,
    batch: u64,
    tokens: u64,
    ctx: u64,
    tree: bool,
    target: &Target,
) -> Option<Planned> {
    plan_with(dims, batch, tokens, ctx, tree, target, None)
}

/// [`plan`] with the work split `split` instead of the plan's choice (benchmark sweeps).
pub fn plan_with(
    dims: Dims,
    batch: u64,
    tokens: u64,
    ctx: u64,
    tree: bool,
    target: &Target,
    split: Option<MlaChoice>,
) -> Option<Planned> {
    let rows = batch * tokens * dims.heads;
    let out_bytes = (2 * rows * dims.latent).next_multiple_of(256);
    let mut p = MlaTileParams {
        batch,
        tokens,
        heads: dims.heads,
        latent: dims.latent,
        rope: dims.rope,
        ctx,
        scale: 1.0 / ((128 + dims.rope) as f32).sqrt(),
        dtype: DType::BF16,
        q_lat: Loc::table(Q_LAT),
        q_pe: Loc::table(Q_PE),
        c_cache: Loc::table(C_CACHE),
        pe_cache: Loc::table(PE_CACHE),
        pos: Loc::table(POS),
        pos_dtype: DType::I32,
        mask: if tree {
            MlaMask::Tree {
                prefix_len: Loc::table(PREFIX),
                prefix_dtype: DType::I32,
                ancestors: Loc::table(ANC),
                words: 1,
            }
        } else {
            MlaMask::Causal
        },
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
    };
    let t = match split {
        Some(t) => t,
        None => tiling(&p, target)?,
    };
    p.splits = t.splits;
    p.block_row_tiles = t.block_row_tiles;
    p.stages = t.stages;
    p.wgmma = t.wgmma;
    p.cluster = t.cluster;
    let (acc, ml) = p.partial_bytes(p.parts());
    p.partial_acc = Loc::arena(out_bytes);
    p.partial_ml = Loc::arena(out_bytes + acc.next_multiple_of(256));
    let arena_bytes = out_bytes + acc.next_multiple_of(256) + ml.next_multiple_of(256);
    let kernels = match mla_tile(&p) {
        Ok(k) => k,
        // A swept split the kernel does not take (shared memory): not a planned launch.
        Err(_) if split.is_some() => return None,
        Err(e) => panic!("{e}"),
    };
    let buf_bytes = vec![
        2 * rows * dims.latent,
        2 * rows * dims.rope,
        2 * batch * ctx * dims.latent,
        2 * batch * ctx * dims.rope,
        4 * batch * tokens,
        4 * batch,
        8 * batch * tokens,
    ];
    Some(Planned {
        p,
        kernels,
        buf_bytes,
        arena_bytes,
    })
}
