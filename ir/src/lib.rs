//! specc's operator IR: an arena graph of typed values, its verifier, its text form and the
//! CPU interpreter that defines every op.

mod dtype;
mod error;
mod graph;
mod infer;
mod infer_mla;
pub mod op;
mod shape;
mod verify;

pub use dtype::{DType, FP8_BLOCK};
pub use error::IrError;
pub use graph::{Graph, Node, ValueId};
pub use infer::scale_shape;
pub use op::{
    Arity, AttnMask, BinaryOp, MoeScoring, Op, OpInfo, ReduceOp, RopeScaling, RopeStyle, UnaryOp,
};
pub use shape::{Bindings, BucketDim, Dim, Shape, TensorType};
pub use verify::verify;

pub mod engine;
pub mod interp;
#[doc(hidden)]
pub mod testing;
pub mod text;
