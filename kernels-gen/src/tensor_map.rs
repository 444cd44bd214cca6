//! TMA tensor-map operands: a kernel that loads 2-D boxes of a row-major tensor with
//! `cp.async.bulk.tensor.2d` names the tensor as a [`crate::abi::Loc::TensorMap`]; its
//! operand-table entry then points at a 128-byte descriptor (`CUtensorMap`) that the runtime
//! encodes at load time from the tensor's address and the launch's bucket. The map's data and
//! rules live with the ABI's other operand kinds ([`specc_ir::engine::abi::TensorMap`]).

pub use specc_ir::engine::abi::{TensorMap, BOX_ROW_BYTES, BOX_SMEM_ALIGN, DESCRIPTOR_BYTES};
