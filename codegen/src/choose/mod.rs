//! The one selection module: every kernel choice of the build, made from a fused group's
//! shapes and the [`specc_ir::engine::Target`] and returned as a
//! [`specc_ir::engine::choice::KernelChoice`] value. The kernel generators take the choice
//! and only print CUDA; the choice is recorded in the engine per (bucket, group).
//!
//! No device fact is read anywhere else: SM counts, shared memory per block and the
//! architectures come from the target.

pub mod attention;
pub mod chain;
pub mod gemm;
pub mod matmul;
pub mod mla;
pub mod moe;

use specc_ir::engine::choice::{AttentionKernel, MatmulCore, TileTiling};
use specc_ir::engine::Target;
use specc_kernels_gen::abi::KernelSource;
use specc_kernels_gen::attention::{self as attn, AttentionKernels, AttentionParams};
use specc_kernels_gen::gemv::{gemv_tiled, GemvParams};
use specc_kernels_gen::gemv_mma::{gemv_mma_split, SplitScratch};
use specc_kernels_gen::gemv_quant::{gemv_quant_tiled, quant_tiling, QuantWeights};
use specc_kernels_gen::Error;

/// The matmul kernel the build emits for `p` on `target` (for tests and benchmarks of one
/// kernel); `split` is the split-K scratch its tiling needs, if any.
pub fn matmul_kernel(
    p: &GemvParams,
    split: Option<SplitScratch>,
    target: &Target,
) -> Result<KernelSource, Error> {
    let rows = match p.rows {
        specc_kernels_gen::abi::Rows::Fixed(r) => r,
        _ => p.row_tile,
    };
    match matmul::core(p, rows, target) {
        MatmulCore::CudaCores(t) => gemv_tiled(p, &t),
        MatmulCore::TensorCores(t) => gemv_mma_split(p, &t, split),
        MatmulCore::Gemm(t) => specc_kernels_gen::gemm_mma::gemm_mma(p, &t),
        MatmulCore::Wgmma(t) => specc_kernels_gen::gemm_wgmma::gemm_wgmma(p, &t),
        MatmulCore::Dequant(_) => Err(Error::Unsupported {
            family: "gemv_q",
            op: "matmul",
            reason: "quantised weights come with their scales: quant_matmul_kernel".into(),
        }),
    }
}

/// The matmul kernel the build emits for `p` over weights stored as `q` (for tests and
/// benchmarks of one kernel).
pub fn quant_matmul_kernel(p: &GemvParams, q: &QuantWeights) -> Result<KernelSource, Error> {
    let t = match matmul::quant_core(p, q) {
        MatmulCore::Dequant(t) => t,
        _ => quant_tiling(p, q),
    };
    gemv_quant_tiled(p, q, &t)
}

/// The attention kernels the build emits for `p` on `target`, at `p.splits` splits (for
/// tests and benchmarks of one kernel).
pub fn attention_kernels(p: &AttentionParams, target: &Target) -> Result<AttentionKernels, Error> {
    match attention::kernel(p, target) {
        Some(AttentionKernel::TensorCores(t)) => attn::attention_tiles_tiled(p, t),
        _ => attn::attention(p),
    }
}

/// The tensor-core attention kernels for `p` with the block shape chosen for `target`
/// (an error where no tile fits or the shapes do not suit them).
pub fn attention_tiles(p: &AttentionParams, target: &Target) -> Result<AttentionKernels, Error> {
    let smallest = TileTiling {
        warps: 1,
        tile_slots: 16,
        split_p: true,
        slot_warps: 1,
    };
    attn::attention_tiles_tiled(p, attention::tiling(p, target).unwrap_or(smallest))
}

/// A plain projection for the selection tests (`gemv::test_projection` over token rows).
#[cfg(test)]
pub(crate) fn test_params(
    row_tile: u32,
    k: u32,
    n: u32,
    gate_up: bool,
    dt: specc_kernels_gen::abi::Dtype,
) -> specc_kernels_gen::gemv::GemvParams {
    use specc_kernels_gen::abi::Rows;
    specc_kernels_gen::gemv::test_projection(Rows::Tokens, row_tile, k, n, gate_up, dt)
}
