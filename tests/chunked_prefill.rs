//! Chunked prefill on the interpreter: prompts longer than the prefill chunk are prefilled
//! chunk by chunk (each chunk attending to the cache rows of the ones before it), alone
//! (`admit_lane`) and interleaved with the other lanes' steps (`begin_admission` /
//! `prefill_chunk`, as `specc serve` runs them). Under greedy acceptance every request must
//! emit exactly the target's greedy tokens (what a whole prefill gives), for every way a
//! method primes its draft: a standalone draft chunk by chunk, EAGLE-3 pairs across chunk
//! boundaries, DFlash context per chunk, trees.

mod common;
mod lanes_common;
mod spec_common;

use specc_models::{Model, SpecBundle, SpecConfig};
use specc_runtime::{SpecCpuSession, SpecGraphs, Speculator};

use lanes_common::{alone, long_staggered, serve_interleaved, Arrival};
use spec_common::{default_model, python_prompts};

const CTX: u64 = 256;
/// The smallest prompt bucket: the long prompts below take 3 to 4 chunks.
const CHUNK: usize = 16;

fn arrivals() -> Vec<Arrival> {
    long_staggered(&python_prompts(4))
}

fn check(spec_file: &str) {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec_file)).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    let arrivals = arrivals();
    assert!(
        arrivals[1].prompt.len() > 2 * CHUNK,
        "a prompt of 3+ chunks"
    );
    // Greedy tokens are the target's whatever the draft proposes: the drafts themselves
    // (each step's acceptance) show that the chunks primed the draft as a whole prefill.
    let mut whole = SpecCpuSession::new(SpecGraphs::of(&b), &weights, 3, CTX);
    alone(&mut whole, &arrivals);
    let mut s = SpecCpuSession::new(SpecGraphs::of(&b), &weights, 3, CTX);
    s.set_prefill_chunk(CHUNK).unwrap();
    let lone = alone(&mut s, &arrivals);
    assert_eq!(
        (s.stats.steps, &s.stats.histogram),
        (whole.stats.steps, &whole.stats.histogram),
        "{spec_file}: steps and acceptance histogram, chunks of {CHUNK} vs whole prefills"
    );
    let got = serve_interleaved(&mut s, &arrivals);
    let w = target.load_weights_f32();
    for (i, a) in arrivals.iter().enumerate() {
        let want = target
            .greedy_generate(&w, &a.prompt, a.max_new, CTX as usize)
            .unwrap();
        assert_eq!(
            got.tokens[i],
            want,
            "{spec_file}: request {i} ({} prompt tokens, chunks of {CHUNK}, interleaved) differs \
             from the target's greedy tokens",
            a.prompt.len()
        );
        assert_eq!(
            lone[i], want,
            "{spec_file}: request {i} alone in chunks of {CHUNK} differs from the target's"
        );
    }
    // The long prompt's chunks ran between steps of the lane already decoding.
    let chunks = arrivals[1].prompt.len().div_ceil(CHUNK);
    assert_eq!(
        got.steps_during_prefill[1],
        chunks - 1,
        "{spec_file}: one step of the live lane between each two chunks of request 1"
    );
}

#[test]
fn draft_model_prefills_in_chunks() {
    check("spec.toml");
}

#[test]
fn eagle3_prefills_in_chunks() {
    check("spec.eagle3.toml");
}

#[test]
fn eagle3_tree_prefills_in_chunks() {
    check("spec.eagle3-tree.toml");
}

#[test]
fn dflash_prefills_in_chunks() {
    check("spec.dflash.toml");
}

#[test]
fn ddtree_prefills_in_chunks() {
    check("ddtree.toml");
}

/// Admits `prompts` together (`admit`: one window of every lane) and decodes until every
/// lane ends; each lane's first `n` tokens.
fn admit_and_decode(s: &mut SpecCpuSession, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let mut got: Vec<Vec<u32>> = s
        .admit(prompts, n)
        .unwrap()
        .iter()
        .map(|&f| vec![f])
        .collect();
    while s.live().iter().any(|&l| l) {
        s.step().unwrap();
        for (g, t) in got.iter_mut().zip(s.drain().unwrap()) {
            g.extend(t);
        }
    }
    for g in &mut got {
        g.truncate(n);
    }
    got
}

