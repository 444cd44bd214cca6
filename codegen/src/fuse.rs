//! Fusion: partitions the graph's compute nodes into groups.
//!
//! Rules (each only fires when every intermediate it hides has no reader outside the group
//! and is not a graph output):
//! - matmuls reading the same `x` form one group, so `x` is read once;
//! - an rmsnorm whose every reader is in that group becomes its prologue;
//! - one matmul whose sole reader is `add(other, mm)` or `add(mm, other)` absorbs the add;
//! - two matmuls read only by one `silu_mul` become a gate/up pair with a SwiGLU epilogue;
//! - three matmuls q/k/v reshaped to heads, (optionally per-head normed,) roped and written
//!   to the KV cache become one group with a RoPE + KV-write epilogue (kernels-gen runs it
//!   in the q/k/v GEMV's epilogue; with per-head norms as a second kernel, `rope_kv`);
//! - one matmul read only by `cast<f32>` (itself read only by an `argmax` and/or the graph
//!   outputs) becomes the lm-head with logits and argmax epilogue;
//! - MLA's latent / rope-key preparation and its query split become one group each
//!   ([`crate::fuse_mla`]).
//!
//! `reshape` nodes are views and weight stacks (`stacks`) are built at upload: neither forms
//! a group; every other remaining compute node is a
//! `Single` group. Leaves (input, weight, state) and folded constants are not groups.

use std::collections::BTreeSet;

use specc_ir::{BinaryOp, DType, Graph, Op, ValueId};

use crate::group::{Epilogue, Group, GroupKind, HeadNorm, MatOut, NormPrologue, RopeKvWrite};
use crate::stacks;
use crate::uses::Uses;

/// Whether a node is a view of its first operand (no kernel, no storage of its own).
pub fn is_view(op: &Op) -> bool {
    matches!(op, Op::Reshape { .. })
}

fn is_leaf(op: &Op) -> bool {
    matches!(op, Op::Input { .. } | Op::Weight { .. } | Op::State { .. })
}

