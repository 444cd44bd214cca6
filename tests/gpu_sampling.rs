//! Speculative sampling on the CUDA step graph reproduces the target's next-token
//! distribution (the device twin of tests/spec_sampling.rs): on a tiny-vocab model, over
//! many lanes and seeds, the prefill's draw of each lane's first token against the target's
//! softmax after the prompt, and the first token each lane's first step emits against its
//! distribution after the prompt and a first token drawn alike (the mixture over first
//! tokens), by chi-square tests. Run with `--features cuda`; without a driver it skips.

#![cfg(feature = "cuda")]

use std::collections::HashMap;

use specc_ir::interp::Tensor;
use specc_models::methods::DRAFT_PREFIX;
use specc_models::{Checkpoint, Model, RandomWeights, SpecConfig};
use specc_runtime::cuda::{driver_present, CudaSpecSession, WeightSources};
use specc_runtime::{DraftKind, Speculator};

mod common;
mod gpu_common;
mod sampling_common;

use gpu_common::build_engine_with;
use sampling_common::{
    chi_square, target_probs, tiny_llama_json, CRITICAL_7DF, TEMPERATURE, VOCAB,
};

/// Lanes per step graph; four seeds give 2048 samples of the first emitted token.
const LANES: usize = 512;

/// Counts and distributions of two draws per lane: the prefill's first token x1 (vs the
/// target's distribution after the prompt) and the first token x2 of the first step (vs
/// `Σ_x1 p(x1 | prompt) · p(x2 | prompt, x1)`). The target's weights are random (seed 7),
/// the draft's random with `draft_seed` (7: the target's own).
struct Draws {
    first: Vec<usize>,
    first_probs: Vec<f64>,
    step: Vec<usize>,
    step_probs: Vec<f64>,
}

fn first_step_tokens(draft_seed: u64, seeds: &[u64]) -> Draws {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), tiny_llama_json(1)).unwrap();
    let target = Model::open_random(dir.path(), 7).unwrap();
    let target_g = target.graph();
    let draft_ck = Checkpoint::random(dir.path(), target_g, draft_seed);
    let weights: HashMap<String, Tensor> = target_g
        .weights()
        .map(|(_, name, _)| {
            (
                name.to_string(),
                target.checkpoint().load_f32(name).unwrap(),
            )
        })
        .collect();
    let prompt: Vec<u32> = vec![1, 5, 2, 7];
    let mut first_counts = vec![0usize; VOCAB];
    let mut counts = vec![0usize; VOCAB];
    for &seed in seeds {
        // The draft is the target's config; its engine-side weights are replaced below.
        let cfg = SpecConfig::from_toml(
            &dir.path().join("spec.toml"),
            &format!(
                "method = \"draft_model\"\ndraft = \".\"\nnum_steps = 3\n\
                 [acceptance]\nmode = \"sample\"\ntemperature = {TEMPERATURE}\ntop_p = 1.0\nseed = {seed}\n"
            ),
        )
        .unwrap();
        let (engine, _) = build_engine_with(
            &target,
            Some(&cfg),
            &[LANES as u32],
            64,
            &[],
            Some(RandomWeights::seeded(7)),
        );
        let sources = WeightSources {
            sources: vec![("", target.checkpoint()), (DRAFT_PREFIX, &draft_ck)],
        };
        let mut s = CudaSpecSession::new(&engine, true, &sources, LANES).unwrap();
        assert_eq!(s.contract().kind, DraftKind::Model);
        assert_eq!(s.contract().num_steps, 3);
        let first = Speculator::admit(&mut s, &vec![prompt.clone(); LANES], 8).unwrap();
        for &t in &first {
            first_counts[t as usize] += 1;
        }
        Speculator::step(&mut s).unwrap();
        for lane in Speculator::drain(&mut s).unwrap() {
            counts[lane[0] as usize] += 1;
        }
    }
    let first_probs = target_probs(target_g, &weights, &prompt);
    let mut step_probs = vec![0.0; VOCAB];
    for (x1, &p1) in first_probs.iter().enumerate() {
        let mut ctx = prompt.clone();
        ctx.push(x1 as u32);
        for (m, p2) in step_probs
            .iter_mut()
            .zip(target_probs(target_g, &weights, &ctx))
        {
            *m += p1 * p2;
        }
    }
    Draws {
        first: first_counts,
        first_probs,
        step: counts,
        step_probs,
    }
}

#[test]
fn cuda_rejection_sampling_matches_target_distribution() {
    if !driver_present() {
        specc_ir::testing::skip("no CUDA driver");
        return;
    }
    for (what, draft_seed, seeds) in [
        ("a different draft", 99, [1, 2, 3, 4]),
        ("the target as draft", 7, [5, 6, 7, 8]),
    ] {
        let d = first_step_tokens(draft_seed, &seeds);
        for (draw, counts, probs) in [
            ("prefill", &d.first, &d.first_probs),
            ("first step", &d.step, &d.step_probs),
        ] {
            let x2 = chi_square(counts, probs);
            eprintln!("{what}, {draw}: chi2 {x2:.2} counts {counts:?} probs {probs:.3?}");
            assert!(x2 < CRITICAL_7DF, "{what}, {draw}: chi2 {x2:.2}");
            // Power: the uniform distribution fails the same statistic on these samples.
            let uniform = vec![1.0 / VOCAB as f64; VOCAB];
            assert!(chi_square(counts, &uniform) > CRITICAL_7DF, "{probs:?}");
        }
    }
}
