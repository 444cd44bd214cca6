use thiserror::Error;

#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The context is the engine's: where it came from (a flag, a spec, an engine.json) is
    /// the caller's to say.
    #[error("sequence of {needed} tokens exceeds the maximum context of {max_context}")]
    ContextOverflow { needed: usize, max_context: u64 },
    /// The memory estimate of a run exceeds what is available (one line, from
    /// [`crate::memory::Footprint::check`]).
    #[error("{0}")]
    OutOfMemory(String),
    /// A weight cannot be read (e.g. it holds a NaN).
    #[error(transparent)]
    Model(#[from] specc_models::ModelError),
    #[error("empty step: at least one token is required")]
    EmptyStep,
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("graph has no `{0}` output")]
    MissingOutput(&'static str),
    #[error("lane {lane}: more than {capacity} tokens emitted since the last drain (the ring overran; drain more often)")]
    RingOverrun { lane: usize, capacity: usize },
    /// The engine cannot be loaded or lacks what was asked of it (a bucket, a cubin, a graph).
    #[error("engine: {0}")]
    Engine(String),
    #[error(transparent)]
    Ir(#[from] specc_ir::IrError),
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
}
