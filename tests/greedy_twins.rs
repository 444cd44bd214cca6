//! Greedy twins on the CPU backend: a sampling engine carries each step (every variant and
//! the configured k) lowered again for greedy acceptance, and runs the twin while no live
//! lane samples. Greedy lanes then emit exactly the target's greedy tokens through every
//! variant of every method, every step a twin; next to a sampled lane the steps sample, the
//! greedy lanes stay exact and the sampled lane's tokens equal its lone run's; once it
//! ends the twins run again.

use std::collections::HashMap;

use specc_ir::interp::Tensor;
use specc_models::{Acceptance, Model, SpecBundle, SpecConfig};
use specc_runtime::admission::LaneSampling;
use specc_runtime::{SpecCpuSession, SpecGraphs};

mod common;

use common::default_model;

const CTX: u64 = 128;

/// The embedded default's `spec` under sampled acceptance.
fn sampling_bundle(spec: &str) -> (Model, SpecBundle) {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec)).unwrap();
    let cfg = SpecConfig {
        acceptance: Acceptance::Sample {
            temperature: 0.8,
            top_k: None,
            top_p: 1.0,
            seed: 3,
        },
        ..cfg
    };
    let bundle = SpecBundle::open(&target, &cfg).unwrap();
    (target, bundle)
}

fn prompt(i: usize) -> Vec<u32> {
    (0..(4 + 3 * i))
        .map(|j| ((j * 37 + i * 11 + 3) % 300) as u32)
        .collect()
}

struct Join {
    lane: usize,
    prompt: Vec<u32>,
    max_new: usize,
    sampling: LaneSampling,
}

/// Admits `joins` and steps until every lane ends (each step's variant forced from
/// `schedule`, cycled, where given). Returns each lane's tokens.
fn generate(s: &mut SpecCpuSession, joins: &[Join], schedule: &[usize]) -> Vec<Vec<u32>> {
    let lanes = s.live().len();
    let mut tokens = vec![Vec::new(); lanes];
    for j in joins {
        let first = s
            .admit_lane(j.lane, &j.prompt, j.max_new, j.sampling)
            .unwrap();
        tokens[j.lane].push(first);
    }
    let mut i = 0;
    while s.live().iter().any(|&l| l) {
        if !schedule.is_empty() {
            s.policy_mut().force(&[schedule[i % schedule.len()]]);
            i += 1;
        }
        s.step().unwrap();
        for (b, new) in s.drain().unwrap().into_iter().enumerate() {
            tokens[b].extend(new);
        }
    }
    for j in joins {
        tokens[j.lane].truncate(j.max_new);
    }
    tokens
}

fn session<'a>(
    b: &'a SpecBundle,
    w: &'a HashMap<String, Tensor>,
    lanes: usize,
) -> SpecCpuSession<'a> {
    SpecCpuSession::new(SpecGraphs::of(b), w, lanes, CTX)
}

/// Every method: a twin for each k a step may run, greedy lanes exact through every
/// variant at batch 1 and 3, and every step a twin.
fn greedy_lanes_run_twins_exactly(spec: &str) {
    let (target, b) = sampling_bundle(spec);
    let ks: Vec<usize> = b.contract.step_variants().iter().map(|v| v.k).collect();
    let twins: Vec<usize> = b.contract.greedy.iter().map(|v| v.k).collect();
    assert_eq!(twins, ks, "{spec}: a twin for every step");
    let w = b.load_weights_f32(&target).unwrap();
    let tw = target.load_weights_f32();
    let n = 24;
    // Through every variant, with plain stretches and switches between every pair.
    let schedule: Vec<usize> = [3, 0, 1, 3, 2, 0, 0, 3, 1, 2, 1, 0, 3, 3, 2]
        .into_iter()
        .map(|v| v % ks.len())
        .collect();
    for lanes in [1, 3] {
        let joins: Vec<Join> = (0..lanes)
            .map(|lane| Join {
                lane,
                prompt: prompt(lane),
                max_new: n,
                sampling: LaneSampling::greedy(lane as u32),
            })
            .collect();
        let mut s = session(&b, &w, lanes);
        let got = generate(&mut s, &joins, &schedule);
        for j in &joins {
            let want = target
                .greedy_generate(&tw, &j.prompt, n, CTX as usize)
                .unwrap();
            assert_eq!(got[j.lane], want, "{spec}, {lanes} lanes, lane {}", j.lane);
        }
        assert!(s.stats.steps > 0);
        assert_eq!(
            s.stats.greedy_steps, s.stats.steps,
            "{spec}: every step of greedy lanes is a twin"
        );
    }
}

#[test]
fn draft_model_greedy_lanes_run_twins_exactly() {
    greedy_lanes_run_twins_exactly("spec.toml");
}

#[test]
fn eagle3_greedy_lanes_run_twins_exactly() {
    greedy_lanes_run_twins_exactly("spec.eagle3.toml");
}

#[test]
fn eagle3_tree_greedy_lanes_run_twins_exactly() {
    greedy_lanes_run_twins_exactly("spec.eagle3-tree.toml");
}

#[test]
fn dflash_greedy_lanes_run_twins_exactly() {
    greedy_lanes_run_twins_exactly("spec.dflash.toml");
}

#[test]
fn ddtree_greedy_lanes_run_twins_exactly() {
    greedy_lanes_run_twins_exactly("ddtree.toml");
}

/// A sampled lane next to two greedy ones: while it is live the steps sample (no twin), the
/// greedy lanes stay exact, its tokens equal its lone run's; after it ends (a shorter
/// budget) the greedy lanes' steps are twins again.
#[test]
fn a_sampled_lane_suspends_the_twins_while_it_is_live() {
    let (target, b) = sampling_bundle("spec.toml");
    let w = b.load_weights_f32(&target).unwrap();
    let tw = target.load_weights_f32();
    let sampled = LaneSampling {
        stream: 7,
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
    };
    let join = |lane: usize, max_new: usize, sampling: LaneSampling| Join {
        lane,
        prompt: prompt(lane),
        max_new,
        sampling,
    };
    let mixed = [
        join(0, 30, LaneSampling::greedy(0)),
        join(1, 8, sampled),
        join(2, 30, LaneSampling::greedy(2)),
    ];
    let mut s = session(&b, &w, 3);
    let got = generate(&mut s, &mixed, &[]);
    for lane in [0, 2] {
        let want = target
            .greedy_generate(&tw, &prompt(lane), 30, CTX as usize)
            .unwrap();
        assert_eq!(got[lane], want, "greedy lane {lane} next to a sampled one");
    }
    assert!(
        s.stats.greedy_steps > 0 && s.stats.greedy_steps < s.stats.steps,
        "twins only once the sampled lane ended: {} of {} steps",
        s.stats.greedy_steps,
        s.stats.steps
    );
    let mut lone = session(&b, &w, 3);
    let alone = generate(&mut lone, &[join(1, 8, sampled)], &[]);
    assert_eq!(lone.stats.greedy_steps, 0, "a sampled lane's steps sample");
    assert_eq!(
        got[1], alone[1],
        "the sampled lane's tokens equal its lone run's"
    );
    assert_eq!(got[1].len(), 8);
}
