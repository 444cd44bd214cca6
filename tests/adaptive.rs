//! Adaptive speculation on the CPU backend: every step variant of the embedded default
//! (draft_model k = 5: variants k = 0, 1, 3, 5) and any schedule of switches between them
//! emit exactly the target's greedy tokens, alone and batched; after a stretch of plain
//! steps the re-primed draft cache equals a fresh draft prefill over the committed tokens.
//! The same for the methods whose draft reads target hidden states (EAGLE-3 chain and tree,
//! DFlash, DDTree), whose plain step keeps the draft's caches whole instead.

use std::collections::HashMap;

use specc_ir::interp::Tensor;
use specc_models::methods::CATCH_UP_ROWS;
use specc_models::{Model, SpecBundle, SpecConfig};
use specc_runtime::{SpecCpuSession, SpecGraphs, SpecPolicy};

mod common;

use common::default_model;

const CTX: u64 = 128;

fn embedded() -> (Model, SpecBundle) {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join("spec.toml")).unwrap();
    let bundle = SpecBundle::open(&target, &cfg).unwrap();
    (target, bundle)
}

fn prompts(lanes: usize) -> Vec<Vec<u32>> {
    (0..lanes)
        .map(|i| {
            (0..(4 + 3 * i))
                .map(|j| ((j * 37 + i * 11 + 3) % 300) as u32)
                .collect()
        })
        .collect()
}

/// Runs `prompts` to `n` tokens, the policy in `mode` after `schedule` (forced variants,
/// cycled until every lane ends). Returns each lane's tokens and the session's variant
/// counts.
fn generate(
    s: &mut SpecCpuSession,
    prompts: &[Vec<u32>],
    n: usize,
    schedule: &[usize],
) -> Vec<Vec<u32>> {
    let first = s.admit(prompts, n).unwrap();
    let mut tokens: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
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
    for t in &mut tokens {
        t.truncate(n);
    }
    tokens
}

fn greedy(target: &Model, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let w = target.load_weights_f32();
    prompts
        .iter()
        .map(|p| target.greedy_generate(&w, p, n, CTX as usize).unwrap())
        .collect()
}

fn session<'a>(
    b: &'a SpecBundle,
    w: &'a HashMap<String, Tensor>,
    lanes: usize,
) -> SpecCpuSession<'a> {
    SpecCpuSession::new(SpecGraphs::of(b), w, lanes, CTX)
}

#[test]
fn the_embedded_default_has_plain_and_smaller_k_variants() {
    let (_, b) = embedded();
    let ks: Vec<usize> = b.contract.step_variants().iter().map(|v| v.k).collect();
    assert_eq!(ks, vec![0, 1, 3, 5]);
}

#[test]
fn every_variant_alone_is_exact() {
    let (target, b) = embedded();
    let w = b.load_weights_f32(&target).unwrap();
    for lanes in [1, 3] {
        let ps = prompts(lanes);
        let want = greedy(&target, &ps, 24);
        for v in 0..4 {
            let mut s = session(&b, &w, lanes);
            let got = generate(&mut s, &ps, 24, &[v]);
            assert_eq!(got, want, "variant {v}, {lanes} lanes");
            assert_eq!(s.policy().steps()[v] as usize, s.stats.steps);
        }
    }
}

#[test]
fn switching_mid_generation_is_exact_and_reprimes_the_draft() {
    let (target, b) = embedded();
    let w = b.load_weights_f32(&target).unwrap();
    let schedule = [3, 0, 0, 1, 0, 0, 0, 2, 3, 0, 3, 1, 2, 0, 0, 3];
    for lanes in [1, 4] {
        let ps = prompts(lanes);
        let n = 40;
        let want = greedy(&target, &ps, n);
        let mut s = session(&b, &w, lanes);
        let got = generate(&mut s, &ps, n, &schedule);
        assert_eq!(got, want, "{lanes} lanes");
        assert!(
            s.policy().steps().iter().all(|&c| c > 0),
            "every variant ran"
        );
    }
}

