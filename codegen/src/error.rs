use thiserror::Error;

use specc_ir::{IrError, ValueId};

#[derive(Debug, Error)]
pub enum CodegenError {
    #[error("IR verification failed after pass `{pass}`: {source}")]
    Verify {
        pass: &'static str,
        #[source]
        source: IrError,
    },
    #[error("scheduling found a dependency cycle among {groups} groups (a fusion bug)")]
    Cycle { groups: usize },
    #[error("{value} of type {ty} has a bucket dim the plan does not bind")]
    Unbound { value: ValueId, ty: String },
    #[error("memory plan overlaps live values {a} and {b}")]
    Overlap { a: ValueId, b: ValueId },
    #[error("{graph}: {source}")]
    Kernels {
        graph: String,
        #[source]
        source: specc_kernels_gen::Error,
    },
    #[error("{0}")]
    Nvrtc(specc_kernels_gen::Error),
    #[error("folding constant {value} failed: {source}")]
    Fold {
        value: ValueId,
        #[source]
        source: IrError,
    },
}
