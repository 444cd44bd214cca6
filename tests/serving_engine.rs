//! A server's engine at a full-size vocabulary: prefills are planned at every batch bucket
//! and prompt chunk, so their logits must not grow with `B·T·V`. The target prefill runs
//! its LM head on each lane's last prompt row only; the all-row forward
//! ([`GraphRole::Logits`]) is planned only where asked for.

use std::path::Path;

use specc_codegen::{build, BuildOptions, Cubins};
use specc_ir::engine::{Arch, Engine, GraphRole, Target};
use specc_models::spec_bundle::{engine_input, EngineExtras};
use specc_models::{Acceptance, Model, RandomWeights, SpecConfig};
use specc_runtime::admission::lane_chunk;
use specc_runtime::memory::Footprint;
use specc_runtime::windows::{lane_major, AdmissionWindows};

mod common;

use common::repo_path;

const LANES: u32 = 16;
const MAX_CONTEXT: u64 = 2048;

/// The Llama-3.1-8B shape (two of its layers: the LM head and the arenas' widest values are
/// the full model's) planned for sm_90a at batch [`LANES`] and `max_context`, plain decoding
/// under the acceptance a server builds for (sampling, each lane greedy unless a request
/// asks otherwise: its prefill also draws each lane's first token).
fn engine_8b(max_context: u64, extras: EngineExtras) -> (Model, Engine) {
    let config = repo_path("bench/configs/llama-3.1-8b/config.json");
    let model = Model::open_random_layers(&config, 1, Some(2)).unwrap();
    let extras = EngineExtras {
        batch_buckets: Some(vec![LANES]),
        acceptance: Some(Acceptance::Sample {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
        }),
        ..extras
    };
    let (input, _) = engine_input(
        &model,
        None,
        max_context,
        Some(RandomWeights::seeded(1)),
        &extras,
        &|p: &Path| p.to_path_buf(),
    )
    .unwrap();
    let opts = BuildOptions {
        cubins: Cubins::Never,
        ..BuildOptions::default()
    };
    let built = build(input, &Target::for_archs(&[Arch::Sm90a]), &opts)
        .unwrap_or_else(|e| panic!("the 8B engine at {LANES} lanes, {max_context} tokens: {e}"));
    (model, built.engine)
}

fn arena(engine: &Engine, role: GraphRole, t: u32) -> u64 {
    engine
        .plan(role, LANES, Some(t))
        .unwrap_or_else(|| panic!("no {role} plan at B={LANES}, T={t}"))
        .arena_bytes
}

/// `specc serve CONFIG --random-weights --lanes 16 --max-context 2048` at the 8B shape: every
/// prefill plans, no all-row forward is planned, and the session's estimated activations
/// are every prefill's arena (about twice the longest's) and the step's, far below every
/// row's logits.
#[test]
fn an_8b_serving_engine_plans_batch_16_prefills_of_2048_tokens() {
    let (model, engine) = engine_8b(MAX_CONTEXT, EngineExtras::default());
    let vocab = model.spec().vocab as u64;
    let prefill_ts = engine.token_buckets(GraphRole::Prefill, LANES);
    assert_eq!(
        prefill_ts.last(),
        Some(&(MAX_CONTEXT as u32)),
        "{prefill_ts:?}"
    );
    assert!(engine.token_buckets(GraphRole::Logits, LANES).is_empty());

    let longest = arena(&engine, GraphRole::Prefill, MAX_CONTEXT as u32);
    let step = arena(&engine, GraphRole::Decode, 1);
    let contract = engine.contract(false).clone();
    let sizes = |n: &str| {
        model
            .checkpoint()
            .tensor(n)
            .map_or(0, |e| e.range.len() as u64)
    };
    let need = Footprint::of_cuda_engine(&engine, &contract, LANES, 0, &sizes);
    // The f32 logits of every row alone were 15.7 GiB at T = 2048.
    let every_row_logits = u64::from(LANES) * MAX_CONTEXT * vocab * 4;
    println!(
        "B={LANES}: prefill arena at T={MAX_CONTEXT}: {:.2} GiB, estimated activations {:.2} GiB \
         (every row's f32 logits: {:.2} GiB)",
        gib(longest),
        gib(need.activations),
        gib(every_row_logits)
    );
    let prefills: u64 = prefill_ts
        .iter()
        .map(|&t| arena(&engine, GraphRole::Prefill, t))
        .sum();
    assert_eq!(need.activations, prefills + step, "{need:?}");
    assert!(prefills < 2 * longest + longest / 4, "{need:?}");
    assert!(need.activations < every_row_logits / 3, "{need:?}");
    // Prefilled in chunks of 512 rows across the 16 lanes (32 a lane), the session never
    // loads a prefill above 32.
    const CHUNK: usize = 512;
    let chunked = Footprint::of_cuda_engine(&engine, &contract, LANES, CHUNK, &sizes);
    let per_lane = lane_chunk(CHUNK, LANES as usize);
    assert_eq!(per_lane, 32);
    let upto_chunk: u64 = prefill_ts
        .iter()
        .filter(|&&t| t as usize <= per_lane)
        .map(|&t| arena(&engine, GraphRole::Prefill, t))
        .sum();
    println!(
        "chunk {CHUNK}: estimated activations {:.2} GiB",
        gib(chunked.activations)
    );
    assert_eq!(chunked.activations, upto_chunk + step, "{chunked:?}");
    // The same weights (fewer plans' constants).
    assert!(chunked.weights <= need.weights && chunked.weights > need.weights / 2);
}