#[test]
fn after_plain_steps_the_draft_cache_equals_a_fresh_prefill() {
    let (target, b) = embedded();
    let w = b.load_weights_f32(&target).unwrap();
    let ps = prompts(2);
    let mut s = session(&b, &w, 2);
    let first = s.admit(&ps, 60).unwrap();
    let mut tokens: Vec<Vec<u32>> = ps
        .iter()
        .zip(&first)
        .map(|(p, &f)| p.iter().copied().chain([f]).collect())
        .collect();
    s.policy_mut().force(&[3, 3, 0, 0, 0, 0, 0, 0, 0, 2]);
    for _ in 0..10 {
        s.step().unwrap();
        for (lane, new) in s.drain().unwrap().into_iter().enumerate() {
            tokens[lane].extend(new);
        }
    }
    // Lane `b`'s draft cache must hold slots 0..len-1 as a prefill over its tokens writes
    // them (len = tokens − 1).
    let mut fresh = session(&b, &w, 1);
    for (lane, toks) in tokens.iter().enumerate() {
        let len = toks.len() - 1;
        fresh.admit(&[toks[..len - 1].to_vec()], 1).unwrap();
        for name in ["draft/kv.0.k", "draft/kv.1.v"] {
            let got = s.states()[name].as_f32().unwrap();
            let want = fresh.states()[name].as_f32().unwrap();
            let row = want.len() / CTX as usize;
            let got = &got[lane * row * CTX as usize..][..(len - 1) * row];
            let want = &want[..(len - 1) * row];
            for (i, (g, e)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-5 * e.abs().max(1.0),
                    "lane {lane} {name}[{i}] (slot {}): got {g}, want {e}",
                    i / row
                );
            }
        }
    }
}

#[test]
fn the_adaptive_policy_is_exact_and_reports_its_choices() {
    let (target, b) = embedded();
    let w = b.load_weights_f32(&target).unwrap();
    let ps = prompts(4);
    let want = greedy(&target, &ps, 48);
    let mut s = session(&b, &w, 4);
    s.policy_mut().set_mode(SpecPolicy::Adaptive);
    let got = generate(&mut s, &ps, 48, &[]);
    assert_eq!(got, want);
    let counted: u64 = s.policy().steps().iter().sum();
    assert_eq!(counted as usize, s.stats.steps);
    assert!(s.policy().current().is_some());
}

/// A lane that joins while plain decoding runs skips the draft prefill (it would be wasted
/// if plain decoding goes on); the first speculative step re-primes its whole draft cache,
/// and its tokens, and those of the lane already running, stay the target's greedy tokens.
#[test]
fn a_lane_joining_during_plain_decoding_is_primed_only_when_speculation_resumes() {
    lazy_join(prompts(2), 0);
}

/// The same with lane 1's 56-token prompt prefilled in chunks of 16: the draft prefill is
/// skipped for every chunk, and re-priming makes the draft whole again.
#[test]
fn a_lane_joining_in_chunks_during_plain_decoding_is_primed_when_speculation_resumes() {
    let mut ps = prompts(2);
    ps[1] = ps[1].repeat(8);
    lazy_join(ps, 16);
}

fn lazy_join(ps: Vec<Vec<u32>>, chunk: usize) {
    use specc_runtime::admission::LaneSampling;
    let (target, b) = embedded();
    let w = b.load_weights_f32(&target).unwrap();
    let n = 30;
    let want = greedy(&target, &ps, n);
    let mut s = session(&b, &w, 2);
    s.set_prefill_chunk(chunk).unwrap();
    // Adaptive, as a server runs it; every step's variant is forced below.
    s.policy_mut().set_mode(SpecPolicy::Adaptive);
    let mut tokens = [Vec::new(), Vec::new()];
    tokens[0].push(s.admit_lane(0, &ps[0], n, LaneSampling::greedy(0)).unwrap());
    // Plain steps with lane 0 alone, then lane 1 joins, then speculation resumes.
    let mut schedule = vec![0usize; 4];
    schedule.extend([3, 1, 3, 2, 0, 3].repeat(20));
    let mut joined = false;
    for (i, &v) in schedule.iter().enumerate() {
        if i == 4 {
            tokens[1].push(s.admit_lane(1, &ps[1], n, LaneSampling::greedy(1)).unwrap());
            joined = true;
        }
        if !s.live().iter().any(|&l| l) {
            break;
        }
        s.policy_mut().force(&[v]);
        s.step().unwrap();
        for (lane, new) in s.drain().unwrap().into_iter().enumerate() {
            tokens[lane].extend(new);
        }
    }
    assert!(joined);
    assert_eq!(
        s.unprimed_admissions(),
        1,
        "lane 1 joined during plain steps"
    );
    for (lane, t) in tokens.iter_mut().enumerate() {
        t.truncate(n);
        assert_eq!(*t, want[lane], "lane {lane}");
    }
    assert!(
        s.policy().steps()[2] > 0,
        "speculation resumed after the join"
    );
}

