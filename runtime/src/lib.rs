//! specc's runtime: sessions that advance sequences one step at a time over a compiled
//! graph. The CPU backend executes the graph with the IR interpreter.

mod cpu;
mod error;

pub use cpu::{CpuSession, StepOutput};
pub use error::RuntimeError;
