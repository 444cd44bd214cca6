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

use lanes_common::{serve, staggered};
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
