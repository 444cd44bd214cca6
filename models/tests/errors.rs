//! One test per bad input: each error is one line naming the file, the field or tensor, and
//! what was expected versus found.

mod common;

use std::path::Path;

use common::*;
use safetensors::Dtype;
use specc_models::{Checkpoint, Model, ModelError, ModelSpec};

fn config_err(text: &str) -> String {
    let e = ModelSpec::from_json(Path::new("some/dir/config.json"), text).unwrap_err();
    e.to_string()
}

fn llama() -> String {
    tiny_llama_config(false, "float32")
}

#[test]
fn malformed_json() {
    let msg = config_err("{\n  \"hidden_size\": 64,\n");
    assert_msg(
        &msg,
        &["some/dir/config.json: malformed JSON at line 3 column 0"],
    );
}

#[test]
fn missing_field() {
    let msg = config_err(&llama().replace("\"num_hidden_layers\": 2,", ""));
    assert_eq!(
        msg,
        "some/dir/config.json: field \"num_hidden_layers\": expected a positive integer, found nothing (field absent)"
    );
}

#[test]
fn negative_count() {
    let msg =
        config_err(&llama().replace("\"num_attention_heads\": 4", "\"num_attention_heads\": -3"));
    assert_eq!(
        msg,
        "some/dir/config.json: field \"num_attention_heads\": expected a positive integer, found -3"
    );
}

#[test]
fn zero_count() {
    let msg = config_err(&llama().replace("\"vocab_size\": 64", "\"vocab_size\": 0"));
    assert_msg(
        &msg,
        &["field \"vocab_size\": expected a positive integer, found 0"],
    );
}

#[test]
fn wrong_field_type() {
    let msg = config_err(&llama().replace("\"hidden_size\": 32", "\"hidden_size\": \"32\""));
    assert_eq!(
        msg,
        "some/dir/config.json: field \"hidden_size\": expected a positive integer, found \"32\""
    );
    let msg = config_err(&llama().replace(
        "\"tie_word_embeddings\": false",
        "\"tie_word_embeddings\": \"no\"",
    ));
    assert_msg(
        &msg,
        &["field \"tie_word_embeddings\": expected true or false, found \"no\""],
    );
}

#[test]
fn wrong_nested_field_type() {
    let msg = config_err(&llama().replace(
        "\"rope_scaling\": null",
        r#""rope_scaling": {"rope_type": "llama3", "factor": "eight"}"#,
    ));
    assert_msg(
        &msg,
        &["config.json: field \"rope_scaling.factor\": expected a number, found \"eight\""],
    );
}

#[test]
fn missing_llama3_rope_field() {
    let msg = config_err(&llama().replace(
        "\"rope_scaling\": null",
        r#""rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}"#,
    ));
    assert_msg(
        &msg,
        &["field \"rope_scaling.original_max_position_embeddings\": expected a positive integer, found nothing"],
    );
}

#[test]
fn unsupported_rope_type() {
    let msg = config_err(&llama().replace(
        "\"rope_scaling\": null",
        r#""rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}"#,
    ));
    assert_msg(
        &msg,
        &["field \"rope_parameters.rope_type\": expected \"default\" or \"llama3\", found \"yarn\""],
    );
}

#[test]
fn unsupported_architecture() {
    let msg = config_err(&llama().replace("LlamaForCausalLM", "MistralForCausalLM"));
    assert_eq!(
        msg,
        "some/dir/config.json: field \"architectures\": expected one of \"LlamaForCausalLM\", \"Qwen3ForCausalLM\", \"DeepseekV3ForCausalLM\", found [\"MistralForCausalLM\"]"
    );
}

#[test]
fn attention_bias_is_unsupported() {
    let msg = config_err(&llama().replace("\"attention_bias\": false", "\"attention_bias\": true"));
    assert_msg(
        &msg,
        &["field \"attention_bias\": expected false or absent (unsupported for LlamaForCausalLM), found true"],
    );
}

#[test]
fn unsupported_dtype() {
    let msg = config_err(&llama().replace("float32", "float8_e4m3fn"));
    assert_msg(
        &msg,
        &["field \"torch_dtype\": expected \"bfloat16\", \"float16\" or \"float32\", found \"float8_e4m3fn\""],
    );
}

