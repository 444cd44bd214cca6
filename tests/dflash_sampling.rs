//! Speculative sampling with a DFlash drafter reproduces the target's distribution: each
//! drafted token is drawn from its block row's softmax (the rows do not depend on each
//! other's draws), and the shared rejection rule corrects it. On a tiny-vocab target, the
//! first token a step emits (over many lanes and seeds) is compared with the target's
//! softmax by a chi-square test.

use std::collections::HashMap;

use specc_models::methods::{
    lower_dflash_prefill, lower_dflash_step, lower_target_prefill, StepShape,
};
use specc_models::{lower_dense, Acceptance};
use specc_runtime::{DraftKind, SpecCpuSession, SpecGraphs};

mod common;
mod sampling_common;

use common::spec_contract;

use sampling_common::{
    chi_square, fill_weights, target_probs, tiny_dflash, tiny_dflash_target, CRITICAL_7DF,
    TEMPERATURE, VOCAB,
};

#[test]
fn dflash_sampling_matches_target_distribution() {
    let spec = tiny_dflash_target();
    let d = tiny_dflash(&spec);
    let dense = lower_dense(&spec).unwrap();
    let prefill = lower_target_prefill(&spec, &d.taps, &Acceptance::Greedy).unwrap();
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
                top_k: None,
                top_p: 1.0,
                seed,
            },
        };
        let step = lower_dflash_step(&spec, &d, &shape).unwrap();
        fill_weights(&dense, 7, &mut w);
        fill_weights(&step, 99, &mut w);
        fill_weights(&dpre, 99, &mut w);
        let kind = DraftKind::DFlash {
            taps_width: d.taps_width(),
        };
        let graphs = SpecGraphs {
            contract: spec_contract(kind, 3, 16),
            target_prefill: &prefill,
            draft_prefill: &dpre,
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
