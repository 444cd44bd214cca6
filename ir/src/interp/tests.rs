//! Whole-graph tests of `run`: leaf checks, bucket binding, states, value lifetimes.

use std::collections::HashMap;

use super::testutil::*;
use super::{run, Env, Tensor};
use crate::op::{BinaryOp, Op, B, CTX, T};
use crate::{Bindings, DType, Dim, Graph, IrError, TensorType};

fn env_run(
    g: &Graph,
    bind: Bindings,
    inputs: Vec<(&str, Tensor)>,
    weights: &HashMap<String, Tensor>,
    states: &mut HashMap<String, Tensor>,
) -> Result<HashMap<String, Tensor>, IrError> {
    let mut env = Env {
        bind,
        inputs: inputs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        weights,
        states,
    };
    run(g, &mut env)
}

fn err_text(r: Result<HashMap<String, Tensor>, IrError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

/// `y = x · wᵀ + x · wᵀ` over `x: bf16[B, T, 2]`, `w: bf16[3, 2]`.
fn small_graph() -> Graph {
    let mut g = Graph::new("small");
    let x = g
        .input("x", TensorType::new(DType::BF16, [B, T, Dim::Static(2)]))
        .unwrap();
    let w = g.weight("w", tt(DType::BF16, &[3, 2])).unwrap();
    let y = g.add(Op::MatMul, &[x, w]).unwrap();
    let z = g.add(Op::Binary(BinaryOp::Add), &[y, y]).unwrap();
    g.set_output("z", z);
    g.set_output("y", y);
    g
}

fn small_weights() -> HashMap<String, Tensor> {
    let mut w = HashMap::new();
    w.insert(
        "w".to_string(),
        tf(DType::BF16, &[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
    );
    w
}

#[test]
fn runs_with_bound_buckets() {
    let g = small_graph();
    let w = small_weights();
    let x = tf(DType::BF16, &[1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let out = env_run(
        &g,
        Bindings::new(1, 2, 8),
        vec![("x", x)],
        &w,
        &mut HashMap::new(),
    )
    .unwrap();
    assert_eq!(out["y"].shape, vec![1, 2, 3]);
    assert_eq!(out["y"].as_f32().unwrap(), &[1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
    assert_eq!(out["z"].as_f32().unwrap(), &[2.0, 4.0, 6.0, 6.0, 8.0, 14.0]);
}

#[test]
fn input_errors_name_the_value() {
    let g = small_graph();
    let w = small_weights();
    let bind = || Bindings::new(1, 2, 8);
    let e = err_text(env_run(&g, bind(), vec![], &w, &mut HashMap::new()));
    assert!(e.contains("input `x` not given"), "{e}");
    let x = tf(DType::BF16, &[1, 3, 2], &[0.0; 6]);
    let e = err_text(env_run(&g, bind(), vec![("x", x)], &w, &mut HashMap::new()));
    assert!(
        e.contains("input `x`: expected bf16[1, 2, 2], found bf16[1, 3, 2]"),
        "{e}"
    );
    let x = tf(DType::F32, &[1, 2, 2], &[0.0; 4]);
    let e = err_text(env_run(&g, bind(), vec![("x", x)], &w, &mut HashMap::new()));
    assert!(
        e.contains("expected bf16[1, 2, 2], found f32[1, 2, 2]"),
        "{e}"
    );
}

#[test]
fn weight_errors_name_the_weight() {
    let g = small_graph();
    let x = || tf(DType::BF16, &[1, 2, 2], &[0.0; 4]);
    let bind = || Bindings::new(1, 2, 8);
    let e = err_text(env_run(
        &g,
        bind(),
        vec![("x", x())],
        &HashMap::new(),
        &mut HashMap::new(),
    ));
    assert!(e.contains("weight `w` not found"), "{e}");
    let mut w = HashMap::new();
    w.insert("w".to_string(), tf(DType::F16, &[3, 2], &[0.0; 6]));
    let e = err_text(env_run(
        &g,
        bind(),
        vec![("x", x())],
        &w,
        &mut HashMap::new(),
    ));
    assert!(
        e.contains("weight `w`: expected bf16[3, 2], found f16[3, 2]"),
        "{e}"
    );
    // Right dtype label, wrong storage.
    let mut w = HashMap::new();
    w.insert(
        "w".to_string(),
        Tensor {
            dtype: DType::BF16,
            shape: vec![3, 2],
            data: super::Data::I64(vec![0; 6]),
        },
    );
    let e = err_text(env_run(
        &g,
        bind(),
        vec![("x", x())],
        &w,
        &mut HashMap::new(),
    ));
    assert!(e.contains("weight `w`: bf16 values stored as i64"), "{e}");
}

#[test]
fn unbound_bucket_is_an_error() {
    let g = small_graph();
    let mut bind = Bindings::default();
    bind.set(crate::BucketDim::B, 1);
    let x = tf(DType::BF16, &[1, 2, 2], &[0.0; 4]);
    let e = err_text(env_run(
        &g,
        bind,
        vec![("x", x)],
        &small_weights(),
        &mut HashMap::new(),
    ));
    assert!(e.contains("bucket dim T"), "{e}");
}

/// `state c: f32[B, Ctx, 1, 1]`, `kv_write(c, x, pos)`, then `attention` over it reading
/// the written cache, plus a second state that is only read (and output).
fn cache_graph() -> Graph {
    let mut g = Graph::new("cache");
    let one = Dim::Static(1);
    let r = g
        .state("ro", TensorType::new(DType::F32, [B, CTX, one, one]))
        .unwrap();
    let c = g
        .state("c", TensorType::new(DType::F32, [B, CTX, one, one]))
        .unwrap();
    let x = g
        .input("x", TensorType::new(DType::F32, [B, T, one, one]))
        .unwrap();
    let pos = g.input("pos", TensorType::new(DType::I32, [B, T])).unwrap();
    let c2 = g.add(Op::KvWrite, &[c, x, pos]).unwrap();
    let q = g
        .add(
            Op::Fill {
                value: 0.0,
                ty: TensorType::new(DType::F32, [B, T, one, one]),
            },
            &[],
        )
        .unwrap();
    let a = g
        .add(
            Op::Attention {
                scale: 1.0,
                mask: crate::AttnMask::Causal,
            },
            &[q, c2, c2, pos],
        )
        .unwrap();
    g.set_output("attn", a);
    g.set_output("ro", r);
    g
}

#[test]
fn states_are_created_updated_and_checked() {
    let g = cache_graph();
    let w = HashMap::new();
    let mut states = HashMap::new();
    let step = |states: &mut HashMap<String, Tensor>, xs: &[f32], pos: &[i64]| {
        let t = xs.len();
        env_run(
            &g,
            Bindings::new(1, t as u64, 4),
            vec![
                ("x", tf(DType::F32, &[1, t, 1, 1], xs)),
                ("pos", ti(DType::I32, &[1, t], pos)),
            ],
            &w,
            states,
        )
    };
    // Prefill two tokens: q = 0, so attention averages the values seen so far.
    let out = step(&mut states, &[2.0, 4.0], &[0, 1]).unwrap();
    assert_eq!(out["attn"].as_f32().unwrap(), &[2.0, 3.0]);
    assert_eq!(states["c"].as_f32().unwrap(), &[2.0, 4.0, 0.0, 0.0]);
    assert_eq!(
        states["ro"].as_f32().unwrap(),
        &[0.0; 4],
        "read-only state kept"
    );
    assert_eq!(out["ro"], states["ro"]);
    // Decode one token at position 2: mean of 2, 4, 9.
    let out = step(&mut states, &[9.0], &[2]).unwrap();
    assert_eq!(out["attn"].as_f32().unwrap(), &[5.0]);
    assert_eq!(states["c"].as_f32().unwrap(), &[2.0, 4.0, 9.0, 0.0]);
    // A state of the wrong shape is an error and is left as it was.
    states.insert("c".into(), tf(DType::F32, &[1, 3, 1, 1], &[1.0, 2.0, 3.0]));
    let e = step(&mut states, &[1.0], &[0]).unwrap_err().to_string();
    assert!(
        e.contains("state `c`: expected f32[1, 4, 1, 1], found f32[1, 3, 1, 1]"),
        "{e}"
    );
    assert_eq!(states["c"].shape, vec![1, 3, 1, 1]);
    assert!(
        states.contains_key("ro"),
        "states taken before the error are restored"
    );
}

#[test]
fn outputs_survive_and_intermediates_are_freed() {
    // A chain of 50 adds reading the previous value once; an early value is also an output.
    let mut g = Graph::new("chain");
    let x = g.input("x", tt(DType::F32, &[2])).unwrap();
    let mut v = x;
    let mut first = None;
    for _ in 0..50 {
        v = g.add(Op::Binary(BinaryOp::Add), &[v, x]).unwrap();
        first.get_or_insert(v);
    }
    g.set_output("first", first.unwrap());
    g.set_output("last", v);
    let out = env_run(
        &g,
        Bindings::default(),
        vec![("x", tf(DType::F32, &[2], &[1.0, -1.0]))],
        &HashMap::new(),
        &mut HashMap::new(),
    )
    .unwrap();
    assert_eq!(out["first"].as_f32().unwrap(), &[2.0, -2.0]);
    assert_eq!(out["last"].as_f32().unwrap(), &[51.0, -51.0]);
}

#[test]
fn all_reduce_and_copy_are_identity() {
    let x = tf(DType::BF16, &[2], &[1.5, -2.0]);
    assert_eq!(run_op(Op::AllReduce, vec![x.clone()]), x);
    assert_eq!(run_op(Op::Copy, vec![x.clone()]), x);
}

#[test]
fn unverifiable_graph_is_rejected() {
    let mut g = Graph::new("bad");
    let x = g.input("x", tt(DType::F32, &[2])).unwrap();
    g.push_unchecked(crate::Node {
        op: Op::Unary(crate::UnaryOp::Exp),
        args: vec![x],
        ty: tt(DType::F32, &[3]),
    });
    let e = env_run(
        &g,
        Bindings::default(),
        vec![("x", tf(DType::F32, &[2], &[0.0; 2]))],
        &HashMap::new(),
        &mut HashMap::new(),
    );
    assert!(matches!(e, Err(IrError::Verify { .. })), "{e:?}");
}

#[test]
fn assign_and_int_row_store() {
    // state `len: i32[B]` overwritten by `assign`; state `ring: i32[B, Ctx, 1, 1]` used as a
    // token ring through kv_write.
    let mut g = Graph::new("commit");
    let one = Dim::Static(1);
    let len = g.state("len", TensorType::new(DType::I32, [B])).unwrap();
    let ring = g
        .state("ring", TensorType::new(DType::I32, [B, CTX, one, one]))
        .unwrap();
    let new_len = g
        .input("new_len", TensorType::new(DType::I32, [B]))
        .unwrap();
    let tok = g
        .input("tok", TensorType::new(DType::I32, [B, T, one, one]))
        .unwrap();
    let pos = g.input("pos", TensorType::new(DType::I32, [B, T])).unwrap();
    let l2 = g.add(Op::Assign, &[len, new_len]).unwrap();
    let r2 = g.add(Op::KvWrite, &[ring, tok, pos]).unwrap();
    g.set_output("len", l2);
    g.set_output("ring", r2);
    let mut states = HashMap::new();
    let out = env_run(
        &g,
        Bindings::new(2, 1, 3),
        vec![
            ("new_len", ti(DType::I32, &[2], &[5, 7])),
            ("tok", ti(DType::I32, &[2, 1, 1, 1], &[42, 43])),
            ("pos", ti(DType::I32, &[2, 1], &[2, -1])),
        ],
        &HashMap::new(),
        &mut states,
    )
    .unwrap();
    assert_eq!(states["len"].as_i64().unwrap(), &[5, 7]);
    assert_eq!(states["ring"].as_i64().unwrap(), &[0, 0, 42, 0, 0, 0]);
    assert_eq!(out["len"], states["len"]);
    assert_eq!(out["ring"], states["ring"]);
}

#[test]
fn narrow_float_results_are_rounded() {
    // fp8e4m3: 1.0 + 0.1 = 1.1 -> 1.125; 300 + 300 saturates at 448.
    let a = tf(DType::Fp8E4M3, &[2], &[1.0, 288.0]);
    let b = tf(DType::Fp8E4M3, &[2], &[0.1015625, 288.0]);
    let r = run_op(Op::Binary(BinaryOp::Add), vec![a, b]);
    assert_eq!(r.as_f32().unwrap(), &[1.125, 448.0]);
    // f16: 2048 + 1 = 2049 -> 2048 (spacing 2, tie to even); 2048 + 3 -> 2052.
    let a = tf(DType::F16, &[2], &[2048.0, 2048.0]);
    let b = tf(DType::F16, &[2], &[1.0, 3.0]);
    let r = run_op(Op::Binary(BinaryOp::Add), vec![a, b]);
    assert_eq!(r.as_f32().unwrap(), &[2048.0, 2052.0]);
}
