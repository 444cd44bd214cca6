//! Nothing wrong runs silently: inputs that used to run a wrong model with exit 0, abort in
//! an allocator, hang, or fail with a misleading message. Each is one `error:` line naming
//! the file, field, tensor or flag at fault (or a `note:` saying what was skipped or capped).

use std::fs;
use std::path::Path;

use safetensors::tensor::Dtype;

mod cli_common;
mod common;

use cli_common::{command, copy_dir, fails, rewrite_weights, s, scratch, set_json, specc, tmp};
use common::default_model;

fn run_args(dir: &Path) -> Vec<String> {
    [
        "run",
        s(dir),
        "--prompt",
        "def ",
        "--max-tokens",
        "2",
        "--no-spec",
    ]
    .map(String::from)
    .to_vec()
}

fn run_fails(dir: &Path) -> String {
    let args = run_args(dir);
    fails(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `error: {msg}\n`, exactly.
fn assert_error(err: &str, msg: &str) {
    assert_eq!(err.trim_end(), format!("error: {msg}"));
}

fn file(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

#[test]
fn config_with_fewer_layers_than_the_checkpoint() {
    let d = scratch("val-layers");
    set_json(&d.join("config.json"), "num_hidden_layers", "4");
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: field \"num_hidden_layers\": expected 6 (the layers {} holds: it has tensor \"model.layers.4.input_layernorm.weight\"), found 4",
            file(&d, "config.json"),
            file(&d, "model.safetensors")
        ),
    );
}

#[test]
fn absurd_layer_count_answers_at_once() {
    let d = scratch("val-layers-huge");
    set_json(&d.join("config.json"), "num_hidden_layers", "1000000000000");
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: field \"num_hidden_layers\": expected 6 (the layers {} holds: it has no tensor \"model.layers.6.*\"), found 1000000000000",
            file(&d, "config.json"),
            file(&d, "model.safetensors")
        ),
    );
}

#[test]
fn unused_tensor_is_an_error() {
    let d = scratch("val-extra");
    rewrite_weights(&d, |t| {
        t.push(("model.extra.bias".into(), Dtype::F32, vec![2], vec![0; 8]))
    });
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: tensor \"model.extra.bias\": expected only tensors the model reads, found a tensor nothing reads (does {} describe this checkpoint?)",
            file(&d, "model.safetensors"),
            file(&d, "config.json")
        ),
    );
}

#[test]
fn known_unused_tensors_are_noted_once() {
    let d = scratch("val-inv-freq");
    rewrite_weights(&d, |t| {
        for l in 0..6 {
            let name = format!("model.layers.{l}.self_attn.rotary_emb.inv_freq");
            t.push((name, Dtype::F32, vec![16], vec![0; 64]));
        }
    });
    let args = run_args(&d);
    let out = specc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&out.stderr);
    let notes: Vec<&str> = err.lines().filter(|l| l.starts_with("note:")).collect();
    assert_eq!(
        notes,
        [format!(
            "note: {}: skipped 6 tensors nothing reads: 6 × rotary_emb.inv_freq (RoPE frequencies, recomputed from the config)",
            file(&d, "model.safetensors")
        )]
    );
}

#[test]
fn special_tokens_outside_the_vocabulary() {
    let d = scratch("val-bos");
    set_json(&d.join("config.json"), "bos_token_id", "100000");
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: field \"bos_token_id\": expected a token id below vocab_size (512), found 100000",
            file(&d, "config.json")
        ),
    );
    set_json(&d.join("config.json"), "bos_token_id", "0");
    set_json(&d.join("config.json"), "eos_token_id", "512");
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: field \"eos_token_id\": expected a token id below vocab_size (512), found 512",
            file(&d, "config.json")
        ),
    );
}

#[test]
fn tokenizer_ids_beyond_the_vocabulary() {
    let d = scratch("val-tokenizer");
    let path = d.join("tokenizer.json");
    let mut t: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    t["added_tokens"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "id": 512, "content": "<extra>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }));
    fs::write(&path, t.to_string()).unwrap();
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: expected token ids below vocab_size (512, {}), found id 512 (token \"<extra>\"; 513 ids in all)",
            path.display(),
            file(&d, "config.json")
        ),
    );
}

