//! EAGLE-3 draft trees (`method = "eagle3"`, `topk > 1`): spec.toml knobs and their errors,
//! and greedy exactness of the whole tree step graph on the interpreter (dynamic tree
//! drafted by the head on device, `tree_select` of the best `num_draft_tokens` nodes, tree
//! verify, greedy walk, KV-row commit) for topk 2 / 4 / 8 and several tree sizes — one above
//! 64 nodes, so ancestor masks take two words — with the trained head (partial acceptance,
//! at least the chain's), a random head (near-zero acceptance) and a target-derived head
//! (full acceptance, tests/full_accept), at batch 1 and batch 4 with different prompt
//! lengths.

use std::path::Path;

use specc_models::{Acceptance, Method, Model, SpecBundle, SpecConfig, TreeKnobs};

mod common;
mod full_accept;
mod spec_common;

use full_accept::Family;
use spec_common::{
    default_model, first_step_tree, fixture, python_prompts, random_prompts, Outcome,
};

/// KV slots per sequence in these tests.
const CTX: u64 = 512;

fn check_exact(target: &Model, b: &SpecBundle, prompts: &[Vec<u32>], n: usize) -> Outcome {
    spec_common::check_exact(target, b, prompts, n, CTX)
}

fn spec_cfg(target_dir: &Path, body: &str) -> Result<SpecConfig, String> {
    SpecConfig::from_toml(&target_dir.join("spec.eagle3-tree-test.toml"), body)
        .map_err(|e| e.to_string())
}

#[test]
fn spec_toml_knobs_and_errors() {
    let dir = fixture("llama3_scaled_untied");
    let head = "method = \"eagle3\"\ndraft = \"../eagle3_random\"\n";
    let cfg = spec_cfg(&dir, head).unwrap();
    assert_eq!(
        (cfg.method, cfg.tree),
        (Method::Eagle3, None),
        "topk 1: chain"
    );
    let cfg = spec_cfg(&dir, &format!("{head}num_steps = 5\ntopk = 4")).unwrap();
    let knobs = TreeKnobs {
        budget: 32,
        topk: 4,
    };
    assert_eq!(cfg.tree, Some(knobs), "default num_draft_tokens");
    assert_eq!(cfg.verify_margin(), 31);
    let cfg = spec_cfg(&dir, &format!("{head}num_steps = 3\ntopk = 2")).unwrap();
    assert_eq!(
        cfg.tree.unwrap().budget,
        11,
        "capped at 1 + 2 + 2·4 candidates"
    );
    let cfg = spec_cfg(
        &dir,
        &format!("{head}num_steps = 9\ntopk = 8\nnum_draft_tokens = 16"),
    )
    .unwrap();
    assert_eq!(cfg.verify_margin(), 64, "the head's 8 · 8 draft rows");
    let bad = |body: &str, parts: &[&str]| {
        let e = spec_cfg(&dir, &format!("{head}{body}")).unwrap_err();
        assert!(e.contains("spec.eagle3-tree-test.toml"), "{e}");
        for p in parts {
            assert!(e.contains(p), "`{e}` should mention {p:?}");
        }
    };
    bad("topk = 0", &["topk", "1..=16"]);
    bad("topk = 17", &["topk", "17"]);
    bad("num_draft_tokens = 8", &["num_draft_tokens", "topk = 1"]);
    bad(
        "num_steps = 3\ntopk = 2\nnum_draft_tokens = 12",
        &["num_draft_tokens", "2..=11", "12"],
    );
    bad(
        "num_steps = 8\ntopk = 8\nnum_draft_tokens = 257",
        &["num_draft_tokens", "2..=256"],
    );
    bad("topk = 4\nnum_draft_tokens = 1", &["num_draft_tokens", "1"]);
    bad("num_steps = 63\ntopk = 16", &["num_steps", "4096"]);
    bad("topk = 2\nbudget = 16", &["budget", "num_draft_tokens"]);
    bad(
        "num_steps = 5\ntopk = 4\nnum_draft_tokens = 60\nmax_context = 100",
        &["max_context", "124", "num_draft_tokens = 60"],
    );
    let e = spec_cfg(
        &dir,
        "method = \"draft_model\"\ndraft = \"../llama_tied\"\nnum_draft_tokens = 8",
    )
    .unwrap_err();
    assert!(e.contains("num_draft_tokens"), "{e}");
    let e = spec_cfg(
        &dir,
        "method = \"ddtree\"\ndraft = \"../dflash_random\"\nnum_draft_tokens = 8",
    )
    .unwrap_err();
    assert!(
        e.contains("num_draft_tokens") && e.contains("budget"),
        "{e}"
    );
    // A chain keeps its old meaning; chains and trees take sampled acceptance.
    for topk in [1, 2] {
        let cfg = spec_cfg(
            &dir,
            &format!("{head}topk = {topk}\n[acceptance]\nmode = \"sample\"\ntemperature = 0.7"),
        )
        .unwrap();
        assert!(
            matches!(cfg.acceptance, Acceptance::Sample { temperature, .. } if temperature == 0.7),
            "{:?}",
            cfg.acceptance
        );
    }
}

fn trained_bundle(target: &Model, depth: u32, topk: u32, nodes: u32) -> SpecBundle {
    let cfg = spec_cfg(
        &default_model(),
        &format!(
            "method = \"eagle3\"\ndraft = \"eagle3\"\nnum_steps = {depth}\ntopk = {topk}\nnum_draft_tokens = {nodes}"
        ),
    )
    .unwrap();
    SpecBundle::open(target, &cfg).unwrap()
}

