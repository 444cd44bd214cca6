//! Every speculative method with quantised DeepSeek-V3 targets on the interpreter: the int4
//! fixture (Kimi-K2-Thinking / K2.5's routed experts as compressed-tensors int4) with
//! draft_model, EAGLE-3 chain and tree, DFlash and DDTree, and the fp8 block fixture with
//! draft_model; greedy output equals the target's own greedy tokens exactly at batch 1 and 4.

use specc_models::{Model, SpecBundle, SpecConfig};

mod common;
mod deepseek_drafters;
mod spec_common;

use deepseek_drafters::{dflash_drafter, eagle3_head};
use spec_common::{fixture, Outcome};

const CTX: u64 = 256;
const INT4: &str = "deepseek_v3_int4";

/// `b` prompts of different lengths inside the fixtures' 256-token vocabulary.
fn prompts(b: usize) -> Vec<Vec<u32>> {
    (0..b)
        .map(|i| {
            (0..(4 + 3 * i))
                .map(|j| ((j * 41 + i * 13 + 5) % 256) as u32)
                .collect()
        })
        .collect()
}

/// `body` (spec.toml) over target fixture `name`, exact at batch 1 and 4; the outcomes.
fn exact(name: &str, body: &str, n: usize) -> Vec<Outcome> {
    let target = Model::open(fixture(name)).unwrap_or_else(|e| panic!("{e}"));
    let cfg = SpecConfig::from_toml(&fixture(name).join("spec.test.toml"), body)
        .unwrap_or_else(|e| panic!("{e}"));
    let b = SpecBundle::open(&target, &cfg).unwrap_or_else(|e| panic!("{e}"));
    [1, 4]
        .into_iter()
        .map(|lanes| {
            let out = spec_common::check_exact(&target, &b, &prompts(lanes), n, CTX);
            eprintln!(
                "{name} B={lanes}: mean acceptance length {:.2}",
                out.mean_accept
            );
            out
        })
        .collect()
}

fn identical_draft(name: &str) {
    let k = 3;
    let body = format!(
        "method = \"draft_model\"\ndraft = \"{}\"\nnum_steps = {k}",
        fixture(name).display()
    );
    for out in exact(name, &body, 16) {
        assert!(out.mean_accept > k as f64, "{name}: {}", out.mean_accept);
    }
}

#[test]
fn int4_draft_model_identical_draft_accepts_everything() {
    identical_draft(INT4);
}

#[test]
fn fp8_draft_model_identical_draft_accepts_everything() {
    identical_draft("deepseek_v3_fp8");
}

#[test]
fn int4_eagle3_chain_and_tree_are_exact() {
    let chain = format!(
        "method = \"eagle3\"\ndraft = \"{}\"\nnum_steps = 3",
        eagle3_head("q_eagle3_chain").display()
    );
    exact(INT4, &chain, 12);
    let tree = format!(
        "method = \"eagle3\"\ndraft = \"{}\"\nnum_steps = 3\ntopk = 4\nnum_draft_tokens = 12",
        eagle3_head("q_eagle3_tree").display()
    );
    exact(INT4, &tree, 12);
}

#[test]
fn int4_dflash_and_ddtree_are_exact() {
    let dflash = format!(
        "method = \"dflash\"\ndraft = \"{}\"",
        dflash_drafter("q_dflash").display()
    );
    exact(INT4, &dflash, 12);
    let ddtree = format!(
        "method = \"ddtree\"\ndraft = \"{}\"\nbudget = 16\ntopk = 4",
        dflash_drafter("q_ddtree").display()
    );
    exact(INT4, &ddtree, 12);
}
