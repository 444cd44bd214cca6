//! What the speculative-sampling tests share: the tiny-vocab setting, the target's next-token
//! distribution from the interpreter, and the chi-square statistic.

use std::collections::HashMap;

use specc_ir::interp::{self, Data, Env, Tensor};
use specc_ir::{Bindings, DType, Graph};
use specc_models::ModelSpec;
use std::path::Path;

pub const VOCAB: usize = 8;
pub const TEMPERATURE: f64 = 1.3;

/// The target's next-token distribution after `ids`, at the test temperature.
pub fn target_probs(g: &Graph, w: &HashMap<String, Tensor>, ids: &[u32]) -> Vec<f64> {
    let t = ids.len();
    let mut states = HashMap::new();
    let mut env = Env {
        bind: Bindings::new(1, t as u64, 64),
        inputs: HashMap::from([
            (
                "tokens".to_string(),
                Tensor::from_i64(
                    DType::I32,
                    vec![1, t],
                    ids.iter().map(|&x| x as i64).collect(),
                ),
            ),
            (
                "positions".to_string(),
                Tensor::from_i64(DType::I32, vec![1, t], (0..t as i64).collect()),
            ),
        ]),
        weights: w,
        states: &mut states,
    };
    let out = interp::run(g, &mut env).unwrap();
    let Data::F32(l) = &out["logits"].data else {
        panic!("f32 logits")
    };
    let last = &l[(t - 1) * VOCAB..t * VOCAB];
    let m = last.iter().cloned().fold(f32::MIN, f32::max) as f64;
    let e: Vec<f64> = last
        .iter()
        .map(|&x| ((x as f64 - m) / TEMPERATURE).exp())
        .collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

pub fn chi_square(counts: &[usize], probs: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// chi-square critical value for 7 degrees of freedom at p = 0.001.
pub const CRITICAL_7DF: f64 = 24.32;

/// A one-layer Llama over the test vocabulary (f32), the target and draft of these tests.
#[allow(dead_code)] // not every test crate that includes this module uses it
pub fn tiny_spec() -> ModelSpec {
    let json = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 32,
        "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
        "vocab_size": {VOCAB}, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 64, "tie_word_embeddings": false, "torch_dtype": "float32"}}"#
    );
    ModelSpec::from_json(Path::new("tiny/config.json"), &json).unwrap()
}
