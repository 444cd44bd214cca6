//! Memory estimates of DeepSeek-V3 / Kimi-K2 (issue 19): the KV cache holds RMSNorm(c) and
//! the rotated k_pe per token and layer — 576 values for Kimi-K2, 70 272 bytes a token in
//! bf16 over 61 layers — not the expanded keys and values.

use std::path::Path;

use specc_ir::Bindings;
use specc_models::{lower_dense, ModelSpec};
use specc_runtime::memory::{Footprint, Storage};

/// Kimi-K2-Instruct's text config (REFERENCE.md), dense bf16 weights.
const KIMI_K2: &str = r#"{
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
    "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.827,
    "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 163840, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                     "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "tie_word_embeddings": false, "torch_dtype": "bfloat16"
}"#;

#[test]
fn kimi_k2_cache_is_576_values_a_token_and_layer() {
    let spec = ModelSpec::from_json(Path::new("kimi-k2/config.json"), KIMI_K2).unwrap();
    let mla = spec.mla.as_ref().unwrap();
    assert_eq!(mla.cache_width(), 576);
    // Softmax scale 192^-0.5 · m², m = 0.1 · ln 32 + 1.
    let m = 0.1 * 32f64.ln() + 1.0;
    assert!((mla.softmax_scale - m * m / 192f64.sqrt()).abs() < 1e-12);
    // ≈ 1.03 T parameters.
    let params = spec.param_count().unwrap();
    assert!((1.0e12..1.1e12).contains(&(params as f64)), "{params}");

    // The cache does not depend on the experts: lower with 8 of them (a graph of 384 experts
    // × 60 layers takes minutes to build on a small machine).
    let small = KIMI_K2.replace("\"n_routed_experts\": 384", "\"n_routed_experts\": 8");
    let spec = ModelSpec::from_json(Path::new("kimi-k2/config.json"), &small).unwrap();
    assert_eq!(spec.moe.as_ref().unwrap().experts, 8);
    let g = lower_dense(&spec).unwrap();
    let states =
        |ctx: u64| Footprint::of_graphs(&[(&g, Bindings::new(1, 1, ctx))], Storage::Device).states;
    let per_token = states(2048) - states(1024);
    assert_eq!(per_token, 1024 * 61 * 576 * 2);
    // Batch 4: four times the cache.
    let b4 = Footprint::of_graphs(&[(&g, Bindings::new(4, 1, 1024))], Storage::Device).states;
    assert_eq!(b4, 4 * 1024 * 61 * 576 * 2);
}
