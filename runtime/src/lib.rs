//! specc's runtime: sessions that advance sequences one step at a time over a compiled
//! graph. The CPU backend executes the graph with the IR interpreter; the CUDA backend
//! (feature `cuda`) replays one captured graph per step.

pub mod admission;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod draft_sync;
mod error;
pub mod memory;
pub mod policy;
mod session;
mod spec_cpu;
pub mod windows;

pub use cpu::{CpuSession, StepOutput};
#[cfg(feature = "cuda")]
pub use cuda::{CudaDevice, CudaError};
pub use error::RuntimeError;
pub use policy::{AdaptivePolicy, SpecPolicy};
pub use session::{Behind, Speculator};
pub use spec_cpu::{DraftKind, EngineGraphs, SpecCpuSession, SpecGraphs, SpecStats};