/// Every lane admitted at once (`admit`, as `specc run` does) in chunks: the prompts of
/// different lengths end in different chunks.
#[test]
fn a_whole_batch_prefills_in_chunks() {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join("spec.eagle3.toml")).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    let prompts: Vec<Vec<u32>> = arrivals()[..3].iter().map(|a| a.prompt.clone()).collect();
    let mut s = SpecCpuSession::new(SpecGraphs::of(&b), &weights, 3, CTX);
    s.set_prefill_chunk(CHUNK).unwrap();
    const N: usize = 12;
    let got = admit_and_decode(&mut s, &prompts, N);
    let w = target.load_weights_f32();
    for (p, g) in prompts.iter().zip(&got) {
        let want = target.greedy_generate(&w, p, N, CTX as usize).unwrap();
        assert_eq!(*g, want, "a {}-token prompt in a batch admission", p.len());
    }
}

/// The prefill chunk is a budget of rows per prefill across the lanes admitted together: a
/// 4-lane window under a budget of 64 rows prefills 16 rows a lane per chunk (not 64), so
/// no prefill takes more than 64 rows, and every lane's tokens are the whole prefill's.
fn check_budget(spec_file: &str) {
    const LANES: usize = 4;
    const BUDGET: usize = LANES * CHUNK;
    const N: usize = 12;
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec_file)).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    let prompts: Vec<Vec<u32>> = arrivals()[..LANES]
        .iter()
        .map(|a| a.prompt.clone())
        .collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap();
    assert!(
        longest > 2 * CHUNK,
        "a prompt of 3+ chunks of {CHUNK} a lane"
    );
    let mut whole = SpecCpuSession::new(SpecGraphs::of(&b), &weights, LANES, CTX);
    let want = admit_and_decode(&mut whole, &prompts, N);
    assert_eq!(
        whole.stats.widest_prefill,
        LANES * longest,
        "{spec_file}: the whole admission's prefill takes every lane's longest prompt"
    );
    let mut s = SpecCpuSession::new(SpecGraphs::of(&b), &weights, LANES, CTX);
    s.set_prefill_chunk(BUDGET).unwrap();
    let got = admit_and_decode(&mut s, &prompts, N);
    assert_eq!(
        s.stats.widest_prefill, BUDGET,
        "{spec_file}: the widest prefill of {LANES} lanes under a budget of {BUDGET} rows \
         (prompts of up to {longest} tokens)"
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g,
            w,
            "{spec_file}: lane {i} ({} prompt tokens) under a budget of {BUDGET} rows differs \
             from the whole admission's tokens",
            prompts[i].len()
        );
    }
    assert_eq!(
        (s.stats.steps, &s.stats.histogram),
        (whole.stats.steps, &whole.stats.histogram),
        "{spec_file}: steps and acceptance histogram, budgeted chunks vs whole prefills"
    );
}

#[test]
fn a_window_of_four_lanes_prefills_within_the_budget() {
    check_budget("spec.eagle3.toml");
}

#[test]
fn a_window_of_four_draft_model_lanes_prefills_within_the_budget() {
    check_budget("spec.toml");
}

/// Sampled acceptance: a request's draws interleaved in chunks equal its draws alone with
/// one whole prefill (its first token is drawn after its last chunk, from its own stream).
#[test]
fn sampled_ddtree_draws_the_same_in_chunks() {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let text = "method = \"ddtree\"\ndraft = \"dflash\"\nbudget = 16\ntopk = 4\n\
                [acceptance]\nmode = \"sample\"\ntemperature = 0.9\nseed = 11\n";
    let cfg = SpecConfig::from_toml(&dir.join("sampled.toml"), text).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    let arrivals = arrivals();
    let mut s = SpecCpuSession::new(SpecGraphs::of(&b), &weights, 3, CTX);
    let whole = alone(&mut s, &arrivals);
    s.set_prefill_chunk(CHUNK).unwrap();
    let got = serve_interleaved(&mut s, &arrivals);
    assert_eq!(
        got.tokens, whole,
        "sampled requests differ chunked and whole"
    );
}

/// A chunk must be a prompt bucket: a power of two from the smallest.
#[test]
fn a_chunk_that_is_not_a_prompt_bucket_is_refused() {
    let dir = default_model();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join("spec.toml")).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    let mut s = SpecCpuSession::new(SpecGraphs::of(&b), &weights, 1, CTX);
    for bad in [3, 8, 48, 512] {
        let e = Speculator::set_prefill_chunk(&mut s, bad).unwrap_err();
        assert!(e.to_string().contains("power of two"), "{bad}: {e}");
    }
    s.set_prefill_chunk(32).unwrap();
}
