//! Speculative steps built from spec.toml bundles on the CUDA backend (DFlash, and the trained
//! default family's standalone draft and EAGLE-3 head): the step graph captured and replayed on
//! the device must emit exactly the target's greedy tokens, like the interpreter does
//! (tests/dflash.rs, tests/spec_exactness.rs). Run with `--features cuda`; without a driver
//! every test prints why it skipped and passes.

#![cfg(feature = "cuda")]

mod common;
mod full_accept;
mod gpu_common;

use std::path::Path;

use full_accept::{Family, BLOCK_SIZE};
use gpu_common::{
    assert_exact, build_engine, corpus_prompts, default_model, fixture, gpu, plain_cuda,
    random_prompts,
};
use specc_models::{Model, SpecConfig};

/// KV slots per sequence.
const CTX: u64 = 256;

/// `method` with `draft` (relative to the target dir); `extra` holds further spec.toml lines.
fn check_with(
    target_dir: &Path,
    method: &str,
    draft: &str,
    extra: &str,
    prompts: &[Vec<u32>],
    n: usize,
) -> f64 {
    let target = Model::open(target_dir).unwrap();
    let cfg = SpecConfig::from_toml(
        &target_dir.join("spec.gpu-test.toml"),
        &format!("method = {method:?}\ndraft = {draft:?}\n{extra}"),
    )
    .unwrap();
    assert_exact(&target, &cfg, prompts, n, CTX, method)
}

fn check(target_dir: &Path, method: &str, draft: &str, prompts: &[Vec<u32>], n: usize) -> f64 {
    check_with(target_dir, method, draft, "", prompts, n)
}

#[test]
fn random_dflash_is_exact_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = fixture("llama3_scaled_untied");
    for lanes in [1, 4] {
        let m = check(
            &dir,
            "dflash",
            "../dflash_random",
            &random_prompts(lanes),
            20,
        );
        eprintln!("random dflash cuda B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m < 1.6, "{m}");
    }
}

/// The trained family: real, partial acceptance (neither every draft token nor none). B = 1
/// and 4, 48 tokens; with `SPECC_GPU_QUICK` (runs under compute-sanitizer,
/// `scripts/device/sanitize.sh`) B = 4 for 16 tokens: one step graph, replayed a few times.
fn check_trained(method: &str, draft: &str, extra: &str) {
    let dir = default_model();
    let prompts = corpus_prompts();
    let quick = std::env::var_os("SPECC_GPU_QUICK").is_some();
    let (lanes_list, n): (&[usize], usize) = if quick { (&[4], 16) } else { (&[1, 4], 48) };
    for &lanes in lanes_list {
        let m = check_with(&dir, method, draft, extra, &prompts[..lanes], n);
        eprintln!("trained {method} cuda B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m > 1.5, "{m}");
    }
}

#[test]
fn trained_dflash_is_exact_on_cuda() {
    if gpu() {
        check_trained("dflash", "dflash", "");
    }
}

#[test]
fn trained_draft_model_is_exact_on_cuda() {
    if gpu() {
        check_trained("draft_model", "draft", "num_steps = 5\n");
    }
}

#[test]
fn trained_eagle3_is_exact_on_cuda() {
    if gpu() {
        check_trained("eagle3", "eagle3", "num_steps = 5\n");
    }
}

/// Full acceptance on the device (tests/full_accept): with the target-derived drafter
/// every step accepts all `BLOCK_SIZE − 1` drafts plus the bonus, at B = 1 (up to the KV
/// capacity) and B = 4 (lanes stopping at `max_new` and at the capacity).
#[test]
fn target_derived_dflash_accepts_every_draft_on_cuda() {
    if !gpu() {
        return;
    }
    let fam = Family::new();
    let target = fam.target();
    let cfg = fam.config("method = \"dflash\"\ndraft = \"../dflash\"");
    for lanes in [1, 4] {
        let what = format!("dflash cuda B={lanes}");
        let depth = BLOCK_SIZE - 1;
        full_accept::check_cuda(&what, &target, &cfg, depth, lanes, build_engine, plain_cuda);
    }
}
