//! Test helpers: tensor shorthands, one-op graphs, and closeness checks.

use std::collections::HashMap;

use super::{run, Env, Tensor};
use crate::{Bindings, DType, Dim, Graph, IrError, Op, TensorType};

/// A float tensor (values rounded to `dtype`).
pub fn tf(dtype: DType, shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::from_f32(dtype, shape.to_vec(), data.to_vec())
}

/// An integer / bool / int4 tensor.
pub fn ti(dtype: DType, shape: &[usize], data: &[i64]) -> Tensor {
    Tensor::from_i64(dtype, shape.to_vec(), data.to_vec())
}

/// A static tensor type.
pub fn tt(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dtype, shape.iter().map(|&d| Dim::from(d)))
}

/// Runs `op` on `args` (each fed as a graph input) through [`run`].
pub fn try_run_op(op: Op, args: Vec<Tensor>) -> Result<Tensor, IrError> {
    let mut g = Graph::new("one_op");
    let mut inputs = HashMap::new();
    let mut ids = Vec::new();
    for (i, a) in args.into_iter().enumerate() {
        let name = format!("a{i}");
        ids.push(g.input(&name, tt(a.dtype, &a.shape))?);
        inputs.insert(name, a);
    }
    let v = g.add(op, &ids)?;
    g.set_output("out", v);
    let weights: HashMap<String, Tensor> = HashMap::new();
    let mut states = HashMap::new();
    let mut env = Env {
        bind: Bindings::default(),
        inputs,
        weights: &weights,
        states: &mut states,
    };
    let mut out = run(&g, &mut env)?;
    Ok(out.remove("out").expect("output"))
}

pub fn run_op(op: Op, args: Vec<Tensor>) -> Tensor {
    match try_run_op(op, args) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

/// Asserts `|got - want| <= tol · max(1, |want|)` elementwise, naming the first bad index.
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = g == w || (g - w).abs() <= tol * w.abs().max(1.0);
        assert!(
            ok,
            "index {i}: got {g}, want {w}, tol {tol}\n got  {got:?}\n want {want:?}"
        );
    }
}
