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
    for &v in &gr.inputs {
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
            _ => numel(g, n, bind),
        };
    }
    c
}
