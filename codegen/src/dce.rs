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

#[cfg(test)]
mod tests {
    use specc_ir::{BinaryOp, DType, Dim, Graph, Op, TensorType, ValueId};

    fn ty() -> TensorType {
        TensorType::new(DType::F32, [Dim::Static(4)])
    }

    /// What the graph's name index answers, next to what a scan of the nodes says.
    fn lookups(g: &mut Graph) -> Vec<Option<ValueId>> {
        let scan = |g: &Graph, name: &str| {
            g.nodes()
                .find(|(_, n)| n.op.leaf_name() == Some(name))
                .map(|(v, _)| v)
        };
        let mut got = Vec::new();
        for name in ["x", "w.live", "s", "nobody"] {
            assert_eq!(g.find_leaf(name), scan(g, name), "find_leaf({name})");
            got.push(g.find_leaf(name));
        }
        // The weight and the state resolve to their (renumbered) nodes, the state to the
        // newest version of its chain; neither lookup adds a node.
        let n = g.len();
        let w = g.weight("w.live", ty()).unwrap();
        let s = g.state("s", ty()).unwrap();
        assert_eq!(g.len(), n);
        assert_eq!(Some(w), scan(g, "w.live"));
        assert!(matches!(g.node(s).op, Op::Assign));
        assert_eq!(g.latest_version(g.find_leaf("s").unwrap()), s);
        got.extend([Some(w), Some(s)]);
        got
    }

    #[test]
    fn name_index_follows_dce_and_the_text_form() {
        let mut g = Graph::new("index");
        // Dead nodes first, so every survivor is renumbered.
        let dead_w = g.weight("w.dead", ty()).unwrap();
        let dead = g.add(Op::Binary(BinaryOp::Add), &[dead_w, dead_w]).unwrap();
        let _ = g.add(Op::Binary(BinaryOp::Mul), &[dead, dead]).unwrap();
        let x = g.input("x", ty()).unwrap();
        let w = g.weight("w.live", ty()).unwrap();
        let y = g.add(Op::Binary(BinaryOp::Mul), &[x, w]).unwrap();
        let s = g.state("s", ty()).unwrap();
        let s1 = g.add(Op::Assign, &[s, y]).unwrap();
        assert_eq!(g.state("s", ty()).unwrap(), s1);
        let s2 = g.add(Op::Assign, &[s1, x]).unwrap();
        assert_eq!(g.state("s", ty()).unwrap(), s2);
        g.set_output("y", y);
        assert_eq!(g.weight("w.live", ty()).unwrap(), w);

        assert_eq!(super::run(&mut g), 3);
        assert_eq!(g.find_leaf("w.dead"), None);
        let after_dce = lookups(&mut g);
        assert_eq!(after_dce[0], Some(ValueId(0)), "x is now the first node");

        let mut parsed = specc_ir::text::parse(&specc_ir::text::print(&g)).unwrap();
        assert_eq!(parsed, g);
        assert_eq!(lookups(&mut parsed), after_dce);
        // A lookup with another type is still an error after the round trip.
        let other = TensorType::new(DType::BF16, [Dim::Static(4)]);
        assert!(parsed.weight("w.live", other).is_err());
    }
}