#[test]
fn kv_heads_must_divide_heads() {
    let msg =
        config_err(&llama().replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"));
    assert_msg(
        &msg,
        &["field \"num_key_value_heads\": expected a divisor of num_attention_heads (4), found 3"],
    );
}

#[test]
fn qwen3_needs_head_dim() {
    let msg = config_err(&llama().replace("LlamaForCausalLM", "Qwen3ForCausalLM"));
    assert_msg(
        &msg,
        &["field \"head_dim\": expected a positive integer, found nothing"],
    );
}

#[test]
fn config_file_missing() {
    let dir = tempfile::tempdir().unwrap();
    let msg = Model::open(dir.path()).err().unwrap().to_string();
    assert_msg(&msg, &["config.json: cannot read:"]);
}

// ---- checkpoints ----

/// A valid tiny model dir, with `edit` applied to its tensors first.
fn model_dir(edit: impl FnOnce(&mut Vec<Stored>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = llama();
    let mut t = weights_for(&config, Dtype::F32);
    edit(&mut t);
    write_model(dir.path(), &config, &t);
    dir
}

fn open_err(dir: &Path) -> String {
    match Model::open(dir) {
        Ok(_) => panic!("opened a bad model"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn valid_model_opens() {
    let dir = model_dir(|_| {});
    let m = Model::open(dir.path()).unwrap();
    assert_eq!(m.spec().layers, 2);
}

#[test]
fn missing_tensor() {
    let dir = model_dir(|t| t.retain(|s| s.name != "model.layers.1.mlp.up_proj.weight"));
    assert_msg(
        &open_err(dir.path()),
        &["model.safetensors: tensor \"model.layers.1.mlp.up_proj.weight\": expected shape [48, 32] f32, found no such tensor"],
    );
}

#[test]
fn wrong_shape() {
    let dir = model_dir(|t| {
        let s = t
            .iter_mut()
            .find(|s| s.name == "model.layers.0.self_attn.q_proj.weight")
            .unwrap();
        s.shape = vec![32, 16];
        s.bytes.truncate(32 * 16 * 4);
    });
    assert_msg(
        &open_err(dir.path()),
        &["model.safetensors: tensor \"model.layers.0.self_attn.q_proj.weight\": expected shape [32, 32] f32, found [32, 16] f32"],
    );
}

#[test]
fn wrong_dtype() {
    let dir = model_dir(|t| {
        let s = t
            .iter_mut()
            .find(|s| s.name == "model.norm.weight")
            .unwrap();
        s.dtype = Dtype::I32;
    });
    assert_msg(
        &open_err(dir.path()),
        &["model.safetensors: tensor \"model.norm.weight\": expected shape [32] f32, found [32] i32"],
    );
}

#[test]
fn bf16_checkpoint_for_f32_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = llama();
    write_model(dir.path(), &config, &weights_for(&config, Dtype::BF16));
    assert_msg(
        &open_err(dir.path()),
        &["expected shape [64, 32] f32, found [64, 32] bf16"],
    );
}

#[test]
fn truncated_safetensors() {
    let dir = model_dir(|_| {});
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let data = bytes.len() - 8 - header;
    std::fs::write(&path, &bytes[..8 + header + 4096]).unwrap();
    let msg = open_err(dir.path());
    assert_msg(
        &msg,
        &[&format!(
            "model.safetensors: truncated: header says {data} bytes of data, file has 4096"
        )],
    );
    // Also through the checkpoint API directly: an error, never a panic.
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(ModelError::Truncated { .. })
    ));
}

#[test]
fn truncated_inside_header() {
    let dir = model_dir(|_| {});
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..20]).unwrap();
    assert_msg(
        &open_err(dir.path()),
        &["model.safetensors: invalid safetensors header: header length says"],
    );
    std::fs::write(&path, &bytes[..3]).unwrap();
    assert_msg(
        &open_err(dir.path()),
        &["expected at least the 8-byte header length, found a 3-byte file"],
    );
}

#[test]
fn no_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), llama()).unwrap();
    assert_msg(
        &open_err(dir.path()),
        &["expected model.safetensors or model.safetensors.index.json, found neither"],
    );
}

