//! The CUDA backend: one device, one stream, one graph replay per step.
//!
//! - [`CudaDevice`]: context + the one stream everything runs on (event tracking off, so
//!   capture works); device name, arch, memory.
//! - [`DeviceWeights`]: all weights in one slab, uploaded through pinned staging.
//! - [`operand_table`]: the kernel ABI's `ops` tables (each launch's operand addresses);
//!   [`pointer_table`] checks 16-byte aligned bases.
//! - [`DeviceArena`], [`StateBuffers`]: the bucket's activation arena at the memory plan's
//!   offsets, and the persistent states (KV caches) by name.
//! - [`KernelModule`]: cubin / PTX loading, functions with their shared-memory opt-in.
//! - [`PreparedLaunch`], [`launch_all`]: checked launches issued in order.
//! - [`StepGraph`]: capture (with a guard that always ends it) and replay; keeps every
//!   buffer and module it touches alive.
//! - [`TokenRing`]: the step's per-lane token rings and emitted counts copied to pinned host
//!   mirrors after each replay, read without blocking.
//!
//! Ordering rule: every copy, launch and replay goes on [`CudaDevice::stream`], so the
//! stream orders them; nothing relies on cudarc's per-buffer events.
//!
//! Wiring an engine (kernel ABI of `specc_kernels_gen::abi`: `(void* const* ops, StepConsts
//! c)`; [`CudaEngine::load`] does all of this):
//! 1. `CudaDevice::open(0)`; choose the engine's cubins with
//!    `pick_arch(&dev.info().arch, &archs)`.
//! 2. `DeviceWeights::upload(&dev, tensors, true)`; `StateBuffers::for_graph(&dev, &graph,
//!    &bind)`; `TokenRing::from_states(&dev, states.get(RING)?.clone(),
//!    states.get(EMITTED)?.clone(), b, ring_capacity, DEFAULT_RING_DEPTH)` over the step
//!    graph's `spec.ring` / `spec.emitted` states.
//! 3. One [`BufRef`] per plan slot (`weights.buf_ref(name)`, `states.buf_ref(name)`) and
//!    `DeviceArena::new(&dev, plan.arena_bytes)`; each launch's operands (`k.operands`: arena
//!    offsets or slot + offset) resolved against them into one [`operand_table`].
//! 4. Per module of `Nvrtc::compile_many` (several kernels in one cubin)
//!    `KernelModule::load(&dev, &m.name, KernelImage::Binary(m.compiled.cubin))`, and per
//!    kernel `module.function(&k.entry, geom.smem_bytes)` from the module listing it; then `PreparedLaunch::new(&k.name, f,
//!    grid, block, smem, vec![KernelParam::buf(&table, 8 * first_operand)?,
//!    KernelParam::i32s(&[b, t, ctx, b * t])])?.with_pdl()` in plan order (generated kernels
//!    wait for their predecessor, so they may launch programmatically: see the PDL notes in
//!    `launch.rs` and [`CudaDevice::pdl_enabled`]).
//! 5. `StepGraph::from_launches(&dev, launches, vec![])` (the launches hold the operand
//!    table, which holds the arena, the slab, states and ring).
//! 6. Per step: `arena.write_input(..)` if the host has new inputs, `graph.replay()`,
//!    `ring.after_replay()`, and `ring.poll()` whenever convenient.

mod arena;
pub mod bench;
mod buffer;
mod device;
mod engine;
mod error;
mod graph;
mod launch;
mod module;
mod prefills;
mod ring;
mod session;
mod table;
mod tensor_map;
mod weights;

pub use arena::{state_sizes, DeviceArena, StateBuffers};
pub use buffer::{DeviceBuffer, ALLOC_GRANULE};
pub use device::{
    arch_for, driver_present, pdl_default, pick_arch, CudaDevice, DeviceInfo, LaunchCounters,
    PDL_ENV,
};
pub use engine::{check_loadable, CudaEngine, LoadedGraph, WeightSources};
pub use error::CudaError;
pub use graph::{Retained, StepGraph};
pub use launch::{launch_all, KernelParam, PreparedLaunch};
pub use module::{KernelFunction, KernelImage, KernelModule};
pub use prefills::PrefillAt;
pub use ring::{TokenRing, DEFAULT_RING_DEPTH};
pub use session::{prefill_bucket, CudaSpecSession, MIN_PREFILL_T};
pub use table::{operand_table, pointer_table, BufRef, TABLE_ENTRY_ALIGN};
pub use tensor_map::encode_tensor_map;
pub use weights::{slab_layout, DeviceWeights, HostTensor, WeightEntry, WEIGHT_ALIGN};