/// Methods whose draft reads the target's hidden states (EAGLE-3 chain and tree, DFlash,
/// DDTree) keep the draft whole across plain steps (`models/src/methods/variants.rs`): each
/// has plain decoding, one token (a depth-1 tree) and about half its k besides its own.
fn tap_method(spec: &str) -> (Model, SpecBundle) {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec)).unwrap();
    let bundle = SpecBundle::open(&target, &cfg).unwrap();
    (target, bundle)
}

/// Forced through every variant, in a sequence with plain stretches and switches between
/// every pair, each method emits the target's greedy tokens at batch 1 and batch 4.
fn forced_variants_are_exact(spec: &str, ks: &[usize]) {
    let (target, b) = tap_method(spec);
    let got_ks: Vec<usize> = b.contract.step_variants().iter().map(|v| v.k).collect();
    assert_eq!(got_ks, ks, "{spec}");
    let w = b.load_weights_f32(&target).unwrap();
    let schedule = [
        3, 0, 1, 3, 2, 0, 0, 0, 3, 1, 2, 1, 1, 0, 3, 3, 1, 0, 2, 2, 3,
    ];
    for lanes in [1, 4] {
        let ps = prompts(lanes);
        let n = 40;
        let want = greedy(&target, &ps, n);
        let mut s = session(&b, &w, lanes);
        let got = generate(&mut s, &ps, n, &schedule);
        assert_eq!(got, want, "{spec}, {lanes} lanes");
        assert!(
            s.policy().steps().iter().all(|&c| c > 0),
            "{spec}: every variant ran: {:?}",
            s.policy().steps()
        );
    }
}

#[test]
fn eagle3_chain_variants_are_exact_through_forced_switches() {
    forced_variants_are_exact("spec.eagle3.toml", &[0, 1, 3, 5]);
}

#[test]
fn eagle3_tree_variants_are_exact_through_forced_switches() {
    forced_variants_are_exact("spec.eagle3-tree.toml", &[0, 1, 3, 5]);
}

#[test]
fn dflash_variants_are_exact_through_forced_switches() {
    forced_variants_are_exact("spec.dflash.toml", &[0, 1, 4, 7]);
}

#[test]
fn ddtree_variants_are_exact_through_forced_switches() {
    forced_variants_are_exact("ddtree.toml", &[0, 1, 4, 7]);
}

/// A plain step of a tap-reading draft queues its row, and the catch-up before the next
/// speculative step writes the queue into the draft's caches: after switches in and out of
/// plain stretches the draft's cache of committed positions (slots `0..base`, the rest still
/// queued) equals what a fresh draft prefill over the committed tokens writes, as if
/// speculation had never stopped, and what is queued is the last speculative step's rows and
/// the plain steps' since.
fn after_plain_steps_the_draft_caches_equal_a_fresh_prefill(
    spec: &str,
    base_state: &str,
    states: &[&str],
) {
    let (target, b) = tap_method(spec);
    let w = b.load_weights_f32(&target).unwrap();
    let ps = prompts(2);
    let mut s = session(&b, &w, 2);
    let first = s.admit(&ps, 60).unwrap();
    let mut tokens: Vec<Vec<u32>> = ps
        .iter()
        .zip(&first)
        .map(|(p, &f)| p.iter().copied().chain([f]).collect())
        .collect();
    s.policy_mut().force(&[3, 3, 0, 0, 0, 2, 0, 0, 1, 3, 0, 0]);
    for _ in 0..12 {
        s.step().unwrap();
        for (lane, new) in s.drain().unwrap().into_iter().enumerate() {
            tokens[lane].extend(new);
        }
    }
    let mut fresh = session(&b, &w, 1);
    for (lane, toks) in tokens.iter().enumerate() {
        let len = toks.len() - 1;
        let base = s.states()[base_state].as_i64().unwrap()[lane] as usize;
        assert!(
            base + b.num_steps() + 1 >= len && base > ps[lane].len(),
            "{spec} lane {lane}: base {base}, len {len}"
        );
        fresh.admit(&[toks[..len].to_vec()], 1).unwrap();
        for &name in states {
            let got = s.states()[name].as_f32().unwrap();
            let want = fresh.states()[name].as_f32().unwrap();
            let row = want.len() / CTX as usize;
            let got = &got[lane * row * CTX as usize..][..base * row];
            let want = &want[..base * row];
            for (i, (g, e)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-2 * e.abs().max(1.0),
                    "{spec} lane {lane} {name}[{i}] (slot {}): got {g}, want {e}",
                    i / row
                );
            }
        }
    }
}

