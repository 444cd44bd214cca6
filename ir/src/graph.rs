//! The graph: an arena of single-result nodes in topological order.

use std::collections::HashMap;
use std::fmt;

use crate::engine::Phase;
use crate::{IrError, Op, TensorType};

/// A value, which is also the id of the node that defines it (every node has one result).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub args: Vec<ValueId>,
    pub ty: TensorType,
}

/// Invariant (checked by [`crate::verify`]): every node's args name earlier nodes, so the
/// arena order is a topological order.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    nodes: Vec<Node>,
    outputs: Vec<(String, ValueId)>,
    /// Which part of a step each node computes for, as the lowering marked it: `(first
    /// node, phase)` in node order, each mark lasting until the next. An annotation for
    /// reports and timing breakdowns only: evaluation, the text form and equality ignore it.
    phases: Vec<(u32, Phase)>,
    /// Derived from `nodes`, kept in step by every mutation (all of them go through
    /// [`Graph::push_unchecked`] or [`Graph::rebuild`]), so that name lookups and version
    /// chains cost O(1) and lowering stays linear in the model's size.
    index: Index,
}

/// Lookups over the node list (see [`Graph::index`]).
#[derive(Clone, Debug, Default)]
struct Index {
    /// The first `input`, `weight` and `state` node with each leaf name.
    leaves: HashMap<String, LeafIds>,
    /// For a value, the first in-place node after it whose target (first operand) it is.
    next_version: HashMap<ValueId, ValueId>,
}

#[derive(Clone, Copy, Debug, Default)]
struct LeafIds {
    input: Option<ValueId>,
    weight: Option<ValueId>,
    state: Option<ValueId>,
}

impl LeafIds {
    fn first(&self) -> Option<ValueId> {
        [self.input, self.weight, self.state]
            .into_iter()
            .flatten()
            .min()
    }
}

impl Index {
    /// Records node `id`, appended after every node already indexed.
    fn note(&mut self, id: ValueId, node: &Node) {
        if let Some(name) = node.op.leaf_name() {
            let ids = self.leaves.entry(name.to_string()).or_default();
            let slot = match node.op {
                Op::Input { .. } => &mut ids.input,
                Op::Weight { .. } => &mut ids.weight,
                _ => &mut ids.state,
            };
            slot.get_or_insert(id);
        }
        if node.op.is_in_place() {
            // Only earlier targets: chains then only go forward (an unverified graph with
            // a forward reference cannot make one loop).
            if let Some(&target) = node.args.first().filter(|t| **t < id) {
                self.next_version.entry(target).or_insert(id);
            }
        }
    }

    fn of(nodes: &[Node]) -> Index {
        let mut index = Index::default();
        for (i, n) in nodes.iter().enumerate() {
            index.note(ValueId(i as u32), n);
        }
        index
    }
}

