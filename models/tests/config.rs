//! Resolution of real-shaped `config.json` files into `ModelSpec`.

use std::path::Path;

use specc_ir::{DType, RopeScaling};
use specc_models::{Arch, ModelSpec};

const LLAMA_31_8B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}"#;

/// The same model as transformers 5 writes it.
const LLAMA_31_8B_V5: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 128000,
  "dtype": "bfloat16",
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rope_type": "llama3"
  },
  "tie_word_embeddings": false,
  "transformers_version": "5.24.0",
  "vocab_size": 128256
}"#;

const QWEN3_06B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

const LLAMA_32_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_size": 2048,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "vocab_size": 128256
}"#;

fn resolve(text: &str) -> ModelSpec {
    ModelSpec::from_json(Path::new("config.json"), text).unwrap()
}

#[test]
fn llama_31_8b() {
    let s = resolve(LLAMA_31_8B);
    assert_eq!(
        s,
        ModelSpec {
            arch: Arch::Llama,
            hidden: 4096,
            layers: 32,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            intermediate: 14336,
            vocab: 128256,
            rms_eps: 1e-5,
            rope_theta: 500000.0,
            rope_scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192,
            },
            tie_embeddings: false,
            max_position: 131072,
            mtp_layers: 0,
            bos_token_id: Some(128000),
            eos_token_ids: vec![128001, 128008, 128009],
            dtype: DType::BF16,
            qk_norm: false,
            mla: None,
            moe: None,
            weight_prefix: String::new(),
            quant: Default::default(),
        }
    );
    assert_eq!((s.q_dim(), s.kv_dim()), (4096, 1024));
}

#[test]
fn transformers5_layout_resolves_the_same() {
    assert_eq!(resolve(LLAMA_31_8B_V5), resolve(LLAMA_31_8B));
}

#[test]
fn legacy_rope_type_key() {
    let text = LLAMA_31_8B.replace("\"rope_type\": \"llama3\"", "\"type\": \"llama3\"");
    assert_ne!(text, LLAMA_31_8B);
    assert_eq!(resolve(&text), resolve(LLAMA_31_8B));
}

#[test]
fn qwen3_06b() {
    let s = resolve(QWEN3_06B);
    assert_eq!(s.arch, Arch::Qwen3);
    assert!(s.qk_norm);
    assert_eq!((s.hidden, s.heads, s.head_dim), (1024, 16, 128));
    assert_eq!(
        s.q_dim(),
        2048,
        "Qwen3 q width is heads*head_dim, not hidden"
    );
    assert_eq!((s.kv_heads, s.layers, s.intermediate), (8, 28, 3072));
    assert_eq!(s.vocab, 151936);
    assert_eq!(s.rms_eps, 1e-6);
    assert_eq!(s.rope_theta, 1e6);
    assert_eq!(s.rope_scaling, RopeScaling::None);
    assert!(s.tie_embeddings);
    assert_eq!(s.max_position, 40960);
    assert_eq!(s.bos_token_id, Some(151643));
    assert_eq!(s.eos_token_ids, vec![151645]);
    assert_eq!(s.dtype, DType::BF16);
}

#[test]
fn llama_32_1b_tied() {
    let s = resolve(LLAMA_32_1B);
    assert!(s.tie_embeddings);
    assert_eq!(
        (s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim),
        (2048, 16, 32, 8, 64)
    );
    assert!(matches!(s.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 32.0));
    let untied = resolve(&LLAMA_32_1B.replace(
        "\"tie_word_embeddings\": true",
        "\"tie_word_embeddings\": false",
    ));
    assert!(!untied.tie_embeddings);
    // Absent means untied (the HF default).
    let absent = resolve(&LLAMA_32_1B.replace("\"tie_word_embeddings\": true,", ""));
    assert!(!absent.tie_embeddings);
}

#[test]
fn llama_head_dim_defaults_to_hidden_over_heads() {
    let text = LLAMA_32_1B.replace("\"head_dim\": 64,", "");
    assert_eq!(resolve(&text).head_dim, 64);
}

#[test]
fn optional_fields() {
    let text = LLAMA_31_8B
        .replace("\"num_key_value_heads\": 8,", "")
        .replace(
            "\"eos_token_id\": [128001, 128008, 128009],",
            "\"eos_token_id\": null,",
        )
        .replace("\"bos_token_id\": 128000,", "");
    let s = resolve(&text);
    assert_eq!(s.kv_heads, 32, "absent num_key_value_heads means MHA");
    assert!(s.eos_token_ids.is_empty());
    assert_eq!(s.bos_token_id, None);
    let f16 = resolve(&LLAMA_31_8B.replace("bfloat16", "float16"));
    assert_eq!(f16.dtype, DType::F16);
}

#[test]
fn default_rope_parameters() {
    let text = LLAMA_31_8B_V5.replace(
        r#""factor": 8.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rope_type": "llama3""#,
        r#""rope_theta": 10000.0, "rope_type": "default""#,
    );
    let s = resolve(&text);
    assert_eq!(s.rope_scaling, RopeScaling::None);
    assert_eq!(s.rope_theta, 10000.0);
}

/// The fixtures keep both layouts of the same config; they must resolve identically.
#[test]
fn fixture_configs_agree_across_layouts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut seen = 0;
    for name in ["llama3_scaled_untied", "llama_tied", "qwen3_headdim"] {
        let dir = root.join(name);
        if !dir.join("config.transformers5.json").is_file() {
            specc_ir::testing::skip(format!("{name}: fixture missing"));
            continue;
        }
        let a = ModelSpec::from_file(&dir.join("config.json")).unwrap();
        let b = ModelSpec::from_file(&dir.join("config.transformers5.json")).unwrap();
        assert_eq!(a, b, "{name}");
        seen += 1;
    }
    eprintln!("compared {seen} fixture configs");
}
