//! DDTree on the CUDA backend: the tree step graph (tree build, tree-masked verify, greedy
//! walk, KV-row commit) captured and replayed on the device must emit exactly the target's
//! greedy tokens under the same kernels, like the interpreter does (tests/ddtree.rs), for a
//! one-word budget and budgets above 64 nodes (up to 256: four ancestor words). Run with
//! `--features cuda`; without a driver every test prints why it skipped and passes.

#![cfg(feature = "cuda")]

mod common;
mod full_accept;
mod gpu_common;

use std::path::Path;

use full_accept::{Family, BLOCK_SIZE};
use gpu_common::{
    assert_draws_match_interpreter, assert_exact, build_engine, corpus_prompts, default_model,
    fixture, gpu, plain_cuda, random_prompts,
};
use specc_models::{Model, SpecConfig};

/// KV slots per sequence: room for the prompt, 48 tokens and a 256-node tree.
const CTX: u64 = 512;

fn check(target_dir: &Path, draft: &str, budget: u32, prompts: &[Vec<u32>], n: usize) -> f64 {
    let target = Model::open(target_dir).unwrap();
    let cfg = SpecConfig::from_toml(
        &target_dir.join("spec.ddtree-test.toml"),
        &format!("method = \"ddtree\"\ndraft = {draft:?}\nbudget = {budget}\ntopk = 8\n"),
    )
    .unwrap();
    assert_exact(&target, &cfg, prompts, n, CTX, &format!("budget {budget}"))
}

#[test]
fn random_ddtree_is_exact_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = fixture("llama3_scaled_untied");
    for (budget, lanes) in [(16, 1), (80, 4)] {
        let m = check(&dir, "../dflash_random", budget, &random_prompts(lanes), 20);
        eprintln!("random ddtree cuda budget {budget} B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m < 2.0, "{m}");
    }
}

/// Budgets 32 and 96 at B = 1, 64 and 256 at B = 4, 48 tokens each; with `SPECC_GPU_QUICK`
/// (runs under compute-sanitizer, `scripts/device/sanitize.sh`) budget 64 at B = 4 for 16
/// tokens: one many-row tree verify graph, captured and replayed a few times.
#[test]
fn trained_ddtree_is_exact_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = default_model();
    let prompts = corpus_prompts();
    let quick = std::env::var_os("SPECC_GPU_QUICK").is_some();
    let (cases, n): (&[(u32, usize)], usize) = if quick {
        (&[(64, 4)], 16)
    } else {
        (&[(32, 1), (96, 1), (64, 4), (256, 4)], 48)
    };
    for &(budget, lanes) in cases {
        let m = check(&dir, "dflash", budget, &prompts[..lanes], n);
        eprintln!("trained ddtree cuda budget {budget} B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m > 1.5, "{m}");
    }
}

/// Full acceptance on the device (tests/full_accept): with the target-derived drafter
/// every step accepts the tree's deepest path (`BLOCK_SIZE − 1` nodes) plus the bonus, for
/// a one-word budget and one above 64 nodes, at B = 1 and B = 4.
#[test]
fn target_derived_ddtree_accepts_the_deepest_path_on_cuda() {
    if !gpu() {
        return;
    }
    let fam = Family::new();
    let target = fam.target();
    for budget in [16, 80] {
        let cfg = fam.config(&format!(
            "method = \"ddtree\"\ndraft = \"../dflash\"\nbudget = {budget}"
        ));
        for lanes in [1, 4] {
            let what = format!("ddtree cuda budget {budget} B={lanes}");
            let depth = BLOCK_SIZE - 1;
            full_accept::check_cuda(&what, &target, &cfg, depth, lanes, build_engine, plain_cuda);
        }
    }
}

/// Sampled acceptance on the device: the captured DDTree step graph draws the interpreter's
/// tokens for a two-word budget at B = 4 (the distribution itself is tested on the
/// interpreter, tests/tree_sampling.rs).
#[test]
fn sampled_ddtree_draws_the_interpreters_tokens_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = fixture("llama3_scaled_untied");
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_toml(
        &dir.join("spec.ddtree-test.toml"),
        "method = \"ddtree\"\ndraft = \"../dflash_random\"\nbudget = 80\ntopk = 8\n\
         [acceptance]\nmode = \"sample\"\ntemperature = 1.0\nseed = 11\n",
    )
    .unwrap();
    let what = "sampled ddtree cuda budget 80 B=4";
    let mean = assert_draws_match_interpreter(&target, &cfg, &random_prompts(4), 32, CTX, what);
    eprintln!("{what}: the interpreter's tokens; mean acceptance {mean:.2}");
}
