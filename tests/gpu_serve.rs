//! Continuous batching on the device (`CudaSpecSession::admit_lane`): requests join a
//! running batch one lane at a time, finish and leave; every request's tokens must equal
//! its tokens served alone in the same engine (batch invariance: every step replays the
//! one captured graph of the session's bucket), for every way a method primes a lane.
//! Run with `--features cuda`; without a driver every test prints why it skipped and passes.

#![cfg(feature = "cuda")]

mod common;
mod gpu_common;
mod lanes_common;

use gpu_common::{build_engine, corpus_prompts, default_model, drive, gpu, session};
use lanes_common::{alone, long_staggered, serve, serve_behind, serve_interleaved, staggered};
use specc_ir::engine::Engine;
use specc_models::spec_bundle::prefill_buckets;
use specc_models::{Model, SpecBundle, SpecConfig};
use specc_runtime::admission::LaneSampling;
use specc_runtime::cuda::CudaSpecSession;
use specc_runtime::{EngineGraphs, SpecCpuSession, SpecGraphs, SpecPolicy};

fn check(spec_file: &str) {
    let dir = default_model();
    check_cfg(
        spec_file,
        SpecConfig::from_file(&dir.join(spec_file)).unwrap(),
        &[4],
    );
}

/// `cfg` served as [`check`] does on 4 lanes of an engine of batch `buckets`; `spec_file`
/// labels failures. With buckets below 4, every admission prefills one lane's window at
/// bucket 1 (`CudaSpecSession::lone_window`), its state slots moved to the lane.
fn check_cfg(spec_file: &str, cfg: SpecConfig, buckets: &[u32]) {
    if !gpu() {
        return;
    }
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let (engine, bundle) = build_engine(&target, Some(&cfg), buckets, 256);
    let bundle = bundle.expect("a spec opens its draft");
    let mut s = session(&engine, &target, Some(&bundle), 4);
    let arrivals = staggered(&corpus_prompts());
    let want = alone(&mut s, &arrivals);
    let got = serve(&mut s, &arrivals);
    let behind = serve_behind(&mut s, &arrivals);
    assert_eq!(
        behind, want,
        "{spec_file}: reading each step's tokens behind the next step changed them"
    );
    // Serving the same requests again admits the same prompts at the same lanes: every
    // prefill replays a graph captured above (one per role, lane window and prompt bucket).
    let captured = s.captured_prefills();
    let again = serve(&mut s, &arrivals);
    assert_eq!(
        s.captured_prefills(),
        captured,
        "{spec_file}: a second admission at a captured window and prompt bucket captured again"
    );
    assert_eq!(
        again, got,
        "{spec_file}: the second serving differs from the first"
    );
    let replays: u64 = prefill_buckets(256)
        .into_iter()
        .map(|t| s.target_prefill_replays(t as usize))
        .sum();
    assert_eq!(
        replays,
        4 * arrivals.len() as u64,
        "{spec_file}: one target prefill replay per admission (alone, served, served reading behind, again)"
    );
    let target_role = engine.contract(true).target_prefill;
    let widest = s
        .prefill_places()
        .iter()
        .filter(|(r, _)| *r == target_role)
        .map(|(_, at)| at.b)
        .max();
    let smallest = *buckets.iter().min().unwrap() as usize;
    assert_eq!(
        widest,
        Some(smallest),
        "{spec_file}: admissions prefill at the smallest bucket: {:?}",
        s.prefill_places()
    );
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
        "{spec_file}: 6 requests on 4 lanes, joining and leaving, equal to their lone tokens; \
         {captured} prefill graphs captured, {replays} target prefill replays"
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
    check_cfg("sampled draft_model", cfg, &[4]);
}

/// Every way a method primes a lane, with admissions at bucket 1 in the lane's own window
/// (sampled acceptance too: its per-lane knobs and streams are shadowed, 12 and 4 bytes a
/// lane): batched equals alone, and each admission replays one bucket-1 target prefill.
#[test]
fn lanes_join_through_one_lane_windows() {
    let dir = default_model();
    for spec_file in [
        "spec.toml",
        "spec.eagle3.toml",
        "spec.eagle3-tree.toml",
        "spec.dflash.toml",
        "ddtree.toml",
    ] {
        let cfg = SpecConfig::from_file(&dir.join(spec_file)).unwrap();
        check_cfg(spec_file, cfg, &[1, 2, 4]);
    }
    let text = "method = \"draft_model\"\ndraft = \"draft\"\nnum_steps = 5\n[acceptance]\nmode = \"sample\"\ntemperature = 0.9\nseed = 11\n";
    let cfg = SpecConfig::from_toml(&dir.join("sampled.toml"), text).unwrap();
    check_cfg("sampled draft_model", cfg, &[1, 2, 4]);
}

