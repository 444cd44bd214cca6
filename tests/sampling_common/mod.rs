//! What the speculative-sampling tests share: the tiny-vocab setting, the target's next-token
//! distribution from the interpreter, and the chi-square statistic.

use std::collections::HashMap;

use specc_ir::interp::{self, Data, Env, Tensor};
use specc_ir::{Bindings, DType, Graph};
use specc_models::methods::dflash::DFlashSpec;
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
    tiny_llama(1)
}

/// The config.json of a Llama of `layers` layers over the test vocabulary (f32).
#[allow(dead_code)]
pub fn tiny_llama_json(layers: usize) -> String {
    format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 32,
        "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": {layers},
        "vocab_size": {VOCAB}, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 64, "tie_word_embeddings": false, "torch_dtype": "float32"}}"#
    )
}

/// A Llama of `layers` layers over the test vocabulary (f32).
fn tiny_llama(layers: usize) -> ModelSpec {
    ModelSpec::from_json(Path::new("tiny/config.json"), &tiny_llama_json(layers)).unwrap()
}

/// A two-layer Llama over the test vocabulary (f32): the target of the DFlash / DDTree tests.
#[allow(dead_code)]
pub fn tiny_dflash_target() -> ModelSpec {
    tiny_llama(2)
}

/// A one-layer DFlash drafter (block 4, mask token 7) tapping both target layers.
#[allow(dead_code)]
pub fn tiny_dflash(target: &ModelSpec) -> DFlashSpec {
    let json = format!(
        r#"{{"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 4,
        "mask_token_id": 7, "target_layer_ids": [1, 0], "num_target_layers": 2,
        "hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 8, "num_hidden_layers": 1, "vocab_size": {VOCAB},
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 64,
        "torch_dtype": "float32"}}"#
    );
    DFlashSpec::from_json(Path::new("tiny-dflash/config.json"), &json, target).unwrap()
}

/// Deterministic weights (every weight of `g`, by its full name) with enough spread that
/// the distributions are far from uniform and far from one-hot.
#[allow(dead_code)]
pub fn fill_weights(g: &Graph, seed: u64, out: &mut HashMap<String, Tensor>) {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as f64 / (1u64 << 31) as f64) as f32 * 2.0 - 1.0
    };
    for (_, name, ty) in g.weights() {
        if out.contains_key(name) {
            continue;
        }
        let dims = ty.shape.resolve(&Bindings::default()).unwrap();
        let n: usize = dims.iter().product();
        if !ty.dtype.is_float() {
            // Index tables (an EAGLE-3 head's d2t): zero offsets, the identity map.
            out.insert(
                name.to_string(),
                Tensor::from_i64(ty.dtype, dims, vec![0; n]),
            );
            continue;
        }
        let norm = name.ends_with("norm.weight");
        let v: Vec<f32> = (0..n)
            .map(|_| {
                if norm {
                    1.0 + 0.1 * next()
                } else {
                    0.8 * next()
                }
            })
            .collect();
        out.insert(name.to_string(), Tensor::from_f32(DType::F32, dims, v));
    }
}

/// A one-layer EAGLE-3 head over the test vocabulary (draft vocab = target vocab), tapping
/// layers 1, 0, 1 of [`tiny_dflash_target`].
#[allow(dead_code)]
pub fn tiny_eagle3(target: &ModelSpec) -> specc_models::methods::eagle3::Eagle3Spec {
    let json = format!(
        r#"{{"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": {VOCAB},
        "eagle_config": {{"eagle_aux_hidden_state_layer_ids": [1, 0, 1]}}, "head_dim": 8,
        "hidden_size": 16, "intermediate_size": 24, "max_position_embeddings": 64,
        "num_attention_heads": 2, "num_hidden_layers": 1, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": {VOCAB},
        "torch_dtype": "float32"}}"#
    );
    specc_models::methods::eagle3::Eagle3Spec::from_json(
        Path::new("tiny-eagle3/config.json"),
        &json,
        target,
    )
    .unwrap()
}
