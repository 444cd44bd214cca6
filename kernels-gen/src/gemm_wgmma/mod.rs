//! `gemm_wgmma`: the many-row matmul `y[M, N] = x[M, K] · W[N, K]ᵀ` on sm_90a's warpgroup
//! tensor cores (`wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}`, both operands
//! from shared memory), fed by TMA. Same parameters ([`GemvParams`]), numerics and
//! epilogues (store, cast, residual, SwiGLU, argmax partials) as [`crate::gemm_mma`], which
//! stays the GEMM of the other architectures (wgmma exists on sm_90a only).
//!
//! Block `(bx, by)` computes rows `bx · BM ..` and columns `by · BN ..` (of both matrices
//! for the gate/up pair); row tiles are the fastest grid dimension, so the blocks reading
//! one weight tile run together and the weights leave HBM about once whatever M is.
//!
//! Warps: `BM / 64` consumer warpgroups (warps `0 .. 4 · BM / 64`, warpgroup `wg` owning
//! tile rows `64 · wg ..`) and one producer warp after them. K advances in chunks of 64
//! (one 128-byte box row) through a ring of `NS` stages; stage `s` (1024-byte aligned)
//! holds the x box (`BM` rows) then the weight box of each matrix (`BN` rows), every row
//! 128 bytes with 16-byte piece `c` at `c ^ (row % 8)` (TMA's 128-byte swizzle, which is
//! also the K-major layout the wgmma descriptors name: see `cuda/wgmma.cuh`).
//!
//! Ring invariant: chunk `n` lives in stage `n % NS`; it completes phase `(n / NS) & 1`
//! of `full[n % NS]` (the producer's arrival with the stage's byte count, then its box
//! copies) and its stage is released by phase `(n / NS) & 1` of `empty[n % NS]` (one
//! arrival per consumer warpgroup once the mma batch that read it has completed), which
//! the producer awaits before issuing chunk `n + NS`. A consumer keeps one batch in flight:
//! after issuing chunk `n`'s batch it waits for chunk `n − 1`'s and releases that stage.
//!
//! Masking: x rows past M, weight rows past N and k past K arrive as zeros (the tensor
//! maps' bounds; no memory read); outputs past M or N are not stored. K must be a multiple
//! of 8 (16-byte rows for the maps); M and N are arbitrary.
//!
//! Accumulators: `acc[G][BN / 2]` per consumer thread, the m64nN f32 layout: thread
//! `(warp w of the warpgroup, lane 4g + t)` holds in `acc[gm][4 · j + d]` the row
//! `16w + g + 8 · (d >> 1)` of the warpgroup's 64 and the column `8j + 2t + (d & 1)` of
//! the block's `BN` — per 8-column group `j` the m16n8 C fragment of `gemm_mma`. The
//! gate/up pair's single `m64n(2·BN)` wgmma (whose B is both weight boxes, contiguous in
//! the stage) leaves the same: its column `8j' + ..` with `j' = BN/8 · gm + j` is
//! accumulator `4j' + d`, i.e. `acc[gm][4j + d]` of the array read flat.
//!
//! Split K (`split_k = S > 1`): a cluster of `S` blocks along the grid's z computes one
//! tile, block `r` chunks `r · KT / S .. (r + 1) · KT / S` into its own accumulators; then a
//! reduce-scatter: block `o` owns the rows of consumer warps `w ≡ o (mod S)`, receives the
//! other blocks' sums for them into its idle ring, adds the `S` partial sums in rank order
//! (`((a₀ + a₁) + a₂) + a₃`) and runs the epilogue of those rows.
//!
//! Batch invariance: each output element is the sum of `S` f32 accumulators, each receiving
//! the k16 steps of its K range in order, added in rank order; nothing else (no cross-warp
//! reduction) whatever M, the tile or the element's place in it. For a given split a row's
//! result does not depend on the other rows of the launch; the split itself is chosen per
//! row count (`specc_codegen::choose::gemm`), like the K splits of `gemv_mma` below it.
//!
//! Kernel family `gemm_wgmma`; name dtype: the weight dtype.

use crate::abi::{
    Dtype, Extent, KernelAttrs, KernelBuilder, KernelSource, LaunchSpec, Loc, Rows, TensorMap,
};
use crate::gemv::{GemvParams, GemvWeights};
use crate::writer::emit;
use crate::Error;
pub use specc_ir::engine::choice::WgmmaTiling;

