//! EAGLE-3 draft trees on the CUDA backend: the tree step graph (head drafting over its
//! own tree-masked cache, `tree_select`, tree-masked verify, greedy walk, KV-row commit)
//! captured and replayed on the device must emit exactly the target's greedy tokens under
//! the same kernels, like the interpreter does (tests/eagle3_tree.rs), for topk 2 / 4 / 8,
//! trees of 8 to 256 nodes (up to four ancestor words) and 72 draft rows in the head (two
//! words). Run with `--features cuda`; without a driver every test prints why it skipped
//! and passes.

#![cfg(feature = "cuda")]

mod common;
mod full_accept;
mod gpu_common;

use std::path::Path;

use full_accept::Family;
use gpu_common::{
    assert_draws_match_interpreter, assert_exact, build_engine, corpus_prompts, default_model,
    fixture, gpu, plain_cuda, random_prompts,
};
use specc_models::{Model, SpecConfig};

/// KV slots per sequence: room for the prompt, 48 tokens and a 256-node tree.
const CTX: u64 = 512;

/// EAGLE-3 tree `(depth, topk, nodes)` with the head in `draft` (relative to the target).
fn check(
    target_dir: &Path,
    draft: &str,
    knobs: (u32, u32, u32),
    prompts: &[Vec<u32>],
    n: usize,
) -> f64 {
    let (depth, topk, nodes) = knobs;
    let target = Model::open(target_dir).unwrap();
    let cfg = SpecConfig::from_toml(
        &target_dir.join("spec.eagle3-tree-test.toml"),
        &format!(
            "method = \"eagle3\"\ndraft = {draft:?}\nnum_steps = {depth}\ntopk = {topk}\nnum_draft_tokens = {nodes}\n"
        ),
    )
    .unwrap();
    let what = format!("(depth, topk, nodes) {knobs:?}");
    assert_exact(&target, &cfg, prompts, n, CTX, &what)
}

#[test]
fn random_eagle3_tree_is_exact_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = fixture("llama3_scaled_untied");
    for (knobs, lanes) in [((4, 2, 8), 1), ((5, 4, 60), 4), ((10, 8, 100), 4)] {
        let m = check(&dir, "../eagle3_random", knobs, &random_prompts(lanes), 20);
        eprintln!("random eagle3 tree cuda {knobs:?} B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m < 2.0, "{m}");
    }
}

#[test]
fn trained_eagle3_tree_is_exact_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = default_model();
    let prompts = corpus_prompts();
    for (knobs, lanes) in [
        ((5, 2, 8), 1),
        ((5, 4, 16), 1),
        ((5, 4, 32), 4),
        ((6, 4, 60), 1),
        ((8, 8, 256), 4),
    ] {
        let m = check(&dir, "eagle3", knobs, &prompts[..lanes], 48);
        eprintln!("trained eagle3 tree cuda {knobs:?} B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m > 1.5, "{m}");
    }
}

/// Full acceptance on the device (tests/full_accept): with the target-derived head every
/// step accepts the tree's deepest path (`num_steps` nodes) plus the bonus, for a one-word
/// tree and one of 80 nodes, at B = 1 and B = 4.
#[test]
fn target_derived_eagle3_tree_accepts_the_deepest_path_on_cuda() {
    if !gpu() {
        return;
    }
    let fam = Family::new();
    let target = fam.target();
    for (depth, topk, nodes) in [(5, 4, 16), (8, 8, 80)] {
        let cfg = fam.config(&format!(
            "method = \"eagle3\"\ndraft = \"../eagle3\"\nnum_steps = {depth}\ntopk = {topk}\nnum_draft_tokens = {nodes}"
        ));
        for lanes in [1, 4] {
            let what =
                format!("eagle3 tree cuda depth {depth} topk {topk} nodes {nodes} B={lanes}");
            full_accept::check_cuda(&what, &target, &cfg, depth, lanes, build_engine, plain_cuda);
        }
    }
}

/// Sampled acceptance on the device: the captured EAGLE-3 tree step draws the interpreter's
/// tokens (the distribution itself is tested on the interpreter, tests/tree_sampling.rs).
#[test]
fn sampled_eagle3_tree_draws_the_interpreters_tokens_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = fixture("llama3_scaled_untied");
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_toml(
        &dir.join("spec.eagle3-tree-test.toml"),
        "method = \"eagle3\"\ndraft = \"../eagle3_random\"\nnum_steps = 5\ntopk = 4\n\
         num_draft_tokens = 60\n[acceptance]\nmode = \"sample\"\ntemperature = 1.0\nseed = 5\n",
    )
    .unwrap();
    let what = "sampled eagle3 tree cuda (5, 4, 60) B=4";
    let mean = assert_draws_match_interpreter(&target, &cfg, &random_prompts(4), 32, CTX, what);
    eprintln!("{what}: the interpreter's tokens; mean acceptance {mean:.2}");
}
