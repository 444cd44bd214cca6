//! The CPU backend: one sequence (B = 1) run through the interpreter over a KV cache held
//! in interpreter states. Prefill and decode are the same graph with different `T`.

use std::collections::HashMap;

use specc_ir::interp::{self, Data, Env, Tensor, WeightSource};
use specc_ir::{Bindings, DType, Graph};

use crate::RuntimeError;

/// What one forward step produced.
pub struct StepOutput {
    /// f32 logits, `[tokens, vocab]` row-major.
    pub logits: Vec<f32>,
    pub vocab: usize,
    /// Greedy next token after each position.
    pub next: Vec<u32>,
}

/// A single sequence's state on the CPU backend.
///
/// Invariant: `len` tokens occupy KV slots `0..len`; a step writes slots `len..len + T`.
pub struct CpuSession<'a> {
    graph: &'a Graph,
    weights: &'a dyn WeightSource,
    states: HashMap<String, Tensor>,
    max_context: u64,
    len: usize,
}

impl<'a> CpuSession<'a> {
    pub fn new(graph: &'a Graph, weights: &'a dyn WeightSource, max_context: u64) -> Self {
        CpuSession {
            graph,
            weights,
            states: HashMap::new(),
            max_context,
            len: 0,
        }
    }

    /// Tokens currently in the KV cache.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets the sequence; the KV cache is reused.
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Appends `ids` at the next positions and returns logits and greedy next tokens for
    /// each of them. Fails, with the cache untouched, if the sequence would not fit.
    pub fn step(&mut self, ids: &[u32]) -> Result<StepOutput, RuntimeError> {
        if ids.is_empty() {
            return Err(RuntimeError::EmptyStep);
        }
        let needed = self.len + ids.len();
        if needed as u64 > self.max_context {
            return Err(RuntimeError::ContextOverflow {
                needed,
                max_context: self.max_context,
            });
        }
        let t = ids.len();
        let tokens: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let positions: Vec<i64> = (self.len..needed).map(|p| p as i64).collect();
        let mut inputs = HashMap::new();
        inputs.insert(
            "tokens".to_string(),
            Tensor::from_i64(DType::I32, vec![1, t], tokens),
        );
        inputs.insert(
            "positions".to_string(),
            Tensor::from_i64(DType::I32, vec![1, t], positions),
        );
        let mut env = Env {
            bind: Bindings::new(1, t as u64, self.max_context),
            inputs,
            weights: self.weights,
            states: &mut self.states,
        };
        let mut out = interp::run(self.graph, &mut env)?;
        self.len = needed;
        let logits = out
            .remove("logits")
            .ok_or(RuntimeError::MissingOutput("logits"))?;
        let vocab = *logits.shape.last().unwrap_or(&0);
        let logits = match logits.data {
            Data::F32(v) => v,
            Data::I64(_) => return Err(RuntimeError::MissingOutput("logits")),
        };
        let next = match out.remove("next_token").map(|t| t.data) {
            Some(Data::I64(v)) => v.into_iter().map(|x| x as u32).collect(),
            _ => return Err(RuntimeError::MissingOutput("next_token")),
        };
        Ok(StepOutput {
            logits,
            vocab,
            next,
        })
    }
}
