//! DDTree as a method: spec.toml knobs and their errors, and greedy exactness of the whole
//! tree step graph on the interpreter (draft tree from the DFlash drafter's block, tree
//! verify, greedy walk, KV-row commit) for several budgets — one above 64 nodes, so the
//! ancestor masks take two words — with the trained drafter (partial acceptance), a
//! random drafter (near-zero acceptance) and a target-derived one (full acceptance,
//! tests/full_accept), at batch 1 and batch 4 with different prompt lengths.

use std::path::Path;

use specc_models::{Acceptance, Method, Model, SpecBundle, SpecConfig, TreeKnobs};
use specc_runtime::{DraftKind, SpecCpuSession, SpecGraphs};

mod common;
mod full_accept;
mod spec_common;

use full_accept::{Family, BLOCK_SIZE};
use spec_common::{
    default_model, first_step_tree, fixture, python_prompts, random_prompts, Outcome,
};

/// KV slots per sequence in these tests.
const CTX: u64 = 512;

fn check_exact(target: &Model, b: &SpecBundle, prompts: &[Vec<u32>], n: usize) -> Outcome {
    spec_common::check_exact(target, b, prompts, n, CTX)
}

fn spec_cfg(target_dir: &Path, body: &str) -> Result<SpecConfig, String> {
    SpecConfig::from_toml(&target_dir.join("spec.ddtree-test.toml"), body)
        .map_err(|e| e.to_string())
}

#[test]
fn spec_toml_knobs_and_errors() {
    let dir = fixture("llama3_scaled_untied");
    let cfg = spec_cfg(&dir, "method = \"ddtree\"\ndraft = \"../dflash_random\"").unwrap();
    assert_eq!(cfg.method, Method::DDTree);
    assert_eq!(cfg.num_steps, 3, "depth = block_size - 1");
    assert_eq!(
        cfg.tree,
        Some(TreeKnobs {
            budget: 64,
            topk: 8
        })
    );
    let cfg = spec_cfg(
        &dir,
        "method = \"ddtree\"\ndraft = \"../dflash_random\"\nbudget = 100\ntopk = 3",
    )
    .unwrap();
    assert_eq!(
        cfg.tree,
        Some(TreeKnobs {
            budget: 100,
            topk: 3
        })
    );
    let bad = |body: &str, parts: &[&str]| {
        let e = spec_cfg(&dir, body).unwrap_err();
        assert!(e.contains("spec.ddtree-test.toml"), "{e}");
        for p in parts {
            assert!(e.contains(p), "`{e}` should mention {p:?}");
        }
    };
    let head = "method = \"ddtree\"\ndraft = \"../dflash_random\"\n";
    bad(&format!("{head}budget = 8"), &["budget", "16..=256", "8"]);
    bad(&format!("{head}budget = 257"), &["budget", "257"]);
    bad(&format!("{head}topk = 0"), &["topk", "1..=64"]);
    let sampled = spec_cfg(&dir, &format!("{head}[acceptance]\nmode = \"sample\"")).unwrap();
    assert!(
        matches!(sampled.acceptance, Acceptance::Sample { temperature, .. } if temperature == 1.0),
        "{:?}",
        sampled.acceptance
    );
    bad(
        &format!("{head}budget = 64\nmax_context = 100"),
        &["max_context", "132", "budget = 64"],
    );
    bad(
        "method = \"dflash\"\ndraft = \"../dflash_random\"\nbudget = 32",
        &["budget", "ddtree"],
    );
}

fn trained_bundle(target: &Model, budget: u32, topk: u32) -> SpecBundle {
    let cfg = spec_cfg(
        &default_model(),
        &format!("method = \"ddtree\"\ndraft = \"dflash\"\nbudget = {budget}\ntopk = {topk}"),
    )
    .unwrap();
    assert_eq!(cfg.num_steps, 7);
    SpecBundle::open(target, &cfg).unwrap()
}

fn trained_batch1(budget: u32, topk: u32, n: usize) -> Outcome {
    let target = Model::open(default_model()).unwrap();
    let b = trained_bundle(&target, budget, topk);
    let out = check_exact(&target, &b, &python_prompts(1), n);
    eprintln!(
        "trained ddtree budget {budget} topk {topk} B=1: mean acceptance length {:.2}, histogram {:?}",
        out.mean_accept, out.histogram
    );
    assert!(out.mean_accept > 1.5, "mean accept {}", out.mean_accept);
    out
}

#[test]
fn trained_ddtree_budget16_is_exact_batch1() {
    trained_batch1(16, 4, 48);
}

