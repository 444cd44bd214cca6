//! spec.toml parsing and validation: every bad key or inconsistent value is a one-line
//! error naming the file and the key.

use std::path::{Path, PathBuf};

use specc_models::methods::eagle3::Eagle3Spec;
use specc_models::{Acceptance, Method, Model, SpecBundle, SpecConfig};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn parse(text: &str) -> Result<SpecConfig, String> {
    SpecConfig::from_toml(Path::new("/cfg/spec.toml"), text).map_err(|e| e.to_string())
}

#[test]
fn a_full_spec_resolves() {
    let s = parse(
        r#"
method = "eagle3"
draft = "heads/eagle"
num_steps = 7
batch_buckets = [4, 1, 2, 4]
max_context = 2048
[acceptance]
mode = "sample"
temperature = 0.7
top_p = 1.0
seed = 42
"#,
    )
    .unwrap();
    assert_eq!(s.method, Method::Eagle3);
    assert_eq!(s.draft.as_deref(), Some(Path::new("/cfg/heads/eagle")));
    assert_eq!(s.batch_buckets, vec![1, 2, 4]);
    assert_eq!(
        s.acceptance,
        Acceptance::Sample {
            temperature: 0.7,
            top_k: None,
            top_p: 1.0,
            seed: 42
        }
    );
}

#[test]
fn top_k_and_top_p_resolve() {
    let s = parse("method = \"none\"\n[acceptance]\nmode = \"sample\"\ntop_k = 40\ntop_p = 0.9")
        .unwrap();
    assert_eq!(
        s.acceptance,
        Acceptance::Sample {
            temperature: 1.0,
            top_k: Some(40),
            top_p: 0.9,
            seed: 0
        }
    );
}

#[test]
fn greedy_is_the_default_and_none_needs_no_draft() {
    let s = parse("method = \"none\"").unwrap();
    assert_eq!(s.acceptance, Acceptance::Greedy);
    assert_eq!(s.num_steps, 0);
}

fn err(text: &str, parts: &[&str]) {
    let e = parse(text).unwrap_err();
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("spec.toml"), "{e}");
    for p in parts {
        assert!(e.contains(p), "`{e}` should mention {p:?}");
    }
}

#[test]
fn unknown_keys_are_errors() {
    err(
        "method = \"draft_model\"\ndraft = \"d\"\nnum_step = 3",
        &["num_step", "line 3"],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\n[acceptance]\nmode = \"greedy\"\ntemp = 1",
        &["temp"],
    );
}

#[test]
fn bad_values_name_their_key() {
    err("method = \"medusa\"", &["medusa"]);
    err("method = \"draft_model\"", &["draft"]);
    err(
        "method = \"draft_model\"\ndraft = \"d\"\nnum_steps = 0",
        &["num_steps", "1..="],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\nnum_steps = 99",
        &["num_steps"],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\nbatch_buckets = []",
        &["batch_buckets"],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\nbatch_buckets = [0]",
        &["batch_buckets"],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\nmax_context = 4",
        &["max_context"],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\n[acceptance]\nmode = \"sample\"\ntemperature = 0",
        &["acceptance.temperature"],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\n[acceptance]\nmode = \"greedy\"\ntemperature = 0.5",
        &["acceptance.temperature", "greedy"],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\n[acceptance]\nmode = \"sample\"\ntop_p = 1.5",
        &["acceptance.top_p"],
    );
    err("method = \"none\"\ndraft = \"d\"", &["draft", "none"]);
    err(
        "method = \"draft_model\"\ndraft = \"d\"\n[acceptance]\nmode = \"sample\"\ntop_p = 0",
        &["acceptance.top_p", "(0, 1]"],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\n[acceptance]\nmode = \"sample\"\ntop_k = 0",
        &["acceptance.top_k", ">= 1"],
    );
    err(
        "method = \"draft_model\"\ndraft = \"d\"\n[acceptance]\nmode = \"greedy\"\ntop_k = 5",
        &["acceptance.top_k", "greedy"],
    );
}

#[test]
fn draft_with_another_vocabulary_is_rejected() {
    let target = Model::open(fixtures().join("llama3_scaled_untied")).unwrap();
    let dir = fixtures().join("llama_tied");
    let cfg = SpecConfig::from_toml(
        Path::new("/x/spec.toml"),
        &format!("method = \"draft_model\"\ndraft = \"{}\"", dir.display()),
    )
    .unwrap();
    let e = SpecBundle::open(&target, &cfg).err().unwrap().to_string();
    assert!(
        e.contains("spec.toml") && e.contains("draft") && e.contains("vocab"),
        "{e}"
    );
}

fn eagle_config(edit: impl Fn(&mut serde_json::Value)) -> String {
    let text = std::fs::read_to_string(fixtures().join("eagle3_random/config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    v.to_string()
}

#[test]
fn eagle_head_must_match_the_target() {
    let target = Model::open(fixtures().join("llama3_scaled_untied")).unwrap();
    let file = Path::new("/h/config.json");
    let e = Eagle3Spec::from_json(
        file,
        &eagle_config(|v| v["hidden_size"] = 32.into()),
        target.spec(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("hidden_size") && e.contains("64"), "{e}");
    let e = Eagle3Spec::from_json(
        file,
        &eagle_config(|v| {
            v["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = serde_json::json!([0, 1, 2])
        }),
        target.spec(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("eagle_aux_hidden_state_layer_ids") && e.contains("0..2"),
        "{e}"
    );
    let e = Eagle3Spec::from_json(
        file,
        &eagle_config(|v| v["architectures"] = serde_json::json!(["LlamaForCausalLM"])),
        target.spec(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("architectures") && e.contains("LlamaForCausalLMEagle3"),
        "{e}"
    );
}

#[test]
fn eagle_default_taps_when_absent() {
    let target = Model::open(fixtures().join("llama3_scaled_untied")).unwrap();
    let text = eagle_config(|v| {
        v.as_object_mut().unwrap().remove("eagle_config");
    });
    let e = Eagle3Spec::from_json(Path::new("/h/config.json"), &text, target.spec()).unwrap();
    assert_eq!(e.taps, specc_models::methods::eagle3::default_taps(2));
    assert_eq!(
        specc_models::methods::eagle3::default_taps(32),
        vec![1, 15, 28]
    );
}