mod epilogue;
mod mainloop;

pub(crate) use mainloop::{emit_wgmma_function, WgmmaOperands};

const FAMILY: &str = "gemm_wgmma";
/// K per ring stage: one 128-byte swizzled box row of 16-bit elements.
pub const BK: u32 = 64;
/// The widest wgmma (n ≤ 256) and so the most accumulator columns per consumer thread.
pub const MAX_MMA_N: u32 = 256;
/// Module items: shared-memory addresses.
const CP_ASYNC: &str = crate::CP_ASYNC_ITEMS;
/// Module items: mbarriers.
const BULK_HELPERS: &str = include_str!("../../cuda/bulk_copy.cuh");
/// Module items: tensor-map box copies.
const TMA_HELPERS: &str = include_str!("../../cuda/tma.cuh");
/// Module items: descriptors, fences, commit and wait of the warpgroup mma.
const WGMMA_HELPERS: &str = include_str!("../../cuda/wgmma.cuh");
/// Module items: the quad argmax of the m16n8 C layout (shared with `gemm_mma`).
const GEMM_HELPERS: &str = include_str!("../../cuda/gemm_mma.cuh");
/// Module items of clustered tiles: multicast box copies, remote arrivals, cluster barrier.
const CLUSTER_HELPERS: &str = include_str!("../../cuda/tma_cluster.cuh");
/// Module items of a split K: the publishing cluster barrier and remote stores.
const SPLIT_K_HELPERS: &str = include_str!("../../cuda/split_k.cuh");

/// Weight matrices one x tile feeds (2 for the gate/up pair).
pub fn mats(p: &GemvParams) -> u32 {
    if p.gate_up() {
        2
    } else {
        1
    }
}

/// Bytes of one ring stage: the x box and the weight box(es), 128 bytes per row.
pub fn stage_bytes(p: &GemvParams, t: &WgmmaTiling) -> u64 {
    (t.bm + mats(p) * t.bn) as u64 * 128
}

/// Dynamic shared memory: the ring and the slack that aligns it to 1024 bytes.
pub fn ring_bytes(p: &GemvParams, t: &WgmmaTiling) -> u64 {
    t.stages as u64 * stage_bytes(p, t) + crate::tensor_map::BOX_SMEM_ALIGN as u64
}

/// Shared memory one block uses: the ring, the static mbarriers and 1 KiB of slack for the
/// compiler's own.
pub fn block_smem_bytes(p: &GemvParams, t: &WgmmaTiling) -> u64 {
    ring_bytes(p, t) + 16 * t.stages as u64 + 1024
}

/// Bytes one block receives from each peer in a split K: the f32 accumulators of the
/// `BM / split_k` rows it owns, `G · BN` columns.
pub fn split_slot_bytes(p: &GemvParams, t: &WgmmaTiling) -> u64 {
    (t.bm / t.split_k.max(1)) as u64 * (mats(p) * t.bn) as u64 * 4
}

/// Argmax partials each row gets: one per column block (the grid's y extent).
pub fn partials_per_row(p: &GemvParams, t: &WgmmaTiling) -> u32 {
    p.n.div_ceil(t.bn)
}

/// The tensor maps the kernel reads: x (boxes of the rows a block loads: `BM`, or its
/// `BM / cluster_n` slice), then the weight(s) (`BN` rows, or the `BN / cluster_m` slice),
/// each 64 k wide.
pub fn maps(p: &GemvParams, t: &WgmmaTiling) -> (Loc, Loc, Option<Loc>) {
    let x = TensorMap::of(
        p.x.loc,
        p.x.dtype,
        p.k,
        p.rows,
        p.x.row_stride,
        t.bm / t.cluster_n,
    );
    let w = |loc| {
        TensorMap::of(
            loc,
            p.w_dtype,
            p.k,
            Rows::Fixed(p.n),
            p.k as u64,
            t.bn / t.cluster_m,
        )
    };
    match p.weights {
        GemvWeights::Single(l) => (x, w(l), None),
        GemvWeights::GateUp { gate, up } => (x, w(gate), Some(w(up))),
    }
}

