//! Bad DeepSeek-V3 / Kimi-K2 inputs fail with one line naming the file and the field or
//! tensor (issue 19 item 8): routing parameters that cannot work, zero ranks, rope dims that
//! do not add up, missing expert tensors, a bias of the wrong length.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use serde_json::{json, Value};
use specc_models::{Model, ModelSpec};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deepseek_v3_qlora")
}

fn base_config() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap()).unwrap()
}

/// The error of resolving the fixture's config with `edit` applied.
fn config_error(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
    let mut cfg = base_config();
    edit(cfg.as_object_mut().unwrap());
    let err = ModelSpec::from_json(Path::new("dsv3/config.json"), &cfg.to_string())
        .expect_err("the config is invalid")
        .to_string();
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(
        err.starts_with("dsv3/config.json: "),
        "names the file: {err}"
    );
    err
}

#[track_caller]
fn assert_names(err: &str, field: &str) {
    assert!(
        err.contains(&format!("field \"{field}\"")),
        "names {field}: {err}"
    );
}

#[test]
fn routing_parameters_that_cannot_work() {
    let e = config_error(|c| {
        c.insert("num_experts_per_tok".into(), json!(9));
    });
    assert_names(&e, "num_experts_per_tok");
    assert!(e.contains("at most n_routed_experts (8)"), "{e}");

    let e = config_error(|c| {
        c.insert("n_group".into(), json!(3));
    });
    assert_names(&e, "n_group");
    assert!(e.contains("a divisor of n_routed_experts (8)"), "{e}");

    let e = config_error(|c| {
        c.insert("topk_group".into(), json!(5));
    });
    assert_names(&e, "topk_group");
    assert!(e.contains("at most n_group (4)"), "{e}");

    // 2 kept groups of 2 experts cannot supply 5 experts.
    let e = config_error(|c| {
        c.insert("num_experts_per_tok".into(), json!(5));
    });
    assert_names(&e, "num_experts_per_tok");

    let e = config_error(|c| {
        c.insert("scoring_func".into(), json!("softmax"));
    });
    assert_names(&e, "scoring_func");
}

#[test]
fn zero_ranks_and_sizes() {
    for field in [
        "kv_lora_rank",
        "q_lora_rank",
        "qk_rope_head_dim",
        "qk_nope_head_dim",
        "v_head_dim",
        "n_routed_experts",
        "moe_intermediate_size",
    ] {
        let e = config_error(|c| {
            c.insert(field.into(), json!(0));
        });
        assert_names(&e, field);
    }
    let e = config_error(|c| {
        c.remove("q_lora_rank");
    });
    assert_names(&e, "q_lora_rank");
    assert!(e.contains("or null"), "{e}");
}

#[test]
fn rope_dims_that_do_not_add_up() {
    let e = config_error(|c| {
        c.insert("qk_head_dim".into(), json!(25));
    });
    assert_names(&e, "qk_head_dim");
    assert!(e.contains("16 + 8 = 24"), "{e}");
    let e = config_error(|c| {
        c.insert("head_dim".into(), json!(24));
    });
    assert_names(&e, "head_dim");
    let e = config_error(|c| {
        c.insert("qk_rope_head_dim".into(), json!(7));
        c.remove("head_dim");
        c.remove("qk_head_dim");
    });
    assert_names(&e, "qk_rope_head_dim");
    let e = config_error(|c| {
        c.insert("num_key_value_heads".into(), json!(2));
    });
    assert_names(&e, "num_key_value_heads");
    let e = config_error(|c| {
        c["rope_scaling"]["factor"] = json!(-1.0);
    });
    assert_names(&e, "rope_scaling.factor");
    let e = config_error(|c| {
        c["rope_scaling"]["truncate"] = json!(false);
    });
    assert_names(&e, "rope_scaling.truncate");
}

#[test]
fn kimi_k25_errors_name_text_config() {
    let mut text = base_config();
    text.as_object_mut()
        .unwrap()
        .insert("n_group".into(), json!(3));
    let cfg = json!({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": text,
    });
    let err = ModelSpec::from_json(Path::new("k25/config.json"), &cfg.to_string())
        .unwrap_err()
        .to_string();
    assert!(err.contains("k25/config.json"), "{err}");
    assert_names(&err, "text_config.n_group");
    let cfg = json!({"architectures": ["KimiK25ForConditionalGeneration"]});
    let err = ModelSpec::from_json(Path::new("k25/config.json"), &cfg.to_string())
        .unwrap_err()
        .to_string();
    assert_names(&err, "text_config");
}

/// A copy of the fixture in a fresh directory with its tensors edited by `edit`; the error of
/// opening it.
fn checkpoint_error(
    name: &str,
    edit: impl FnOnce(&mut BTreeMap<String, TensorView<'_>>),
) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deepseek_errors_{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture().join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: BTreeMap<String, TensorView> = st.tensors().into_iter().collect();
    edit(&mut tensors);
    let out = safetensors::serialize(tensors, &None).unwrap();
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
    let err = match Model::open(&dir) {
        Ok(_) => panic!("{name}: the checkpoint is invalid"),
        Err(e) => e.to_string(),
    };
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(err.contains("model.safetensors"), "names the file: {err}");
    err
}

#[test]
fn missing_or_misshapen_tensors() {
    let e = checkpoint_error("expert", |t| {
        t.remove("model.layers.2.mlp.experts.5.up_proj.weight");
    });
    assert!(
        e.contains("\"model.layers.2.mlp.experts.5.up_proj.weight\""),
        "{e}"
    );
    assert!(e.contains("no such tensor"), "{e}");
    let e = checkpoint_error("shared", |t| {
        t.remove("model.layers.1.mlp.shared_experts.down_proj.weight");
    });
    assert!(
        e.contains("\"model.layers.1.mlp.shared_experts.down_proj.weight\""),
        "{e}"
    );
    let e = checkpoint_error("bias", |t| {
        // The first 4 of the 8 bias values.
        let v = t["model.layers.1.mlp.gate.e_score_correction_bias"].clone();
        let short = TensorView::new(v.dtype(), vec![4], &v.data()[..16]).unwrap();
        t.insert(
            "model.layers.1.mlp.gate.e_score_correction_bias".into(),
            short,
        );
    });
    assert!(
        e.contains("\"model.layers.1.mlp.gate.e_score_correction_bias\""),
        "{e}"
    );
    assert!(e.contains("[8]"), "states the expected length: {e}");
    let e = checkpoint_error("extra_expert", |t| {
        let v = t["model.layers.1.mlp.experts.0.up_proj.weight"].clone();
        t.insert("model.layers.1.mlp.experts.8.up_proj.weight".into(), v);
    });
    assert!(e.contains("experts.8.up_proj.weight"), "{e}");
}
