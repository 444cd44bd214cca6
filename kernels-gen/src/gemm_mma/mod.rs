//! `gemm_mma`: the many-row matmul `y[M, N] = x[M, K] · W[N, K]ᵀ` on tensor cores
//! (`mma.sync.aligned.m16n8k16.row.col`, bf16 or f16 operands, f32 accumulation), for the
//! row counts where [`crate::gemv_mma`] re-reads every weight byte once per 64-row tile and
//! every x fragment once per warp. Same parameters ([`GemvParams`]), numerics and epilogues
//! (the shared per-element epilogue of [`crate::gemv`]: store, cast, residual, SwiGLU, and
//! argmax partials) as the GEMV kernels; the build picks it in `specc_codegen::choose::matmul`.
//!
//! Tiles: block `(bx, by)` computes rows `bx · BM ..` and columns `by · BN ..` (of both
//! matrices for the gate/up pair). Row tiles are the fastest grid dimension, so the blocks
//! that read one weight tile run together and all but the first find it in L2: the weights
//! leave HBM about once whatever M is. K advances in steps of `BK = 64` through a ring of
//! `NS` shared-memory stages filled by 16-byte `cp.async.cg` copies, `NS − 1` steps ahead;
//! each stage holds the x tile (`BM` rows) then the weight tile (`G · BN` rows), 128 bytes
//! per row, the eight 16-byte chunks of row `r` stored at chunk `c ^ (r & 7)` so that both
//! the copies and the `ldmatrix` reads of 8 rows hit 8 distinct bank groups. x is the A
//! operand (rows on the m16 side), the weights the B operand (columns on the n8 side).
//!
//! Masking: x rows past M, weight rows past N and chunks past K are zero-filled by the copy
//! (no memory read); outputs past M or N are not stored. K must be a multiple of 8 (one
//! 16-byte chunk); N and M are arbitrary.
//!
//! Batch invariance: every output element is one f32 accumulator that receives the
//! m16n8k16 steps of k = 0, 16, 32, .. K in that order, and nothing else (no split-K, no
//! reduction across warps or blocks). The order depends on K only — not on M, on the tile
//! shape or on the element's position in the tile — so a row's result is bit-identical
//! whatever the other rows of the launch are and whichever tiling the bucket's row count
//! selects. (The tensor-core step computes each element of a fragment from its own row and
//! column alone.)
//!
//! Kernel family `gemm_mma`; name dtype: the weight dtype. `mainloop` emits the staging
//! and the mma steps, `epilogue` the per-element epilogues.

use crate::abi::{Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec};
use crate::gemv::{GemvParams, GemvWeights};
use crate::writer::emit;
use crate::Error;
pub use specc_ir::engine::choice::GemmTiling;

mod epilogue;
mod mainloop;

const FAMILY: &str = "gemm_mma";
/// The K step of every tiling: 64 elements, one 128-byte row per staged row (the swizzle
/// permutes its eight 16-byte chunks).
pub const BK: u32 = 64;
/// Module items: `cp.async` and shared-memory addresses.
const CP_ASYNC: &str = crate::CP_ASYNC_ITEMS;
/// Module items: `ldmatrix` and the m16n8k16 step.
const FRAGMENT_HELPERS: &str = include_str!("../../cuda/attn_mma.cuh");
/// Module items of this family (the argmax quad reduction).
const GEMM_HELPERS: &str = include_str!("../../cuda/gemm_mma.cuh");

/// Weight matrices one x tile feeds (2 for the gate/up pair).
pub fn mats(p: &GemvParams) -> u32 {
    if p.gate_up() {
        2
    } else {
        1
    }
}

/// Bytes of one ring stage: the x tile and the weight tile(s), `BK` elements per row.
pub fn stage_bytes(p: &GemvParams, t: &GemmTiling) -> u64 {
    (t.bm + mats(p) * t.bn) as u64 * t.bk as u64 * p.w_dtype.size()
}

