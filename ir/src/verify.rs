//! The verifier. Rules, each checked for every node:
//! 1. every arg names an earlier node (the arena order is topological);
//! 2. the operand count fits the op's arity;
//! 3. the stored type equals the op's shape/dtype rule applied to the operand types;
//! 4. input, weight and state names are unique within their kind;
//! 5. a `kv_write` cache operand is a `state` or another `kv_write` result (one in-place
//!    chain per state), and each version in such a chain is consumed by at most one
//!    `kv_write` and read by no node after the `kv_write` that replaced it;
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
        if let Op::KvWrite = node.op {
            let cache = node.args[0];
            match g.node(cache).op {
                Op::State { .. } | Op::KvWrite => {}
                _ => {
                    return Err(IrError::Verify {
                        node: id,
                        msg: format!("kv_write cache {cache} is not a state or kv_write"),
                    })
                }
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