#[test]
fn sharded_checkpoint_opens_and_loads() {
    let single = model_dir(|_| {});
    let sharded = tempfile::tempdir().unwrap();
    let config = llama();
    write_sharded(
        sharded.path(),
        &config,
        &weights_for(&config, Dtype::F32),
        2,
    );
    let a = Model::open(single.path()).unwrap();
    let b = Model::open(sharded.path()).unwrap();
    assert_eq!(a.load_weights_f32(), b.load_weights_f32());
    let e = b.checkpoint().tensor("model.norm.weight").unwrap();
    assert!(b
        .checkpoint()
        .file_of(e)
        .ends_with("model-00002-of-00002.safetensors"));
}

#[test]
fn missing_shard() {
    let dir = tempfile::tempdir().unwrap();
    let config = llama();
    write_sharded(dir.path(), &config, &weights_for(&config, Dtype::F32), 2);
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert_msg(
        &open_err(dir.path()),
        &[
            "model.safetensors.index.json: weight_map: tensor \"",
            "expected shard file \"model-00002-of-00002.safetensors\" to exist, found no such file",
        ],
    );
}

#[test]
fn tensor_not_in_its_shard() {
    let dir = tempfile::tempdir().unwrap();
    let config = llama();
    write_sharded(dir.path(), &config, &weights_for(&config, Dtype::F32), 2);
    let index = dir.path().join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors".into();
    std::fs::write(&index, v.to_string()).unwrap();
    assert_msg(
        &open_err(dir.path()),
        &["model-00001-of-00002.safetensors: tensor \"model.norm.weight\": expected to be in this shard (as model.safetensors.index.json says), found no such tensor"],
    );
}

#[test]
fn truncated_shard() {
    let dir = tempfile::tempdir().unwrap();
    let config = llama();
    write_sharded(dir.path(), &config, &weights_for(&config, Dtype::F32), 2);
    let path = dir.path().join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    assert_msg(
        &open_err(dir.path()),
        &["model-00002-of-00002.safetensors: truncated: header says"],
    );
}

#[test]
fn index_without_weight_map() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), llama()).unwrap();
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"metadata": {}}"#,
    )
    .unwrap();
    assert_msg(
        &open_err(dir.path()),
        &["model.safetensors.index.json: field \"weight_map\": expected an object mapping tensor names to shard files, found nothing"],
    );
}

#[test]
fn load_f32_keeps_the_stored_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_llama_config(false, "bfloat16");
    let tensors = weights_for(&config, Dtype::BF16);
    write_model(dir.path(), &config, &tensors);
    let m = Model::open(dir.path()).unwrap();
    let w = m.load_weights_f32();
    let t = &w["model.embed_tokens.weight"];
    assert_eq!(t.dtype, specc_ir::DType::BF16);
    assert_eq!(t.shape, vec![64, 32]);
    let stored = &tensors
        .iter()
        .find(|s| s.name == "model.embed_tokens.weight")
        .unwrap()
        .bytes;
    let want: Vec<f32> = stored
        .chunks_exact(2)
        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    assert_eq!(t.as_f32().unwrap(), &want[..]);
    let err = m.checkpoint().load_f32("nope").unwrap_err().to_string();
    assert_msg(
        &err,
        &["model.safetensors: tensor \"nope\": expected a tensor, found no such tensor"],
    );
}

/// A streaming upload drops each shard's resident pages once it is staged: the tensors read
/// back the same afterwards, and a file index past the checkpoint is ignored.
#[test]
fn released_shards_read_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_llama_config(false, "float32");
    write_sharded(dir.path(), &config, &weights_for(&config, Dtype::F32), 3);
    let ck = Checkpoint::open(dir.path()).unwrap();
    let before: Vec<(String, Vec<u8>)> = ck
        .tensors()
        .map(|(n, _)| (n.to_string(), ck.bytes(n).unwrap().to_vec()))
        .collect();
    for file in 0..4 {
        ck.release_file(file);
    }
    for (n, bytes) in &before {
        assert_eq!(ck.bytes(n).unwrap(), bytes.as_slice(), "{n}");
    }
    assert!(before.len() > 3);
}
