//! Speculative sampling must reproduce the target's distribution: on a tiny-vocab model, the
//! first token a step emits is drawn (over many lanes and seeds) and compared with the
//! target's softmax by a chi-square test.

use std::collections::HashMap;

use specc_ir::engine::Phase;
use specc_ir::interp::Tensor;
use specc_ir::Graph;
use specc_models::methods::{
    lower_draft_model_step, lower_target_prefill, StepShape, DRAFT_PREFIX,
};
use specc_models::{lower_dense, lower_dense_prefixed, Acceptance};
use specc_runtime::{DraftKind, SpecCpuSession, SpecGraphs};

mod common;
mod sampling_common;

use common::spec_contract;

use sampling_common::{
    chi_square, fill_weights, target_probs, tiny_spec, CRITICAL_7DF, TEMPERATURE, VOCAB,
};

/// [`fill_weights`] of `g` under `prefix` (the draft's weights next to the target's).
fn random_weights(g: &Graph, seed: u64, prefix: &str) -> HashMap<String, Tensor> {
    let mut m = HashMap::new();
    fill_weights(g, seed, &mut m);
    m.into_iter()
        .map(|(name, t)| (format!("{prefix}{name}"), t))
        .collect()
}

fn first_step_tokens(draft_seed: u64, seeds: &[u64]) -> (Vec<usize>, Vec<f64>) {
    let spec = tiny_spec();
    let target = lower_dense(&spec).unwrap();
    let draft = lower_dense_prefixed(&spec, DRAFT_PREFIX, Phase::Draft).unwrap();
    // The prefill's token is greedy so every lane shares the context.
    let prefill = lower_target_prefill(&spec, &[], &Acceptance::Greedy).unwrap();
    let mut w = random_weights(&target, 7, "");
    w.extend(random_weights(&target, draft_seed, DRAFT_PREFIX));
    let prompt: Vec<u32> = vec![1, 5, 2, 7];
    let lanes = 512;
    let mut counts = vec![0usize; VOCAB];
    let mut first_bonus = None;
    for &seed in seeds {
        let shape = StepShape {
            num_steps: 3,
            ring: 16,
            acceptance: Acceptance::Sample {
                temperature: TEMPERATURE,
                top_k: None,
                top_p: 1.0,
                seed,
            },
        };
        let step = lower_draft_model_step(&spec, &spec, &shape).unwrap();
        let graphs = SpecGraphs {
            contract: spec_contract(DraftKind::Model, 3, 16),
            target_prefill: &prefill,
            draft_prefill: &draft,
            step: &step,
            variants: Vec::new(),
            greedy: Vec::new(),
            catch_up: None,
            acceptance: shape.acceptance.clone(),
        };
        let mut s = SpecCpuSession::new(graphs, &w, lanes, 64);
        let first = s.admit(&vec![prompt.clone(); lanes], 8).unwrap();
        first_bonus = Some(first[0]);
        s.step().unwrap();
        for lane in s.drain().unwrap() {
            counts[lane[0] as usize] += 1;
        }
    }
    let mut ctx = prompt.clone();
    ctx.push(first_bonus.unwrap());
    (counts, target_probs(&target, &w, &ctx))
}

#[test]
fn rejection_sampling_matches_target_distribution_with_a_different_draft() {
    let (counts, probs) = first_step_tokens(99, &[1, 2, 3, 4]);
    let x2 = chi_square(&counts, &probs);
    eprintln!("chi2 {x2:.2} counts {counts:?} probs {probs:.3?}");
    assert!(
        x2 < CRITICAL_7DF,
        "chi2 {x2:.2}: counts {counts:?} vs probs {probs:?}"
    );
    // The draft really differs: otherwise this would not exercise rejection.
    assert!(probs.iter().all(|&p| p > 0.005), "{probs:?}");
}

#[test]
fn rejection_sampling_matches_target_distribution_with_the_target_as_draft() {
    let (counts, probs) = first_step_tokens(7, &[5, 6, 7, 8]);
    let x2 = chi_square(&counts, &probs);
    eprintln!("chi2 {x2:.2} counts {counts:?} probs {probs:.3?}");
    assert!(
        x2 < CRITICAL_7DF,
        "chi2 {x2:.2}: counts {counts:?} vs probs {probs:?}"
    );
}

#[test]
fn a_wrong_distribution_fails_the_same_test() {
    // Power check: the uniform distribution is rejected by the same statistic.
    let (counts, probs) = first_step_tokens(99, &[1, 2, 3, 4]);
    let uniform = vec![1.0 / VOCAB as f64; VOCAB];
    assert!(chi_square(&counts, &uniform) > CRITICAL_7DF, "{probs:?}");
}
