//! An engine for the CPU backend end to end, without the binary: the embedded default with
//! its spec.toml built by `specc_codegen::build` for `Target::cpu()`, written to a directory
//! and read back, then executed by the interpreter through the engine's own contracts and
//! graph texts with weights from the checkpoints it names. Its speculative output must
//! equal the target's own greedy tokens, and the plain contract's of the same engine.

use std::collections::HashMap;
use std::path::Path;

use specc_codegen::{build, BuildOptions, Cubins};
use specc_ir::engine::{Engine, GraphRole, Target, ENGINE_FILE};
use specc_ir::interp::Tensor;
use specc_models::spec_bundle::{engine_input, EngineExtras};
use specc_models::{Checkpoint, Model, SpecConfig};
use specc_runtime::{DraftKind, EngineGraphs, SpecCpuSession, SpecGraphs, Speculator};

mod common;
mod spec_common;

use spec_common::{default_model, python_prompts};

/// KV slots per sequence.
const CTX: u64 = 256;

/// The default model + spec.toml built for the CPU, through a directory.
fn round_tripped(dir: &Path) -> Engine {
    let model = Model::open(default_model()).unwrap();
    let cfg = SpecConfig::from_file(&default_model().join("spec.toml")).unwrap();
    let (input, bundle) = engine_input(
        &model,
        Some(&cfg),
        CTX,
        None,
        &EngineExtras::default(),
        &|p: &Path| p.to_path_buf(),
    )
    .unwrap();
    let bundle = bundle.expect("the default spec speculates");
    let built = build(
        input,
        &Target::cpu(),
        &BuildOptions {
            cubins: Cubins::Require,
            threads: 1,
            progress: None,
        },
    )
    .unwrap();
    let engine = built.engine;
    assert!(engine.plans.is_empty(), "a CPU target plans no kernels");
    assert!(engine.kernels.is_empty() && engine.cubins.is_empty());
    assert_eq!(engine.max_context, CTX);
    assert_eq!(engine.spec.as_ref(), Some(&bundle.contract()));
    engine.write_dir(dir).unwrap();
    assert!(dir.join(ENGINE_FILE).is_file());
    let back = Engine::read_dir(dir).unwrap();
    assert_eq!(
        serde_json::to_value(&back).unwrap(),
        serde_json::to_value(&engine).unwrap(),
        "engine.json round trip"
    );
    back
}

/// Every weight of `roles`' graphs as interpreter tensors, from the checkpoints the engine
/// names (each checked against what the engine recorded of it).
fn weights_of(
    engine: &Engine,
    graphs: &EngineGraphs,
    roles: &[GraphRole],
) -> HashMap<String, Tensor> {
    let cks: Vec<(&str, Checkpoint)> = engine
        .checkpoints
        .iter()
        .map(|r| {
            let ck = Checkpoint::open(&r.dir).unwrap();
            ck.matches(r).unwrap();
            (r.prefix.as_str(), ck)
        })
        .collect();
    let mut out = HashMap::new();
    for &role in roles {
        for (_, name, _) in graphs.get(role).unwrap().weights() {
            if out.contains_key(name) {
                continue;
            }
            let (prefix, ck) = cks
                .iter()
                .filter(|(p, _)| name.starts_with(p))
                .max_by_key(|(p, _)| p.len())
                .unwrap_or_else(|| panic!("weight `{name}` is in no checkpoint of the engine"));
            out.insert(
                name.to_string(),
                ck.load_f32(&name[prefix.len()..]).unwrap(),
            );
        }
    }
    out
}

/// Each lane's tokens (first + emitted, truncated to `n`) and the mean acceptance length.
fn drive(s: &mut dyn Speculator, prompts: &[Vec<u32>], n: usize) -> (Vec<Vec<u32>>, f64) {
    let first = s.admit(prompts, n).unwrap();
    let mut out: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    while s.live().unwrap().iter().any(|&l| l) {
        s.step().unwrap();
        for (i, new) in s.drain().unwrap().into_iter().enumerate() {
            out[i].extend(new);
        }
    }
    for t in &mut out {
        t.truncate(n);
    }
    (out, s.stats().mean_accept_len())
}

#[test]
fn a_cpu_engine_read_back_from_disk_speculates_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let engine = round_tripped(dir.path());
    let graphs = EngineGraphs::parse(&engine).unwrap();
    let prompts = python_prompts(2);
    let n = 24;

    let spec = engine.contract(true).clone();
    assert_eq!(spec.kind, DraftKind::Model);
    assert_eq!(spec.num_steps, 5, "the default spec's k");
    let weights = weights_of(&engine, &graphs, &spec.roles());
    let sg = SpecGraphs::from_engine(&spec, &graphs).unwrap();
    let mut s = SpecCpuSession::new(sg, &weights, prompts.len(), engine.max_context);
    let (got, mean) = drive(&mut s, &prompts, n);

    let plain = engine.contract(false).clone();
    assert_eq!(plain.kind, DraftKind::None);
    let plain_w = weights_of(&engine, &graphs, &plain.roles());
    let pg = SpecGraphs::from_engine(&plain, &graphs).unwrap();
    let mut p = SpecCpuSession::new(pg, &plain_w, prompts.len(), engine.max_context);
    let (want_plain, _) = drive(&mut p, &prompts, n);

    let model = Model::open(default_model()).unwrap();
    let w = model.load_weights_f32();
    for (i, prompt) in prompts.iter().enumerate() {
        let want = model.greedy_generate(&w, prompt, n, CTX as usize).unwrap();
        assert_eq!(
            got[i], want,
            "lane {i}: speculative vs the target's greedy tokens"
        );
        assert_eq!(
            want_plain[i], want,
            "lane {i}: the plain contract vs greedy"
        );
    }
    eprintln!(
        "engine read back from {}: {} exact tokens per lane; mean acceptance {mean:.2}",
        dir.path().display(),
        n
    );
    assert!(mean > 1.0, "the trained draft accepts something: {mean}");
}
