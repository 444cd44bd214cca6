//! The plain step (k = 0) of a draft that reads the target's hidden states costs what plain
//! decoding does: at the Llama-3.1-8B shape with the EAGLE-3 head and the DFlash drafter of
//! `bench/configs` (random weights), planned for sm_90a, the k = 0 variant reads exactly
//! plain decoding's weights — no draft weight — in a few more launches (its row queued in
//! the catch-up ring), and the drafter's weights are read by the catch-up graph, once for
//! every queued row (`models/src/methods/variants.rs`).

use std::path::Path;

use specc_codegen::{build, BuildOptions, Cubins};
use specc_ir::engine::{Arch, BucketPlan, Engine, GraphRole, Slot, Target};
use specc_models::methods::CATCH_UP_ROWS;
use specc_models::spec_bundle::{engine_input, EngineExtras};
use specc_models::{Model, RandomWeights, SpecConfig};

mod common;

use common::repo_path;

/// The 8B target with the draft of `spec` (a `bench/configs` spec.toml), at batch 1.
fn engine_8b(spec: &str) -> Engine {
    let config = repo_path("bench/configs/llama-3.1-8b/config.json");
    let model = Model::open_random(&config, 1).unwrap();
    let cfg = SpecConfig::from_file(&repo_path(spec)).unwrap();
    let extras = EngineExtras {
        batch_buckets: Some(vec![1]),
        smallest_chunk_only: true,
        ..EngineExtras::default()
    };
    let (input, _) = engine_input(
        &model,
        Some(&cfg),
        1024,
        Some(RandomWeights::seeded(1)),
        &extras,
        &|p: &Path| p.to_path_buf(),
    )
    .unwrap();
    let opts = BuildOptions {
        cubins: Cubins::Never,
        ..BuildOptions::default()
    };
    build(input, &Target::for_archs(&[Arch::Sm90a]), &opts)
        .unwrap_or_else(|e| panic!("{spec}: {e}"))
        .engine
}

fn plan(engine: &Engine, role: GraphRole) -> &BucketPlan {
    engine
        .plan(role, 1, Some(1))
        .unwrap_or_else(|| panic!("no {role} plan at batch 1"))
}

/// Weight bytes the plan's launches read (its fused groups' sum).
fn weight_bytes(p: &BucketPlan) -> u64 {
    p.groups.iter().map(|g| g.weight_bytes).sum()
}

/// Names of the weights the plan's operand table reaches.
fn weights(p: &BucketPlan) -> Vec<String> {
    let mut names: Vec<String> = p
        .slots
        .iter()
        .flat_map(|s| match s {
            Slot::Weight(n) => vec![n.clone()],
            Slot::ConcatRows(ns) => ns.clone(),
            Slot::WeightBlocks(b) => vec![b.name.clone()],
            _ => Vec::new(),
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

fn check(spec: &str, prefix: &str) {
    let engine = engine_8b(spec);
    let contract = engine.spec.clone().expect("a speculative engine");
    let catch_up = contract.catch_up.expect("a tap-reading draft catches up");
    assert_eq!(catch_up.rows, CATCH_UP_ROWS as usize);
    let plain = plan(&engine, GraphRole::Decode);
    let k0 = plan(&engine, GraphRole::SpecVariant(0));
    let up = plan(&engine, catch_up.role);
    println!(
        "{spec}: k = 0 step {} launches, {} weight bytes; plain decoding {} launches, {} weight bytes; catch-up {} launches, {} weight bytes",
        k0.launches.len(),
        weight_bytes(k0),
        plain.launches.len(),
        weight_bytes(plain),
        up.launches.len(),
        weight_bytes(up)
    );
    assert_eq!(
        weight_bytes(k0),
        weight_bytes(plain),
        "{spec}: k = 0 weights"
    );
    assert_eq!(k0.physical.weights, plain.physical.weights, "{spec}");
    assert_eq!(
        weights(k0),
        weights(plain),
        "{spec}: k = 0 reads plain's weights"
    );
    assert!(
        !weights(k0).iter().any(|w| w.starts_with(prefix)),
        "{spec}: the k = 0 step reads no draft weight"
    );
    assert!(
        k0.launches.len() <= plain.launches.len() + 4,
        "{spec}: k = 0 step {} launches, plain {}",
        k0.launches.len(),
        plain.launches.len()
    );
    assert!(
        weights(up).iter().any(|w| w.starts_with(prefix)),
        "{spec}: the catch-up reads the draft's weights"
    );
    assert!(
        weight_bytes(up) < weight_bytes(plain) / 10,
        "{spec}: a catch-up reads the drafter's weights, not the target's"
    );
}

#[test]
fn the_8b_eagle3_plain_step_reads_plain_decodings_weights() {
    check("bench/configs/eagle3-k7.toml", "eagle/");
}

#[test]
fn the_8b_dflash_plain_step_reads_plain_decodings_weights() {
    check("bench/configs/dflash-b16.toml", "dflash/");
}
