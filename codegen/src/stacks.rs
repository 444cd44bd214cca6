//! Weight stacks: a `concat` along axis 0 of views of 2-D checkpoint weights of one dtype
//! and one column count (the routed experts of a MoE layer, `[E, rows, cols]` from E
//! `[rows, cols]` weights) is not computed by a kernel on every step. Its bytes are the
//! weights' bytes in order, so the runtime builds it once at upload as a
//! [`specc_ir::engine::Slot::ConcatRows`] slot, and no arena space holds it.
//!
//! Weight blocks: a `slice` of a view of a checkpoint weight (MLA's per-head W_UK and W_UV
//! rows of `kv_b_proj`) is likewise gathered once at upload, a
//! [`specc_ir::engine::Slot::WeightBlocks`] slot, instead of copied by a kernel every step;
//! so is a slice of a view of the `dequantize` of a stored weight (fp8 `kv_b_proj`): the
//! runtime dequantises it once, by the op's definition, and no kernel computes the
//! `dequantize` ([`dequant_folded`]).

use specc_ir::engine::{BlockDequant, WeightBlocks};
use specc_ir::{DType, Graph, Op, ValueId};

use crate::fuse::is_view;
use crate::uses::Uses;

/// The weights stacked by `v` in order, when `v` is a weight stack (see the module docs).
pub fn weight_stack(g: &Graph, v: ValueId) -> Option<Vec<String>> {
    let n = g.node(v);
    if !matches!(n.op, Op::Concat { axis: 0 }) || n.args.is_empty() {
        return None;
    }
    let mut names = Vec::with_capacity(n.args.len());
    let mut cols = None;
    for &a in &n.args {
        let mut r = a;
        while is_view(&g.node(r).op) {
            r = g.node(r).args[0];
        }
        let leaf = g.node(r);
        let Op::Weight { name, .. } = &leaf.op else {
            return None;
        };
        let dims = leaf.ty.shape.dims();
        if dims.len() != 2 || leaf.ty.dtype != n.ty.dtype {
            return None;
        }
        let c = dims[1].as_static()?;
        if *cols.get_or_insert(c) != c {
            return None;
        }
        names.push(name.clone());
    }
    Some(names)
}

/// The blocks `v` gathers, when `v` is a static slice of a view of one weight of its dtype,
/// or of a view of the `dequantize` of one stored weight by one scale weight to its dtype
/// (see the module docs).
pub fn weight_blocks(g: &Graph, v: ValueId) -> Option<WeightBlocks> {
    let n = g.node(v);
    let Op::Slice { axis, start, len } = n.op else {
        return None;
    };
    let src = n.args[0];
    let r = through_views(g, src);
    let (name, dequant) = match weight_name(g, r) {
        Some(name) if g.node(r).ty.dtype == n.ty.dtype => (name, None),
        Some(_) => return None,
        None => {
            let (w, scale, to) = dequantized_weight(g, r)?;
            (w, Some(BlockDequant { scale, to }))
        }
    };
    n.ty.dtype.size_bytes()?;
    let dims = g
        .ty(src)
        .shape
        .dims()
        .iter()
        .map(|d| d.as_static())
        .collect::<Option<Vec<u64>>>()?;
    let outer: u64 = dims.get(..axis)?.iter().product();
    let inner: u64 = dims.get(axis + 1..)?.iter().product();
    Some(WeightBlocks {
        name,
        outer,
        period: dims[axis].checked_mul(inner)?,
        start: start.checked_mul(inner)?,
        len: len.checked_mul(inner)?,
        dequant,
    })
}

/// Whether `v` is a `dequantize` of weights that no kernel computes: every use of it
/// (through views) is a [`weight_blocks`] slice, gathered at upload.
pub fn dequant_folded(g: &Graph, uses: &Uses, v: ValueId) -> bool {
    if dequantized_weight(g, v).is_none() {
        return false;
    }
    fn only_blocks(g: &Graph, uses: &Uses, v: ValueId) -> bool {
        !uses.is_output(v)
            && uses.users(v).iter().all(|&u| {
                if is_view(&g.node(u).op) {
                    only_blocks(g, uses, u)
                } else {
                    weight_blocks(g, u).is_some()
                }
            })
    }
    only_blocks(g, uses, v)
}

/// `v` with its views peeled off.
fn through_views(g: &Graph, mut v: ValueId) -> ValueId {
    while is_view(&g.node(v).op) {
        v = g.node(v).args[0];
    }
    v
}

fn weight_name(g: &Graph, v: ValueId) -> Option<String> {
    match &g.node(v).op {
        Op::Weight { name, .. } => Some(name.clone()),
        _ => None,
    }
}

/// (weight, scale, dtype) when `v` is `dequantize(weight, scale)` of two checkpoint
/// weights, each as stored (no views: the dequantisation reads the stored layout).
fn dequantized_weight(g: &Graph, v: ValueId) -> Option<(String, String, DType)> {
    let n = g.node(v);
    let Op::Dequantize { to } = n.op else {
        return None;
    };
    let w = weight_name(g, *n.args.first()?)?;
    let scale = weight_name(g, *n.args.get(1)?)?;
    Some((w, scale, to))
}

