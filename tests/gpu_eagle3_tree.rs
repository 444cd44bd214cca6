//! EAGLE-3 draft trees on the CUDA backend: the tree step graph (head drafting over its
//! own tree-masked cache, `tree_select`, tree-masked verify, greedy walk, KV-row commit)
//! captured and replayed on the device must emit exactly the target's greedy tokens under
//! the same kernels, like the interpreter does (tests/eagle3_tree.rs), for topk 2 / 4 / 8,
//! trees of 8 to 256 nodes (up to four ancestor words) and 72 draft rows in the head (two
//! words). Run with `--features cuda`; without a driver every test prints why it skipped
//! and passes.

#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};

use specc_models::spec_step::{lower_decode_step, lower_target_prefill, StepShape};
use specc_models::{Acceptance, Model, SpecBundle, SpecConfig};
use specc_runtime::cuda::{driver_present, CudaSpecGraphs, CudaSpecSession, WeightSources};
use specc_runtime::{DraftKind, Speculator};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn gpu() -> bool {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver");
        return false;
    }
    true
}

fn bundle(target: &Model, target_dir: &Path, draft: &str, knobs: (u32, u32, u32)) -> SpecBundle {
    let (depth, topk, nodes) = knobs;
    let cfg = SpecConfig::from_toml(
        &target_dir.join("spec.eagle3-tree-test.toml"),
        &format!(
            "method = \"eagle3\"\ndraft = {draft:?}\nnum_steps = {depth}\ntopk = {topk}\nnum_draft_tokens = {nodes}\n"
        ),
    )
    .unwrap();
    SpecBundle::open(target, &cfg).unwrap()
}

/// Drives a session until every lane finished; returns the tokens (truncated to `n`).
fn drive(s: &mut CudaSpecSession, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let first = Speculator::admit(s, prompts, n).unwrap();
    let mut out: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    let mut guard = 0;
    while Speculator::live(s).unwrap().iter().any(|&l| l) {
        Speculator::step(s).unwrap();
        for (i, new) in Speculator::drain(s).unwrap().into_iter().enumerate() {
            out[i].extend(new);
        }
        guard += 1;
        assert!(guard < 4 * n + 8, "lanes never finished");
    }
    for t in &mut out {
        t.truncate(n);
    }
    out
}

fn run(target: &Model, b: &SpecBundle, prompts: &[Vec<u32>], n: usize) -> (Vec<Vec<u32>>, f64) {
    let sources = WeightSources {
        sources: vec![("", target.checkpoint()), (b.prefix, &b.draft_checkpoint)],
    };
    let graphs = CudaSpecGraphs {
        kind: DraftKind::Eagle3Tree {
            taps_width: b.taps_width().unwrap(),
            depth: b.num_steps(),
        },
        target_prefill: &b.target_prefill,
        draft_prefill: &b.draft_prefill,
        step: &b.step,
        num_steps: b.verify_margin(),
        ring: b.shape.ring as usize,
    };
    let mut s = CudaSpecSession::new(graphs, &sources, prompts.len(), 512).unwrap();
    let out = drive(&mut s, prompts, n);
    (out, s.stats.mean_accept_len())
}

/// Target-only greedy decoding on the device (the k = 0 step graph).
fn plain_cuda(target: &Model, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let shape = StepShape {
        num_steps: 0,
        ring: 64,
        acceptance: Acceptance::Greedy,
    };
    let prefill = lower_target_prefill(target.spec(), &[]).unwrap();
    let step = lower_decode_step(target.spec(), &shape).unwrap();
    let sources = WeightSources {
        sources: vec![("", target.checkpoint())],
    };
    let graphs = CudaSpecGraphs {
        kind: DraftKind::None,
        target_prefill: &prefill,
        draft_prefill: &prefill,
        step: &step,
        num_steps: 0,
        ring: 64,
    };
    let mut s = CudaSpecSession::new(graphs, &sources, prompts.len(), 512).unwrap();
    drive(&mut s, prompts, n)
}

fn check(
    target_dir: &Path,
    draft: &str,
    knobs: (u32, u32, u32),
    prompts: &[Vec<u32>],
    n: usize,
) -> f64 {
    let target = Model::open(target_dir).unwrap();
    let b = bundle(&target, target_dir, draft, knobs);
    let (got, mean) = run(&target, &b, prompts, n);
    let plain = plain_cuda(&target, prompts, n);
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            got[i],
            plain[i],
            "(depth, topk, nodes) {knobs:?}: lane {i} (prompt len {}) vs CUDA greedy",
            p.len()
        );
    }
    mean
}

fn random_prompts(b: usize) -> Vec<Vec<u32>> {
    (0..b)
        .map(|i| {
            (0..(5 + 3 * i))
                .map(|j| ((j * 37 + i * 11 + 3) % 300) as u32)
                .collect()
        })
        .collect()
}

#[test]
fn random_eagle3_tree_is_exact_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = root().join("tests/fixtures/llama3_scaled_untied");
    for (knobs, lanes) in [((4, 2, 8), 1), ((5, 4, 60), 4), ((10, 8, 100), 4)] {
        let m = check(&dir, "../eagle3_random", knobs, &random_prompts(lanes), 20);
        eprintln!("random eagle3 tree cuda {knobs:?} B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m < 2.0, "{m}");
    }
}

#[test]
fn trained_eagle3_tree_is_exact_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = root().join("models/default");
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let texts = [
        "import os\n\ndef main(argv):\n    ",
        "class Parser:\n    def __init__(self, text):\n        self.",
        "for i in range(",
        "    if not isinstance(value, str):\n        raise TypeError(",
    ];
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| {
            let mut ids = vec![0u32];
            ids.extend(tok.encode(*t, false).unwrap().get_ids());
            ids
        })
        .collect();
    for (knobs, lanes) in [
        ((5, 2, 8), 1),
        ((5, 4, 16), 1),
        ((5, 4, 32), 4),
        ((6, 4, 60), 1),
        ((8, 8, 256), 4),
    ] {
        let m = check(&dir, "eagle3", knobs, &prompts[..lanes], 48);
        eprintln!("trained eagle3 tree cuda {knobs:?} B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m > 1.5, "{m}");
    }
}