/// Request `i`'s knobs in the mixed tests: even requests greedy, odd ones sampled with a
/// temperature, top-k or top-p of their own (the stream is set per request).
fn mixed_knobs(i: usize) -> LaneSampling {
    let sampled = |temperature, top_k, top_p| LaneSampling {
        stream: 0,
        temperature,
        top_k,
        top_p,
    };
    match i % 6 {
        0 | 2 | 4 => LaneSampling::greedy(0),
        1 => sampled(0.9, 0, 1.0),
        3 => sampled(1.3, 5, 1.0),
        _ => sampled(0.7, 0, 0.8),
    }
}

/// A draft_model engine that samples (temperature 0.9, seed 11, by default) at `buckets`.
fn sampled_engine(target: &Model, buckets: &[u32]) -> (Engine, Option<SpecBundle>) {
    let dir = default_model();
    let text = "method = \"draft_model\"\ndraft = \"draft\"\nnum_steps = 5\n[acceptance]\nmode = \"sample\"\ntemperature = 0.9\nseed = 11\n";
    let cfg = SpecConfig::from_toml(&dir.join("sampled.toml"), text).unwrap();
    build_engine(target, Some(&cfg), buckets, 256)
}

/// The greedy engine of [`sampled_engine`]'s method (the embedded `spec.toml`) at batch 4.
fn greedy_engine(target: &Model) -> (Engine, SpecBundle) {
    let cfg = SpecConfig::from_file(&default_model().join("spec.toml")).unwrap();
    let (engine, bundle) = build_engine(target, Some(&cfg), &[4], 256);
    (engine, bundle.expect("a spec opens its draft"))
}

/// Per-lane sampling parameters on the device: greedy and sampled lanes in one captured
/// step graph. A greedy lane's tokens are the greedy engine's (served alone), a seeded
/// sampled lane's are its tokens alone, and every lane's tokens are the interpreter's for
/// the same knobs and stream (up to bf16 numerics, noted).
#[test]
fn greedy_and_sampled_lanes_share_the_device_step() {
    if !gpu() {
        return;
    }
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let (engine, bundle) = sampled_engine(&target, &[4]);
    let bundle = bundle.expect("a spec opens its draft");
    let mut s = session(&engine, &target, Some(&bundle), 4);
    let mut arrivals = staggered(&corpus_prompts());
    for (i, a) in arrivals.iter_mut().enumerate() {
        a.knobs = Some(mixed_knobs(i));
    }
    let want = alone(&mut s, &arrivals);
    let got = serve(&mut s, &arrivals);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "request {i} differs batched and alone");
    }
    // Greedy lanes against a greedy engine of the same method, each request alone.
    let (greedy_engine, greedy_bundle) = greedy_engine(&target);
    let mut g = session(&greedy_engine, &target, Some(&greedy_bundle), 4);
    let greedy_arrivals: Vec<_> = arrivals
        .iter()
        .map(|a| lanes_common::Arrival {
            prompt: a.prompt.clone(),
            max_new: a.max_new,
            at_step: a.at_step,
            knobs: None,
        })
        .collect();
    let greedy = alone(&mut g, &greedy_arrivals);
    for i in (0..arrivals.len()).filter(|i| i % 2 == 0) {
        assert_eq!(
            got[i], greedy[i],
            "greedy request {i} next to sampled lanes differs from the greedy engine's tokens"
        );
    }
    for i in (0..arrivals.len()).filter(|i| i % 2 == 1) {
        assert_ne!(
            got[i], greedy[i],
            "sampled request {i} drew the greedy tokens"
        );
    }
    // The interpreter over the same engine's graphs, same knobs and streams.
    let graphs = EngineGraphs::parse(&engine).unwrap();
    let contract = engine.contract(true).clone();
    let sg = SpecGraphs::from_engine(&contract, &graphs).unwrap();
    let w = bundle.load_weights_f32(&target).unwrap();
    let mut cpu = SpecCpuSession::new(sg, &w, 4, 256);
    let on_cpu = serve(&mut cpu, &arrivals);
    let same = (0..arrivals.len()).filter(|&i| on_cpu[i] == got[i]).count();
    eprintln!(
        "mixed lanes: 6 requests (3 greedy, 3 sampled) batched = alone; greedy = the greedy engine's; {same} of 6 equal the interpreter's tokens"
    );
}