#[test]
fn after_plain_steps_the_eagle3_head_cache_equals_a_fresh_prefill() {
    after_plain_steps_the_draft_caches_equal_a_fresh_prefill(
        "spec.eagle3.toml",
        "eagle.base",
        &["eagle/kv.0.k", "eagle/kv.0.v"],
    );
}

#[test]
fn after_plain_steps_the_dflash_context_cache_equals_a_fresh_prefill() {
    after_plain_steps_the_draft_caches_equal_a_fresh_prefill(
        "spec.dflash.toml",
        "dflash.base",
        &["dflash/kv.0.k", "dflash/kv.0.v"],
    );
}

/// The adaptive policy itself (not forced) keeps every lane of every tap-reading method
/// exact at batch 4.
#[test]
fn the_adaptive_policy_is_exact_for_every_method() {
    for spec in [
        "spec.eagle3.toml",
        "spec.eagle3-tree.toml",
        "spec.dflash.toml",
        "ddtree.toml",
    ] {
        let (target, b) = tap_method(spec);
        let w = b.load_weights_f32(&target).unwrap();
        let ps = prompts(4);
        let want = greedy(&target, &ps, 32);
        let mut s = session(&b, &w, 4);
        s.policy_mut().set_mode(SpecPolicy::Adaptive);
        let got = generate(&mut s, &ps, 32, &[]);
        assert_eq!(got, want, "{spec}");
        eprintln!(
            "{spec}: adaptive steps per variant {:?}",
            s.policy().steps()
        );
    }
}

/// KV slots per lane of the long-stretch checks below (room for a hundred tokens past the
/// widest verify margin).
const LONG_CTX: u64 = 256;

/// A session of `lanes` lanes over `LONG_CTX` slots.
fn long_session<'a>(
    b: &'a SpecBundle,
    w: &'a HashMap<String, Tensor>,
    lanes: usize,
) -> SpecCpuSession<'a> {
    SpecCpuSession::new(SpecGraphs::of(b), w, lanes, LONG_CTX)
}

fn long_greedy(target: &Model, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let w = target.load_weights_f32();
    prompts
        .iter()
        .map(|p| target.greedy_generate(&w, p, n, LONG_CTX as usize).unwrap())
        .collect()
}

/// Plain stretches longer than the queue ring ([`CATCH_UP_ROWS`]) between speculative steps
/// of every size: the plain steps queue the draft's rows, the host catches up when the ring
/// is full and before speculation resumes, and every lane emits the target's greedy tokens
/// at batch 1 and 4 (lanes of different prompt lengths: different pending counts and bases
/// at every catch-up).
fn long_plain_stretches_are_exact(spec: &str) {
    let (target, b) = tap_method(spec);
    let ring = b
        .contract
        .catch_up
        .expect("a tap-reading draft catches up")
        .rows;
    assert_eq!(ring, CATCH_UP_ROWS as usize);
    let w = b.load_weights_f32(&target).unwrap();
    let mut schedule = vec![3, 3];
    schedule.extend(vec![0; ring + 9]);
    schedule.extend([1, 2]);
    schedule.extend(vec![0; 2 * ring + 5]);
    schedule.push(3);
    for lanes in [1, 4] {
        let ps = prompts(lanes);
        let n = 100;
        let want = long_greedy(&target, &ps, n);
        let mut s = long_session(&b, &w, lanes);
        let got = generate(&mut s, &ps, n, &schedule);
        assert_eq!(got, want, "{spec}, {lanes} lanes");
        // An overflow catch-up in each stretch, and one as the first ends (the lanes finish
        // inside the second).
        assert!(
            s.catch_ups() >= 3,
            "{spec}, {lanes} lanes: {} catch-ups",
            s.catch_ups()
        );
    }
}

