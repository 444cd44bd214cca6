//! Speculative steps built from spec.toml bundles on the CUDA backend (DFlash, and the trained
//! default family's standalone draft and EAGLE-3 head): the step graph captured and replayed on
//! the device must emit exactly the target's greedy tokens, like the interpreter does
//! (tests/dflash.rs, tests/spec_exactness.rs). Run with `--features cuda`; without a driver
//! every test prints why it skipped and passes.

#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};

use specc_models::spec_step::{lower_decode_step, lower_target_prefill, StepShape};
use specc_models::{Acceptance, DraftSide, Model, SpecBundle, SpecConfig};
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

/// `method` with `draft` (relative to the target dir); `extra` holds further spec.toml lines.
fn bundle(target: &Model, target_dir: &Path, method: &str, draft: &str, extra: &str) -> SpecBundle {
    let cfg = SpecConfig::from_toml(
        &target_dir.join("spec.gpu-test.toml"),
        &format!("method = {method:?}\ndraft = {draft:?}\n{extra}"),
    )
    .unwrap();
    SpecBundle::open(target, &cfg).unwrap()
}

fn draft_kind(b: &SpecBundle) -> DraftKind {
    match &b.draft {
        DraftSide::Model(_) => DraftKind::Model,
        DraftSide::Eagle3(e) => DraftKind::Eagle3 {
            taps_width: 3 * e.hidden(),
        },
        DraftSide::DFlash(d) => DraftKind::DFlash {
            taps_width: d.taps_width(),
        },
    }
}

fn run(target: &Model, b: &SpecBundle, prompts: &[Vec<u32>], n: usize) -> (Vec<Vec<u32>>, f64) {
    let sources = WeightSources {
        sources: vec![("", target.checkpoint()), (b.prefix, &b.draft_checkpoint)],
    };
    let graphs = CudaSpecGraphs {
        kind: draft_kind(b),
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

fn check(target_dir: &Path, method: &str, draft: &str, prompts: &[Vec<u32>], n: usize) -> f64 {
    check_with(target_dir, method, draft, "", prompts, n)
}

fn check_with(
    target_dir: &Path,
    method: &str,
    draft: &str,
    extra: &str,
    prompts: &[Vec<u32>],
    n: usize,
) -> f64 {
    let target = Model::open(target_dir).unwrap();
    let b = bundle(&target, target_dir, method, draft, extra);
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
        let m = check(
            &dir,
            "dflash",
            "../dflash_random",
            &random_prompts(lanes),
            20,
        );
        eprintln!("random dflash cuda B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m < 1.6, "{m}");
    }
}

/// Prompts from the trained default's corpus (Python source), tokenised with its tokenizer.
fn corpus_prompts() -> Vec<Vec<u32>> {
    let dir = root().join("models/default");
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let texts = [
        "import os\n\ndef main(argv):\n    ",
        "class Parser:\n    def __init__(self, text):\n        self.",
        "for i in range(",
        "    if not isinstance(value, str):\n        raise TypeError(",
    ];
    texts
        .iter()
        .map(|t| {
            let mut ids = vec![0u32];
            ids.extend(tok.encode(*t, false).unwrap().get_ids());
            ids
        })
        .collect()
}

/// The trained family: real, partial acceptance (neither every draft token nor none).
fn check_trained(method: &str, draft: &str, extra: &str) {
    let dir = root().join("models/default");
    let prompts = corpus_prompts();
    for lanes in [1, 4] {
        let m = check_with(&dir, method, draft, extra, &prompts[..lanes], 48);
        eprintln!("trained {method} cuda B={lanes}: exact; mean acceptance {m:.2}");
        assert!(m > 1.5, "{m}");
    }
}

#[test]
fn trained_dflash_is_exact_on_cuda() {
    if gpu() {
        check_trained("dflash", "dflash", "");
    }
}

#[test]
fn trained_draft_model_is_exact_on_cuda() {
    if gpu() {
        check_trained("draft_model", "draft", "num_steps = 5\n");
    }
}

#[test]
fn trained_eagle3_is_exact_on_cuda() {
    if gpu() {
        check_trained("eagle3", "eagle3", "num_steps = 5\n");
    }
}
