//! Continuous batching on the interpreter: lanes admitted one at a time while others are
//! mid-generation (`admit_lane`), steps over the lanes in use only (`step_upto`), lanes
//! finished and reused. Under greedy acceptance every request must emit exactly the
//! target's own greedy tokens, whatever its neighbours, its lane and the batch each step
//! ran at: the interpreter computes every row on its own in a fixed order. One check per
//! way a method primes a lane (standalone draft, EAGLE-3 pairs, DFlash context, trees).

mod common;
mod spec_common;

use specc_models::{Model, SpecBundle, SpecConfig};
use specc_runtime::{SpecCpuSession, SpecGraphs};

use spec_common::{default_model, python_prompts};

const CTX: u64 = 256;

/// One request: its prompt, its token budget and the step at which it arrives.
struct Arrival {
    prompt: Vec<u32>,
    max_new: usize,
    at_step: usize,
}

/// Serves `arrivals` on a session of `lanes` lanes the way `specc serve` does: at each
/// step, arrivals due join the lowest free lanes; a lane whose budget is spent is freed.
fn serve(
    b: &SpecBundle,
    weights: &dyn specc_ir::interp::WeightSource,
    lanes: usize,
    arrivals: &[Arrival],
) -> Vec<Vec<u32>> {
    let mut s = SpecCpuSession::new(SpecGraphs::of(b), weights, lanes, CTX);
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); arrivals.len()];
    let mut lane_of: Vec<Option<usize>> = vec![None; lanes];
    let mut next = 0;
    let mut step = 0;
    while next < arrivals.len() || lane_of.iter().any(Option::is_some) {
        while next < arrivals.len() && arrivals[next].at_step <= step {
            let Some(free) = lane_of.iter().position(Option::is_none) else {
                break;
            };
            let a = &arrivals[next];
            let first = s.admit_lane(free, &a.prompt, a.max_new).unwrap();
            out[next].push(first);
            lane_of[free] = Some(next);
            next += 1;
        }
        let upto = lane_of
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |l| l + 1);
        if upto > 0 {
            s.step_upto(upto).unwrap();
            let toks = s.drain().unwrap();
            let live = s.live();
            for (l, slot) in lane_of.iter_mut().enumerate() {
                if let Some(r) = *slot {
                    out[r].extend(&toks[l]);
                    if !live[l] || out[r].len() >= arrivals[r].max_new {
                        s.finish(l);
                        *slot = None;
                    }
                }
            }
        }
        step += 1;
    }
    for (o, a) in out.iter_mut().zip(arrivals) {
        o.truncate(a.max_new);
    }
    out
}

fn check(spec_file: &str) {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec_file)).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    let prompts = python_prompts(4);
    // Six requests for three lanes: staggered arrivals, different budgets, a lane reused
    // twice, steps at batch 1, 2 and 3.
    let arrivals: Vec<Arrival> = [
        (0, 20, 0),
        (2, 12, 0),
        (1, 24, 3),
        (3, 9, 4),
        (0, 16, 5),
        (2, 18, 9),
    ]
    .iter()
    .map(|&(p, max_new, at_step)| Arrival {
        prompt: prompts[p].clone(),
        max_new,
        at_step,
    })
    .collect();
    let got = serve(&b, &weights, 3, &arrivals);
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
