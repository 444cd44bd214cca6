//! The physical floor of a step: the bytes any implementation must move, whatever its
//! kernels — the roofline `specc bench` and `plan.txt` measure against.
//!
//! Counted per compute node (so a chain of k dependent draft steps reads the draft's
//! weights k times, and a target forward reads each of its weights once):
//! - every weight operand at its stored bytes (int4 nibbles, fp8 bytes, and their scale
//!   tensors, which are weights of their own), seen through the views and upload-time
//!   gathers that only re-index weights (`reshape`, a static `slice`, a `concat` of
//!   weights); an embedding reads only the rows its ids select; a `moe_experts` node reads
//!   the uniform-routing union of the experts its tokens select
//!   ([`crate::cost::expected_union`]);
//! - every attention's cache operands up to the live context, once per sequence;
//! - the rows `kv_write` writes and the rows `kv_move` copies (read and written);
//! - the step's inputs and outputs.
//!
//! Activations passed between nodes are not counted: a perfect fusion keeps them on chip.
//! The plan's own bytes ([`crate::Cost`]) sit beside this floor; their ratio is the plan's
//! overhead.

use specc_ir::engine::PhysicalBytes;
use specc_ir::{Bindings, BucketDim, Graph, Op, ValueId};

use crate::cost::{expected_union, moe_dims};

/// The physical floor of `g` under `bind` with `live_ctx` cache slots in use per sequence
/// (at most the cache capacity; the capacity itself gives the bound at a full context).
pub fn physical_bytes(g: &Graph, bind: &Bindings, live_ctx: u64) -> PhysicalBytes {
    let mut p = PhysicalBytes::default();
    let bytes = |v: ValueId| g.ty(v).bytes(bind).unwrap_or(0);
    let numel = |v: ValueId| -> u64 {
        g.ty(v)
            .shape
            .resolve(bind)
            .map_or(0, |d| d.iter().map(|&x| x as u64).product())
    };
    for (n, node) in g.nodes() {
        match &node.op {
            Op::Input { .. } => p.io = p.io.saturating_add(bytes(n)),
            // Views and gathers of weights are read by their consumers.
            _ if stored_weight_bytes(g, n, bind).is_some() => {}
            Op::Embedding => {
                let (table, ids) = (node.args[0], node.args[1]);
                if let Some(all) = stored_weight_bytes(g, table, bind) {
                    let rows = g.ty(table).shape.dims()[0].resolve(bind).unwrap_or(1);
                    let read = all / rows.max(1) * numel(ids).min(rows);
                    p.weights = p.weights.saturating_add(read);
                }
            }
            Op::MoeExperts => {
                let (tokens, experts, top_k) = moe_dims(g, n, bind);
                let share = expected_union(experts, top_k, tokens) / experts.max(1) as f64;
                for &a in &node.args[2..] {
                    if let Some(all) = stored_weight_bytes(g, a, bind) {
                        let read = (all as f64 * share).round() as u64;
                        p.weights = p.weights.saturating_add(read);
                    }
                }
            }
            Op::Attention { .. } | Op::MlaAttention { .. } => {
                let caches = match node.op {
                    Op::Attention { .. } => &node.args[1..3],
                    _ => &node.args[2..4],
                };
                for &c in caches {
                    let cap = g.ty(c).shape.dims()[1].resolve(bind).unwrap_or(1).max(1);
                    let read = bytes(c) / cap * live_ctx.min(cap);
                    p.kv_read = p.kv_read.saturating_add(read);
                }
                p.weights = p.weights.saturating_add(weight_args(g, &node.args, bind));
            }
            Op::KvWrite => p.kv_written = p.kv_written.saturating_add(bytes(node.args[1])),
            Op::KvMove => {
                let cache = node.args[0];
                let dims = g.ty(cache).shape.resolve(bind).unwrap_or_default();
                let slots = dims.iter().take(2).map(|&d| d as u64).product::<u64>();
                let row = bytes(cache) / slots.max(1);
                let moved = numel(node.args[1]).saturating_mul(row);
                p.kv_written = p.kv_written.saturating_add(moved.saturating_mul(2));
            }
            _ => p.weights = p.weights.saturating_add(weight_args(g, &node.args, bind)),
        }
    }
    for &(_, v) in g.outputs() {
        if !matches!(g.node(v).op, Op::KvWrite | Op::KvMove | Op::Assign) {
            p.io = p.io.saturating_add(bytes(v));
        }
    }
    p
}

/// Stored bytes of the weight operands among `args`.
fn weight_args(g: &Graph, args: &[ValueId], bind: &Bindings) -> u64 {
    args.iter()
        .filter_map(|&a| stored_weight_bytes(g, a, bind))
        .fold(0u64, u64::saturating_add)
}

/// Stored bytes behind `v` when `v` only re-indexes checkpoint weights (a weight, a
/// reshape of one, a static slice of one, a concat of them), else `None`.
fn stored_weight_bytes(g: &Graph, v: ValueId, bind: &Bindings) -> Option<u64> {
    let node = g.node(v);
    match &node.op {
        Op::Weight { ty, .. } => ty.bytes(bind),
        Op::Reshape { .. } => stored_weight_bytes(g, node.args[0], bind),
        Op::Slice { axis, len, .. } => {
            let src = node.args[0];
            let whole = stored_weight_bytes(g, src, bind)?;
            let dim = g.ty(src).shape.dims().get(*axis)?.resolve(bind)?;
            Some(whole / dim.max(1) * len)
        }
        Op::Concat { .. } => node
            .args
            .iter()
            .map(|&a| stored_weight_bytes(g, a, bind))
            .sum(),
        _ => None,
    }
}

/// The cache capacity (`Ctx`) of `bind`, the live context of a full cache.
pub fn capacity(bind: &Bindings) -> u64 {
    bind.get(BucketDim::Ctx).unwrap_or(0)
}