/// Groups of `g`; `constants[v]` marks folded nodes, which form no group (a matmul group
/// never contains one: every node it absorbs depends on the matmul).
pub fn run(g: &Graph, constants: &[bool]) -> Vec<Group> {
    let uses = Uses::new(g);
    let mut claimed = vec![false; g.len()];
    let mut groups = Vec::new();
    for (id, node) in g.nodes() {
        if claimed[id.index()] || !matches!(node.op, Op::MatMul) {
            continue;
        }
        let x = node.args[0];
        let mats: Vec<ValueId> = uses
            .users(x)
            .iter()
            .copied()
            .filter(|&u| {
                !claimed[u.index()] && matches!(g.node(u).op, Op::MatMul) && g.node(u).args[0] == x
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let group = matmul_group(g, &uses, x, &mats);
        for n in &group.nodes {
            claimed[n.index()] = true;
        }
        groups.push(group);
    }
    for (id, _) in g.nodes() {
        let kind = match crate::fuse_mla::kv_group(g, &uses, id) {
            Some((kv, nodes)) => Some((GroupKind::MlaKv(Box::new(kv)), nodes)),
            None => crate::fuse_mla::q_group(g, &uses, id)
                .map(|(q, nodes)| (GroupKind::MlaQ(Box::new(q)), nodes)),
        };
        let Some((kind, nodes)) = kind else {
            continue;
        };
        if nodes
            .iter()
            .any(|n| claimed[n.index()] || constants[n.index()])
        {
            continue;
        }
        for n in &nodes {
            claimed[n.index()] = true;
        }
        groups.push(close(g, &uses, kind, nodes));
    }
    for (id, node) in g.nodes() {
        if claimed[id.index()]
            || is_leaf(&node.op)
            || is_view(&node.op)
            || constants[id.index()]
            || stacks::weight_stack(g, id).is_some()
            || stacks::weight_blocks(g, id).is_some()
            || stacks::dequant_folded(g, &uses, id)
        {
            continue;
        }
        claimed[id.index()] = true;
        groups.push(close(g, &uses, GroupKind::Single(id), vec![id]));
    }
    groups
}

/// Fills in a group's inputs and outputs from its node set.
fn close(g: &Graph, uses: &Uses, kind: GroupKind, mut nodes: Vec<ValueId>) -> Group {
    nodes.sort();
    nodes.dedup();
    let inside: BTreeSet<ValueId> = nodes.iter().copied().collect();
    let mut inputs = BTreeSet::new();
    let mut outputs = Vec::new();
    for &n in &nodes {
        for &a in &g.node(n).args {
            if !inside.contains(&a) {
                inputs.insert(a);
            }
        }
        if uses.is_output(n) || uses.users(n).iter().any(|u| !inside.contains(u)) {
            outputs.push(n);
        }
    }
    Group {
        kind,
        nodes,
        inputs: inputs.into_iter().collect(),
        outputs,
    }
}

fn mat_out(g: &Graph, node: ValueId) -> MatOut {
    let args = &g.node(node).args;
    MatOut {
        node,
        weight: args[1],
        scale: args.get(2).copied(),
    }
}

fn matmul_group(g: &Graph, uses: &Uses, x: ValueId, mats: &[ValueId]) -> Group {
    let mut nodes: Vec<ValueId> = mats.to_vec();
    let mut x_in = x;
    let mut norm = None;
    if let Op::RmsNorm { eps } = g.node(x).op {
        let all_in = !uses.is_output(x) && uses.users(x).iter().all(|u| mats.contains(u));
        if all_in {
            norm = Some(NormPrologue {
                weight: g.node(x).args[1],
                eps,
                node: x,
            });
            x_in = g.node(x).args[0];
            nodes.push(x);
        }
    }
    let mut mat_outs: Vec<MatOut> = mats.iter().map(|&m| mat_out(g, m)).collect();
    let mut x_cols = None;
    if let Some(nm) = &norm {
        if let Some((src, start)) = strided_x(g, uses, x_in, nm.node, &mat_outs) {
            nodes.push(x_in);
            x_in = src;
            x_cols = Some(start);
        }
    }
    let epilogue = match mats {
        [m] => residual(g, uses, *m)
            .or_else(|| lm_head(g, uses, *m))
            .unwrap_or((Epilogue::Store, vec![])),
        [a, b] => match silu_mul(g, uses, *a, *b) {
            Some((ep, extra, swapped)) => {
                if swapped {
                    mat_outs.swap(0, 1);
                }
                (ep, extra)
            }
            None => (Epilogue::Store, vec![]),
        },
        [a, b, c] => match rope_kv_write(g, uses, [*a, *b, *c]) {
            Some((ep, extra, order)) => {
                mat_outs = order.iter().map(|&m| mat_out(g, m)).collect();
                (ep, extra)
            }
            None => (Epilogue::Store, vec![]),
        },
        _ => (Epilogue::Store, vec![]),
    };
    let (epilogue, extra) = epilogue;
    nodes.extend(extra);
    close(
        g,
        uses,
        GroupKind::MatMul {
            x: x_in,
            x_cols,
            norm,
            mats: mat_outs,
            epilogue,
        },
        nodes,
    )
}

/// `(source, start)` where the normed x of a matmul group, `x`, is a last-axis slice that
/// only the norm reads, of a source whose rows then start 16-byte aligned at `start` (the
/// GEMV's x loads): the group reads those columns in place and the slice is never stored.
/// Quantised matmuls read contiguous x rows only, so they keep the stored slice.
fn strided_x(
    g: &Graph,
    uses: &Uses,
    x: ValueId,
    norm: ValueId,
    mats: &[MatOut],
) -> Option<(ValueId, u64)> {
    if mats.iter().any(|m| m.scale.is_some())
        || uses.is_output(x)
        || uses.sole_user(x) != Some(norm)
    {
        return None;
    }
    let (src, start) = last_axis_slice(g, x)?;
    let elem = g.ty(src).dtype.size_bytes()? as u64;
    let width = g.ty(src).shape.dims().last()?.as_static()?;
    ((start * elem).is_multiple_of(16) && (width * elem).is_multiple_of(16)).then_some((src, start))
}

/// `(source, start)` where `v` is a slice of its source's last axis (columns `start ..` of
/// each of its rows), which a group can read in place instead of storing the slice.
pub(crate) fn last_axis_slice(g: &Graph, v: ValueId) -> Option<(ValueId, u64)> {
    let n = g.node(v);
    let Op::Slice { axis, start, .. } = n.op else {
        return None;
    };
    let src = *n.args.first()?;
    (axis + 1 == g.ty(src).shape.rank()).then_some((src, start))
}

fn residual(g: &Graph, uses: &Uses, m: ValueId) -> Option<(Epilogue, Vec<ValueId>)> {
    let add = uses.sole_user(m)?;
    let node = g.node(add);
    if node.op != Op::Binary(BinaryOp::Add) || g.ty(node.args[0]) != g.ty(node.args[1]) {
        return None;
    }
    let residual = if node.args[1] == m {
        node.args[0]
    } else {
        node.args[1]
    };
    if residual == m {
        return None;
    }
    Some((Epilogue::ResidualAdd { residual, out: add }, vec![add]))
}

fn lm_head(g: &Graph, uses: &Uses, m: ValueId) -> Option<(Epilogue, Vec<ValueId>)> {
    let cast = uses.sole_user(m)?;
    if g.node(cast).op != (Op::Cast { to: DType::F32 }) {
        return None;
    }
    let argmaxes: Vec<ValueId> = uses
        .users(cast)
        .iter()
        .copied()
        .filter(|&u| g.node(u).op == Op::Argmax)
        .collect();
    if argmaxes.len() != uses.users(cast).len() || argmaxes.len() > 1 {
        return None;
    }
    let argmax = argmaxes.first().copied();
    let mut extra = vec![cast];
    extra.extend(argmax);
    Some((
        Epilogue::LogitsArgmax {
            logits: cast,
            argmax,
        },
        extra,
    ))
}

/// Returns the epilogue, the nodes it absorbs, and whether `[a, b]` must swap to be
/// `[gate, up]`.
fn silu_mul(
    g: &Graph,
    uses: &Uses,
    a: ValueId,
    b: ValueId,
) -> Option<(Epilogue, Vec<ValueId>, bool)> {
    let s = uses.sole_user(a)?;
    if uses.sole_user(b)? != s || g.node(s).op != Op::SiluMul {
        return None;
    }
    let swapped = g.node(s).args[0] == b;
    Some((Epilogue::SiluMul { out: s }, vec![s], swapped))
}

/// Follows `mm → reshape → [rmsnorm] → rope` and returns (chain nodes, rope node, norm).
fn head_chain(
    g: &Graph,
    uses: &Uses,
    mm: ValueId,
) -> Option<(Vec<ValueId>, ValueId, Option<HeadNorm>)> {
    let r = uses.sole_user(mm)?;
    if !is_view(&g.node(r).op) || g.ty(r).shape.rank() != 4 {
        return None;
    }
    let mut chain = vec![r];
    let mut cur = uses.sole_user(r)?;
    let mut norm = None;
    if let Op::RmsNorm { eps } = g.node(cur).op {
        norm = Some(HeadNorm {
            weight: g.node(cur).args[1],
            eps,
        });
        chain.push(cur);
        cur = uses.sole_user(cur)?;
    }
    if !matches!(g.node(cur).op, Op::Rope { .. }) || g.node(cur).args[0] != *chain.last()? {
        return None;
    }
    chain.push(cur);
    Some((chain, cur, norm))
}

type QkvMatch = (Epilogue, Vec<ValueId>, [ValueId; 3]);

fn rope_kv_write(g: &Graph, uses: &Uses, mats: [ValueId; 3]) -> Option<QkvMatch> {
    let (mut q, mut k, mut v) = (None, None, None);
    for m in mats {
        if let Some((chain, rope, norm)) = head_chain(g, uses, m) {
            // k's rope feeds exactly one kv_write as the value operand; q's rope does not.
            match uses.sole_user(rope) {
                Some(w) if g.node(w).op == Op::KvWrite && g.node(w).args[1] == rope => {
                    k = Some((m, chain, rope, norm, w));
                }
                _ => q = Some((m, chain, rope, norm)),
            }
        } else {
            let r = uses.sole_user(m)?;
            let w = uses.sole_user(r)?;
            if !is_view(&g.node(r).op) || g.node(w).op != Op::KvWrite || g.node(w).args[1] != r {
                return None;
            }
            v = Some((m, r, w));
        }
    }
    let (qm, qchain, qrope, q_norm) = q?;
    let (km, kchain, krope, k_norm, kw) = k?;
    let (vm, vr, vw) = v?;
    let pos = g.node(qrope).args[1];
    // q and k rotate at q's positions; k and v are written at one slot value (the same
    // positions, or a draft tree's node slots).
    let slots = g.node(kw).args[2];
    let same_pos = g.node(krope).args[1] == pos && g.node(vw).args[2] == slots;
    if !same_pos || g.node(qrope).op != g.node(krope).op {
        return None;
    }
    let qt = &g.ty(qrope).shape;
    let kt = &g.ty(krope).shape;
    let head_dim = qt.dims()[3].as_static()?;
    let mut extra = qchain;
    extra.extend(kchain);
    extra.extend([vr, kw, vw]);
    Some((
        Epilogue::RopeKvWrite(Box::new(RopeKvWrite {
            positions: pos,
            slots,
            head_dim,
            q_heads: qt.dims()[2].as_static()?,
            kv_heads: kt.dims()[2].as_static()?,
            q_norm,
            k_norm,
            rope: g.node(qrope).op.clone(),
            q_out: qrope,
            k_cache_in: g.node(kw).args[0],
            v_cache_in: g.node(vw).args[0],
            k_cache_out: kw,
            v_cache_out: vw,
        })),
        extra,
        [qm, km, vm],
    ))
}