/// At a chunk where both plan, the all-row forward (`specc logits`) holds every row's f32
/// logits and the serving prefill a small fraction of its arena.
#[test]
fn the_last_row_prefill_needs_a_fraction_of_the_all_row_arena() {
    const T: u32 = 256;
    let extras = EngineExtras {
        all_logits: true,
        ..EngineExtras::default()
    };
    let (model, engine) = engine_8b(u64::from(T), extras);
    let rows_logits = u64::from(LANES * T) * model.spec().vocab as u64 * 4;
    let all_rows = arena(&engine, GraphRole::Logits, T);
    let last_row = arena(&engine, GraphRole::Prefill, T);
    println!(
        "B={LANES} T={T}: {:.2} GiB last row vs {:.2} GiB all rows",
        gib(last_row),
        gib(all_rows)
    );
    assert!(
        all_rows >= rows_logits && last_row <= all_rows / 8,
        "last-row prefill arena {last_row} B, all-row forward {all_rows} B (every row's f32 \
         logits: {rows_logits} B)"
    );
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// The embedded default's engine for `spec` at batch buckets 1, 2 and 4, under the
/// acceptance `specc serve` builds for (per-lane sampling, greedy lanes by default).
fn default_engine(spec: &str) -> Engine {
    let dir = repo_path("models/default");
    let model = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(spec)).unwrap();
    let extras = EngineExtras {
        batch_buckets: Some(vec![1, 2, 4]),
        acceptance: Some(Acceptance::Sample {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
        }),
        ..EngineExtras::default()
    };
    let (input, _) = engine_input(&model, Some(&cfg), 256, None, &extras, &|p: &Path| {
        p.to_path_buf()
    })
    .unwrap();
    let opts = BuildOptions {
        cubins: Cubins::Never,
        ..BuildOptions::default()
    };
    build(input, &Target::for_archs(&[Arch::Sm90a]), &opts)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
        .engine
}

/// A lane joins a 4-lane session at the smallest batch bucket whose window of lanes holds
/// it, the same bucket whatever the lane (so its tokens do not depend on the load), for
/// every way a method primes its draft; lanes admitted together share one window.
#[test]
fn admissions_prefill_in_the_smallest_window_of_lanes() {
    for spec in [
        "spec.toml",
        "spec.eagle3.toml",
        "spec.eagle3-tree.toml",
        "spec.dflash.toml",
        "ddtree.toml",
    ] {
        let engine = default_engine(spec);
        for speculative in [false, true] {
            let contract = engine.contract(speculative).clone();
            let major = lane_major(&engine, &contract).unwrap();
            let w = AdmissionWindows::of_engine(&engine, &contract, 4, major);
            println!(
                "{spec} ({}): windows {:?}, first lanes aligned to {}, lone lane 3 at {:?}",
                if speculative { "speculative" } else { "plain" },
                w.buckets,
                w.align,
                w.lone(3)
            );
            assert!(major, "{spec}: states lead with the lane axis");
            assert_eq!(w.buckets, vec![1, 2, 4], "{spec}");
            let (b, first) = w.lone(3);
            assert!(
                b < 4 && first <= 3 && 3 < first + b,
                "{spec}: {:?}",
                w.lone(3)
            );
            assert_eq!(w.lone(0).0, b, "{spec}: one bucket for every lane");
            let (b2, first2) = w.covering(&[1, 2]);
            assert!(b2 <= 4 && first2 <= 1 && 2 < first2 + b2, "{spec}");
        }
    }
}
