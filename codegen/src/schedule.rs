//! Scheduling: a topological order of groups.
//!
//! Edges: a group depends on the groups that define its inputs (through views), and a group
//! that overwrites a state version in place runs after every other reader of that version
//! (write-after-read). Ties go to the group holding the earliest IR node, so the schedule
//! follows the program order where it can.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use specc_ir::{Graph, Op, ValueId};

use crate::fuse::is_view;
use crate::group::Group;
use crate::CodegenError;

/// The group defining each value (`None` for leaves), looking through views.
pub fn producers(g: &Graph, groups: &[Group]) -> Vec<Option<usize>> {
    let mut prod = vec![None; g.len()];
    for (i, gr) in groups.iter().enumerate() {
        for n in &gr.nodes {
            prod[n.index()] = Some(i);
        }
    }
    for (id, node) in g.nodes() {
        if prod[id.index()].is_none() && is_view(&node.op) {
            prod[id.index()] = prod[node.args[0].index()];
        }
    }
    prod
}

/// Returns the groups reordered into schedule order.
pub fn run(g: &Graph, groups: Vec<Group>) -> Result<Vec<Group>, CodegenError> {
    let n = groups.len();
    let prod = producers(g, &groups);
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut indeg = vec![0usize; n];
    let mut edge = |a: usize, b: usize, succ: &mut Vec<Vec<usize>>| {
        if a != b {
            succ[a].push(b);
            indeg[b] += 1;
        }
    };
    // Readers of each value, per group, through views.
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); g.len()];
    for (i, gr) in groups.iter().enumerate() {
        for &v in &gr.inputs {
            let mut root = v;
            while is_view(&g.node(root).op) {
                root = g.node(root).args[0];
            }
            readers[root.index()].push(i);
            if let Some(p) = prod[v.index()] {
                edge(p, i, &mut succ);
            }
        }
    }
    for (i, gr) in groups.iter().enumerate() {
        for &node in &gr.nodes {
            if matches!(g.node(node).op, Op::KvWrite | Op::KvMove) {
                let old: ValueId = g.node(node).args[0];
                for &r in &readers[old.index()] {
                    edge(r, i, &mut succ);
                }
            }
        }
    }
    let key = |i: usize| groups[i].nodes.first().map(|v| v.0).unwrap_or(0);
    let mut ready: BinaryHeap<Reverse<(u32, usize)>> = (0..n)
        .filter(|&i| indeg[i] == 0)
        .map(|i| Reverse((key(i), i)))
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse((_, i))) = ready.pop() {
        order.push(i);
        for &s in &succ[i] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(Reverse((key(s), s)));
            }
        }
    }
    if order.len() != n {
        return Err(CodegenError::Cycle {
            groups: n - order.len(),
        });
    }
    let mut slots: Vec<Option<Group>> = groups.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .map(|i| slots[i].take().expect("each group scheduled once"))
        .collect())
}