/// Greedy twins on the device: a sampling engine's steps over greedy lanes only replay the
/// twins (every step) through joins and leaves, and the tokens equal the greedy engine's.
#[test]
fn greedy_lanes_of_a_sampling_engine_replay_the_twins() {
    if !gpu() {
        return;
    }
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let (engine, bundle) = sampled_engine(&target, &[4]);
    let bundle = bundle.expect("a spec opens its draft");
    assert!(
        !engine.contract(true).greedy.is_empty(),
        "a sampling engine carries greedy twins"
    );
    let mut s = session(&engine, &target, Some(&bundle), 4);
    let mut arrivals = staggered(&corpus_prompts());
    for (i, a) in arrivals.iter_mut().enumerate() {
        a.knobs = Some(LaneSampling::greedy(i as u32));
    }
    let got = serve(&mut s, &arrivals);
    assert!(s.stats.steps > 0);
    assert_eq!(s.stats.greedy_steps, s.stats.steps, "every step a twin");
    let (greedy_engine, greedy_bundle) = greedy_engine(&target);
    let mut g = session(&greedy_engine, &target, Some(&greedy_bundle), 4);
    for a in &mut arrivals {
        a.knobs = None;
    }
    let want = serve(&mut g, &arrivals);
    assert_eq!(got, want, "twins emit the greedy engine's tokens");
    eprintln!(
        "greedy twins: {} requests, {} of {} steps twins, tokens = the greedy engine's",
        arrivals.len(),
        s.stats.greedy_steps,
        s.stats.steps
    );
}

/// `step_upto` with bucket shrinking on: steps over 1, 2 and 3 lanes replay the captured
/// buckets 1, 2 and 4, every lane's states past the bucket untouched (requests still finish
/// with their full budgets). Tokens may differ from the full-bucket replay at near-ties
/// (other tilings), so how many requests agree is printed, not asserted.
#[test]
fn steps_replay_the_smallest_bucket_holding_the_lanes() {
    if !gpu() {
        return;
    }
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let (engine, bundle) = sampled_engine(&target, &[1, 2, 4]);
    let bundle = bundle.expect("a spec opens its draft");
    assert!(
        session(&engine, &target, Some(&bundle), 4)
            .smaller_buckets()
            .is_empty(),
        "a plain session captures its own bucket only"
    );
    let sources = gpu_common::weight_sources(&target, Some(&bundle));
    let mut s = CudaSpecSession::with_buckets(&engine, true, &sources, 4, true).unwrap();
    assert_eq!(s.smaller_buckets(), vec![1, 2]);
    s.shrink_buckets(false);
    assert_eq!(s.bucket_for(1), 4, "shrinking off: the session's bucket");
    let mut arrivals = staggered(&corpus_prompts());
    for (i, a) in arrivals.iter_mut().enumerate() {
        a.knobs = Some(mixed_knobs(i));
    }
    let full = serve(&mut s, &arrivals);
    assert_eq!((s.replays_at(1), s.replays_at(2)), (0, 0));
    s.shrink_buckets(true);
    assert_eq!(
        (
            s.bucket_for(1),
            s.bucket_for(2),
            s.bucket_for(3),
            s.bucket_for(4)
        ),
        (1, 2, 4, 4)
    );
    let before = s.replays_at(4);
    let shrunk = serve(&mut s, &arrivals);
    // With shrinking on, the two requests arriving at step 0 join in one 2-lane window.
    let target_role = engine.contract(true).target_prefill;
    assert!(
        s.prefill_places()
            .iter()
            .any(|(r, at)| *r == target_role && at.b == 2 && at.lane == 0),
        "lanes 0 and 1 admitted together prefill in one window of 2: {:?}",
        s.prefill_places()
    );
    let (r1, r2, r4) = (s.replays_at(1), s.replays_at(2), s.replays_at(4) - before);
    assert!(
        r1 > 0 && r2 > 0 && r4 > 0,
        "replays at 1 / 2 / 4: {r1} / {r2} / {r4}"
    );
    for (i, a) in arrivals.iter().enumerate() {
        assert_eq!(
            shrunk[i].len(),
            a.max_new,
            "request {i} did not finish its budget"
        );
    }
    let same = (0..arrivals.len())
        .filter(|&i| shrunk[i] == full[i])
        .count();
    eprintln!(
        "shrinking buckets: replays at 1 / 2 / 4 = {r1} / {r2} / {r4}; {same} of 6 requests equal their full-bucket tokens"
    );
}

