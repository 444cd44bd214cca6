//! Checkpoints that contradict their config, or hold what no loader should run: each is one
//! error naming the file and the field or tensor, before anything is lowered or run.

mod common;

use std::path::Path;

use common::*;
use safetensors::Dtype;
use specc_models::Model;

fn llama() -> String {
    tiny_llama_config(false, "float32")
}

/// A tiny model whose config is `config` and whose tensors are those of `llama()` after
/// `edit`.
fn model_dir(config: &str, edit: impl FnOnce(&mut Vec<Stored>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut t = weights_for(&llama(), Dtype::F32);
    edit(&mut t);
    write_model(dir.path(), config, &t);
    dir
}

fn open_err(dir: &Path) -> String {
    match Model::open(dir) {
        Ok(_) => panic!("opened a bad model"),
        Err(e) => e.to_string(),
    }
}

fn p(dir: &Path, file: &str) -> String {
    dir.join(file).display().to_string()
}

fn stored(name: &str, vals: &[f32]) -> Stored {
    Stored {
        name: name.into(),
        dtype: Dtype::F32,
        shape: vec![vals.len()],
        bytes: encode(Dtype::F32, vals),
    }
}

#[test]
fn fewer_layers_in_config_than_in_checkpoint() {
    let config = llama().replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
    let d = model_dir(&config, |_| {});
    let dir = d.path();
    assert_eq!(
        open_err(dir),
        format!(
            "{}: field \"num_hidden_layers\": expected 2 (the layers {} holds: it has tensor \"model.layers.1.input_layernorm.weight\"), found 1",
            p(dir, "config.json"),
            p(dir, "model.safetensors")
        )
    );
}

#[test]
fn more_layers_in_config_than_in_checkpoint() {
    let config = llama().replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    let d = model_dir(&config, |_| {});
    let dir = d.path();
    assert_eq!(
        open_err(dir),
        format!(
            "{}: field \"num_hidden_layers\": expected 2 (the layers {} holds: it has no tensor \"model.layers.2.*\"), found 3",
            p(dir, "config.json"),
            p(dir, "model.safetensors")
        )
    );
}

#[test]
fn absurd_layer_count_fails_before_lowering() {
    // Lowering 10^12 layers would never finish: the headers answer first.
    let config = llama().replace(
        "\"num_hidden_layers\": 2",
        "\"num_hidden_layers\": 1000000000000",
    );
    let d = model_dir(&config, |_| {});
    let msg = open_err(d.path());
    assert_msg(
        &msg,
        &[
            "config.json: field \"num_hidden_layers\": expected 2 (the layers ",
            "found 1000000000000",
        ],
    );
}

#[test]
fn unexpected_tensor() {
    let d = model_dir(&llama(), |t| {
        t.push(stored("model.extra.weight", &[1.0; 4]))
    });
    let dir = d.path();
    assert_eq!(
        open_err(dir),
        format!(
            "{}: tensor \"model.extra.weight\": expected only tensors the model reads, found a tensor nothing reads (does {} describe this checkpoint?)",
            p(dir, "model.safetensors"),
            p(dir, "config.json")
        )
    );
}

#[test]
fn ignorable_tensors_are_skipped_with_a_note() {
    let config = tiny_llama_config(true, "float32");
    let dir = tempfile::tempdir().unwrap();
    let mut t = weights_for(&config, Dtype::F32);
    for l in 0..2 {
        let name = format!("model.layers.{l}.self_attn.rotary_emb.inv_freq");
        t.push(stored(&name, &[1.0, 0.5, 0.25, 0.125]));
    }
    // A tied model that stores its head anyway (transformers then ignores it).
    let embed = t
        .iter()
        .find(|s| s.name == "model.embed_tokens.weight")
        .unwrap();
    t.push(Stored {
        name: "lm_head.weight".into(),
        dtype: embed.dtype,
        shape: embed.shape.clone(),
        bytes: embed.bytes.clone(),
    });
    write_model(dir.path(), &config, &t);
    let m = Model::open(dir.path()).unwrap();
    assert_eq!(
        m.checkpoint().note().unwrap(),
        format!(
            "{}: skipped 3 tensors nothing reads: 2 × rotary_emb.inv_freq (RoPE frequencies, recomputed from the config); 1 × lm_head.weight (tie_word_embeddings: the embedding is the head)",
            p(dir.path(), "model.safetensors")
        )
    );
}

#[test]
fn mtp_layer_is_skipped_with_a_note() {
    let config = llama().replace(
        "\"num_hidden_layers\": 2,",
        "\"num_hidden_layers\": 2, \"num_nextn_predict_layers\": 1,",
    );
    let d = model_dir(&config, |t| {
        t.push(stored("model.layers.2.input_layernorm.weight", &[1.0; 32]));
        t.push(stored("model.layers.2.eh_proj.weight", &[1.0; 8]));
    });
    let m = Model::open(d.path()).unwrap();
    let note = m.checkpoint().note().unwrap();
    assert!(
        note.ends_with("skipped 2 tensors nothing reads: 2 × MTP layers (multi-token prediction, not used to decode)"),
        "{note}"
    );
    // Without the field, the extra layer is a layer-count mismatch.
    let d = model_dir(&llama(), |t| {
        t.push(stored("model.layers.2.input_layernorm.weight", &[1.0; 32]))
    });
    assert_msg(
        &open_err(d.path()),
        &[
            "config.json: field \"num_hidden_layers\": expected 3 (the layers ",
            "it has tensor \"model.layers.2.input_layernorm.weight\"), found 2",
        ],
    );
}

#[test]
fn special_tokens_outside_the_vocabulary() {
    let d = model_dir(
        &llama().replace("\"bos_token_id\": 1", "\"bos_token_id\": 64"),
        |_| {},
    );
    assert_eq!(
        open_err(d.path()),
        format!(
            "{}: field \"bos_token_id\": expected a token id below vocab_size (64), found 64",
            p(d.path(), "config.json")
        )
    );
    let config = llama().replace("\"eos_token_id\": 2", "\"eos_token_id\": [2, 100000]");
    let d = model_dir(&config, |_| {});
    assert_eq!(
        open_err(d.path()),
        format!(
            "{}: field \"eos_token_id\": expected a token id below vocab_size (64), found 100000",
            p(d.path(), "config.json")
        )
    );
}

#[test]
fn parameter_count_overflow_is_a_config_error() {
    let config = llama()
        .replace("\"hidden_size\": 32", "\"hidden_size\": 1000000000000")
        .replace("\"vocab_size\": 64", "\"vocab_size\": 1000000000000");
    let d = model_dir(&config, |_| {});
    assert_msg(
        &open_err(d.path()),
        &["config.json: field \"hidden_size\": expected sizes whose parameter count fits in 64 bits (with intermediate_size, num_hidden_layers and vocab_size), found 1000000000000"],
    );
}

/// A safetensors file whose header is `header` (JSON) followed by `data` bytes.
fn raw_safetensors(path: &Path, header: &serde_json::Value, data: usize) {
    let h = header.to_string().into_bytes();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.resize(bytes.len() + data, 0);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn overlapping_data_offsets() {
    let d = model_dir(&llama(), |_| {});
    let header = serde_json::json!({
        "a": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]},
        "b": {"dtype": "F32", "shape": [16], "data_offsets": [32, 96]},
    });
    let file = d.path().join("model.safetensors");
    raw_safetensors(&file, &header, 96);
    assert_eq!(
        open_err(d.path()),
        format!(
            "{}: tensor \"b\": expected data_offsets that do not overlap tensor \"a\" ([0, 64]), found [32, 96]",
            file.display()
        )
    );
}

