//! Speculative sampling with a DFlash drafter reproduces the target's distribution: each
//! drafted token is drawn from its block row's softmax (the rows do not depend on each
//! other's draws), and the shared rejection rule corrects it. On a tiny-vocab target, the
//! first token a step emits (over many lanes and seeds) is compared with the target's
//! softmax by a chi-square test.

use std::collections::HashMap;
use std::path::Path;

use specc_ir::interp::Tensor;
use specc_ir::{Bindings, DType, Graph};
use specc_models::dflash::DFlashSpec;
use specc_models::spec_step::{
    lower_dflash_prefill, lower_dflash_step, lower_target_prefill, StepShape,
};
use specc_models::{lower_dense, Acceptance, ModelSpec};
use specc_runtime::{DraftKind, SpecCpuSession, SpecGraphs};

mod sampling_common;

use sampling_common::{chi_square, target_probs, CRITICAL_7DF, TEMPERATURE, VOCAB};

fn tiny_target() -> ModelSpec {
    let json = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 32,
        "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2,
        "vocab_size": {VOCAB}, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 64, "tie_word_embeddings": false, "torch_dtype": "float32"}}"#
    );
    ModelSpec::from_json(Path::new("tiny/config.json"), &json).unwrap()
}

fn tiny_dflash(target: &ModelSpec) -> DFlashSpec {
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
fn random_weights(g: &Graph, seed: u64, out: &mut HashMap<String, Tensor>) {
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

#[test]
fn dflash_sampling_matches_target_distribution() {
    let spec = tiny_target();
    let d = tiny_dflash(&spec);
    let dense = lower_dense(&spec).unwrap();
    let prefill = lower_target_prefill(&spec, &d.taps).unwrap();
    let dpre = lower_dflash_prefill(&spec, &d).unwrap();
    let prompt: Vec<u32> = vec![1, 5, 2, 7, 3];
    let lanes = 512;
    let mut counts = vec![0usize; VOCAB];
    let mut w = HashMap::new();
    let mut first_bonus = None;
    let mut accepted = 0usize;
    for seed in [1u64, 2, 3, 4] {
        let shape = StepShape {
            num_steps: 3,
            ring: 16,
            acceptance: Acceptance::Sample {
                temperature: TEMPERATURE,
                top_p: 1.0,
                seed,
            },
        };
        let step = lower_dflash_step(&spec, &d, &shape).unwrap();
        random_weights(&dense, 7, &mut w);
        random_weights(&step, 99, &mut w);
        random_weights(&dpre, 99, &mut w);
        let graphs = SpecGraphs {
            kind: DraftKind::DFlash {
                taps_width: d.taps_width(),
            },
            target_prefill: &prefill,
            draft_prefill: &dpre,
            step: &step,
            num_steps: 3,
            ring: 16,
        };
        let mut s = SpecCpuSession::new(graphs, &w, lanes, 64);
        let first = s.admit(&vec![prompt.clone(); lanes], 8).unwrap();
        first_bonus = Some(first[0]);
        s.step().unwrap();
        for lane in s.drain().unwrap() {
            counts[lane[0] as usize] += 1;
            accepted += lane.len() - 1;
        }
    }
    let mut ctx = prompt.clone();
    ctx.push(first_bonus.unwrap());
    let probs = target_probs(&dense, &w, &ctx);
    let x2 = chi_square(&counts, &probs);
    eprintln!(
        "dflash sampling: chi2 {x2:.2} counts {counts:?} probs {probs:.3?}; {:.2} drafts accepted per lane-step",
        accepted as f64 / (4 * lanes) as f64
    );
    assert!(x2 < CRITICAL_7DF, "chi2 {x2:.2}: {counts:?} vs {probs:?}");
    // Rejection really happens, and so does acceptance.
    assert!(accepted > 0 && accepted < 3 * 4 * lanes, "{accepted}");
    let uniform = vec![1.0 / VOCAB as f64; VOCAB];
    assert!(chi_square(&counts, &uniform) > CRITICAL_7DF, "power check");
}