/// The variant schedule of the forced-variant checks (indices into the contract's step
/// variants, ascending by k: 0 = plain decoding, 3 = the configured step): plain stretches
/// and a switch between every pair of variants.
const SCHEDULE: [usize; 21] = [
    3, 0, 1, 3, 2, 0, 0, 0, 3, 1, 2, 1, 1, 0, 3, 3, 1, 0, 2, 2, 3,
];

/// Runs 4 lanes of `prompts` to `n` tokens, each step's variant forced from `schedule`
/// (cycled). Returns each lane's tokens and the steps run per variant.
fn forced(
    s: &mut CudaSpecSession,
    prompts: &[Vec<u32>],
    n: usize,
    schedule: &[usize],
) -> (Vec<Vec<u32>>, Vec<u64>) {
    let first = s.admit(prompts, n).unwrap();
    let mut out: Vec<Vec<u32>> = first.iter().map(|&f| vec![f]).collect();
    let mut i = 0;
    while s.live().unwrap().iter().any(|&l| l) {
        s.policy_mut().force(&[schedule[i % schedule.len()]]);
        i += 1;
        s.step().unwrap();
        for (l, t) in s.drain().unwrap().into_iter().enumerate() {
            out[l].extend(t);
        }
        assert!(i < 10_000, "lanes never finished");
    }
    for o in &mut out {
        o.truncate(n);
    }
    (out, s.policy().steps().to_vec())
}

/// Adaptive speculation on the device for a method whose draft reads target hidden states:
/// the captured variants (plain decoding, k = 1, about k/2, k) run in [`SCHEDULE`] over one
/// session, and every lane's tokens equal the interpreter's greedy tokens wherever the
/// configured step's own tokens and plain decoding's on the device do (where either differs,
/// a near-tie flipped by the GPU's rounding, the lane is reported, not failed).
fn forced_variants_are_exact(spec_file: &str) {
    if !gpu() {
        return;
    }
    check_forced(spec_file, &SCHEDULE, 40);
}

/// [`forced_variants_are_exact`] through `schedule` to `n` tokens; returns the catch-ups of
/// queued draft rows the forced session replayed.
fn check_forced(spec_file: &str, schedule: &[usize], n: usize) -> u64 {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec_file)).unwrap();
    let (engine, bundle) = build_engine(&target, Some(&cfg), &[4], CTX);
    let bundle = bundle.expect("a spec opens its draft");
    let ks: Vec<usize> = bundle
        .contract
        .step_variants()
        .iter()
        .map(|v| v.k)
        .collect();
    assert_eq!(ks.len(), 4, "{spec_file}: variants {ks:?}");
    let prompts = corpus_prompts()[..4].to_vec();
    let w = target.load_weights_f32();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| target.greedy_generate(&w, p, n, CTX as usize).unwrap())
        .collect();
    let mut s = session(&engine, &target, Some(&bundle), 4);
    let (fixed, _) = forced(&mut s, &prompts, n, &[3]);
    let fixed_accept = s.stats.mean_accept_len();
    // Plain decoding alone on the device: where its tokens differ from the interpreter's, a
    // near-tie flipped by the GPU's rounding, a schedule of mostly plain steps follows them.
    let mut s = session(&engine, &target, Some(&bundle), 4);
    let (plain, _) = forced(&mut s, &prompts, n, &[0]);
    // Adaptive speculation times every variant on synthetic live lanes first: what those
    // replays wrote must not reach the lanes admitted after them.
    let mut s = session(&engine, &target, Some(&bundle), 4);
    s.set_policy(SpecPolicy::Adaptive).unwrap();
    let (got, steps) = forced(&mut s, &prompts, n, schedule);
    assert!(
        steps.iter().all(|&c| c > 0),
        "{spec_file}: every variant ran: {steps:?}"
    );
    let mut checked = 0;
    for lane in 0..4 {
        if fixed[lane] != want[lane] || plain[lane] != want[lane] {
            eprintln!("note: {spec_file}: lane {lane}: the configured step's or plain decoding's CUDA tokens differ from the interpreter's (numerics, first at {:?} / {:?}); not checked", first_difference(&fixed[lane], &want[lane]), first_difference(&plain[lane], &want[lane]));
            continue;
        }
        checked += 1;
        if got[lane] != want[lane] {
            let at = first_difference(&got[lane], &want[lane]);
            eprintln!(
                "FAIL {spec_file}: lane {lane} through variants {ks:?} (steps {steps:?}) differs from the interpreter's greedy tokens at token {at:?} (from plain decoding's on the device at {:?})",
                first_difference(&got[lane], &plain[lane])
            );
            panic!(
                "{spec_file}: lane {lane}: got {:?}, want {:?}",
                got[lane], want[lane]
            );
        }
    }
    assert!(checked > 0, "{spec_file}: no lane to check");
    eprintln!(
        "PASS {spec_file}: variants k = {ks:?}, steps per variant {steps:?}, {} catch-ups: {checked}/4 lanes equal the interpreter's greedy {n} tokens; mean tokens per step: forced {:.2}, configured alone {fixed_accept:.2}",
        s.catch_ups(),
        s.stats.mean_accept_len()
    );
    s.catch_ups()
}

