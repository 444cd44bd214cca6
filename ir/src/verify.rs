//! The verifier. Rules, each checked for every node:
//! 1. every arg names an earlier node (the arena order is topological);
//! 2. the operand count fits the op's arity;
//! 3. the stored type equals the op's shape/dtype rule applied to the operand types;
//! 4. input, weight and state names are unique within their kind;
//! 5. the first operand of an in-place op (`kv_write`, `assign`) is a `state` or another
//!    in-place result (one chain per state), and each version in such a chain is consumed
//!    by at most one in-place op and read by no node after the op that replaced it;
//! 6. every graph output names a node, and output names are unique.

use std::collections::HashSet;

use crate::{Graph, IrError, Op, ValueId};

pub fn verify(g: &Graph) -> Result<(), IrError> {
    let mut names: HashSet<(&'static str, &str)> = HashSet::new();
    // For each value: the node that overwrote it in place (rule 5).
    let mut replaced_by: Vec<Option<ValueId>> = vec![None; g.len()];
    for (id, node) in g.nodes() {
        let info = node.op.info();
        for &a in &node.args {
            if a >= id {
                return Err(IrError::UnknownValue { node: id, arg: a });
            }
            if let Some(w) = replaced_by[a.index()] {
                if w != id {
                    return Err(IrError::Verify {
                        node: id,
                        msg: format!("reads {a} after {w} overwrote it in place"),
                    });
                }
            }
        }
        if !info.arity.admits(node.args.len()) {
            return Err(IrError::Verify {
                node: id,
                msg: format!(
                    "{} takes {:?} operands, has {}",
                    info.name,
                    info.arity,
                    node.args.len()
                ),
            });
        }
        let tys: Vec<_> = node.args.iter().map(|&a| g.ty(a)).collect();
        let want = node.op.infer(&tys).map_err(|msg| IrError::Type {
            node: id,
            op: info.name,
            msg,
        })?;
        if want != node.ty {
            return Err(IrError::Verify {
                node: id,
                msg: format!("type {} but {} gives {}", node.ty, info.name, want),
            });
        }
        if let Some(name) = node.op.leaf_name() {
            if !names.insert((info.name, name)) {
                return Err(IrError::Verify {
                    node: id,
                    msg: format!("duplicate {} name `{name}`", info.name),
                });
            }
        }
        if node.op.is_in_place() {
            let cache = node.args[0];
            let src = &g.node(cache).op;
            if !(matches!(src, Op::State { .. }) || src.is_in_place()) {
                return Err(IrError::Verify {
                    node: id,
                    msg: format!(
                        "{} target {cache} is not a state or an in-place result",
                        info.name
                    ),
                });
            }
            if let Some(prev) = replaced_by[cache.index()] {
                return Err(IrError::Verify {
                    node: id,
                    msg: format!("{cache} was already overwritten by {prev}"),
                });
            }
            replaced_by[cache.index()] = Some(id);
        }
    }
    let mut out_names = HashSet::new();
    for (name, v) in g.outputs() {
        if v.index() >= g.len() {
            return Err(IrError::Output {
                name: name.clone(),
                msg: format!("{v} does not exist"),
            });
        }
        if !out_names.insert(name.as_str()) {
            return Err(IrError::Output {
                name: name.clone(),
                msg: "duplicate output name".into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! One test per rule in the module doc, each on a graph broken through
    //! `push_unchecked` / `rebuild`, which skip the checks `Graph::add` makes.

    use super::verify;
    use crate::op::{B, CTX, T};
    use crate::{DType, Dim, Graph, IrError, Node, Op, TensorType, ValueId};

    fn f32s(n: u64) -> TensorType {
        TensorType::new(DType::F32, [Dim::Static(n)])
    }

    fn node(op: Op, args: &[u32], ty: TensorType) -> Node {
        Node {
            op,
            args: args.iter().map(|&a| ValueId(a)).collect(),
            ty,
        }
    }

    fn input(name: &str, ty: TensorType) -> Node {
        let op = Op::Input {
            name: name.into(),
            ty: ty.clone(),
        };
        node(op, &[], ty)
    }

    fn graph(nodes: Vec<Node>, outputs: &[(&str, u32)]) -> Graph {
        let mut g = Graph::new("t");
        let outs = outputs
            .iter()
            .map(|&(n, v)| (n.to_string(), ValueId(v)))
            .collect();
        g.rebuild(nodes, outs);
        g
    }

    /// `%0` a state cache, `%1` a value, `%2` positions, `%3` the first kv_write.
    fn cache_graph() -> Vec<Node> {
        let cache = TensorType::new(DType::BF16, [B, CTX, Dim::Static(2), Dim::Static(8)]);
        let state = Op::State {
            name: "k".into(),
            ty: cache.clone(),
        };
        vec![
            node(state, &[], cache.clone()),
            input(
                "x",
                TensorType::new(DType::BF16, [B, T, 2u64.into(), 8u64.into()]),
            ),
            input("pos", TensorType::new(DType::I32, [B, T])),
            node(Op::KvWrite, &[0, 1, 2], cache),
        ]
    }

    fn verify_msg(g: &Graph) -> (ValueId, String) {
        match verify(g) {
            Err(IrError::Verify { node, msg }) => (node, msg),
            other => panic!("want IrError::Verify, got {other:?}"),
        }
    }

    #[test]
    fn rule1_args_name_earlier_nodes() {
        let copy_of = |a| node(Op::Copy, &[a], f32s(4));
        for bad in [1, 2] {
            let g = graph(vec![input("a", f32s(4)), copy_of(bad)], &[]);
            assert_eq!(
                verify(&g),
                Err(IrError::UnknownValue {
                    node: ValueId(1),
                    arg: ValueId(bad)
                })
            );
        }
        let g = graph(vec![input("a", f32s(4)), copy_of(0)], &[("o", 1)]);
        assert_eq!(verify(&g), Ok(()));
    }

    #[test]
    fn rule2_operand_count_fits_arity() {
        let g = graph(
            vec![input("a", f32s(4)), node(Op::Copy, &[0, 0], f32s(4))],
            &[],
        );
        let (n, msg) = verify_msg(&g);
        assert_eq!(n, ValueId(1));
        assert_eq!(msg, "copy takes Exact(1) operands, has 2");
    }

    #[test]
    fn rule3_stored_type_matches_the_shape_rule() {
        let bf16 = TensorType::new(DType::BF16, [Dim::Static(4)]);
        let g = graph(
            vec![input("a", f32s(4)), node(Op::Copy, &[0], bf16.clone())],
            &[],
        );
        let (n, msg) = verify_msg(&g);
        assert_eq!(n, ValueId(1));
        assert_eq!(msg, "type bf16[4] but copy gives f32[4]");

        // Operand types the rule rejects are a type error naming the op.
        let g = graph(
            vec![
                input("a", f32s(4)),
                input("b", bf16),
                node(Op::Binary(crate::BinaryOp::Add), &[0, 1], f32s(4)),
            ],
            &[],
        );
        match verify(&g) {
            Err(IrError::Type { node, op, msg }) => {
                assert_eq!((node, op), (ValueId(2), "add"));
                assert!(msg.contains("differ in dtype"), "{msg}");
            }
            other => panic!("want IrError::Type, got {other:?}"),
        }
    }

    #[test]
    fn rule4_leaf_names_unique_per_kind() {
        let weight = Op::Weight {
            name: "w".into(),
            ty: f32s(4),
        };
        // The same name in two kinds is fine.
        let ok = vec![input("w", f32s(4)), node(weight.clone(), &[], f32s(4))];
        assert_eq!(verify(&graph(ok.clone(), &[])), Ok(()));
        let mut bad = ok;
        bad.push(node(weight, &[], f32s(4)));
        let (n, msg) = verify_msg(&graph(bad, &[]));
        assert_eq!(n, ValueId(2));
        assert_eq!(msg, "duplicate weight name `w`");
    }

    #[test]
    fn rule5_kv_write_cache_is_a_state_chain() {
        // A chain state -> kv_write -> kv_write, read at its end, is fine.
        let mut ok = cache_graph();
        let cache_ty = ok[0].ty.clone();
        ok.push(node(Op::KvWrite, &[3, 1, 2], cache_ty.clone()));
        ok.push(node(Op::Copy, &[4], cache_ty.clone()));
        assert_eq!(verify(&graph(ok, &[("k", 4)])), Ok(()));

        // The cache must be a state or a kv_write result.
        let mut nodes = cache_graph();
        nodes[0] = input("k", cache_ty.clone());
        let (n, msg) = verify_msg(&graph(nodes, &[]));
        assert_eq!(n, ValueId(3));
        assert_eq!(
            msg,
            "kv_write target %0 is not a state or an in-place result"
        );

        // A version may not be read after the kv_write that replaced it.
        let mut nodes = cache_graph();
        nodes.push(node(Op::Copy, &[0], cache_ty.clone()));
        let (n, msg) = verify_msg(&graph(nodes, &[]));
        assert_eq!(n, ValueId(4));
        assert_eq!(msg, "reads %0 after %3 overwrote it in place");

        // Nor consumed by a second kv_write (the read check fires first).
        let mut nodes = cache_graph();
        nodes.push(node(Op::KvWrite, &[0, 1, 2], cache_ty));
        let (n, msg) = verify_msg(&graph(nodes, &[]));
        assert_eq!(n, ValueId(4));
        assert_eq!(msg, "reads %0 after %3 overwrote it in place");
    }

    #[test]
    fn rule6_outputs_exist_and_are_unique() {
        let g = graph(vec![input("a", f32s(4))], &[("o", 1)]);
        assert_eq!(
            verify(&g),
            Err(IrError::Output {
                name: "o".into(),
                msg: "%1 does not exist".into()
            })
        );
        let g = graph(vec![input("a", f32s(4))], &[("o", 0), ("o", 0)]);
        assert_eq!(
            verify(&g),
            Err(IrError::Output {
                name: "o".into(),
                msg: "duplicate output name".into()
            })
        );
        let g = graph(vec![input("a", f32s(4))], &[("o", 0), ("p", 0)]);
        assert_eq!(verify(&g), Ok(()));
    }
}
