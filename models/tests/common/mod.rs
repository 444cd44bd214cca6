//! Helpers shared by the integration tests: tiny configs and checkpoints written into temp
//! dirs with the `safetensors` crate.
#![allow(dead_code)]

use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use specc_models::{lower_dense, ModelSpec};

/// A tiny Llama config (GQA 4/2 heads, head_dim 8) as `config.json` text.
pub fn tiny_llama_config(tied: bool, dtype: &str) -> String {
    format!(
        r#"{{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 32,
  "intermediate_size": 48,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "vocab_size": 64,
  "max_position_embeddings": 32,
  "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0,
  "rope_scaling": null,
  "tie_word_embeddings": {tied},
  "torch_dtype": "{dtype}",
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2
}}"#
    )
}

/// One stored tensor: name, dtype, shape, little-endian bytes.
pub struct Stored {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// Deterministic pseudo-random values in [-scale, scale).
pub fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            (2.0 * u - 1.0) * scale
        })
        .collect()
}

pub fn encode(dtype: Dtype, vals: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::BF16 => vals
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::F16 => vals
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::I32 => vals
            .iter()
            .flat_map(|v| (*v as i32).to_le_bytes())
            .collect(),
        other => panic!("encode: {other:?}"),
    }
}

/// Every weight the lowered graph of `config` needs, with random values (norm weights
/// near 1) in `dtype`.
pub fn weights_for(config: &str, dtype: Dtype) -> Vec<Stored> {
    let spec = ModelSpec::from_json(Path::new("config.json"), config).unwrap();
    let g = lower_dense(&spec).unwrap();
    g.weights()
        .enumerate()
        .map(|(i, (_, name, ty))| {
            let shape: Vec<usize> = ty
                .shape
                .dims()
                .iter()
                .map(|d| d.as_static().unwrap() as usize)
                .collect();
            let n = shape.iter().product();
            let mut v = values(i as u64 + 7, n, 0.5);
            if name.ends_with("norm.weight") {
                v.iter_mut().for_each(|x| *x = 1.0 + *x * 0.2);
            }
            Stored {
                name: name.to_string(),
                dtype,
                shape,
                bytes: encode(dtype, &v),
            }
        })
        .collect()
}

/// Serialises tensors as one safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[Stored]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), &t.bytes).unwrap(),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, &None).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Writes `config.json` and `model.safetensors` into `dir`.
pub fn write_model(dir: &Path, config: &str, tensors: &[Stored]) {
    std::fs::write(dir.join("config.json"), config).unwrap();
    write_safetensors(&dir.join("model.safetensors"), tensors);
}

/// Writes `config.json`, the tensors split over `n` shards, and the index.
pub fn write_sharded(dir: &Path, config: &str, tensors: &[Stored], n: usize) {
    std::fs::write(dir.join("config.json"), config).unwrap();
    let mut map = serde_json::Map::new();
    let per = tensors.len().div_ceil(n);
    for (k, chunk) in tensors.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", k + 1, n);
        write_safetensors(&dir.join(&file), chunk);
        for t in chunk {
            map.insert(t.name.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index).unwrap(),
    )
    .unwrap();
}

/// Asserts `msg` is one line containing every needle.
pub fn assert_msg(msg: &str, needles: &[&str]) {
    assert!(!msg.contains('\n'), "message is not one line: {msg}");
    for n in needles {
        assert!(msg.contains(n), "message lacks {n:?}: {msg}");
    }
}