/// The first index where `a` and `b` differ (`None` when one is a prefix of the other).
fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// KV slots per lane of the forced-variant engines (the long stretches below emit 100
/// tokens past DDTree's 63-slot verify margin).
const CTX: u64 = 256;

/// Plain stretches longer than the catch-up ring on the device: the k = 0 step only queues
/// the draft's rows, the captured catch-up replays when the ring is full and before
/// speculation resumes, and the lanes stay exact as in [`forced_variants_are_exact`].
fn long_plain_stretches_are_exact(spec_file: &str) {
    if !gpu() {
        return;
    }
    let ring = specc_models::methods::CATCH_UP_ROWS as usize;
    let mut schedule = vec![3, 3];
    schedule.extend(vec![0; ring + 9]);
    schedule.extend([1, 2]);
    schedule.extend(vec![0; 2 * ring + 5]);
    schedule.push(3);
    let catch_ups = check_forced(spec_file, &schedule, 100);
    assert!(catch_ups >= 3, "{spec_file}: {catch_ups} catch-ups");
}

#[test]
fn eagle3_long_plain_stretches_are_exact() {
    long_plain_stretches_are_exact("spec.eagle3.toml");
}

#[test]
fn eagle3_tree_long_plain_stretches_are_exact() {
    long_plain_stretches_are_exact("spec.eagle3-tree.toml");
}

#[test]
fn dflash_long_plain_stretches_are_exact() {
    long_plain_stretches_are_exact("spec.dflash.toml");
}

#[test]
fn ddtree_long_plain_stretches_are_exact() {
    long_plain_stretches_are_exact("ddtree.toml");
}

#[test]
fn eagle3_forced_variants_are_exact() {
    forced_variants_are_exact("spec.eagle3.toml");
}

#[test]
fn eagle3_tree_forced_variants_are_exact() {
    forced_variants_are_exact("spec.eagle3-tree.toml");
}

#[test]
fn dflash_forced_variants_are_exact() {
    forced_variants_are_exact("spec.dflash.toml");
}

#[test]
fn ddtree_forced_variants_are_exact() {
    forced_variants_are_exact("ddtree.toml");
}