#[test]
fn eagle3_chain_is_exact_through_plain_stretches_longer_than_the_ring() {
    long_plain_stretches_are_exact("spec.eagle3.toml");
}

#[test]
fn eagle3_tree_is_exact_through_plain_stretches_longer_than_the_ring() {
    long_plain_stretches_are_exact("spec.eagle3-tree.toml");
}

#[test]
fn dflash_is_exact_through_plain_stretches_longer_than_the_ring() {
    long_plain_stretches_are_exact("spec.dflash.toml");
}

#[test]
fn ddtree_is_exact_through_plain_stretches_longer_than_the_ring() {
    long_plain_stretches_are_exact("ddtree.toml");
}

/// Lanes in different states at every catch-up: lane 0 runs plain steps alone, lane 1
/// joins in the middle of the stretch (its queue starts empty while lane 0's is deep), the
/// stretch outlasts the ring, and speculation resumes; both lanes stay exact for every
/// tap-reading method.
#[test]
fn a_lane_joining_in_a_long_plain_stretch_stays_exact() {
    use specc_runtime::admission::LaneSampling;
    for spec in [
        "spec.eagle3.toml",
        "spec.eagle3-tree.toml",
        "spec.dflash.toml",
        "ddtree.toml",
    ] {
        let (target, b) = tap_method(spec);
        let w = b.load_weights_f32(&target).unwrap();
        let ps = prompts(2);
        let n = 90;
        let want = long_greedy(&target, &ps, n);
        let mut s = long_session(&b, &w, 2);
        s.policy_mut().set_mode(SpecPolicy::Adaptive);
        let mut tokens = [Vec::new(), Vec::new()];
        tokens[0].push(s.admit_lane(0, &ps[0], n, LaneSampling::greedy(0)).unwrap());
        let ring = CATCH_UP_ROWS as usize;
        let mut schedule = vec![3, 0, 0];
        schedule.extend(vec![0; ring + 4]);
        schedule.extend([3, 1, 0, 0, 2, 3].repeat(30));
        for (i, &v) in schedule.iter().enumerate() {
            if i == 12 {
                tokens[1].push(s.admit_lane(1, &ps[1], n, LaneSampling::greedy(1)).unwrap());
            }
            if i > 12 && !s.live().iter().any(|&l| l) {
                break;
            }
            s.policy_mut().force(&[v]);
            s.step().unwrap();
            for (lane, new) in s.drain().unwrap().into_iter().enumerate() {
                tokens[lane].extend(new);
            }
        }
        for (lane, t) in tokens.iter_mut().enumerate() {
            t.truncate(n);
            assert_eq!(*t, want[lane], "{spec} lane {lane}");
        }
        assert!(s.catch_ups() >= 2, "{spec}: {} catch-ups", s.catch_ups());
    }
}