fn trained_batch1(depth: u32, topk: u32, nodes: u32, n: usize) -> Outcome {
    let target = Model::open(default_model()).unwrap();
    let b = trained_bundle(&target, depth, topk, nodes);
    let out = check_exact(&target, &b, &python_prompts(1), n);
    eprintln!(
        "trained eagle3 tree depth {depth} topk {topk} nodes {nodes} B=1: mean acceptance length {:.2}, histogram {:?}",
        out.mean_accept, out.histogram
    );
    assert!(out.mean_accept > 1.5, "mean accept {}", out.mean_accept);
    out
}

#[test]
fn trained_tree_topk2_nodes8_is_exact_batch1() {
    trained_batch1(5, 2, 8, 48);
}

#[test]
fn trained_tree_topk4_nodes16_is_exact_batch1() {
    trained_batch1(5, 4, 16, 48);
}

#[test]
fn trained_tree_topk4_nodes60_is_exact_batch1() {
    trained_batch1(6, 4, 60, 40);
}

#[test]
fn trained_tree_topk4_is_exact_batch4() {
    let target = Model::open(default_model()).unwrap();
    let b = trained_bundle(&target, 5, 4, 16);
    let prompts = python_prompts(4);
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    assert!(lens.windows(2).any(|w| w[0] != w[1]), "{lens:?}");
    let out = check_exact(&target, &b, &prompts, 32);
    eprintln!(
        "trained eagle3 tree topk 4 nodes 16 B=4 (prompt lengths {lens:?}): mean acceptance length {:.2}, histogram {:?}",
        out.mean_accept, out.histogram
    );
    assert!(out.mean_accept > 1.5, "mean accept {}", out.mean_accept);
}

/// The tree accepts at least as much as the head's own chain (k = depth) on the same prompts.
#[test]
fn trained_tree_accepts_at_least_the_chain() {
    let target = Model::open(default_model()).unwrap();
    let prompts = python_prompts(2);
    let tree = check_exact(&target, &trained_bundle(&target, 5, 4, 32), &prompts, 40);
    let cfg = spec_cfg(
        &default_model(),
        "method = \"eagle3\"\ndraft = \"eagle3\"\nnum_steps = 5",
    )
    .unwrap();
    let chain = check_exact(
        &target,
        &SpecBundle::open(&target, &cfg).unwrap(),
        &prompts,
        40,
    );
    eprintln!(
        "mean acceptance length: eagle3 chain k=5 {:.2}, tree depth 5 topk 4 nodes 32 {:.2}",
        chain.mean_accept, tree.mean_accept
    );
    assert!(
        tree.mean_accept >= chain.mean_accept,
        "tree {} < chain {}",
        tree.mean_accept,
        chain.mean_accept
    );
}

/// Random head: topk 2 / 4 / 8, 8..256 nodes (up to four ancestor words), and with topk 8
/// and depth 10 72 draft rows (two words in the head's own tree masks too).
#[test]
fn random_tree_is_exact_batch1_and_batch4() {
    let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
    for (depth, topk, nodes, lanes, n) in [
        (4, 2, 8, 1, 24),
        (5, 4, 60, 4, 16),
        (10, 8, 100, 1, 16),
        (10, 8, 100, 4, 12),
        (8, 8, 256, 2, 12),
    ] {
        let cfg = spec_cfg(
            &fixture("llama3_scaled_untied"),
            &format!(
                "method = \"eagle3\"\ndraft = \"../eagle3_random\"\nnum_steps = {depth}\ntopk = {topk}\nnum_draft_tokens = {nodes}"
            ),
        )
        .unwrap();
        let b = SpecBundle::open(&target, &cfg).unwrap();
        let out = check_exact(&target, &b, &random_prompts(lanes), n);
        eprintln!(
            "random eagle3 tree depth {depth} topk {topk} nodes {nodes} B={lanes}: mean acceptance length {:.2}",
            out.mean_accept
        );
        assert!(out.mean_accept < 2.0, "mean accept {}", out.mean_accept);
    }
}

/// The selected tree's invariants on a real step: node 0 is the bonus token, every other
/// node has a parent before it (prefix-closed: nothing detached), depth = parent's + 1 ≤
/// num_steps, ancestors = parent's | own bit, and no two siblings share a token.
#[test]
fn step_tree_is_prefix_closed() {
    use std::collections::HashSet;

    let target = Model::open(default_model()).unwrap();
    let b = trained_bundle(&target, 6, 4, 80);
    let (_, tree, cols) = first_step_tree(&target, &b, 80, 2, 6);
    let mut children = HashSet::new();
    for i in 1..80 {
        let row = &tree[i * cols..][..cols];
        assert!(
            children.insert((row[1], row[0])),
            "node {i}: duplicate sibling"
        );
    }
}

/// Full acceptance (tests/full_accept): with the target-derived head every node's top-1
/// is the target's greedy token, so every step accepts the deepest path (`num_steps`
/// nodes) plus the bonus, for a one-word tree and one of 80 nodes (two ancestor words).
fn target_derived(lanes: usize) {
    let fam = Family::new();
    let target = fam.target();
    for (depth, topk, nodes) in [(5, 4, 16), (8, 8, 80)] {
        let b = fam.bundle(
            &target,
            &format!(
                "method = \"eagle3\"\ndraft = \"../eagle3\"\nnum_steps = {depth}\ntopk = {topk}\nnum_draft_tokens = {nodes}"
            ),
        );
        let what = format!("eagle3 tree depth {depth} topk {topk} nodes {nodes} B={lanes}");
        full_accept::check_cpu(&what, &target, &b, depth, lanes);
    }
}

#[test]
fn target_derived_tree_accepts_the_deepest_path_batch1() {
    target_derived(1);
}

#[test]
fn target_derived_tree_accepts_the_deepest_path_batch4() {
    target_derived(4);
}