#[cfg(test)]
mod tests {
    use super::*;
    use specc_ir::{DType, Dim, Shape, TensorType};

    fn expert(g: &mut Graph, name: &str, rows: u64, cols: u64, dt: DType) -> ValueId {
        let w = g
            .weight(
                name,
                TensorType::new(dt, [Dim::from(rows), Dim::from(cols)]),
            )
            .unwrap();
        g.add(
            Op::Reshape {
                shape: Shape::new([Dim::from(1u64), Dim::from(rows), Dim::from(cols)]),
            },
            &[w],
        )
        .unwrap()
    }

    #[test]
    fn experts_concatenated_on_axis_0_are_a_stack() {
        let mut g = Graph::new("t");
        let a = expert(&mut g, "e0", 4, 8, DType::BF16);
        let b = expert(&mut g, "e1", 4, 8, DType::BF16);
        let s = g.add(Op::Concat { axis: 0 }, &[a, b]).unwrap();
        assert_eq!(weight_stack(&g, s), Some(vec!["e0".into(), "e1".into()]));
        let t = g.add(Op::Concat { axis: 1 }, &[a, b]).unwrap();
        assert_eq!(weight_stack(&g, t), None, "axis 1 interleaves rows");
    }

    #[test]
    fn a_computed_operand_or_other_columns_is_not_a_stack() {
        let mut g = Graph::new("t");
        let a = expert(&mut g, "e0", 4, 8, DType::F32);
        let neg = g.add(Op::Unary(specc_ir::UnaryOp::Neg), &[a]).unwrap();
        let s = g.add(Op::Concat { axis: 0 }, &[a, neg]).unwrap();
        assert_eq!(weight_stack(&g, s), None);
    }

    #[test]
    fn a_per_head_slice_of_a_weight_is_gathered_blocks() {
        let mut g = Graph::new("t");
        let w = g
            .weight(
                "kv_b",
                TensorType::new(DType::BF16, [Dim::from(2 * 5u64), Dim::from(4u64)]),
            )
            .unwrap();
        let heads = g
            .add(
                Op::Reshape {
                    shape: Shape::new([Dim::from(2u64), Dim::from(5u64), Dim::from(4u64)]),
                },
                &[w],
            )
            .unwrap();
        let uv = g
            .add(
                Op::Slice {
                    axis: 1,
                    start: 3,
                    len: 2,
                },
                &[heads],
            )
            .unwrap();
        let b = weight_blocks(&g, uv).unwrap();
        assert_eq!(
            (b.name.as_str(), b.outer, b.period, b.start, b.len),
            ("kv_b", 2, 20, 12, 8)
        );
        let neg = g.add(Op::Unary(specc_ir::UnaryOp::Neg), &[heads]).unwrap();
        let computed = g
            .add(
                Op::Slice {
                    axis: 1,
                    start: 0,
                    len: 3,
                },
                &[neg],
            )
            .unwrap();
        assert_eq!(weight_blocks(&g, computed), None);
    }

    /// fp8 `kv_b_proj` (`[heads · 5, 4]` with block scales): its per-head slices gather
    /// from the dequantised weight, and the `dequantize` itself is folded only while every
    /// use is such a slice.
    #[test]
    fn slices_of_a_dequantized_weight_gather_at_upload() {
        let mut g = Graph::new("t");
        let ty = |dt, r: u64, c: u64| TensorType::new(dt, [Dim::from(r), Dim::from(c)]);
        let w = g.weight("kv_b", ty(DType::Fp8E4M3, 10, 4)).unwrap();
        let s = g.weight("kv_b.scale", ty(DType::F32, 1, 1)).unwrap();
        let d = g.add(Op::Dequantize { to: DType::BF16 }, &[w, s]).unwrap();
        let heads = g
            .add(
                Op::Reshape {
                    shape: Shape::new([Dim::from(2u64), Dim::from(5u64), Dim::from(4u64)]),
                },
                &[d],
            )
            .unwrap();
        let slice = |g: &mut Graph, start, len| {
            g.add(
                Op::Slice {
                    axis: 1,
                    start,
                    len,
                },
                &[heads],
            )
            .unwrap()
        };
        let uk = slice(&mut g, 0, 3);
        let uv = slice(&mut g, 3, 2);
        g.set_output("uk", uk);
        g.set_output("uv", uv);
        let b = weight_blocks(&g, uv).unwrap();
        assert_eq!(
            (b.name.as_str(), b.outer, b.period, b.start, b.len),
            ("kv_b", 2, 20, 12, 8)
        );
        assert_eq!(
            b.dequant,
            Some(BlockDequant {
                scale: "kv_b.scale".into(),
                to: DType::BF16
            })
        );
        assert!(dequant_folded(&g, &Uses::new(&g), d));
        // A use that is not a gathered slice keeps the kernel.
        let neg = g.add(Op::Unary(specc_ir::UnaryOp::Neg), &[d]).unwrap();
        g.set_output("neg", neg);
        assert!(!dequant_folded(&g, &Uses::new(&g), d));
    }
}
