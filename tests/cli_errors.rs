//! Bad input through the `specc` binary: each case must exit non-zero with one line on
//! stderr that names the file and the field or tensor, and must never panic.

use std::fs;
use std::path::Path;

use safetensors::tensor::Dtype;

mod cli_common;
mod common;

use cli_common::{assert_mentions, fails, rewrite_weights, scratch};

fn run_on(dir: &Path) -> String {
    fails(&[
        "run",
        dir.to_str().unwrap(),
        "--prompt",
        "Hello",
        "--max-tokens",
        "2",
    ])
}

#[test]
fn malformed_config_json() {
    let d = scratch("malformed");
    fs::write(d.join("config.json"), "{ \"hidden_size\": 12,").unwrap();
    assert_mentions(&run_on(&d), &["config.json"]);
}

#[test]
fn incomplete_config_json() {
    let d = scratch("incomplete");
    let text = fs::read_to_string(d.join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("num_attention_heads");
    fs::write(d.join("config.json"), v.to_string()).unwrap();
    assert_mentions(&run_on(&d), &["config.json", "num_attention_heads"]);
}

#[test]
fn unsupported_architecture() {
    let d = scratch("arch");
    let text = fs::read_to_string(d.join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["architectures"] = serde_json::json!(["MambaForCausalLM"]);
    fs::write(d.join("config.json"), v.to_string()).unwrap();
    assert_mentions(
        &run_on(&d),
        &["config.json", "architectures", "MambaForCausalLM"],
    );
}

#[test]
fn missing_tensor() {
    let d = scratch("missing");
    rewrite_weights(&d, |t| {
        t.retain(|x| x.0 != "model.layers.1.mlp.up_proj.weight")
    });
    assert_mentions(
        &run_on(&d),
        &["model.safetensors", "model.layers.1.mlp.up_proj.weight"],
    );
}

#[test]
fn wrong_shape() {
    let d = scratch("shape");
    rewrite_weights(&d, |t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "model.layers.0.self_attn.o_proj.weight")
            .unwrap();
        let half = x.3.len() / 2;
        x.3.truncate(half);
        x.2[1] /= 2;
    });
    assert_mentions(
        &run_on(&d),
        &[
            "model.safetensors",
            "model.layers.0.self_attn.o_proj.weight",
            "shape",
        ],
    );
}

#[test]
fn wrong_dtype() {
    let d = scratch("dtype");
    rewrite_weights(&d, |t| {
        let x = t.iter_mut().find(|x| x.0 == "model.norm.weight").unwrap();
        // Same byte count, integer type.
        x.1 = Dtype::I16;
    });
    assert_mentions(&run_on(&d), &["model.safetensors", "model.norm.weight"]);
}

#[test]
fn truncated_safetensors() {
    let d = scratch("truncated");
    let bytes = fs::read(d.join("model.safetensors")).unwrap();
    fs::write(d.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    assert_mentions(&run_on(&d), &["model.safetensors", "truncated"]);
}

#[test]
fn missing_tokenizer() {
    let d = scratch("tokenizer");
    fs::remove_file(d.join("tokenizer.json")).unwrap();
    assert_mentions(&run_on(&d), &["tokenizer.json"]);
}

#[test]
fn prompt_longer_than_context() {
    let d = scratch("context");
    let prompt = "word ".repeat(400);
    let err = fails(&[
        "run",
        d.to_str().unwrap(),
        "--prompt",
        &prompt,
        "--max-context",
        "64",
    ]);
    assert_mentions(&err, &["--prompt", "tokens", "64"]);
}

#[test]
fn max_context_beyond_model_limit() {
    let err = fails(&["run", "--prompt", "Hi", "--max-context", "100000000"]);
    assert_mentions(&err, &["--max-context", "max_position_embeddings"]);
}

#[test]
fn missing_model_directory() {
    let err = fails(&["run", "/nonexistent/specc-model", "--prompt", "Hi"]);
    assert_mentions(&err, &["/nonexistent/specc-model"]);
}

#[test]
fn logits_id_out_of_vocab() {
    let err = fails(&[
        "logits",
        "--ids",
        "1,999999",
        "--out",
        "/tmp/specc-never.safetensors",
    ]);
    assert_mentions(&err, &["--ids", "999999"]);
}
