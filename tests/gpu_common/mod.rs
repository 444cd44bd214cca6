//! What the device tests of speculative steps share: the driver check, a session driven to
//! the end, a bundle's step graph run on the device, and the target's own greedy tokens
//! under the same kernels (the k = 0 step graph) that speculative output must equal.

#![allow(dead_code)]

use std::path::PathBuf;

use specc_models::spec_step::lower_plain_greedy;
use specc_models::{Model, SpecBundle};
use specc_runtime::cuda::{driver_present, CudaSpecGraphs, CudaSpecSession, WeightSources};
use specc_runtime::{SpecCpuSession, SpecGraphs, Speculator};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether a driver is present (otherwise prints why the test skips).
pub fn gpu() -> bool {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver");
        return false;
    }
    true
}

/// Admits `prompts` and steps until every lane finished; each lane's tokens (first +
/// emitted), truncated to `n`.
pub fn drive(s: &mut dyn Speculator, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let first = s.admit(prompts, n).unwrap();
    let mut out: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    let mut guard = 0;
    while s.live().unwrap().iter().any(|&l| l) {
        s.step().unwrap();
        for (i, new) in s.drain().unwrap().into_iter().enumerate() {
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

/// `b`'s step graph on the device over `prompts` (KV capacity `ctx`): tokens and the mean
/// acceptance length.
pub fn run_bundle(
    target: &Model,
    b: &SpecBundle,
    prompts: &[Vec<u32>],
    n: usize,
    ctx: u64,
) -> (Vec<Vec<u32>>, f64) {
    let sources = WeightSources {
        sources: vec![("", target.checkpoint()), (b.prefix, &b.draft_checkpoint)],
    };
    let mut s = CudaSpecSession::new(CudaSpecGraphs::of(b), &sources, prompts.len(), ctx).unwrap();
    let out = drive(&mut s, prompts, n);
    (out, s.stats.mean_accept_len())
}

/// Target-only greedy decoding on the device (the k = 0 step graph).
pub fn plain_cuda(target: &Model, prompts: &[Vec<u32>], n: usize, ctx: u64) -> Vec<Vec<u32>> {
    let (prefill, step) = lower_plain_greedy(target.spec(), 64).unwrap();
    let sources = WeightSources {
        sources: vec![("", target.checkpoint())],
    };
    let graphs = CudaSpecGraphs::plain(&prefill, &step, 64);
    let mut s = CudaSpecSession::new(graphs, &sources, prompts.len(), ctx).unwrap();
    drive(&mut s, prompts, n)
}

/// `b` prompts of different lengths over the first 300 token ids.
pub fn random_prompts(b: usize) -> Vec<Vec<u32>> {
    (0..b)
        .map(|i| {
            (0..(5 + 3 * i))
                .map(|j| ((j * 37 + i * 11 + 3) % 300) as u32)
                .collect()
        })
        .collect()
}

/// Prompts from the trained default's corpus (Python source), BOS + its tokenizer's ids.
pub fn corpus_prompts() -> Vec<Vec<u32>> {
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

/// Runs `b` and plain decoding on the device and asserts every lane's tokens are equal
/// (`what` labels failures); notes where CUDA greedy differs from the CPU interpreter's.
/// Returns the mean acceptance length.
pub fn assert_exact(
    target: &Model,
    b: &SpecBundle,
    prompts: &[Vec<u32>],
    n: usize,
    ctx: u64,
    what: &str,
) -> f64 {
    let (got, mean) = run_bundle(target, b, prompts, n, ctx);
    let plain = plain_cuda(target, prompts, n, ctx);
    let w = target.load_weights_f32();
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            got[i],
            plain[i],
            "{what}: lane {i} (prompt len {}) vs CUDA greedy",
            p.len()
        );
        if target.greedy_generate(&w, p, n, ctx as usize).ok().as_ref() != Some(&plain[i]) {
            eprintln!("note: lane {i}: CUDA greedy differs from the CPU interpreter's (numerics)");
        }
    }
    mean
}

/// Sampled acceptance: `b`'s step graph on the device draws the interpreter's tokens (the
/// same counter-based uniforms; on f32 fixtures the logits agree to ~5e-7, so a draw falls
/// on the other side of a CDF boundary with negligible probability). Returns the device's
/// mean acceptance length.
pub fn assert_draws_match_interpreter(
    target: &Model,
    b: &SpecBundle,
    prompts: &[Vec<u32>],
    n: usize,
    ctx: u64,
    what: &str,
) -> f64 {
    let (cuda, mean) = run_bundle(target, b, prompts, n, ctx);
    let weights = b.load_weights_f32(target).unwrap();
    let mut cpu = SpecCpuSession::new(SpecGraphs::of(b), &weights, prompts.len(), ctx);
    let cpu = drive(&mut cpu, prompts, n);
    for (i, (g, c)) in cuda.iter().zip(&cpu).enumerate() {
        assert_eq!(g, c, "{what}: lane {i}: CUDA vs interpreter draws");
    }
    mean
}
