//! Static memory planning: every value that crosses a group boundary gets a home.
//!
//! Homes: graph inputs and group results live in one arena at fixed offsets; weights and
//! states live in their own buffers; folded constants (see `consts`) are their bytes,
//! uploaded once into a buffer of their own; weight stacks and blocks are built at upload;
//! views and in-place `kv_write` results share their
//! source's home. Two arena values may overlap in memory only if their live ranges (in
//! schedule positions, both ends inclusive) are disjoint. Inputs are live from before the
//! first group; graph outputs until after the last.

use std::collections::{BTreeMap, HashMap};

use specc_ir::engine::WeightBlocks;
use specc_ir::{Bindings, Graph, Op, ValueId};

use crate::consts;
use crate::fuse::is_view;
use crate::group::Group;
use crate::stacks;
use crate::CodegenError;

/// Arena offsets are multiples of this (the widest vector load is 16 bytes; 256 keeps
/// every buffer on its own cache-line group).
pub const ALIGN: u64 = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Home {
    Arena {
        offset: u64,
        bytes: u64,
    },
    Weight(String),
    /// Weights stacked at upload (`stacks`): the rows of each, in order.
    WeightStack(Vec<String>),
    /// Blocks of a weight gathered at upload (`stacks`).
    WeightBlocks(WeightBlocks),
    State(String),
    /// A folded constant: its bytes at this bucket (little-endian, as kernels read them).
    Const(Vec<u8>),
}

#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    /// Home of every value a kernel or the host touches (leaves, group results, views).
    pub homes: BTreeMap<ValueId, Home>,
    pub arena_bytes: u64,
    /// Sum of the arena values' sizes: what the arena would need with no reuse.
    pub unshared_bytes: u64,
    /// Live range (first, last schedule position) of each arena value.
    pub live: BTreeMap<ValueId, (i64, i64)>,
}

/// Source of a view or an in-place update, followed to the root.
pub fn root(g: &Graph, mut v: ValueId) -> ValueId {
    loop {
        let n = g.node(v);
        if is_view(&n.op) || n.op.is_in_place() {
            v = n.args[0];
        } else {
            return v;
        }
    }
}

/// The memory plan of `groups` at `bind`; `constants[v]` marks folded nodes.
pub fn plan(
    g: &Graph,
    groups: &[Group],
    bind: &Bindings,
    constants: &[bool],
) -> Result<MemoryPlan, CodegenError> {
    let end = groups.len() as i64;
    let mut live: BTreeMap<ValueId, (i64, i64)> = BTreeMap::new();
    let touch = |v: ValueId, at: i64, live: &mut BTreeMap<ValueId, (i64, i64)>| {
        let r = live.entry(v).or_insert((at, at));
        r.0 = r.0.min(at);
        r.1 = r.1.max(at);
    };
    for (id, n) in g.nodes() {
        if matches!(n.op, Op::Input { .. }) {
            touch(id, -1, &mut live);
        }
    }
    for (i, gr) in groups.iter().enumerate() {
        for &o in &gr.outputs {
            touch(root(g, o), i as i64, &mut live);
        }
        for &v in &gr.inputs {
            touch(root(g, v), i as i64, &mut live);
        }
    }
    for (_, v) in g.outputs() {
        touch(root(g, *v), end, &mut live);
    }
    let mut plan = MemoryPlan::default();
    let mut arena_vals: Vec<(ValueId, u64)> = Vec::new();
    let mut folded = HashMap::new();
    for &v in live.keys() {
        let n = g.node(v);
        if constants[v.index()] {
            let t = consts::evaluate(g, v, bind, &mut folded)?;
            plan.homes.insert(v, Home::Const(consts::tensor_bytes(&t)));
            continue;
        }
        if let Some(names) = stacks::weight_stack(g, v) {
            plan.homes.insert(v, Home::WeightStack(names));
            continue;
        }
        if let Some(blocks) = stacks::weight_blocks(g, v) {
            plan.homes.insert(v, Home::WeightBlocks(blocks));
            continue;
        }
        match &n.op {
            Op::Weight { name, .. } => {
                plan.homes.insert(v, Home::Weight(name.clone()));
            }
            Op::State { name, .. } => {
                plan.homes.insert(v, Home::State(name.clone()));
            }
            _ => {
                let bytes = n.ty.bytes(bind).ok_or_else(|| CodegenError::Unbound {
                    value: v,
                    ty: n.ty.to_string(),
                })?;
                arena_vals.push((v, bytes.max(1)));
            }
        }
    }
    // Largest first, then earliest definition: a classic greedy first-fit.
    arena_vals.sort_by_key(|&(v, b)| (std::cmp::Reverse(b), live[&v].0, v));
    let mut placed: Vec<(u64, u64, (i64, i64))> = Vec::new();
    for (v, bytes) in arena_vals {
        let r = live[&v];
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|(_, _, lr)| lr.0 <= r.1 && r.0 <= lr.1)
            .map(|&(o, b, _)| (o, o + b))
            .collect();
        busy.sort();
        let mut offset = 0u64;
        for (lo, hi) in busy {
            if offset + bytes <= lo {
                break;
            }
            offset = offset.max(hi.next_multiple_of(ALIGN));
        }
        placed.push((offset, bytes, r));
        plan.arena_bytes = plan.arena_bytes.max(offset + bytes);
        plan.unshared_bytes += bytes.next_multiple_of(ALIGN);
        plan.homes.insert(v, Home::Arena { offset, bytes });
        plan.live.insert(v, r);
    }
    plan.arena_bytes = plan.arena_bytes.next_multiple_of(ALIGN);
    // Views and in-place results share their root's home.
    for (id, _) in g.nodes() {
        let r = root(g, id);
        if r != id {
            if let Some(h) = plan.homes.get(&r).cloned() {
                plan.homes.insert(id, h);
            }
        }
    }
    Ok(plan)
}

/// Checks the plan's invariant directly: no two arena values with overlapping live ranges
/// overlap in memory.
pub fn check(plan: &MemoryPlan) -> Result<(), CodegenError> {
    let vals: Vec<(ValueId, u64, u64, (i64, i64))> = plan
        .live
        .iter()
        .filter_map(|(v, r)| match plan.homes.get(v) {
            Some(Home::Arena { offset, bytes }) => Some((*v, *offset, *bytes, *r)),
            _ => None,
        })
        .collect();
    for (i, a) in vals.iter().enumerate() {
        for b in &vals[i + 1..] {
            let time = a.3 .0 <= b.3 .1 && b.3 .0 <= a.3 .1;
            let space = a.1 < b.1 + b.2 && b.1 < a.1 + a.2;
            if time && space {
                return Err(CodegenError::Overlap { a: a.0, b: b.0 });
            }
        }
    }
    Ok(())
}
