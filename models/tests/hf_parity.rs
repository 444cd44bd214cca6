//! Parity of the CPU interpreter against Hugging Face transformers on the fixtures made by
//! `scripts/make_hf_fixtures.py` (random weights, f32): logits of one forward over the
//! prompt + HF's greedy tokens, and greedy decoding through the KV cache.

mod reference;
use reference::{check_dir, fixture};

/// Relative L2 error allowed on the logits.
const TOL: f64 = 1e-4;

fn check(name: &str) {
    check_dir(name, &fixture(name), TOL, true);
}

#[test]
fn llama3_scaled_untied() {
    check("llama3_scaled_untied");
}

#[test]
fn llama_tied() {
    check("llama_tied");
}

#[test]
fn qwen3_headdim() {
    check("qwen3_headdim");
}
