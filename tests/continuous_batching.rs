//! Continuous batching on the interpreter: lanes admitted one at a time while others are
//! mid-generation (`admit_lane`), steps over the lanes in use only (`step_upto`), lanes
//! finished and reused. Under greedy acceptance every request must emit exactly the
//! target's own greedy tokens, whatever its neighbours, its lane and the batch each step
//! ran at: the interpreter computes every row on its own in a fixed order. One check per
//! way a method primes a lane (standalone draft, EAGLE-3 pairs, DFlash context, trees).

mod common;
mod lanes_common;
mod spec_common;

use specc_models::{Model, SpecBundle, SpecConfig};
use specc_runtime::{SpecCpuSession, SpecGraphs};

use lanes_common::{alone, serve, serve_behind, staggered};
use spec_common::{default_model, python_prompts};

const CTX: u64 = 256;

fn check(spec_file: &str) {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec_file)).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    let arrivals = staggered(&python_prompts(4));
    let mut s = SpecCpuSession::new(SpecGraphs::of(&b), &weights, 3, CTX);
    let got = serve(&mut s, &arrivals);
    let w = target.load_weights_f32();
    for (i, a) in arrivals.iter().enumerate() {
        let want = target
            .greedy_generate(&w, &a.prompt, a.max_new, CTX as usize)
            .unwrap();
        assert_eq!(
            got[i], want,
            "{spec_file}: request {i} differs from the target's greedy tokens"
        );
    }
}

#[test]
fn draft_model_lanes_join_and_leave() {
    check("spec.toml");
}

#[test]
fn eagle3_lanes_join_and_leave() {
    check("spec.eagle3.toml");
}

#[test]
fn eagle3_tree_lanes_join_and_leave() {
    check("spec.eagle3-tree.toml");
}

#[test]
fn dflash_lanes_join_and_leave() {
    check("spec.dflash.toml");
}

#[test]
fn ddtree_lanes_join_and_leave() {
    check("ddtree.toml");
}

/// Sampled acceptance: each request's tokens batched equal its tokens alone, since its draws
/// come from its own RNG stream (admission's) and its logits do not depend on its lane.
fn check_sampled(method: &str) {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let text = format!("{method}\n[acceptance]\nmode = \"sample\"\ntemperature = 0.9\nseed = 11\n");
    let cfg = SpecConfig::from_toml(&dir.join("sampled.toml"), &text).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    let arrivals = staggered(&python_prompts(4));
    let mut s = SpecCpuSession::new(SpecGraphs::of(&b), &weights, 3, CTX);
    let want = alone(&mut s, &arrivals);
    let got = serve(&mut s, &arrivals);
    assert_eq!(
        got, want,
        "{method}: sampled requests differ batched and alone"
    );
    // As `specc serve` reads them: each step's tokens behind the next step.
    let behind = serve_behind(&mut s, &arrivals);
    assert_eq!(behind, want, "{method}: read behind the next step");
    let w = target.load_weights_f32();
    let greedy = target
        .greedy_generate(&w, &arrivals[0].prompt, arrivals[0].max_new, CTX as usize)
        .unwrap();
    assert_ne!(
        got[0], greedy,
        "{method}: temperature 0.9 drew the greedy tokens"
    );
}

#[test]
fn sampled_draft_model_lanes_keep_their_draws() {
    check_sampled("method = \"draft_model\"\ndraft = \"draft\"\nnum_steps = 5");
}

#[test]
fn sampled_ddtree_lanes_keep_their_draws() {
    check_sampled("method = \"ddtree\"\ndraft = \"dflash\"\nbudget = 16\ntopk = 4");
}
