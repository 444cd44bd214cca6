//! Fusion of MLA's small operations around its projections (`models`' `lower_mla`), each
//! pattern a group of one kernel:
//!
//! - key/value: `kva → slice[0, L) → rmsnorm → reshape → kv_write(c_cache)` and
//!   `kva → slice[L, L + R) → reshape → rope → kv_write(pe_cache)`, the two writes at one
//!   slot value ([`MlaKv`]);
//! - query: `q → slice[0, DN)` and `q → slice[DN, DN + DR) → rope` ([`MlaQ`]).
//!
//! A pattern fires only when the slices are `x`'s only readers, along its last axis and
//! covering it, and every intermediate it hides has its one reader inside the group and is
//! not a graph output (the query's `q_nope` slice is an output of the group).

use specc_ir::{Graph, Op, ValueId};

use crate::fuse::is_view;
use crate::group::{MlaKv, MlaQ};
use crate::uses::Uses;

/// `x`'s readers as `(head, tail)`: two slices along the last axis, `[0, a)` and `[a, end)`.
fn split_last(g: &Graph, uses: &Uses, x: ValueId) -> Option<(ValueId, ValueId)> {
    let rank = g.ty(x).shape.rank();
    let width = g.ty(x).shape.dims().last()?.as_static()?;
    let [u, v] = uses.users(x) else {
        return None;
    };
    if uses.is_output(x) || u == v {
        return None;
    }
    let part = |s: ValueId| match g.node(s).op {
        Op::Slice { axis, start, len } if axis + 1 == rank && g.node(s).args[0] == x => {
            Some((start, len))
        }
        _ => None,
    };
    let ((s0, l0), (s1, l1)) = (part(*u)?, part(*v)?);
    let (head, tail, a, b) = if s0 == 0 {
        (*u, *v, (s0, l0), (s1, l1))
    } else {
        (*v, *u, (s1, l1), (s0, l0))
    };
    (a.0 == 0 && b.0 == a.1 && a.1 + b.1 == width && a.1 > 0 && b.1 > 0).then_some((head, tail))
}

/// The node `v`'s sole reader when it has `op`'s kind and reads `v` as operand `arg`.
fn next(g: &Graph, uses: &Uses, v: ValueId, arg: usize, kind: fn(&Op) -> bool) -> Option<ValueId> {
    let u = uses.sole_user(v)?;
    (kind(&g.node(u).op) && g.node(u).args.get(arg) == Some(&v)).then_some(u)
}

fn is_rope(op: &Op) -> bool {
    matches!(op, Op::Rope { .. })
}

fn is_kv_write(op: &Op) -> bool {
    *op == Op::KvWrite
}

/// The key/value group rooted at `kva`, with the nodes it computes.
pub(crate) fn kv_group(g: &Graph, uses: &Uses, kva: ValueId) -> Option<(MlaKv, Vec<ValueId>)> {
    if g.ty(kva).shape.rank() != 3 {
        return None;
    }
    let (c_slice, pe_slice) = split_last(g, uses, kva)?;
    let norm = next(g, uses, c_slice, 0, |op| matches!(op, Op::RmsNorm { .. }))?;
    let c_view = next(g, uses, norm, 0, is_view)?;
    let c_write = next(g, uses, c_view, 1, is_kv_write)?;
    let pe_view = next(g, uses, pe_slice, 0, is_view)?;
    let rope = next(g, uses, pe_view, 0, is_rope)?;
    let pe_write = next(g, uses, rope, 1, is_kv_write)?;
    let Op::RmsNorm { eps } = g.node(norm).op else {
        return None;
    };
    let slots = g.node(c_write).args[2];
    if g.node(pe_write).args[2] != slots || g.ty(c_view).shape.rank() != 4 {
        return None;
    }
    let (src, kva_cols) = match crate::fuse::last_axis_slice(g, kva) {
        Some((src, start)) => (src, Some(start)),
        None => (kva, None),
    };
    let group = MlaKv {
        kva: src,
        kva_cols,
        norm_weight: g.node(norm).args[1],
        eps,
        rope,
        positions: g.node(rope).args[1],
        slots,
        c_cache_out: c_write,
        pe_cache_out: pe_write,
    };
    let mut nodes = vec![
        c_slice, norm, c_view, c_write, pe_slice, pe_view, rope, pe_write,
    ];
    if kva_cols.is_some() {
        nodes.push(kva);
    }
    Some((group, nodes))
}

/// The query group rooted at `q`, with the nodes it computes.
pub(crate) fn q_group(g: &Graph, uses: &Uses, q: ValueId) -> Option<(MlaQ, Vec<ValueId>)> {
    if g.ty(q).shape.rank() != 4 {
        return None;
    }
    let (nope, pe_slice) = split_last(g, uses, q)?;
    let rope = next(g, uses, pe_slice, 0, is_rope)?;
    let group = MlaQ {
        q,
        positions: g.node(rope).args[1],
        q_nope: nope,
        q_pe: rope,
    };
    Some((group, vec![nope, pe_slice, rope]))
}