/// Graphs are equal when they compute the same thing (their phase marks are reports).
impl PartialEq for Graph {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.nodes == other.nodes && self.outputs == other.outputs
    }
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Appends `op(args)`, inferring its type. Fails if an arg is unknown or the operand
    /// types break the op's rule.
    pub fn add(&mut self, op: Op, args: &[ValueId]) -> Result<ValueId, IrError> {
        let id = ValueId(self.nodes.len() as u32);
        let mut tys = Vec::with_capacity(args.len());
        for &a in args {
            let n = self
                .nodes
                .get(a.index())
                .ok_or(IrError::UnknownValue { node: id, arg: a })?;
            tys.push(&n.ty);
        }
        let ty = op.infer(&tys).map_err(|msg| IrError::Type {
            node: id,
            op: op.info().name,
            msg,
        })?;
        Ok(self.push_unchecked(Node {
            op,
            args: args.to_vec(),
            ty,
        }))
    }

    /// Appends a node with a given type without inference (used by the parser and by
    /// passes that rebuild graphs; the verifier re-checks the type).
    pub fn push_unchecked(&mut self, node: Node) -> ValueId {
        let id = ValueId(self.nodes.len() as u32);
        self.index.note(id, &node);
        self.nodes.push(node);
        id
    }

    pub fn input(&mut self, name: &str, ty: TensorType) -> Result<ValueId, IrError> {
        self.add(
            Op::Input {
                name: name.into(),
                ty,
            },
            &[],
        )
    }

    /// The weight called `name`: created on first use, shared afterwards (an unrolled
    /// draft reads the same parameters every step). A second use with another type is an
    /// error.
    pub fn weight(&mut self, name: &str, ty: TensorType) -> Result<ValueId, IrError> {
        if let Some(v) = self.index.leaves.get(name).and_then(|ids| ids.weight) {
            return self.same_type(v, &ty);
        }
        self.add(
            Op::Weight {
                name: name.into(),
                ty,
            },
            &[],
        )
    }

    /// The current version of the state called `name`: created on first use; afterwards
    /// the result of the last in-place op (`kv_write`, `assign`) applied to it, so code
    /// that updates a state several times in one graph always chains the versions.
    pub fn state(&mut self, name: &str, ty: TensorType) -> Result<ValueId, IrError> {
        if let Some(root) = self.index.leaves.get(name).and_then(|ids| ids.state) {
            self.same_type(root, &ty)?;
            return Ok(self.latest_version(root));
        }
        self.add(
            Op::State {
                name: name.into(),
                ty,
            },
            &[],
        )
    }

    /// Follows the chain of in-place updates from `v` to its newest version.
    /// (The first in-place node after each version; the verifier allows only one.)
    pub fn latest_version(&self, mut v: ValueId) -> ValueId {
        while let Some(&next) = self.index.next_version.get(&v) {
            v = next;
        }
        v
    }

    fn same_type(&self, v: ValueId, ty: &TensorType) -> Result<ValueId, IrError> {
        let node = self.node(v);
        if &node.ty != ty {
            return Err(IrError::Type {
                node: v,
                op: node.op.info().name,
                msg: format!(
                    "`{}` reused with type {ty}, first declared {}",
                    node.op.leaf_name().unwrap_or(""),
                    node.ty
                ),
            });
        }
        Ok(v)
    }

    /// Marks `v` as a graph result called `name`.
    pub fn set_output(&mut self, name: &str, v: ValueId) {
        self.outputs.push((name.into(), v));
    }

    pub fn node(&self, v: ValueId) -> &Node {
        &self.nodes[v.index()]
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.nodes[v.index()].ty
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Nodes with their ids, in topological order.
    pub fn nodes(&self) -> impl Iterator<Item = (ValueId, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (ValueId(i as u32), n))
    }

    pub fn outputs(&self) -> &[(String, ValueId)] {
        &self.outputs
    }

    pub fn output(&self, name: &str) -> Option<ValueId> {
        self.outputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }

    /// The leaf node with this kind of name (`input`, `weight`, `state`).
    pub fn find_leaf(&self, name: &str) -> Option<ValueId> {
        self.index.leaves.get(name).and_then(LeafIds::first)
    }

    /// Ids of every `Weight` node with its tensor name.
    pub fn weights(&self) -> impl Iterator<Item = (ValueId, &str, &TensorType)> {
        self.nodes().filter_map(|(v, n)| match &n.op {
            Op::Weight { name, ty } => Some((v, name.as_str(), ty)),
            _ => None,
        })
    }

    /// Ids of every `State` node with its name.
    pub fn states(&self) -> impl Iterator<Item = (ValueId, &str, &TensorType)> {
        self.nodes().filter_map(|(v, n)| match &n.op {
            Op::State { name, ty } => Some((v, name.as_str(), ty)),
            _ => None,
        })
    }

    /// Ids of every `Input` node with its name.
    pub fn inputs(&self) -> impl Iterator<Item = (ValueId, &str, &TensorType)> {
        self.nodes().filter_map(|(v, n)| match &n.op {
            Op::Input { name, ty } => Some((v, name.as_str(), ty)),
            _ => None,
        })
    }

    /// Number of uses of each value (args and outputs).
    pub fn use_counts(&self) -> Vec<u32> {
        let mut uses = vec![0u32; self.nodes.len()];
        for n in &self.nodes {
            for a in &n.args {
                uses[a.index()] += 1;
            }
        }
        for (_, v) in &self.outputs {
            uses[v.index()] += 1;
        }
        uses
    }

    /// Replaces the node list and outputs (for passes); the caller re-verifies. The phase
    /// marks are kept only where the node count is (a pass that drops or renumbers nodes
    /// hands their phases to [`Graph::set_phases`]).
    pub fn rebuild(&mut self, nodes: Vec<Node>, outputs: Vec<(String, ValueId)>) {
        if nodes.len() != self.nodes.len() {
            self.phases.clear();
        }
        self.index = Index::of(&nodes);
        self.nodes = nodes;
        self.outputs = outputs;
    }

    /// Marks the nodes appended from now on as computing for `phase` (the lowering calls
    /// it where a model's forward, or the bookkeeping after it, begins).
    pub fn begin_phase(&mut self, phase: Phase) {
        let at = self.nodes.len() as u32;
        if let Some(last) = self.phases.last_mut().filter(|(first, _)| *first == at) {
            last.1 = phase;
        } else if self.phases.last().map(|(_, p)| *p) != Some(phase) {
            self.phases.push((at, phase));
        }
    }

    /// Runs `f` with the nodes it appends marked as `phase`, then returns to the phase
    /// before (a model's building blocks mark themselves wherever they are called).
    pub fn with_phase<T>(&mut self, phase: Phase, f: impl FnOnce(&mut Graph) -> T) -> T {
        let before = self.phases.last().map_or(Phase::Bookkeeping, |(_, p)| *p);
        self.begin_phase(phase);
        let out = f(self);
        self.begin_phase(before);
        out
    }

    /// The phase node `v` was marked with ([`Phase::Bookkeeping`] before any mark).
    pub fn phase_of(&self, v: ValueId) -> Phase {
        let i = self.phases.partition_point(|(first, _)| *first <= v.0);
        i.checked_sub(1)
            .map_or(Phase::Bookkeeping, |i| self.phases[i].1)
    }

    /// The phase of every node, in node order.
    pub fn phases(&self) -> Vec<Phase> {
        (0..self.nodes.len() as u32)
            .map(|v| self.phase_of(ValueId(v)))
            .collect()
    }

    /// Replaces the phase marks by `per_node[v]` for each node `v`.
    pub fn set_phases(&mut self, per_node: &[Phase]) {
        self.phases.clear();
        for (v, &p) in per_node.iter().enumerate() {
            if self.phases.last().map(|(_, q)| *q) != Some(p) {
                self.phases.push((v as u32, p));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Dim};

    fn leaf(g: &mut Graph, name: &str) -> ValueId {
        let ty = TensorType::new(DType::F32, vec![Dim::Static(4)]);
        g.input(name, ty).unwrap()
    }

    #[test]
    fn phase_marks_cover_the_nodes_after_them() {
        let mut g = Graph::new("phases");
        let a = leaf(&mut g, "a");
        g.begin_phase(Phase::Draft);
        let b = leaf(&mut g, "b");
        let c = leaf(&mut g, "c");
        g.begin_phase(Phase::Target);
        // A mark replaced before any node follows it.
        g.begin_phase(Phase::Bookkeeping);
        let d = leaf(&mut g, "d");
        assert_eq!(
            [a, b, c, d].map(|v| g.phase_of(v)),
            [
                Phase::Bookkeeping,
                Phase::Draft,
                Phase::Draft,
                Phase::Bookkeeping
            ]
        );
        let per_node = g.phases();
        let mut h = g.clone();
        h.set_phases(&[Phase::Target, Phase::Target, Phase::Draft, Phase::Draft]);
        assert_eq!(h.phase_of(c), Phase::Draft);
        assert_eq!(h.phase_of(a), Phase::Target);
        // Phases are an annotation: equality ignores them.
        assert_eq!(g, h);
        h.set_phases(&per_node);
        assert_eq!(h.phases(), per_node);
    }
}
