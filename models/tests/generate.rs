//! CPU execution through the interpreter: KV-cache decoding agrees with full forwards, and
//! the one graph serves batches with padding lanes.

mod common;

use std::collections::HashMap;

use common::*;
use safetensors::Dtype;
use specc_ir::interp::{self, Env, Tensor};
use specc_ir::{Bindings, DType};
use specc_models::Model;

fn tiny_model(config: &str, dtype: Dtype) -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), config, &weights_for(config, dtype));
    let m = Model::open(dir.path()).unwrap();
    (dir, m)
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Each token of a cached greedy decode is the argmax of an uncached forward over the
/// sequence so far.
fn cached_matches_uncached(config: &str, dtype: Dtype) {
    let (_dir, m) = tiny_model(config, dtype);
    let w = m.load_weights_f32();
    let prompt = [3, 17, 5, 60, 9];
    let out = m.greedy_generate(&w, &prompt, 6, 16).unwrap();
    assert_eq!(out.len(), 6);
    let all: Vec<u32> = prompt.iter().chain(&out).copied().collect();
    let (shape, logits) = m.logits(&w, &all).unwrap();
    let v = shape[1];
    for (i, &tok) in out.iter().enumerate() {
        let t = prompt.len() - 1 + i;
        assert_eq!(
            argmax(&logits[t * v..(t + 1) * v]),
            tok,
            "token {i} (position {t})"
        );
    }
}

#[test]
fn llama_f32_cached_decode_matches_full_forward() {
    cached_matches_uncached(&tiny_llama_config(false, "float32"), Dtype::F32);
}

#[test]
fn llama_tied_bf16_runs() {
    let (_dir, m) = tiny_model(&tiny_llama_config(true, "bfloat16"), Dtype::BF16);
    let w = m.load_weights_f32();
    let out = m.greedy_generate(&w, &[1, 2, 3], 4, 8).unwrap();
    assert!(out.iter().all(|&t| (t as usize) < m.spec().vocab));
}

#[test]
fn qwen3_cached_decode_matches_full_forward() {
    let config = tiny_llama_config(false, "float32")
        .replace("LlamaForCausalLM", "Qwen3ForCausalLM")
        .replace("\"model_type\": \"llama\",", "\"head_dim\": 12,");
    cached_matches_uncached(&config, Dtype::F32);
}

#[test]
fn request_errors() {
    let (_dir, m) = tiny_model(&tiny_llama_config(false, "float32"), Dtype::F32);
    let w = m.load_weights_f32();
    let e = m
        .greedy_generate(&w, &[1; 30], 5, 64)
        .unwrap_err()
        .to_string();
    assert_msg(
        &e,
        &[
            "prompt: expected at most 32 tokens in all (max_position_embeddings of ",
            "config.json), found 30 prompt + 5 new = 35 tokens",
        ],
    );
    let e = m
        .greedy_generate(&w, &[1; 10], 5, 12)
        .unwrap_err()
        .to_string();
    assert_msg(
        &e,
        &["expected at most 12 tokens in all (the KV cache's ctx)"],
    );
    let e = m.logits(&w, &[1, 64]).unwrap_err().to_string();
    assert_msg(
        &e,
        &[
            "prompt: expected token ids below vocab_size (64, ",
            "config.json), found id 64 at position 1",
        ],
    );
    let e = m.logits(&w, &[]).unwrap_err().to_string();
    assert_msg(
        &e,
        &["prompt: expected at least one token id, found 0 tokens"],
    );
}

/// B = 2 with lane 1 all padding (negative positions): lane 0 gives the B = 1 logits, and
/// lane 1 writes nothing into the caches.
#[test]
fn padding_lane_is_inert() {
    let (_dir, m) = tiny_model(&tiny_llama_config(false, "float32"), Dtype::F32);
    let w = m.load_weights_f32();
    let ids = [4u32, 8, 15, 16];
    let (_, want) = m.logits(&w, &ids).unwrap();
    let s = m.spec();
    let (t, ctx) = (ids.len(), 8);
    let mut states: HashMap<String, Tensor> = m
        .graph()
        .states()
        .map(|(_, n, _)| {
            (
                n.to_string(),
                Tensor::zeros(s.dtype, vec![2, ctx, s.kv_heads, s.head_dim]),
            )
        })
        .collect();
    let mut tokens: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    tokens.extend([0; 4]);
    let mut pos: Vec<i64> = (0..t as i64).collect();
    pos.extend([-1; 4]);
    let inputs = HashMap::from([
        (
            "tokens".to_string(),
            Tensor::from_i64(DType::I32, vec![2, t], tokens),
        ),
        (
            "positions".to_string(),
            Tensor::from_i64(DType::I32, vec![2, t], pos),
        ),
    ]);
    let mut env = Env {
        bind: Bindings::new(2, t as u64, ctx as u64),
        inputs,
        weights: &w,
        states: &mut states,
    };
    let out = interp::run(m.graph(), &mut env).unwrap();
    let got = out["logits"].as_f32().unwrap();
    let lane0 = &got[..t * s.vocab];
    for (i, (g, w)) in lane0.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "logit {i}: got {g}, want {w}"
        );
    }
    let per_lane = ctx * s.kv_heads * s.head_dim;
    for (name, cache) in &states {
        let v = cache.as_f32().unwrap();
        assert!(
            v[..t * s.kv_heads * s.head_dim].iter().any(|&x| x != 0.0),
            "{name} lane 0 written"
        );
        assert!(
            v[per_lane..].iter().all(|&x| x == 0.0),
            "{name}: padding lane wrote KV"
        );
    }
}