/// Whether `t` is a valid tiling for `p` (what [`gemm_wgmma`] checks first). Whether the
/// block's shared memory ([`block_smem_bytes`]) fits a device, and that the device is
/// sm_90a, are the selection's questions (`specc_codegen::choose::gemm`).
pub fn validate(p: &GemvParams, t: &WgmmaTiling) -> Result<(), Error> {
    p.validate()?;
    let err = |field, reason: &str| Err(Error::param(FAMILY, field, reason));
    if p.w_dtype != p.x.dtype || !matches!(p.w_dtype, Dtype::BF16 | Dtype::F16) {
        return err("w_dtype", "needs bf16 or f16 weights of x's dtype");
    }
    if p.norm.is_some() {
        return err(
            "norm",
            "stages x as stored: the plan normalises x beforehand",
        );
    }
    if p.rope.is_some() {
        return err("rope", "no RoPE epilogue: the plan runs rope_kv after it");
    }
    if !(p.k as u64 * p.w_dtype.size()).is_multiple_of(16) {
        return err("k", "rows must be whole 16-byte chunks");
    }
    if t.bm != 64 && t.bm != 128 {
        return err("tiling", "bm is 64 or 128 (one or two consumer warpgroups)");
    }
    if t.bn == 0 || !t.bn.is_multiple_of(8) || mats(p) * t.bn > MAX_MMA_N {
        return err(
            "tiling",
            "bn is a multiple of 8 with G · bn ≤ 256 (the wgmma n)",
        );
    }
    if t.stages < 2 {
        return err("tiling", "the ring needs at least 2 stages");
    }
    let (cm, cn) = (t.cluster_m, t.cluster_n);
    if !matches!(cm, 1 | 2 | 4) || !matches!(cn, 1 | 2 | 4) || cm > 1 && cn > 1 {
        return err(
            "tiling",
            "a cluster of 1, 2 or 4 blocks along the rows or the columns, not both",
        );
    }
    // A slice of a box lands at a multiple of 8 rows (1024 bytes: the swizzle's period).
    if !(t.bm / cn).is_multiple_of(8) || !(t.bn / cm).is_multiple_of(8) {
        return err("tiling", "box slices of a multiple of 8 rows");
    }
    if !partials_per_row(p, t).is_multiple_of(cn) {
        return err(
            "tiling",
            "the column tiles must fill the column clusters (the argmax partials are one per tile)",
        );
    }
    let (x, w, up) = maps(p, t);
    for m in [Some(x), Some(w), up].into_iter().flatten() {
        if let Loc::TensorMap(m) = m {
            if let Err(e) = m.check() {
                return Err(Error::param(FAMILY, "tensor map", &e));
            }
        }
    }
    if !matches!(t.split_k, 1 | 2 | 4) {
        return err("split_k", "K splits over a cluster of 1, 2 or 4 blocks");
    }
    if t.split_k > 1 {
        if t.cluster() > 1 || t.persistent_blocks > 0 {
            return err(
                "split_k",
                "a split K takes a cluster of its own: no multicast cluster, not persistent",
            );
        }
        if t.bm == 128 && mats(p) * t.bn > 192 {
            return err(
                "split_k",
                "two consumer warpgroups keep at most 192 columns of partial sums beside the adds without spilling",
            );
        }
        if (p.k.div_ceil(BK)) < t.split_k {
            return err("split_k", "every block of the split needs a chunk of 64 k");
        }
        if split_slot_bytes(p, t) * (t.split_k as u64 - 1) > t.stages as u64 * stage_bytes(p, t) {
            return err(
                "split_k",
                "the peers' partial sums must fit the owner's ring (more stages or a smaller split)",
            );
        }
    }
    if t.persistent_blocks > 0
        && (t.cluster_n != 1 || !t.persistent_blocks.is_multiple_of(t.cluster_m))
    {
        return err(
            "tiling",
            "a persistent launch takes whole row clusters (cluster_n 1, blocks a multiple of cluster_m)",
        );
    }
    if block_smem_bytes(p, t) > u32::MAX as u64 {
        return err(
            "tiling",
            "shared memory beyond a launch's 32-bit byte count",
        );
    }
    Ok(())
}