/// After a plain stretch longer than the ring and the catch-up, the draft is where it
/// would be had it seen every token through speculation: its caches, pending rows, `count`
/// and `base` equal those a fresh admission of the committed tokens leaves (the prompt's
/// rows through the draft's prefill), and its next speculative step accepts what the fresh
/// session's does. The embedded default's drafts are trained, so acceptance is real.
fn the_catch_up_leaves_the_draft_a_fresh_admission_would(
    spec: &str,
    prefix: &str,
    caches: &[&str],
    pending: &[&str],
) {
    let (target, b) = tap_method(spec);
    let w = b.load_weights_f32(&target).unwrap();
    let ps = prompts(2);
    let mut s = long_session(&b, &w, 2);
    let first = s.admit(&ps, 150).unwrap();
    let mut tokens: Vec<Vec<u32>> = ps
        .iter()
        .zip(&first)
        .map(|(p, &f)| p.iter().copied().chain([f]).collect())
        .collect();
    let mut schedule = vec![3, 3];
    schedule.extend(vec![0; CATCH_UP_ROWS as usize + 7]);
    s.policy_mut().force(&schedule);
    for _ in 0..schedule.len() {
        s.step().unwrap();
        for (lane, new) in s.drain().unwrap().into_iter().enumerate() {
            tokens[lane].extend(new);
        }
    }
    assert_eq!(s.catch_ups(), 1, "{spec}: the ring overflowed once");
    s.catch_up().unwrap();
    assert_eq!(s.catch_ups(), 2);
    let state = |s: &SpecCpuSession, name: &str| s.states()[name].clone();
    let mut fresh_sessions = Vec::new();
    for (lane, toks) in tokens.iter().enumerate() {
        let len = toks.len() - 1;
        let mut fresh = long_session(&b, &w, 1);
        fresh.admit(&[toks[..len].to_vec()], 150).unwrap();
        for name in ["count", "base"] {
            let name = format!("{prefix}.{name}");
            let got = state(&s, &name).as_i64().unwrap()[lane];
            let want = state(&fresh, &name).as_i64().unwrap()[0];
            assert_eq!(got, want, "{spec} lane {lane} {name}");
        }
        let base = state(&s, &format!("{prefix}.base")).as_i64().unwrap()[lane] as usize;
        let close = |name: &str, got: &[f32], want: &[f32]| {
            for (i, (g, e)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-2 * e.abs().max(1.0),
                    "{spec} lane {lane} {name}[{i}]: got {g}, want {e}"
                );
            }
        };
        for &name in caches {
            let got = state(&s, name);
            let want = state(&fresh, name);
            let row = want.as_f32().unwrap().len() / LONG_CTX as usize;
            let got = &got.as_f32().unwrap()[lane * row * LONG_CTX as usize..][..base * row];
            close(name, got, &want.as_f32().unwrap()[..base * row]);
        }
        for &name in pending {
            // Pending row 0 (EAGLE-3's last pair: its taps and token).
            let got = state(&s, name);
            let want = state(&fresh, name);
            let per = want.shape[1..].iter().product::<usize>();
            let row = per / want.shape[1];
            match (got.as_f32(), want.as_f32()) {
                (Ok(g), Ok(e)) => close(name, &g[lane * per..][..row], &e[..row]),
                _ => assert_eq!(
                    got.as_i64().unwrap()[lane * per..][..row],
                    want.as_i64().unwrap()[..row],
                    "{spec} lane {lane} {name}"
                ),
            }
        }
        fresh_sessions.push(fresh);
    }
    // The next speculative steps propose and accept what the fresh sessions' do.
    let mut accepted = Vec::new();
    for step in 0..8 {
        s.policy_mut().force(&[3]);
        s.step().unwrap();
        let want: Vec<i64> = fresh_sessions
            .iter_mut()
            .map(|f| {
                f.policy_mut().force(&[3]);
                f.step().unwrap();
                f.last_accepted()[0]
            })
            .collect();
        assert_eq!(
            s.last_accepted(),
            want,
            "{spec}: step {step} after the catch-up"
        );
        accepted.push(want);
    }
    let total: i64 = accepted.iter().flatten().sum();
    assert!(total > 0, "{spec}: the trained draft accepts some tokens");
    eprintln!("{spec}: the 8 steps after the catch-up accepted {accepted:?} draft tokens per lane");
}

#[test]
fn after_a_catch_up_the_eagle3_head_is_a_fresh_admissions() {
    the_catch_up_leaves_the_draft_a_fresh_admission_would(
        "spec.eagle3.toml",
        "eagle",
        &["eagle/kv.0.k", "eagle/kv.0.v"],
        &["eagle.hidden", "eagle.tokens"],
    );
}

#[test]
fn after_a_catch_up_the_dflash_drafter_is_a_fresh_admissions() {
    the_catch_up_leaves_the_draft_a_fresh_admission_would(
        "spec.dflash.toml",
        "dflash",
        &["dflash/kv.0.k", "dflash/kv.0.v", "dflash/kv.1.k"],
        &[],
    );
}