/// Lazy priming on the device (draft_model): a lane that joins while plain decoding runs
/// skips the draft prefill, and the first speculative step re-primes its whole draft cache;
/// both lanes' tokens equal the interpreter's greedy tokens (where the configured step's
/// own do).
#[test]
fn draft_model_lane_joining_during_plain_decoding_is_primed_lazily() {
    if !gpu() {
        return;
    }
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join("spec.toml")).unwrap();
    let (engine, bundle) = build_engine(&target, Some(&cfg), &[2], 256);
    let bundle = bundle.expect("a spec opens its draft");
    let ps = corpus_prompts()[..2].to_vec();
    let n = 30;
    let mut s = session(&engine, &target, Some(&bundle), 2);
    let (want, _) = forced(&mut s, &ps, n, &[3]);
    let mut s = session(&engine, &target, Some(&bundle), 2);
    s.set_policy(SpecPolicy::Adaptive).unwrap();
    let greedy = |lane| LaneSampling::greedy(lane);
    let mut out = [
        vec![s.admit_lane(0, &ps[0], n, greedy(0)).unwrap()],
        Vec::new(),
    ];
    let mut schedule = vec![0usize; 4];
    schedule.extend([3, 1, 3, 2, 0, 3].repeat(20));
    for (i, &v) in schedule.iter().enumerate() {
        if i == 4 {
            out[1].push(s.admit_lane(1, &ps[1], n, greedy(1)).unwrap());
        }
        let live = s.live().unwrap();
        if !live.iter().any(|&l| l) {
            break;
        }
        s.policy_mut().force(&[v]);
        s.step_upto(if out[1].is_empty() { 1 } else { 2 }).unwrap();
        for (l, t) in s.drain().unwrap().into_iter().enumerate() {
            out[l].extend(t);
        }
    }
    assert_eq!(
        s.unprimed_admissions(),
        1,
        "lane 1 joined during plain steps"
    );
    let w = target.load_weights_f32();
    let mut checked = 0;
    for (lane, o) in out.iter_mut().enumerate() {
        o.truncate(n);
        let cpu = target.greedy_generate(&w, &ps[lane], n, 256).unwrap();
        if want[lane] != cpu {
            eprintln!("note: lane {lane}: the configured step's CUDA tokens differ from the interpreter's (numerics); not checked");
            continue;
        }
        checked += 1;
        if *o != cpu {
            eprintln!("FAIL draft_model lazy priming: lane {lane} differs from the interpreter's greedy tokens");
        }
        assert_eq!(*o, cpu, "lane {lane}");
    }
    assert!(checked > 0, "no lane to check");
    eprintln!(
        "PASS draft_model lazy priming: 1 unprimed admission, {checked}/2 lanes equal the interpreter's greedy {n} tokens (steps per variant {:?})",
        s.policy().steps()
    );
}

/// Chunked prefill on the device: prompts of up to 4 chunks of 16 rows, admitted alone and
/// interleaved with the other lanes' steps (one chunk between two steps); `spec_file`'s
/// method on 4 lanes. A request's tokens interleaved must equal its tokens alone (both
/// chunked: batch invariance), and its tokens must be the interpreter's greedy tokens
/// wherever the whole-prompt prefill's are (chunks attend to the cache rows of the ones
/// before them: the same target forward). No prefill runs above the chunk.
fn check_chunked(spec_file: &str) {
    if !gpu() {
        return;
    }
    const CHUNK: usize = 16;
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec_file)).unwrap();
    let (engine, bundle) = build_engine(&target, Some(&cfg), &[4], 256);
    let bundle = bundle.expect("a spec opens its draft");
    let arrivals = long_staggered(&corpus_prompts());
    let mut whole_s = session(&engine, &target, Some(&bundle), 4);
    let whole = alone(&mut whole_s, &arrivals);
    drop(whole_s);
    let mut s = session(&engine, &target, Some(&bundle), 4);
    s.set_prefill_chunk(CHUNK).unwrap();
    let lone = alone(&mut s, &arrivals);
    let got = serve_interleaved(&mut s, &arrivals);
    let widest = s.prefill_places().iter().map(|(_, at)| at.t).max();
    assert_eq!(
        widest,
        Some(CHUNK),
        "FAIL {spec_file}: a prefill ran above the chunk: {:?}",
        s.prefill_places()
    );
    // Request 0 decodes while request 1's chunks run, one step between two chunks (fewer
    // if request 0 ends before them: its acceptance is the device's).
    let chunks = arrivals[1].prompt.len().div_ceil(CHUNK);
    let between = got.steps_during_prefill[1];
    assert!(
        (1..chunks).contains(&between),
        "FAIL {spec_file}: {between} steps between request 1's {chunks} chunks, want 1 to {}",
        chunks - 1
    );
    let w = target.load_weights_f32();
    let (mut checked, mut same_as_whole) = (0, 0);
    for (i, a) in arrivals.iter().enumerate() {
        assert_eq!(
            got.tokens[i], lone[i],
            "FAIL {spec_file}: request {i} ({} prompt tokens) chunked: interleaved differs from alone",
            a.prompt.len()
        );
        same_as_whole += usize::from(lone[i] == whole[i]);
        let cpu = target
            .greedy_generate(&w, &a.prompt, a.max_new, 256)
            .unwrap();
        if whole[i] != cpu {
            eprintln!("note: {spec_file}: request {i}: the whole prefill's CUDA greedy differs from the interpreter's (numerics); not checked");
            continue;
        }
        checked += 1;
        assert_eq!(
            lone[i], cpu,
            "FAIL {spec_file}: request {i} ({} prompt tokens) in chunks of {CHUNK} differs from the interpreter's greedy tokens",
            a.prompt.len()
        );
    }
    assert!(checked > 0, "FAIL {spec_file}: no request to check");
    eprintln!(
        "PASS {spec_file} chunked prefill: 5 requests (prompts up to {} tokens, {chunks} chunks \
         of {CHUNK}) interleaved = alone; {checked}/5 equal the interpreter's greedy tokens, \
         {same_as_whole}/5 equal the whole-prompt prefill's; {} steps between request 1's \
         first and last chunk",
        arrivals[1].prompt.len(),
        got.steps_during_prefill[1]
    );
}