/// Generates the kernel with tiling `t` (for sm_90a only).
pub fn gemm_wgmma(p: &GemvParams, t: &WgmmaTiling) -> Result<KernelSource, Error> {
    validate(p, t)?;
    let mut kb = KernelBuilder::new(FAMILY, p.w_dtype);
    for items in [
        CP_ASYNC,
        BULK_HELPERS,
        TMA_HELPERS,
        WGMMA_HELPERS,
        GEMM_HELPERS,
    ] {
        kb.items.line(items.trim_end());
    }
    let clustered = t.cluster() > 1;
    if clustered {
        kb.items.line(CLUSTER_HELPERS.trim_end());
    }
    let split = t.split_k > 1;
    if split {
        kb.items.line(SPLIT_K_HELPERS.trim_end());
    }
    mainloop::emit_mma_function(&mut kb.items, p.w_dtype, mainloop::mma_n(p, t));
    let w = &mut kb.prologue;
    emit!(w, "constexpr int K = {};", p.k);
    emit!(w, "constexpr int N = {};", p.n);
    emit!(w, "constexpr int BM = {};  // rows per block", t.bm);
    emit!(
        w,
        "constexpr int BN = {};  // columns per block and matrix",
        t.bn
    );
    emit!(
        w,
        "constexpr int G = {};  // matrices: 2 for gate and up",
        mats(p)
    );
    emit!(w, "constexpr int NS = {};  // ring stages", t.stages);
    if clustered {
        emit!(
            w,
            "constexpr int CM = {}, CN = {};  // cluster blocks along the rows, the columns",
            t.cluster_m,
            t.cluster_n
        );
    }
    w.line("constexpr int NC = BM / 64;  // consumer warpgroups");
    w.line("constexpr int NA = BN / 2;  // accumulators per thread and matrix");
    w.line("constexpr int KT = (K + 63) / 64;  // k chunks");
    if split {
        emit!(
            w,
            "constexpr int SK = {};  // blocks splitting K (the cluster along z)",
            t.split_k
        );
        w.line("const unsigned rank = blockIdx.z;  // %cluster_ctarank");
        w.line("const int KB = int(rank) * KT / SK;  // this block's first chunk");
        w.line("const int KN = (int(rank) + 1) * KT / SK - KB;  // and its chunks");
    } else {
        w.line("constexpr int KB = 0, KN = KT;  // the block's first chunk and its chunks");
    }
    w.line("constexpr unsigned XBOX = BM * 128, WBOX = BN * 128;  // box bytes");
    w.line("constexpr unsigned STAGE = XBOX + G * WBOX;");
    emit!(
        w,
        "constexpr int CT = {};  // column tiles (argmax partials per row)",
        partials_per_row(p, t)
    );
    if t.persistent_blocks > 0 {
        emit!(
            w,
            "constexpr int PCM = {};  // row tiles per cluster tile",
            t.cluster_m
        );
    } else {
        w.line("const int m0 = blockIdx.x * BM;");
        w.line("const int ct = blockIdx.y;");
        w.line("const int n0 = ct * BN;");
        mainloop::emit_weight_prefetch(w, p, t);
    }
    let w = &mut kb.body;
    emit!(w, "const int M = {};", p.rows.expr());
    w.line("const int lane = threadIdx.x & 31;");
    w.line("const int warp = threadIdx.x >> 5;");
    mainloop::emit(w, p, t, |w| epilogue::emit(w, p));
    let launch = LaunchSpec {
        grid: if t.persistent_blocks > 0 {
            [
                Extent::Fixed(t.persistent_blocks),
                Extent::Fixed(1),
                Extent::Fixed(1),
            ]
        } else {
            [
                p.rows.extent_rounded(t.bm, t.cluster_m),
                Extent::Fixed(partials_per_row(p, t)),
                Extent::Fixed(t.split_k),
            ]
        },
        block: [t.threads(), 1, 1],
        smem_bytes: ring_bytes(p, t) as u32,
    };
    let attrs = KernelAttrs {
        min_blocks: None,
        cluster: if split {
            Some([1, 1, t.split_k])
        } else {
            clustered.then_some([t.cluster_m, t.cluster_n, 1])
        },
    };
    Ok(kb.finish_with(launch, attrs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{Loc, Rows};
    use crate::gemv::RmsNormPrologue;

    fn params(k: u32, n: u32, gate_up: bool) -> GemvParams {
        crate::gemv::test_projection(Rows::Fixed(256), 64, k, n, gate_up, Dtype::BF16)
    }

    const T: WgmmaTiling = WgmmaTiling::new(128, 128, 4);

    #[test]
    fn tilings_and_operands_are_validated() {
        let p = params(4096, 4096, false);
        assert!(gemm_wgmma(&p, &T).is_ok());
        assert!(gemm_wgmma(&p, &WgmmaTiling { bn: 256, ..T }).is_ok());
        assert!(gemm_wgmma(&p, &WgmmaTiling { bm: 96, ..T }).is_err());
        assert!(gemm_wgmma(&p, &WgmmaTiling { bn: 12, ..T }).is_err());
        assert!(gemm_wgmma(&p, &WgmmaTiling { bn: 264, ..T }).is_err());
        assert!(gemm_wgmma(&p, &WgmmaTiling { stages: 1, ..T }).is_err());
        let gate_up = params(4096, 14336, true);
        assert!(gemm_wgmma(&gate_up, &T).is_ok());
        assert!(gemm_wgmma(&gate_up, &WgmmaTiling { bn: 256, ..T }).is_err());
        let mut normed = p.clone();
        normed.norm = Some(RmsNormPrologue {
            weight: Loc::table(1),
            dtype: Dtype::BF16,
            eps: 1e-5,
        });
        assert!(gemm_wgmma(&normed, &T).is_err());
        assert!(gemm_wgmma(&params(4100, 4096, false), &T).is_err(), "K % 8");
    }

    #[test]
    fn persistent_launches_walk_whole_row_clusters() {
        let p = params(4096, 14336, true);
        let t = WgmmaTiling {
            cluster_m: 2,
            persistent_blocks: 132,
            ..WgmmaTiling::new(128, 112, 5)
        };
        let k = gemm_wgmma(&p, &t).unwrap();
        assert_eq!(k.launch.grid[0], Extent::Fixed(132));
        assert_eq!(k.launch.grid[1], Extent::Fixed(1));
        assert!(k
            .kernel
            .contains("for (int u = blockIdx.x / PCM; u < UNITS; u += gridDim.x / PCM)"));
        assert!(k.kernel.contains("constexpr int PCM = 2;"));
        assert!(
            k.kernel.contains("it - 1 + NS < TOTAL"),
            "the block's last NS chunks are not released"
        );
        for bad in [
            WgmmaTiling {
                persistent_blocks: 131,
                ..t
            },
            WgmmaTiling {
                cluster_m: 1,
                cluster_n: 2,
                ..t
            },
        ] {
            assert!(gemm_wgmma(&p, &bad).is_err(), "{bad:?}");
        }
        let one_per_tile = gemm_wgmma(
            &p,
            &WgmmaTiling {
                persistent_blocks: 0,
                ..t
            },
        )
        .unwrap();
        assert!(!one_per_tile.kernel.contains("UNITS"));
    }

    #[test]
    fn the_grid_tiles_rows_fastest_with_a_producer_warp() {
        let p = params(4096, 14336, true);
        let k = gemm_wgmma(&p, &T).unwrap();
        assert_eq!(k.launch.grid[0], Extent::Fixed(2));
        assert_eq!(k.launch.grid[1], Extent::Fixed(14336 / 128));
        assert_eq!(k.launch.threads(), 2 * 128 + 32);
        assert_eq!(k.launch.smem_bytes, 4 * (128 + 2 * 128) * 128 + 1024);
        assert!(k.name.starts_with("gemm_wgmma_bf16_"));
        assert_eq!(k.family(), "gemm_wgmma");
        assert!(
            k.kernel
                .contains("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"),
            "one wgmma over the gate and up boxes"
        );
        let split = WgmmaTiling {
            split_mats: true,
            ..T
        };
        let k = gemm_wgmma(&p, &split).unwrap();
        assert!(k
            .kernel
            .contains("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"));
        assert!(!k.kernel.contains("m64n256k16"));
        assert_eq!(
            k.operands
                .iter()
                .filter(|l| matches!(l, Loc::TensorMap(_)))
                .count(),
            3,
            "x, gate and up maps"
        );
    }
}
