//! Speculative decoding on the interpreter: with greedy acceptance the emitted tokens must
//! equal the target's own greedy tokens exactly, whatever the draft proposes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use specc_ir::interp::{Data, Tensor};
use specc_models::spec_step::{lower_draft_model_step, StepShape, DRAFT_PREFIX};
use specc_models::{lower_dense, lower_dense_prefixed, Acceptance, Model};
use specc_runtime::{SpecCpuSession, SpecGraphs};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Draft weights under the step graph's draft prefix, optionally perturbed.
fn draft_weights(draft: &Model, noise: f32) -> HashMap<String, Tensor> {
    let mut out = HashMap::new();
    for (name, mut t) in draft.load_weights_f32() {
        if noise > 0.0 && name.contains("mlp") {
            if let Data::F32(v) = &mut t.data {
                // Deterministic perturbation: a fixed pseudo-random pattern.
                for (i, x) in v.iter_mut().enumerate() {
                    let h = (i as u32).wrapping_mul(2_654_435_761) >> 16;
                    *x += noise * ((h % 2001) as f32 / 1000.0 - 1.0);
                }
            }
        }
        out.insert(format!("{DRAFT_PREFIX}{name}"), t);
    }
    out
}

struct Outcome {
    tokens: Vec<Vec<u32>>,
    mean_accept: f64,
}

fn speculate(
    target: &Model,
    draft: &Model,
    noise: f32,
    k: u64,
    prompts: &[Vec<u32>],
    max_new: usize,
) -> Outcome {
    let ctx = 128u64;
    let shape = StepShape {
        num_steps: k,
        ring: 64,
        acceptance: Acceptance::Greedy,
    };
    let step = lower_draft_model_step(target.spec(), draft.spec(), &shape).unwrap();
    let target_prefill = lower_dense(target.spec()).unwrap();
    let draft_prefill = lower_dense_prefixed(draft.spec(), DRAFT_PREFIX).unwrap();
    let mut weights = target.load_weights_f32();
    weights.extend(draft_weights(draft, noise));
    let graphs = SpecGraphs {
        target_prefill: &target_prefill,
        draft_prefill: &draft_prefill,
        step: &step,
        num_steps: k as usize,
        ring: 64,
    };
    let mut s = SpecCpuSession::new(graphs, &weights, prompts.len(), ctx);
    let first = s.admit(prompts, max_new).unwrap();
    let mut tokens: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    while s.live().iter().any(|&l| l) {
        s.step().unwrap();
        for (b, new) in s.drain().unwrap().into_iter().enumerate() {
            tokens[b].extend(new);
        }
    }
    for t in &mut tokens {
        t.truncate(max_new);
    }
    Outcome {
        tokens,
        mean_accept: s.stats.mean_accept_len(),
    }
}

fn greedy(target: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let w = target.load_weights_f32();
    target.greedy_generate(&w, prompt, n, 128).unwrap()
}

fn prompts(b: usize) -> Vec<Vec<u32>> {
    (0..b)
        .map(|i| {
            (0..(5 + 3 * i))
                .map(|j| ((j * 37 + i * 11 + 3) % 300) as u32)
                .collect()
        })
        .collect()
}

fn check(target_name: &str, draft_name: &str, noise: f32, lanes: usize, k: u64) -> f64 {
    let target = Model::open(fixture(target_name)).unwrap();
    let draft = Model::open(fixture(draft_name)).unwrap();
    let ps = prompts(lanes);
    let n = 20;
    let out = speculate(&target, &draft, noise, k, &ps, n);
    for (b, p) in ps.iter().enumerate() {
        let want = greedy(&target, p, n);
        assert_eq!(
            out.tokens[b],
            want,
            "lane {b} (prompt len {}) differs from target greedy",
            p.len()
        );
    }
    out.mean_accept
}

#[test]
fn identical_draft_accepts_everything() {
    let k = 4;
    let mean = check("llama3_scaled_untied", "llama3_scaled_untied", 0.0, 1, k);
    assert!((mean - (k + 1) as f64).abs() < 1e-9, "mean accept {mean}");
}

#[test]
fn identical_draft_batch4_different_prompt_lengths() {
    let k = 3;
    let mean = check("llama3_scaled_untied", "llama3_scaled_untied", 0.0, 4, k);
    assert!((mean - (k + 1) as f64).abs() < 1e-9, "mean accept {mean}");
}

#[test]
fn unrelated_draft_accepts_almost_nothing() {
    let mean = check("llama3_scaled_untied", "qwen3_headdim", 0.0, 1, 4);
    assert!(mean < 1.6, "mean accept {mean}");
}

#[test]
fn unrelated_draft_batch4() {
    let mean = check("llama3_scaled_untied", "qwen3_headdim", 0.0, 4, 3);
    assert!(mean < 1.6, "mean accept {mean}");
}

#[test]
fn perturbed_draft_accepts_partially() {
    let mean = check("llama3_scaled_untied", "llama3_scaled_untied", 0.05, 1, 4);
    assert!(mean > 1.2 && mean < 4.9, "mean accept {mean}");
}

#[test]
fn perturbed_draft_batch4() {
    let mean = check("llama3_scaled_untied", "llama3_scaled_untied", 0.05, 4, 5);
    assert!(mean > 1.2 && mean < 5.9, "mean accept {mean}");
}