#[test]
fn draft_model_prefills_in_chunks() {
    check_chunked("spec.toml");
}

#[test]
fn eagle3_prefills_in_chunks() {
    check_chunked("spec.eagle3.toml");
}

#[test]
fn eagle3_tree_prefills_in_chunks() {
    check_chunked("spec.eagle3-tree.toml");
}

#[test]
fn dflash_prefills_in_chunks() {
    check_chunked("spec.dflash.toml");
}

#[test]
fn ddtree_prefills_in_chunks() {
    check_chunked("ddtree.toml");
}

/// Every lane admitted at once (`admit`: one window of 4 lanes) in chunks of 16: prompts of
/// different lengths end in different chunks, each lane's EAGLE-3 slot / DFlash context
/// taken from its own last chunk. Tokens equal the interpreter's greedy tokens wherever the
/// whole-prompt admission's do, and the acceptance is the whole admission's.
fn check_batch_chunked(spec_file: &str) {
    if !gpu() {
        return;
    }
    const CHUNK: usize = 16;
    const N: usize = 16;
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec_file)).unwrap();
    let (engine, bundle) = build_engine(&target, Some(&cfg), &[4], 256);
    let bundle = bundle.expect("a spec opens its draft");
    let prompts: Vec<Vec<u32>> = long_staggered(&corpus_prompts())[..4]
        .iter()
        .map(|a| a.prompt.clone())
        .collect();
    let mut whole_s = session(&engine, &target, Some(&bundle), 4);
    let whole = drive(&mut whole_s, &prompts, N);
    let whole_hist = whole_s.stats.histogram.clone();
    drop(whole_s);
    let mut s = session(&engine, &target, Some(&bundle), 4);
    s.set_prefill_chunk(CHUNK).unwrap();
    let got = drive(&mut s, &prompts, N);
    let w = target.load_weights_f32();
    let mut checked = 0;
    for (i, p) in prompts.iter().enumerate() {
        let cpu = target.greedy_generate(&w, p, N, 256).unwrap();
        if whole[i] != cpu {
            eprintln!("note: {spec_file}: lane {i}: the whole admission's CUDA greedy differs from the interpreter's (numerics); not checked");
            continue;
        }
        checked += 1;
        assert_eq!(
            got[i], cpu,
            "FAIL {spec_file}: lane {i} ({} prompt tokens) admitted in chunks of {CHUNK} differs from the interpreter's greedy tokens",
            p.len()
        );
    }
    assert!(checked > 0, "FAIL {spec_file}: no lane to check");
    eprintln!(
        "PASS {spec_file} batch admission in chunks of {CHUNK}: {checked}/4 lanes equal the \
         interpreter's greedy tokens; acceptance histogram chunked {:?}, whole {whole_hist:?}",
        s.stats.histogram
    );
}

#[test]
fn eagle3_batch_prefills_in_chunks() {
    check_batch_chunked("spec.eagle3.toml");
}

#[test]
fn dflash_batch_prefills_in_chunks() {
    check_batch_chunked("spec.dflash.toml");
}
