//! specc-kernels-gen: CUDA C++ kernel generators for the fused groups of a launch plan, the
//! one kernel ABI they share ([`abi`]), and NVRTC compilation to cubins ([`nvrtc`]).
//!
//! Each family is a function from explicit parameters (dtypes, sizes, arena offsets or
//! weight-table slots, fusion flags) to a [`KernelSource`]: a self-contained module (the
//! hand-written prelude in `cuda/*.cuh` + the generated kernel), its name
//! `{family}_{dtype}_{hash8}` and its launch geometry as formulas of the bucket.
//! Generators validate first and return typed errors; text is printed only from valid
//! parameters, through the structured [`writer`].
//!
//! Families: [`gemv::gemv`] (and its tensor-core variant [`gemv_mma::gemv_mma`] for
//! row tiles of 2..=64, the tiled tensor-core GEMM [`gemm_mma::gemm_mma`] for many rows, and [`gemv_quant::gemv_quant`] over int4 / fp8 weights read as
//! stored, [`quant`]; the first two carry the q|k|v RoPE + KV-write epilogue of [`qkv_rope`]), [`norm::rmsnorm`], [`elementwise::binary`] (add, mul,
//! silu_mul), [`elementwise::embedding`], [`rope::rope_kv`], [`attention::attention`]
//! (split + combine; [`attention_mma`] on tensor cores for many rows per sequence), [`argmax::argmax`].
//!
//! [`module`] groups kernels into NVRTC programs of several entries (one prelude parse per
//! program); [`Nvrtc::compile_many`] compiles those groups on a worker pool.
//!
//! No device constant lives here: every choice that depends on the device (work splits that
//! fill its SMs, shared-memory stages that fit its blocks) takes the build's [`Target`], and
//! every kernel is correct on any device that can launch it.

pub mod abi;
pub mod argmax;
pub mod attention;
pub mod attention_mma;
pub mod chain;
pub mod elementwise;
mod error;
pub mod gemm_mma;
pub mod gemm_wgmma;
pub mod gemv;
pub mod gemv_mma;
pub mod gemv_quant;
pub mod generic;
mod last_arrival;
pub mod mla_tile;
pub mod mla_wgmma;
pub mod module;
pub mod norm;
pub mod nvrtc;
pub mod qkv_rope;
pub mod quant;
pub mod rope;
pub mod tensor_map;
pub mod writer;

/// `cp.async` helpers: module items of the families that stage tiles in shared memory.
pub(crate) const CP_ASYNC_ITEMS: &str = include_str!("../cuda/cp_async.cuh");

pub use abi::{
    Bucket, Dtype, KernelSource, LaunchGeometry, LaunchSpec, Loc, Rows, StepConsts, View,
};
pub use error::{number_lines, CompileFailure, Error};
pub use module::{group_modules, ModuleSource};
pub use nvrtc::{Arch, Compiled, CompiledModule, Nvrtc, PtxasStats};
pub use specc_ir::engine::Target;