/// Shared memory one block uses (the dynamic ring, the static argmax candidates), with
/// 1 KiB of slack for the compiler's own.
pub fn block_smem_bytes(p: &GemvParams, t: &GemmTiling) -> u64 {
    let cand = if p.argmax_partials.is_some() {
        (t.wn * t.bm * 8) as u64
    } else {
        0
    };
    t.stages as u64 * stage_bytes(p, t) + cand + 1024
}

/// Argmax partials each row gets: one per column block (the grid's y extent).
pub fn partials_per_row(p: &GemvParams, t: &GemmTiling) -> u32 {
    p.n.div_ceil(t.bn)
}

/// Whether `t` is a valid tiling for `p` (what [`gemm_mma`] checks first). No device fact
/// enters: whether the block's shared memory ([`block_smem_bytes`]) fits a device is the
/// selection's question (`specc_codegen::choose::matmul`).
pub fn validate(p: &GemvParams, t: &GemmTiling) -> Result<(), Error> {
    p.validate()?;
    let err = |field, reason: &str| Err(Error::param(FAMILY, field, reason));
    if p.w_dtype != p.x.dtype || !matches!(p.w_dtype, Dtype::BF16 | Dtype::F16) {
        return err("w_dtype", "needs bf16 or f16 weights of x's dtype");
    }
    if !p.x.aligned(16) {
        return err("x", "rows must be 16-byte aligned");
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
    if t.bk != BK {
        return err("tiling", "bk must be 64");
    }
    if t.wm == 0 || t.wn == 0 || t.warps() > 16 {
        return err("tiling", "1..=16 warps");
    }
    if !t.bm.is_multiple_of(16 * t.wm) || !t.bn.is_multiple_of(16 * t.wn) {
        return err(
            "tiling",
            "each warp owns whole 16-row and 16-column fragments",
        );
    }
    if t.stages < 2 {
        return err("tiling", "the ring needs at least 2 stages");
    }
    if block_smem_bytes(p, t) > u32::MAX as u64 {
        return err(
            "tiling",
            "shared memory beyond a launch's 32-bit byte count",
        );
    }
    Ok(())
}

/// Generates the kernel with tiling `t`.
pub fn gemm_mma(p: &GemvParams, t: &GemmTiling) -> Result<KernelSource, Error> {
    validate(p, t)?;
    let (xt, wt) = (p.x.dtype.c_type(), p.w_dtype.c_type());
    let mut kb = KernelBuilder::new(FAMILY, p.w_dtype);
    kb.items.line(CP_ASYNC.trim_end());
    kb.items.line(FRAGMENT_HELPERS.trim_end());
    kb.items.line(GEMM_HELPERS.trim_end());
    // The prologue (before the PDL wait) declares the shape, the block's place and the
    // weight pointers, and prefetches the first weight lines; the body stages and computes.
    let w = &mut kb.prologue;
    emit!(w, "constexpr int K = {};", p.k);
    emit!(w, "constexpr int N = {};", p.n);
    emit!(w, "constexpr int BM = {};  // rows per block", t.bm);
    emit!(
        w,
        "constexpr int BN = {};  // columns per block and matrix",
        t.bn
    );
    emit!(w, "constexpr int BK = {};  // k per stage", t.bk);
    emit!(
        w,
        "constexpr int G = {};  // matrices: 2 for gate and up",
        mats(p)
    );
    emit!(w, "constexpr int WM = {};  // warps across rows", t.wm);
    emit!(w, "constexpr int WN = {};  // warps across columns", t.wn);
    w.line("constexpr int NT = 32 * WM * WN;");
    w.line("constexpr int MI = BM / WM / 16;  // m16 fragments per warp");
    w.line("constexpr int NI = BN / WN / 8;  // n8 fragments per warp and matrix");
    emit!(w, "constexpr int NS = {};  // ring stages", t.stages);
    w.line("constexpr int ROWS = BM + G * BN;  // staged rows per stage");
    w.line("constexpr int CPR = BK / 8;  // 16-byte chunks per staged row");
    w.line("constexpr int KT = (K + BK - 1) / BK;  // k steps");
    w.line("const int m0 = blockIdx.x * BM;");
    w.line("const int n0 = blockIdx.y * BN;");
    let (w0, w1) = match p.weights {
        GemvWeights::Single(l) => (l, None),
        GemvWeights::GateUp { gate, up } => (gate, Some(up)),
    };
    emit!(w, "const {wt}* w0 = {};", w0.ptr(p.w_dtype, false));
    if let Some(up) = w1 {
        emit!(w, "const {wt}* w1 = {};", up.ptr(p.w_dtype, false));
    }
    mainloop::emit_weight_prefetch(w, p);
    let w = &mut kb.body;
    emit!(w, "const int M = {};", p.rows.expr());
    w.line("const int lane = threadIdx.x & 31;");
    w.line("const int warp = threadIdx.x >> 5;");
    w.line("const int g = lane >> 2;");
    w.line("const int t = lane & 3;");
    w.line("const int wm0 = (warp / WN) * (BM / WM);  // the warp's first row in the tile");
    w.line("const int wn0 = (warp % WN) * (BN / WN);  // the warp's first column in the tile");
    emit!(w, "const {xt}* x = {};", p.x.loc.ptr(p.x.dtype, false));
    let k16 = match p.w_dtype {
        Dtype::F16 => "mma16816_f16",
        _ => "mma16816_bf16",
    };
    mainloop::emit(w, p, k16);
    epilogue::emit(w, p);
    let launch = LaunchSpec {
        grid: [
            p.rows.extent(1, t.bm),
            Extent::Fixed(partials_per_row(p, t)),
            Extent::Fixed(1),
        ],
        block: [t.threads(), 1, 1],
        smem_bytes: (t.stages as u64 * stage_bytes(p, t)) as u32,
    };
    Ok(kb.finish(launch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{Loc, Rows};
    use crate::gemv::RmsNormPrologue;

    fn params(k: u32, n: u32, gate_up: bool) -> GemvParams {
        crate::gemv::test_projection(Rows::Fixed(256), 64, k, n, gate_up, Dtype::BF16)
    }

    const T: GemmTiling = GemmTiling {
        bm: 128,
        bn: 64,
        bk: 64,
        wm: 4,
        wn: 2,
        stages: 4,
    };

    #[test]
    fn tilings_and_operands_are_validated() {
        let p = params(4096, 4096, false);
        assert!(gemm_mma(&p, &T).is_ok());
        assert!(gemm_mma(&p, &GemmTiling { bk: 32, ..T }).is_err());
        assert!(gemm_mma(&p, &GemmTiling { bn: 48, ..T }).is_err());
        assert!(gemm_mma(&p, &GemmTiling { stages: 1, ..T }).is_err());
        let mut normed = p.clone();
        normed.norm = Some(RmsNormPrologue {
            weight: Loc::table(1),
            dtype: Dtype::BF16,
            eps: 1e-5,
        });
        assert!(gemm_mma(&normed, &T).is_err());
        assert!(gemm_mma(&params(4100, 4096, false), &T).is_err(), "K % 8");
    }

    #[test]
    fn the_grid_tiles_rows_fastest_and_the_ring_is_dynamic() {
        let p = params(4096, 14336, true);
        let k = gemm_mma(&p, &T).unwrap();
        assert_eq!(k.launch.grid[0], Extent::Fixed(2));
        assert_eq!(k.launch.grid[1], Extent::Fixed(14336 / 64));
        assert_eq!(k.launch.threads(), 256);
        assert_eq!(k.launch.smem_bytes, 4 * (128 + 2 * 64) * 128);
        assert!(k.name.starts_with("gemm_mma_bf16_"));
        assert_eq!(k.family(), "gemm_mma");
    }
}