#[test]
fn overlapping_data_offsets() {
    let d = scratch("val-overlap");
    let header = serde_json::json!({
        "a": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]},
        "b": {"dtype": "F32", "shape": [16], "data_offsets": [32, 96]},
    })
    .to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + 96, 0);
    fs::write(d.join("model.safetensors"), bytes).unwrap();
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: tensor \"b\": expected data_offsets that do not overlap tensor \"a\" ([0, 64]), found [32, 96]",
            file(&d, "model.safetensors")
        ),
    );
}

#[test]
fn shard_outside_the_model_directory() {
    let d = scratch("val-shard");
    let single = d.join("model.safetensors");
    fs::rename(&single, d.join("model-00001-of-00001.safetensors")).unwrap();
    let index = d.join("model.safetensors.index.json");
    fs::write(
        &index,
        r#"{"weight_map": {"model.norm.weight": "../x.safetensors"}}"#,
    )
    .unwrap();
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: field \"weight_map\": expected shard file names inside the model directory, found \"../x.safetensors\" for tensor \"model.norm.weight\"",
            index.display()
        ),
    );
}

#[test]
fn non_finite_weight_is_named() {
    let d = scratch("val-nan");
    rewrite_weights(&d, |t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "model.layers.2.mlp.down_proj.weight")
            .unwrap();
        // bf16 NaN at element 5.
        x.3[10..12].copy_from_slice(&0x7fc0u16.to_le_bytes());
    });
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: tensor \"model.layers.2.mlp.down_proj.weight\": expected finite values, found NaN at element 5",
            file(&d, "model.safetensors")
        ),
    );
}

#[test]
fn absurd_sizes_fail_the_memory_estimate() {
    for (field, value) in [
        ("hidden_size", "1000000000"),
        ("vocab_size", "1000000000000"),
        ("num_hidden_layers", "1000000000000"),
    ] {
        let d = scratch(&format!("val-absurd-{field}"));
        let config = d.join("config.json");
        set_json(&config, field, value);
        let err = fails(&[
            "run",
            s(&config),
            "--random-weights",
            "--prompt",
            "def ",
            "--max-tokens",
            "2",
        ]);
        let msg = err.trim_end();
        assert!(
            msg.starts_with("error: estimated memory "),
            "{field}: {msg}"
        );
        assert!(
            msg.contains(" of available host memory (MemAvailable); the weights grow with hidden_size, intermediate_size, num_hidden_layers and vocab_size of "),
            "{field}: {msg}"
        );
        assert!(msg.ends_with(&format!("{}", config.display())), "{msg}");
    }
}

#[test]
fn huge_max_position_embeddings_runs_at_the_default_cap() {
    let d = scratch("val-mpe");
    set_json(
        &d.join("config.json"),
        "max_position_embeddings",
        "1000000000000",
    );
    let args = run_args(&d);
    let out = specc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.lines().next().unwrap(),
        format!(
            "note: max context 4096 tokens (max_position_embeddings 1000000000000 of {} is capped at 4096 by default; --max-context sets it)",
            file(&d, "config.json")
        )
    );
    // Asked for explicitly, the KV cache of 10^12 slots is refused before it is allocated.
    let mut args = run_args(&d);
    args.extend(["--max-context".into(), "1000000000000".into()]);
    let err = fails(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let msg = err.trim_end();
    assert!(msg.starts_with("error: estimated memory "), "{msg}");
    assert!(
        msg.ends_with(
            "it grows with the max context (1000000000000, from --max-context) and the batch (1)"
        ),
        "{msg}"
    );
}

