//! Bytes moved and FLOPs per group, and the roofline time they imply.

use specc_ir::{Bindings, Graph, Op};

use crate::group::Group;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// Bytes read from weights.
    pub weight_bytes: u64,
    /// Bytes of activations and state read or written (inputs + outputs of the group).
    pub act_bytes: u64,
    pub flops: u64,
}

impl Cost {
    pub fn bytes(&self) -> u64 {
        self.weight_bytes + self.act_bytes
    }

    /// Roofline time in microseconds on a GPU with `bw` bytes/s and `flops_s` FLOP/s.
    pub fn roofline_us(&self, bw: f64, flops_s: f64) -> f64 {
        (self.bytes() as f64 / bw).max(self.flops as f64 / flops_s) * 1e6
    }
}

fn numel(g: &Graph, v: specc_ir::ValueId, bind: &Bindings) -> u64 {
    g.ty(v)
        .shape
        .resolve(bind)
        .map(|d| d.iter().map(|&x| x as u64).product())
        .unwrap_or(0)
}

pub fn group_cost(g: &Graph, gr: &Group, bind: &Bindings) -> Cost {
    let mut c = Cost::default();
    // An embedding gather reads only the rows it looks up, not the whole table.
    let gathered: Vec<specc_ir::ValueId> = gr
        .nodes
        .iter()
        .filter(|&&n| g.node(n).op == Op::Embedding)
        .map(|&n| g.node(n).args[0])
        .collect();
    // The expert stacks of a MoE are read only for the experts the tokens select.
    let mut stacks = Vec::new();
    for &n in &gr.nodes {
        if let Some((operands, bytes)) = moe_weight_bytes(g, n, bind) {
            stacks.extend(operands);
            c.weight_bytes += bytes;
        }
    }
    for &v in &gr.inputs {
        if stacks.contains(&v) {
            continue;
        }
        let b = g.ty(v).bytes(bind).unwrap_or(0);
        match g.node(v).op {
            Op::Weight { .. } if gathered.contains(&v) => {
                let rows_read: u64 = gr
                    .nodes
                    .iter()
                    .filter(|&&n| g.node(n).op == Op::Embedding)
                    .map(|&n| g.ty(n).bytes(bind).unwrap_or(0))
                    .sum();
                c.weight_bytes += rows_read.min(b);
            }
            Op::Weight { .. } => c.weight_bytes += b,
            // Blocks gathered from a weight at upload are weight bytes.
            Op::Slice { .. } if crate::stacks::weight_blocks(g, v).is_some() => c.weight_bytes += b,
            // A cache is read only up to the live context; count it whole (the bound).
            _ => c.act_bytes += b,
        }
    }
    for &v in &gr.outputs {
        c.act_bytes += g.ty(v).bytes(bind).unwrap_or(0);
    }
    for &n in &gr.nodes {
        let node = g.node(n);
        c.flops += match &node.op {
            Op::MatMul => {
                let k = g
                    .ty(node.args[0])
                    .shape
                    .last()
                    .and_then(|d| d.resolve(bind));
                2 * numel(g, n, bind) * k.unwrap_or(0)
            }
            Op::Attention { .. } => {
                let q = numel(g, node.args[0], bind);
                let ctx = g.ty(node.args[1]).shape.dims()[1]
                    .resolve(bind)
                    .unwrap_or(0);
                4 * q * ctx
            }
            Op::MoeExperts => {
                let (tokens, experts, top_k) = moe_dims(g, n, bind);
                let (f, h) = expert_dims(g, n, bind);
                2 * 3 * tokens * top_k.min(experts) * f * h
            }
            _ => numel(g, n, bind),
        };
    }
    c
}

/// Experts a step of `tokens` tokens reads at least when each picks `top_k` of `experts`
/// uniformly at random: `E·(1 − (1 − k/E)^T)` (REFERENCE.md, the MoE byte floor).
pub fn expected_union(experts: u64, top_k: u64, tokens: u64) -> f64 {
    if experts == 0 {
        return 0.0;
    }
    let e = experts as f64;
    let p = (top_k.min(experts) as f64) / e;
    e * (1.0 - (1.0 - p).powf(tokens as f64))
}

/// `(tokens, experts, top_k)` of a `moe_experts` node (top_k from its router, else every
/// expert).
pub(crate) fn moe_dims(g: &Graph, n: specc_ir::ValueId, bind: &Bindings) -> (u64, u64, u64) {
    let node = g.node(n);
    let experts = g.ty(node.args[2]).shape.dims()[0]
        .resolve(bind)
        .unwrap_or(0);
    let tokens = numel(g, node.args[1], bind) / experts.max(1);
    (
        tokens,
        experts,
        router_top_k(g, node.args[1]).unwrap_or(experts),
    )
}

/// The `top_k` of the router producing `gates` (a token's non-zero gates at most), or `None`
/// when the gates come from elsewhere.
pub fn router_top_k(g: &Graph, gates: specc_ir::ValueId) -> Option<u64> {
    match g.node(gates).op {
        Op::MoeRoute { top_k, .. } => Some(top_k),
        _ => None,
    }
}

/// `(ffn, hidden)` of a `moe_experts` node's gate weights `[E, F, H]`.
fn expert_dims(g: &Graph, n: specc_ir::ValueId, bind: &Bindings) -> (u64, u64) {
    let d = g.ty(g.node(n).args[2]).shape.dims();
    let r = |i: usize| d[i].resolve(bind).unwrap_or(0);
    (r(1), r(2))
}

/// For a `moe_experts` node: its weight operands (the three stacks, and their three scale
/// stacks when the experts are stored int4 / fp8) and the bytes of them a step reads (the
/// expected union of selected experts, [`expected_union`]): stored bytes — nibbles or fp8
/// bytes plus scales — as [`specc_ir::DType::storage_bytes`] counts them, never a
/// dequantised size.
fn moe_weight_bytes(
    g: &Graph,
    n: specc_ir::ValueId,
    bind: &Bindings,
) -> Option<(Vec<specc_ir::ValueId>, u64)> {
    let node = g.node(n);
    if node.op != Op::MoeExperts {
        return None;
    }
    let (tokens, experts, top_k) = moe_dims(g, n, bind);
    let w = &node.args[2..];
    let all: u64 = w.iter().map(|&v| g.ty(v).bytes(bind).unwrap_or(0)).sum();
    let per_expert = all as f64 / experts.max(1) as f64;
    let bytes = (expected_union(experts, top_k, tokens) * per_expert).round() as u64;
    Some((w.to_vec(), bytes))
}

#[cfg(test)]
mod tests {
    use super::expected_union;

    #[test]
    fn expected_union_matches_the_reference_floor() {
        // REFERENCE.md: E = 384, k = 8: T = 1 -> 8, 2 -> 15.8, 4 -> 31.0, 8 -> 59.5, 16 -> 109.8.
        for (t, want) in [(1, 8.0), (2, 15.8), (4, 31.0), (8, 59.5), (16, 109.8)] {
            let got = expected_union(384, 8, t);
            assert!((got - want).abs() < 0.06, "T={t}: {got} vs {want}");
        }
        assert_eq!(expected_union(8, 8, 3), 8.0);
    }
}
