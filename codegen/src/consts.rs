//! Constant folding: values that depend on nothing but the bucket are computed here, at
//! compile time, instead of by a kernel launch on every step.
//!
//! A node is constant when it is a `fill` or an `iota`, or a pure data-movement /
//! elementwise op (binary, unary, cast, select, slice, concat, gather, copy, reshape) whose
//! operands are all constant; its dtype is an integer, bool or f32 (encoded exactly); its
//! shape has no `Ctx` dim (so the value stays small: static dims × B × T) and its static
//! dims hold at most [`MAX_STATIC_ELEMS`] elements; and it is not a graph output (the host
//! reads outputs from the arena).
//!
//! Constant nodes form no group. A constant read by a group gets [`crate::Home::Const`]:
//! its bytes, evaluated per bucket by the interpreter (so they equal what the folded ops
//! would have computed, bit for bit), uploaded once at load into a buffer the kernels reach
//! through the operand table. Constants read only by other constants are never materialised.

use std::collections::HashMap;

use specc_ir::interp::{self, Tensor};
use specc_ir::{Bindings, BucketDim, DType, Dim, Graph, Op, ValueId};

use crate::CodegenError;

/// Upper bound on the elements of a constant's static dims (bucket dims B and T excluded).
pub const MAX_STATIC_ELEMS: u64 = 1024;

/// Whether `op` may be folded when all its operands are constant.
fn foldable(op: &Op) -> bool {
    matches!(
        op,
        Op::Binary(_)
            | Op::Unary(_)
            | Op::Cast { .. }
            | Op::Select
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::Gather { .. }
            | Op::Copy
            | Op::Reshape { .. }
    )
}

/// `is_const[v]` for every node of `g` (see the module docs for the rule).
pub fn constant_nodes(g: &Graph) -> Vec<bool> {
    let mut is_const = vec![false; g.len()];
    let outputs: Vec<ValueId> = g.outputs().iter().map(|(_, v)| *v).collect();
    for (id, n) in g.nodes() {
        let source = matches!(n.op, Op::Fill { .. } | Op::Iota { .. })
            || (foldable(&n.op)
                && !n.args.is_empty()
                && n.args.iter().all(|a| is_const[a.index()]));
        let exact_dtype = matches!(
            n.ty.dtype,
            DType::I32 | DType::I64 | DType::Bool | DType::F32
        );
        let mut static_elems = 1u64;
        let mut small = true;
        for d in &n.ty.shape.0 {
            match d {
                Dim::Static(s) => static_elems = static_elems.saturating_mul(*s),
                Dim::Bucket(BucketDim::Ctx) => small = false,
                Dim::Bucket(_) => {}
            }
        }
        is_const[id.index()] = source
            && exact_dtype
            && small
            && static_elems <= MAX_STATIC_ELEMS
            && !outputs.contains(&id);
    }
    is_const
}

/// Little-endian bytes of `t` as kernels read its dtype: the layout of a value in the
/// arena ([`Tensor::le_bytes`]).
pub fn tensor_bytes(t: &Tensor) -> Vec<u8> {
    t.le_bytes()
}

/// The value of constant node `v` at `bind`, evaluated by the interpreter (operands first,
/// memoised in `memo`).
pub fn evaluate(
    g: &Graph,
    v: ValueId,
    bind: &Bindings,
    memo: &mut HashMap<ValueId, Tensor>,
) -> Result<Tensor, CodegenError> {
    if let Some(t) = memo.get(&v) {
        return Ok(t.clone());
    }
    let node = g.node(v);
    let mut args = Vec::with_capacity(node.args.len());
    for &a in &node.args {
        args.push(evaluate(g, a, bind, memo)?);
    }
    let refs: Vec<&Tensor> = args.iter().collect();
    let t = interp::eval_node(v, node, &refs, bind)
        .map_err(|source| CodegenError::Fold { value: v, source })?;
    memo.insert(v, t.clone());
    Ok(t)
}