#[test]
fn shard_outside_the_model_directory() {
    let d = tempfile::tempdir().unwrap();
    let config = llama();
    write_sharded(d.path(), &config, &weights_for(&config, Dtype::F32), 2);
    let index = d.path().join("model.safetensors.index.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    v["weight_map"]["model.norm.weight"] = "../x.safetensors".into();
    std::fs::write(&index, v.to_string()).unwrap();
    assert_eq!(
        open_err(d.path()),
        format!(
            "{}: field \"weight_map\": expected shard file names inside the model directory, found \"../x.safetensors\" for tensor \"model.norm.weight\"",
            index.display()
        )
    );
    v["weight_map"]["model.norm.weight"] = "/etc/x.safetensors".into();
    std::fs::write(&index, v.to_string()).unwrap();
    assert_msg(
        &open_err(d.path()),
        &["field \"weight_map\": expected shard file names inside the model directory, found \"/etc/x.safetensors\""],
    );
}

#[test]
fn non_finite_weights_are_named_at_load() {
    for (bad, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf")] {
        let d = model_dir(&llama(), |t| {
            let s = t
                .iter_mut()
                .find(|s| s.name == "model.layers.1.mlp.up_proj.weight")
                .unwrap();
            s.bytes[12..16].copy_from_slice(&bad.to_le_bytes());
        });
        let m = Model::open(d.path()).unwrap();
        let err = m.weights_f32().unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{}: tensor \"model.layers.1.mlp.up_proj.weight\": expected finite values, found {shown} at element 3",
                p(d.path(), "model.safetensors")
            )
        );
    }
}

#[test]
fn non_finite_bf16_and_f16() {
    use specc_models::checkpoint::first_non_finite;
    let bf = |v: f32| half::bf16::from_f32(v).to_le_bytes();
    let bytes: Vec<u8> = [1.0, -2.0, f32::NEG_INFINITY, 3.0]
        .iter()
        .flat_map(|&v| bf(v))
        .collect();
    assert_eq!(
        first_non_finite(Dtype::BF16, &bytes),
        Some((2, f32::NEG_INFINITY))
    );
    let h: Vec<u8> = [0.5f32, 65504.0]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    assert_eq!(first_non_finite(Dtype::F16, &h), None, "f16 max is finite");
    let nan = half::f16::NAN.to_le_bytes();
    assert!(first_non_finite(Dtype::F16, &nan).unwrap().1.is_nan());
}

#[test]
fn non_regular_files_are_named() {
    let d = model_dir(&llama(), |_| {});
    let st = d.path().join("model.safetensors");
    std::fs::remove_file(&st).unwrap();
    std::fs::create_dir(&st).unwrap();
    assert_eq!(
        open_err(d.path()),
        format!(
            "{}: expected a regular file, found a directory",
            st.display()
        )
    );
    std::fs::remove_dir(&st).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &st).unwrap();
    assert_eq!(
        open_err(d.path()),
        format!(
            "{}: expected a regular file, found a character device",
            st.display()
        )
    );
    // A FIFO config.json would block a read forever.
    let config = d.path().join("config.json");
    std::fs::remove_file(&config).unwrap();
    let ok = std::process::Command::new("mkfifo")
        .arg(&config)
        .status()
        .unwrap();
    assert!(ok.success());
    assert_eq!(
        open_err(d.path()),
        format!(
            "{}: expected a regular file, found a FIFO",
            config.display()
        )
    );
}
