//! Dead-code removal: drops pure nodes that no output or side effect depends on, and
//! renumbers the survivors densely (order preserved, so the graph stays topological).

use specc_ir::{Graph, Node, ValueId};

/// Returns the number of nodes removed.
pub fn run(g: &mut Graph) -> usize {
    let n = g.len();
    let mut live = vec![false; n];
    for (_, v) in g.outputs() {
        live[v.index()] = true;
    }
    for (id, node) in g.nodes() {
        if !node.op.info().pure {
            live[id.index()] = true;
        }
    }
    for i in (0..n).rev() {
        if live[i] {
            for a in &g.node(ValueId(i as u32)).args {
                live[a.index()] = true;
            }
        }
    }
    let removed = live.iter().filter(|l| !**l).count();
    if removed == 0 {
        return 0;
    }
    let mut remap = vec![None; n];
    let mut nodes: Vec<Node> = Vec::with_capacity(n - removed);
    let old_phases = g.phases();
    let mut phases = Vec::with_capacity(n - removed);
    for (id, node) in g.nodes() {
        if live[id.index()] {
            phases.push(old_phases[id.index()]);
            remap[id.index()] = Some(ValueId(nodes.len() as u32));
            let mut node = node.clone();
            for a in &mut node.args {
                *a = remap[a.index()].expect("args of live nodes are live");
            }
            nodes.push(node);
        }
    }
    let outputs = g
        .outputs()
        .iter()
        .map(|(name, v)| (name.clone(), remap[v.index()].expect("outputs are live")))
        .collect();
    g.rebuild(nodes, outputs);
    g.set_phases(&phases);
    removed
}
