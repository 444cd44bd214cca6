//! Continuous batching on the device (`CudaSpecSession::admit_lane`): requests join a
//! running batch one lane at a time, finish and leave; every request's tokens must equal
//! its tokens served alone in the same engine (batch invariance: every step replays the
//! one captured graph of the session's bucket), for every way a method primes a lane.
//! Run with `--features cuda`; without a driver every test prints why it skipped and passes.

#![cfg(feature = "cuda")]

mod common;
mod gpu_common;
mod lanes_common;

use gpu_common::{build_engine, corpus_prompts, default_model, gpu, session};
use lanes_common::{alone, serve, staggered};
use specc_models::{Model, SpecConfig};

fn check(spec_file: &str) {
    let dir = default_model();
    check_cfg(
        spec_file,
        SpecConfig::from_file(&dir.join(spec_file)).unwrap(),
    );
}

/// `cfg` served as [`check`] does; `spec_file` labels failures.
fn check_cfg(spec_file: &str, cfg: SpecConfig) {
    if !gpu() {
        return;
    }
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let (engine, bundle) = build_engine(&target, Some(&cfg), &[4], 256);
    let bundle = bundle.expect("a spec opens its draft");
    let mut s = session(&engine, &target, Some(&bundle), 4);
    let arrivals = staggered(&corpus_prompts());
    let want = alone(&mut s, &arrivals);
    let got = serve(&mut s, &arrivals);
    let w = target.load_weights_f32();
    for (i, a) in arrivals.iter().enumerate() {
        assert_eq!(
            got[i], want[i],
            "{spec_file}: request {i} differs batched and alone"
        );
        let cpu = target
            .greedy_generate(&w, &a.prompt, a.max_new, 256)
            .unwrap();
        if cpu != want[i] {
            eprintln!("note: {spec_file}: request {i}: CUDA greedy differs from the interpreter's (numerics)");
        }
    }
    eprintln!(
        "{spec_file}: 6 requests on 4 lanes, joining and leaving, equal to their lone tokens"
    );
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

/// Sampled acceptance: a lane's draws come from its own RNG stream, so batched equals alone.
#[test]
fn sampled_draft_model_lanes_keep_their_draws() {
    let dir = default_model();
    let text = "method = \"draft_model\"\ndraft = \"draft\"\nnum_steps = 5\n[acceptance]\nmode = \"sample\"\ntemperature = 0.9\nseed = 11\n";
    let cfg = SpecConfig::from_toml(&dir.join("sampled.toml"), text).unwrap();
    check_cfg("sampled draft_model", cfg);
}
