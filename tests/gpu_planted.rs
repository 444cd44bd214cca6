//! `--synthetic-acceptance` at the full Llama-3.1-8B shape on the GPU (all 32 layers, bf16
//! kernels): the planted target's greedy tokens must follow its permutation π exactly (the
//! construction's margin, ≈ √H = 64 against ≈ 5, must survive the real kernels), the
//! draft_model step (Llama-3.2-1B shape, untied, k = 7) must equal the engine's own plain
//! decoding, and the mean number of accepted drafts per step must lie within 3 standard
//! errors of `Σ_{i=1..7} P^i`. The reference is π itself: the interpreter checks the same
//! construction at small shapes (tests/synthetic_acceptance.rs). Prints PASS/FAIL lines.
//! Run with `--features cuda`; without a driver it skips.

#![cfg(feature = "cuda")]

mod common;
mod gpu_common;

use specc_models::checkpoint::planted::expected_accepted;
use specc_models::checkpoint::{Plant, PlantRole};
use specc_models::{Model, RandomWeights, SpecConfig};

use gpu_common::{build_engine_with, drive, gpu, plain_of, repo_path, session};

const SEED: u64 = 0x5eed;
const K: usize = 7;
const LANES: usize = 4;
const TOKENS: usize = 128;
const CTX: u64 = 512;

#[test]
fn planted_8b_follows_pi_and_accepts_p_per_draft() {
    if !gpu() {
        return;
    }
    let p: f64 = std::env::var("SPECC_PLANTED_P").map_or(0.6, |v| v.parse().unwrap());
    let random = RandomWeights {
        seed: SEED,
        synthetic_acceptance: Some(p),
    };
    let target = Model::open_synthetic(
        repo_path("bench/configs/llama-3.1-8b/config.json"),
        random,
        None,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("spec.toml");
    let draft = repo_path("bench/configs/llama-3.2-1b-untied");
    std::fs::write(
        &toml,
        format!(
            "method = \"draft_model\"\ndraft = \"{}\"\nnum_steps = {K}\n",
            draft.display()
        ),
    )
    .unwrap();
    let cfg = SpecConfig::from_file(&toml).unwrap();
    let (engine, bundle) =
        build_engine_with(&target, Some(&cfg), &[LANES as u32], CTX, &[], Some(random));
    let bundle = bundle.expect("draft_model opens its draft");
    // Token ids of ordinary text range, none an end-of-sequence id.
    let prompts: Vec<Vec<u32>> = (0..LANES)
        .map(|i| {
            (0..8 + 5 * i)
                .map(|j| (1000 + j * 7919 + i * 104_729) as u32 % 100_000)
                .collect()
        })
        .collect();
    let next = Plant {
        seed: SEED,
        acceptance: p,
        fixed: target.spec().eos_token_ids.clone(),
        role: PlantRole::Target,
    }
    .successor(target.spec().vocab);

    let plain = plain_of(&engine, &target, &prompts, TOKENS);
    let mut off_pi = 0;
    for (lane, (prompt, toks)) in prompts.iter().zip(&plain).enumerate() {
        let mut prev = *prompt.last().unwrap();
        for (i, &t) in toks.iter().enumerate() {
            if t != next[prev as usize] {
                off_pi += 1;
                eprintln!(
                    "lane {lane} token {i}: got {t}, π({prev}) = {}",
                    next[prev as usize]
                );
            }
            prev = t;
        }
    }
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    println!(
        "{} plain greedy follows π: {off_pi} of {} tokens off",
        verdict(off_pi == 0),
        LANES * TOKENS
    );

    let (spec, hist) = {
        let mut s = session(&engine, &target, Some(&bundle), LANES);
        let out = drive(&mut s, &prompts, TOKENS);
        (out, s.stats.histogram.clone())
    };
    let exact = spec == plain;
    println!(
        "{} draft_model k = {K} output equals plain greedy",
        verdict(exact)
    );
    let steps: usize = hist.iter().sum();
    let mean = hist.iter().enumerate().map(|(i, c)| i * c).sum::<usize>() as f64 / steps as f64;
    let want = expected_accepted(p, K);
    let second: f64 = (1..=K as i32).map(|i| (2 * i - 1) as f64 * p.powi(i)).sum();
    let stderr = ((second - want * want) / steps as f64).sqrt();
    let near = (mean - want).abs() <= 3.0 * stderr;
    println!(
        "{} P = {p}: {mean:.3} accepted drafts per step over {steps} steps, expected {want:.3} ± {:.3} (3 standard errors); histogram {hist:?}",
        verdict(near),
        3.0 * stderr
    );
    assert!(off_pi == 0 && exact && near, "see the FAIL lines above");
}
