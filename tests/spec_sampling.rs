//! Speculative sampling must reproduce the target's distribution: on a tiny-vocab model, the
//! first token a step emits is drawn (over many lanes and seeds) and compared with the
//! target's softmax by a chi-square test.

use std::collections::HashMap;

use specc_ir::interp::Tensor;
use specc_ir::{Bindings, DType, Graph};
use specc_models::spec_step::{lower_draft_model_step, StepShape, DRAFT_PREFIX};
use specc_models::{lower_dense, lower_dense_prefixed, Acceptance};
use specc_runtime::{DraftKind, SpecCpuSession, SpecGraphs};

mod sampling_common;

use sampling_common::{chi_square, target_probs, tiny_spec, CRITICAL_7DF, TEMPERATURE, VOCAB};

/// Deterministic weights with enough spread that the next-token distribution is far from
/// uniform and far from one-hot.
fn random_weights(g: &Graph, seed: u64, prefix: &str) -> HashMap<String, Tensor> {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as f64 / (1u64 << 31) as f64) as f32 * 2.0 - 1.0
    };
    g.weights()
        .map(|(_, name, ty)| {
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
            (
                format!("{prefix}{name}"),
                Tensor::from_f32(DType::F32, dims, v),
            )
        })
        .collect()
}

fn first_step_tokens(draft_seed: u64, seeds: &[u64]) -> (Vec<usize>, Vec<f64>) {
    let spec = tiny_spec();
    let target = lower_dense(&spec).unwrap();
    let draft = lower_dense_prefixed(&spec, DRAFT_PREFIX).unwrap();
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
                top_p: 1.0,
                seed,
            },
        };
        let step = lower_draft_model_step(&spec, &spec, &shape).unwrap();
        let graphs = SpecGraphs {
            kind: DraftKind::Model,
            target_prefill: &target,
            draft_prefill: &draft,
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
