//! Use lists: who reads each value.

use specc_ir::{Graph, ValueId};

/// For each value, the nodes that read it (a node reading twice appears twice), and
/// whether it is a graph output.
pub struct Uses {
    users: Vec<Vec<ValueId>>,
    is_output: Vec<bool>,
}

impl Uses {
    pub fn new(g: &Graph) -> Self {
        let mut users = vec![Vec::new(); g.len()];
        for (id, n) in g.nodes() {
            for a in &n.args {
                users[a.index()].push(id);
            }
        }
        let mut is_output = vec![false; g.len()];
        for (_, v) in g.outputs() {
            is_output[v.index()] = true;
        }
        Uses { users, is_output }
    }

    pub fn users(&self, v: ValueId) -> &[ValueId] {
        &self.users[v.index()]
    }

    pub fn is_output(&self, v: ValueId) -> bool {
        self.is_output[v.index()]
    }

    /// The single reader of `v`, when `v` has exactly one use and is not a graph output.
    pub fn sole_user(&self, v: ValueId) -> Option<ValueId> {
        match self.users(v) {
            [u] if !self.is_output(v) => Some(*u),
            _ => None,
        }
    }
}
