//! DFlash on the CUDA backend: the step graph captured and replayed on the device must emit
//! exactly the target's greedy tokens, like the interpreter does (tests/dflash.rs). Run with
//! `--features cuda`; without a driver every test prints why it skipped and passes.

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

fn bundle(target: &Model, target_dir: &Path, draft: &str) -> SpecBundle {
    let cfg = SpecConfig::from_toml(
        &target_dir.join("spec.dflash-test.toml"),
        &format!("method = \"dflash\"\ndraft = {draft:?}\n"),
    )
    .unwrap();
    SpecBundle::open(target, &cfg).unwrap()
}

fn run(target: &Model, b: &SpecBundle, prompts: &[Vec<u32>], n: usize) -> (Vec<Vec<u32>>, f64) {
    let sources = WeightSources {
        sources: vec![("", target.checkpoint()), (b.prefix, &b.draft_checkpoint)],
    };
    let graphs = CudaSpecGraphs {
        kind: DraftKind::DFlash {
            taps_width: b.dflash_taps_width().unwrap(),
        },
        target_prefill: &b.target_prefill,
        draft_prefill: &b.draft_prefill,
        step: &b.step,
        num_steps: b.num_steps(),
        ring: b.shape.ring as usize,
    };
    let mut s = CudaSpecSession::new(graphs, &sources, prompts.len(), 256).unwrap();
    let first = Speculator::admit(&mut s, prompts, n).unwrap();
    let mut out: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    let mut guard = 0;
    while Speculator::live(&s).unwrap().iter().any(|&l| l) {
        Speculator::step(&mut s).unwrap();
        for (i, new) in Speculator::drain(&mut s).unwrap().into_iter().enumerate() {
            out[i].extend(new);
        }
        guard += 1;
        assert!(guard < 4 * n + 8, "lanes never finished");
    }
    for t in &mut out {
        t.truncate(n);
    }
    (out, s.stats.mean_accept_len())
}

/// Target-only greedy decoding on the device (the k = 0 step graph): the reference the
/// speculative output must equal exactly under the same kernels.
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
    let mut s = CudaSpecSession::new(graphs, &sources, prompts.len(), 256).unwrap();
    let first = Speculator::admit(&mut s, prompts, n).unwrap();
    let mut out: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    while Speculator::live(&s).unwrap().iter().any(|&l| l) {
        Speculator::step(&mut s).unwrap();
        for (i, new) in Speculator::drain(&mut s).unwrap().into_iter().enumerate() {
            out[i].extend(new);
        }
    }
    for t in &mut out {
        t.truncate(n);
    }
    out
}

fn check(target_dir: &Path, draft: &str, prompts: &[Vec<u32>], n: usize) -> f64 {
    let target = Model::open(target_dir).unwrap();
    let b = bundle(&target, target_dir, draft);
    let (got, mean) = run(&target, &b, prompts, n);
    let plain = plain_cuda(&target, prompts, n);
    let w = target.load_weights_f32();
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            got[i],
            plain[i],
            "lane {i} (prompt len {}) vs CUDA greedy",
            p.len()
        );
        let cpu = target.greedy_generate(&w, p, n, 256).unwrap();
        if cpu != plain[i] {
            eprintln!("note: lane {i}: CUDA greedy differs from the CPU interpreter's (numerics)");
        }
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
fn random_dflash_is_exact_on_cuda() {
    if !gpu() {
        return;
    }
    let dir = root().join("tests/fixtures/llama3_scaled_untied");
    for lanes in [1, 4] {
        let m = check(&dir, "../dflash_random", &random_prompts(lanes), 20);
        eprintln!("random dflash cuda B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m < 1.6, "{m}");
    }
}

#[test]
fn trained_dflash_is_exact_on_cuda() {
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
    for lanes in [1, 4] {
        let m = check(&dir, "dflash", &prompts[..lanes], 48);
        eprintln!("trained dflash cuda B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m > 1.5, "{m}");
    }
}