#[test]
fn max_tokens_beyond_the_context_are_clamped() {
    let d = scratch("val-max-tokens");
    let ids = d.join("ids.json");
    let out = specc(&[
        "run",
        s(&d),
        "--prompt",
        "def ",
        "--no-spec",
        "--max-context",
        "64",
        "--max-tokens",
        "9223372036854775808",
        "--ids-out",
        s(&ids),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    // BOS + 3 prompt tokens; 64 slots - 4 - 2 kept for the step.
    assert_eq!(
        err.lines().next().unwrap(),
        "note: --max-tokens 9223372036854775808 clamped to 58: what fits after the 4-token prompt in the max context of 64 (from --max-context)"
    );
    let j: serde_json::Value = serde_json::from_str(&fs::read_to_string(&ids).unwrap()).unwrap();
    assert_eq!(j["generated_ids"].as_array().unwrap().len(), 58);
}

#[test]
fn context_errors_name_their_source() {
    let d = scratch("val-ctx-spec");
    let spec = d.join("spec.toml");
    fs::write(
        &spec,
        format!(
            "method = \"draft_model\"\ndraft = \"{}\"\nnum_steps = 3\nmax_context = 100000\n",
            s(&default_model().join("draft"))
        ),
    )
    .unwrap();
    let err = fails(&["run", s(&d), "--spec", s(&spec), "--prompt", "def "]);
    assert_error(
        &err,
        &format!(
            "{}: field \"max_context\": expected 1..=1024 (max_position_embeddings of {}), found 100000",
            spec.display(),
            file(&d, "config.json")
        ),
    );
    let err = fails(&["run", s(&d), "--prompt", "def ", "--max-context", "5000"]);
    assert_error(
        &err,
        &format!(
            "--max-context: expected 1..=1024 (max_position_embeddings of {}), found 5000",
            file(&d, "config.json")
        ),
    );
    // A prompt longer than an engine's context names the engine's manifest.
    let e = tmp("val-ctx-engine");
    specc(&["compile", s(&d), "--max-context", "16", "-o", s(&e)]);
    let prompt = "def ".repeat(20);
    let err = fails(&["run", s(&e), "--prompt", &prompt]);
    let msg = err.trim_end();
    assert!(msg.starts_with("error: --prompt: "), "{msg}");
    assert!(
        msg.ends_with(&format!(
            "exceed the max context of 16 tokens (from \"max_context\" of {})",
            e.join("engine.json").display()
        )),
        "{msg}"
    );
}

#[test]
fn non_regular_files_are_named() {
    let d = scratch("val-fifo");
    let tok = d.join("tokenizer.json");
    fs::remove_file(&tok).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(&tok)
        .status()
        .unwrap()
        .success());
    assert_error(
        &run_fails(&d),
        &format!("{}: expected a regular file, found a FIFO", tok.display()),
    );
    let st = d.join("model.safetensors");
    fs::remove_file(&st).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &st).unwrap();
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: expected a regular file, found a character device",
            st.display()
        ),
    );
    fs::remove_file(&st).unwrap();
    fs::create_dir(&st).unwrap();
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: expected a regular file, found a directory",
            st.display()
        ),
    );
}

#[test]
fn os_errors_are_printed_once() {
    let d = tmp("val-empty");
    fs::create_dir_all(&d).unwrap();
    assert_error(
        &run_fails(&d),
        &format!(
            "{}: cannot read: No such file or directory (os error 2)",
            file(&d, "config.json")
        ),
    );
}

#[test]
fn unwritable_logits_out_is_one_plain_line() {
    let out = "/nonexistent/specc/logits.safetensors";
    let err = fails(&["logits", "--ids", "1,2", "--out", out]);
    assert_error(
        &err,
        &format!("--out {out}: cannot write: No such file or directory (os error 2)"),
    );
}

#[test]
fn draft_head_checkpoints_are_covered_too() {
    let d = tmp("val-eagle");
    copy_dir(&default_model(), &d);
    let spec = d.join("spec.eagle3.toml");
    let run = |d: &Path| {
        command(&[
            "run",
            s(d),
            "--spec",
            s(&spec),
            "--prompt",
            "def ",
            "--max-tokens",
            "2",
        ])
        .output()
        .unwrap()
    };
    // The published format's t2d is read by nothing: noted, not an error.
    let out = run(&d);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let head = d.join("eagle3/model.safetensors");
    assert!(
        err.lines().any(|l| l == format!("note: {}: skipped 1 tensor nothing reads: 1 × t2d (EAGLE-3's target-to-draft vocabulary mask; d2t is read)", head.display())),
        "{err}"
    );
    rewrite_weights(&d.join("eagle3"), |t| {
        t.push((
            "midlayer.extra.weight".into(),
            Dtype::F32,
            vec![2],
            vec![0; 8],
        ))
    });
    let err = fails(&[
        "run",
        s(&d),
        "--spec",
        s(&spec),
        "--prompt",
        "def ",
        "--max-tokens",
        "2",
    ]);
    assert_error(
        &err,
        &format!(
            "{}: tensor \"midlayer.extra.weight\": expected only tensors the model reads, found a tensor nothing reads (does {} describe this checkpoint?)",
            head.display(),
            d.join("eagle3/config.json").display()
        ),
    );
}
