//! A matmul whose normed x is a last-axis slice of a stored product (MLA's q_a columns of the
//! stacked q_a|kv_a product) reads those columns in place: the group carries `x_cols` and
//! no kernel stores the slice. Where the columns' rows would not start 16-byte aligned
//! (the GEMV's x loads), the slice is stored as before.

use specc_codegen::{compile, GroupKind};
use specc_ir::op::{B, T};
use specc_ir::{Bindings, DType, Dim, Graph, Op, TensorType};

/// `matmul(rmsnorm(slice(h · w_aᵀ, cols 0..32)), w_b)` over a product `width` columns wide.
fn sliced_norm_matmul(width: usize) -> Graph {
    let mut g = Graph::new("sliced_norm_matmul");
    let ty = |dims: Vec<Dim>| TensorType::new(DType::BF16, dims);
    let h = g.input("h", ty(vec![B, T, Dim::from(64usize)])).unwrap();
    let wa = g
        .weight("w_a", ty(vec![Dim::from(width), Dim::from(64usize)]))
        .unwrap();
    let both = g.add(Op::MatMul, &[h, wa]).unwrap();
    let qa = g
        .add(
            Op::Slice {
                axis: 2,
                start: 0,
                len: 32,
            },
            &[both],
        )
        .unwrap();
    let rest = g
        .add(
            Op::Slice {
                axis: 2,
                start: 32,
                len: width as u64 - 32,
            },
            &[both],
        )
        .unwrap();
    let nw = g.weight("norm", ty(vec![Dim::from(32usize)])).unwrap();
    let normed = g.add(Op::RmsNorm { eps: 1e-6 }, &[qa, nw]).unwrap();
    let wb = g
        .weight("w_b", ty(vec![Dim::from(48usize), Dim::from(32usize)]))
        .unwrap();
    let q = g.add(Op::MatMul, &[normed, wb]).unwrap();
    g.set_output("q", q);
    g.set_output("rest", rest);
    g
}

/// `(x_cols of the matmul group reading the normed slice, stored slices of the product)`.
fn plan(width: usize) -> (Option<u64>, usize) {
    let buckets = [Bindings::new(1, 1, 64), Bindings::new(1, 8, 64)];
    let c = compile(sliced_norm_matmul(width), &buckets).unwrap();
    let x_cols = c
        .groups
        .iter()
        .find_map(|gr| match &gr.kind {
            GroupKind::MatMul {
                x_cols,
                norm: Some(_),
                ..
            } => Some(*x_cols),
            _ => None,
        })
        .expect("the normed matmul's group");
    let stored = c
        .groups
        .iter()
        .filter(|gr| {
            matches!(gr.kind, GroupKind::Single(v)
                if matches!(c.graph.node(v).op, Op::Slice { start: 0, .. }))
        })
        .count();
    (x_cols, stored)
}

#[test]
fn aligned_columns_are_read_in_place() {
    // 72 bf16 columns: rows 144 bytes apart, q_a's columns start at byte 0.
    assert_eq!(plan(72), (Some(0), 0));
}

#[test]
fn misaligned_rows_keep_the_stored_slice() {
    // 70 bf16 columns: rows 140 bytes apart, not 16-byte aligned.
    assert_eq!(plan(70), (None, 1));
}