#[test]
fn trained_ddtree_budget32_is_exact_batch1() {
    trained_batch1(32, 8, 48);
}

/// More than 64 nodes: two ancestor words per node.
#[test]
fn trained_ddtree_budget96_is_exact_batch1() {
    trained_batch1(96, 8, 40);
}

#[test]
fn trained_ddtree_budget64_is_exact_batch4() {
    let target = Model::open(default_model()).unwrap();
    let b = trained_bundle(&target, 64, 8);
    let prompts = python_prompts(4);
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    assert!(lens.windows(2).any(|w| w[0] != w[1]), "{lens:?}");
    let out = check_exact(&target, &b, &prompts, 32);
    eprintln!(
        "trained ddtree budget 64 B=4 (prompt lengths {lens:?}): mean acceptance length {:.2}, histogram {:?}",
        out.mean_accept, out.histogram
    );
    assert!(out.mean_accept > 1.5, "mean accept {}", out.mean_accept);
}

/// A tree accepts at least as much as the drafter's own chain (the top-1 path is the
/// tree's first branch): DDTree with the same drafter vs DFlash on the same prompt.
#[test]
fn trained_tree_accepts_at_least_the_chain() {
    let target = Model::open(default_model()).unwrap();
    let tree = check_exact(
        &target,
        &trained_bundle(&target, 32, 8),
        &python_prompts(1),
        40,
    );
    let cfg = spec_cfg(&default_model(), "method = \"dflash\"\ndraft = \"dflash\"").unwrap();
    let chain_b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = chain_b.load_weights_f32(&target).unwrap();
    let graphs = SpecGraphs::of(&chain_b);
    assert_eq!(
        graphs.contract.kind,
        DraftKind::DFlash {
            taps_width: chain_b.dflash_taps_width().unwrap(),
        }
    );
    assert_eq!(graphs.contract.num_steps, chain_b.num_steps());
    let mut s = SpecCpuSession::new(graphs, &weights, 1, 512);
    s.admit(&python_prompts(1), 40).unwrap();
    while s.live()[0] {
        s.step().unwrap();
        s.drain().unwrap();
    }
    let chain = s.stats.mean_accept_len();
    eprintln!(
        "mean acceptance length: dflash chain {chain:.2}, ddtree budget 32 {:.2}",
        tree.mean_accept
    );
    assert!(
        tree.mean_accept >= chain,
        "tree {} < chain {chain}",
        tree.mean_accept
    );
}

fn random_bundle(target: &Model, budget: u32) -> SpecBundle {
    let cfg = spec_cfg(
        &fixture("llama3_scaled_untied"),
        &format!("method = \"ddtree\"\ndraft = \"../dflash_random\"\nbudget = {budget}"),
    )
    .unwrap();
    SpecBundle::open(target, &cfg).unwrap()
}

#[test]
fn random_ddtree_is_exact_batch1_and_batch4() {
    let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
    for (budget, lanes, n) in [(16, 1, 24), (80, 4, 16)] {
        let b = random_bundle(&target, budget);
        let out = check_exact(&target, &b, &random_prompts(lanes), n);
        eprintln!(
            "random ddtree budget {budget} B={lanes}: mean acceptance length {:.2}",
            out.mean_accept
        );
        assert!(out.mean_accept < 2.0, "mean accept {}", out.mean_accept);
    }
}

/// The built tree's invariants on a real step: node 0 is the bonus token, parents precede
/// children, depth = parent depth + 1, ancestors = parent's | own bit.
#[test]
fn step_tree_is_well_formed() {
    let target = Model::open(default_model()).unwrap();
    let b = trained_bundle(&target, 96, 8);
    first_step_tree(&target, &b, 96, 2, 7);
}

/// Full acceptance (tests/full_accept): with the target-derived drafter the tree's top-1
/// path is the target's greedy continuation, so every step accepts the deepest path
/// (`BLOCK_SIZE − 1` nodes) plus the bonus, for a one-word budget and one above 64 nodes.
fn target_derived(lanes: usize) {
    let fam = Family::new();
    let target = fam.target();
    for budget in [16, 80] {
        let b = fam.bundle(
            &target,
            &format!("method = \"ddtree\"\ndraft = \"../dflash\"\nbudget = {budget}"),
        );
        let what = format!("ddtree budget {budget} B={lanes}");
        full_accept::check_cpu(&what, &target, &b, BLOCK_SIZE - 1, lanes);
    }
}

#[test]
fn target_derived_ddtree_accepts_the_deepest_path_batch1() {
    target_derived(1);
}

#[test]
fn target_derived_ddtree_accepts_the_deepest_path_batch4() {
    target_derived(4);
}
