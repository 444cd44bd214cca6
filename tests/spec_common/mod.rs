//! What the interpreter's speculative exactness tests share: a bundle's step graph run to the
//! end on the CPU backend, the check against the target's own greedy tokens, and prompts.
//! (A test crate that includes it declares `mod common;` too.)

#![allow(dead_code)]

use specc_models::{Model, SpecBundle};
use specc_runtime::{SpecCpuSession, SpecGraphs};

#[allow(unused_imports)]
pub use crate::common::{default_model, fixture};

/// Tokens per lane (first + emitted, truncated), mean acceptance length and its histogram.
pub struct Outcome {
    pub tokens: Vec<Vec<u32>>,
    pub mean_accept: f64,
    pub histogram: Vec<usize>,
}

/// `b`'s step graph on the CPU backend over `prompts` (KV capacity `ctx`).
pub fn speculate(
    target: &Model,
    b: &SpecBundle,
    prompts: &[Vec<u32>],
    max_new: usize,
    ctx: u64,
) -> Outcome {
    let weights = b.load_weights_f32(target).unwrap();
    let mut s = SpecCpuSession::new(SpecGraphs::of(b), &weights, prompts.len(), ctx);
    let first = s.admit(prompts, max_new).unwrap();
    let mut tokens: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    while s.live().iter().any(|&l| l) {
        s.step().unwrap();
        for (i, new) in s.drain().unwrap().into_iter().enumerate() {
            tokens[i].extend(new);
        }
    }
    for t in &mut tokens {
        t.truncate(max_new);
    }
    Outcome {
        tokens,
        mean_accept: s.stats.mean_accept_len(),
        histogram: s.stats.histogram.clone(),
    }
}

/// [`speculate`], asserting every lane equals the target's greedy tokens.
pub fn check_exact(
    target: &Model,
    b: &SpecBundle,
    prompts: &[Vec<u32>],
    n: usize,
    ctx: u64,
) -> Outcome {
    let out = speculate(target, b, prompts, n, ctx);
    let w = target.load_weights_f32();
    for (i, p) in prompts.iter().enumerate() {
        let want = target.greedy_generate(&w, p, n, ctx as usize).unwrap();
        assert_eq!(
            out.tokens[i],
            want,
            "lane {i} (prompt len {}) differs from target greedy",
            p.len()
        );
    }
    out
}

/// The first `n` of four prompts from the default's corpus (Python source), BOS first.
pub fn python_prompts(n: usize) -> Vec<Vec<u32>> {
    let tok = tokenizers::Tokenizer::from_file(default_model().join("tokenizer.json")).unwrap();
    let texts = [
        "import os\n\ndef main(argv):\n    ",
        "class Parser:\n    def __init__(self, text):\n        self.",
        "for i in range(",
        "    if not isinstance(value, str):\n        raise TypeError(",
    ];
    texts[..n]
        .iter()
        .map(|t| {
            let mut ids = vec![0u32]; // BOS
            ids.extend(tok.encode(*t, false).unwrap().get_ids());
            ids
        })
        .collect()
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

/// One step of a tree bundle after admitting one Python prompt on the interpreter: the
/// bonus token and the step's `TREE` output (rows of `[token, parent, depth, ancestor
/// words…]`), checked for the links every tree has: `n` rows, node 0 is the bonus token at
/// depth 0 without a parent, every other node's parent precedes it, its depth is the
/// parent's + 1 and at most `max_depth`, and its ancestor words are the parent's plus its
/// own bit (`words` words). Returns `(bonus, tree, columns)`.
pub fn first_step_tree(
    target: &Model,
    b: &SpecBundle,
    n: usize,
    words: usize,
    max_depth: i64,
) -> (u32, Vec<i64>, usize) {
    use std::collections::HashMap;

    use specc_ir::interp::{self, Env};
    use specc_ir::Bindings;
    let weights = b.load_weights_f32(target).unwrap();
    let mut s = SpecCpuSession::new(SpecGraphs::of(b), &weights, 1, 512);
    let first = s.admit(&python_prompts(1), 20).unwrap();
    let mut states = s.states().clone();
    let mut env = Env {
        bind: Bindings::new(1, 1, 512),
        inputs: HashMap::new(),
        weights: &weights,
        states: &mut states,
    };
    let out = interp::run(&b.step, &mut env).unwrap();
    let tree = out[specc_models::methods::TREE].as_i64().unwrap().to_vec();
    let cols = 3 + words;
    assert_eq!(tree.len(), n * cols);
    let row = |i: usize| &tree[i * cols..][..cols];
    assert_eq!(row(0)[..3], [first[0] as i64, -1, 0]);
    for i in 1..n {
        let (p, d) = (row(i)[1], row(i)[2]);
        assert!(p >= 0 && (p as usize) < i, "node {i}: parent {p}");
        assert_eq!(d, row(p as usize)[2] + 1, "node {i}");
        assert!((1..=max_depth).contains(&d), "node {i}: depth {d}");
        for w in 0..words {
            let own = if i / 64 == w { 1i64 << (i % 64) } else { 0 };
            assert_eq!(
                row(i)[3 + w],
                row(p as usize)[3 + w] | own,
                "node {i} word {w}"
            );
        }
    }
    (first[0], tree, cols)
}
