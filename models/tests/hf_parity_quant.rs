//! Quantised checkpoints in the published layouts (`scripts/make_quant_fixtures.py`): the
//! CPU interpreter against transformers run over the exactly dequantised weights, and the
//! one-line errors for checkpoints whose quantised tensors disagree with their config or
//! with each other.
//!
//! - `deepseek_v3_int4`: routed experts compressed-tensors `pack-quantized` int4 g32
//!   (Kimi-K2-Thinking / K2.5).
//! - `deepseek_v3_fp8`: every Linear but the router fp8 e4m3 with 128×128 block scales,
//!   partial edge blocks on most (DeepSeek-V3 / Kimi-K2-Instruct).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use specc_ir::DType;
use specc_models::quant::{QuantScheme, WeightFormat};
use specc_models::Model;

mod reference;
use reference::{check_dir, fixture};

/// Relative L2 error allowed on f32 logits (the weights are dequantised exactly as HF's).
const TOL: f64 = 1e-4;

#[test]
fn deepseek_v3_int4() {
    check_dir("deepseek_v3_int4", &fixture("deepseek_v3_int4"), TOL, true);
    let model = Model::open(fixture("deepseek_v3_int4")).unwrap();
    let q = &model.spec().quant;
    assert_eq!(q.scheme, QuantScheme::Int4Pack { group: 32 });
    // 2 MoE layers × 8 experts × 3 projections; nothing else.
    assert_eq!(q.formats.len(), 48, "{:?}", q.formats.keys());
    assert!(q.formats.values().all(|f| *f
        == WeightFormat::Int4 {
            group: 32,
            scale: DType::BF16
        }));
    let w = model
        .graph()
        .weights()
        .find(|(_, n, _)| *n == "model.layers.1.mlp.experts.3.down_proj.weight_packed")
        .expect("the packed weight is a graph weight");
    assert_eq!(w.2.dtype, DType::Int4Group { group: 32 });
    let note = model.checkpoint().note().expect("weight_shape is noted");
    assert!(note.contains("48 × int4 weight_shape"), "{note}");
}

#[test]
fn deepseek_v3_fp8() {
    check_dir("deepseek_v3_fp8", &fixture("deepseek_v3_fp8"), TOL, true);
    let model = Model::open(fixture("deepseek_v3_fp8")).unwrap();
    let q = &model.spec().quant;
    assert_eq!(q.scheme, QuantScheme::Fp8Block);
    // Per layer: q_a, q_b, kv_a, kv_b, o (5); layer 0 dense MLP (3), layers 1-2 experts
    // 8 × 3 + shared 3.
    assert_eq!(q.formats.len(), 3 * 5 + 3 + 2 * (24 + 3));
    assert!(!q.formats.contains_key("model.layers.1.mlp.gate"));
    // kv_b_proj is sliced per head after the reshape: dequantised in the graph.
    assert!(model
        .graph()
        .nodes()
        .any(|(_, n)| matches!(n.op, specc_ir::Op::Dequantize { .. })));
}

/// One tensor of a checkpoint being edited: dtype, shape, bytes.
type Owned = (Dtype, Vec<usize>, Vec<u8>);

/// A copy of fixture `name` in a fresh directory, its tensors passed through `edit` and its
/// config.json through `edit_config`.
fn variant(
    name: &str,
    tag: &str,
    edit: impl FnOnce(&mut BTreeMap<String, Owned>),
    edit_config: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let src = fixture(name);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hf_parity_quant_{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: BTreeMap<String, Owned> = st
        .tensors()
        .into_iter()
        .map(|(k, v)| (k, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(k, (d, s, b))| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, &None).unwrap(),
    )
    .unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit_config(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        src.join("reference.safetensors"),
        dir.join("reference.safetensors"),
    )
    .unwrap();
    dir
}

/// `weight_shape` stored as i32 instead of i64 is the same model.
#[test]
fn int4_weight_shape_as_i32() {
    let dir = variant(
        "deepseek_v3_int4",
        "shape_i32",
        |t| {
            for (name, v) in t.iter_mut() {
                if name.ends_with(".weight_shape") {
                    let vals: Vec<u8> =
                        v.2.chunks_exact(8)
                            .flat_map(|c| {
                                (i64::from_le_bytes(c.try_into().unwrap()) as i32).to_le_bytes()
                            })
                            .collect();
                    *v = (Dtype::I32, vec![2], vals);
                }
            }
        },
        |_| {},
    );
    check_dir("int4 weight_shape i32", &dir, TOL, false);
}

fn open_err(dir: &Path) -> String {
    match Model::open(dir) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => {
            let e = e.to_string();
            assert_eq!(e.lines().count(), 1, "{e}");
            e
        }
    }
}

fn assert_names(e: &str, parts: &[&str]) {
    for p in parts {
        assert!(e.contains(p), "error `{e}` lacks `{p}`");
    }
}

const EXPERT: &str = "model.layers.2.mlp.experts.5.up_proj";

#[test]
fn int4_scale_of_the_wrong_shape_or_dtype() {
    let dir = variant(
        "deepseek_v3_int4",
        "scale_shape",
        |t| {
            let s = t.get_mut(&format!("{EXPERT}.weight_scale")).unwrap();
            s.1 = vec![16, 4];
            s.2.truncate(16 * 4 * 2);
        },
        |_| {},
    );
    let e = open_err(&dir);
    assert_names(
        &e,
        &[&format!("{EXPERT}.weight_scale"), "[32, 2]", "[16, 4]"],
    );
    let dir = variant(
        "deepseek_v3_int4",
        "scale_dtype",
        |t| {
            let s = t.get_mut(&format!("{EXPERT}.weight_scale")).unwrap();
            s.0 = Dtype::I16;
        },
        |_| {},
    );
    let e = open_err(&dir);
    assert_names(&e, &[&format!("{EXPERT}.weight_scale"), "bf16, f16 or f32"]);
}

#[test]
fn int4_without_its_scale() {
    let dir = variant(
        "deepseek_v3_int4",
        "no_scale",
        |t| {
            t.remove(&format!("{EXPERT}.weight_scale"));
        },
        |_| {},
    );
    let e = open_err(&dir);
    assert_names(
        &e,
        &[&format!("{EXPERT}.weight_scale"), "without its scale"],
    );
}

#[test]
fn int4_group_not_dividing_in_features() {
    let dir = variant(
        "deepseek_v3_int4",
        "group",
        |_| {},
        |c| {
            c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] =
                48.into();
        },
    );
    let e = open_err(&dir);
    assert_names(&e, &["weight_packed", "group size 48", "in-features"]);
}

#[test]
fn int4_packed_words_disagreeing_with_weight_shape() {
    let dir = variant(
        "deepseek_v3_int4",
        "packed_shape",
        |t| {
            let s = t.get_mut(&format!("{EXPERT}.weight_shape")).unwrap();
            s.2 = [32i64, 128].iter().flat_map(|v| v.to_le_bytes()).collect();
        },
        |_| {},
    );
    let e = open_err(&dir);
    assert_names(&e, &[&format!("{EXPERT}.weight_packed"), "i32 [32, 16]"]);
}

#[test]
fn unknown_quantisation_config_fields() {
    for (tag, edit, field) in [
        (
            "method",
            (|c: &mut serde_json::Value| c["quantization_config"]["quant_method"] = "gptq".into())
                as fn(&mut serde_json::Value),
            "quantization_config.quant_method",
        ),
        (
            "format",
            |c| c["quantization_config"]["format"] = "marlin-24".into(),
            "quantization_config.format",
        ),
        (
            "bits",
            |c| {
                c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] =
                    8.into()
            },
            "num_bits",
        ),
    ] {
        let dir = variant("deepseek_v3_int4", tag, |_| {}, edit);
        let e = open_err(&dir);
        assert_names(&e, &["config.json", field]);
    }
}

#[test]
fn quantised_tensors_without_a_config() {
    let dir = variant(
        "deepseek_v3_int4",
        "no_config",
        |_| {},
        |c| {
            c.as_object_mut().unwrap().remove("quantization_config");
        },
    );
    let e = open_err(&dir);
    assert_names(&e, &["quantization_config", "weight_packed"]);
}

#[test]
fn experts_of_a_layer_in_mixed_formats() {
    // Expert 5's up_proj stored as plain f32 (its dequantised values) while the others are
    // int4: the experts of a layer are stacked, one format per projection.
    let dir = variant(
        "deepseek_v3_int4",
        "mixed",
        |t| {
            for s in [".weight_packed", ".weight_scale", ".weight_shape"] {
                t.remove(&format!("{EXPERT}{s}"));
            }
            t.insert(
                format!("{EXPERT}.weight"),
                (Dtype::F32, vec![32, 64], vec![0u8; 32 * 64 * 4]),
            );
        },
        |_| {},
    );
    let e = open_err(&dir);
    assert_names(&e, &[EXPERT, "expert 0", "int4g32"]);
}

#[test]
fn fp8_scale_of_the_wrong_shape_or_dtype() {
    // kv_a_proj_with_mqa [144, 160]: scale [2, 2] (both axes end in a partial block).
    let kv_a = "model.layers.1.self_attn.kv_a_proj_with_mqa";
    let dir = variant(
        "deepseek_v3_fp8",
        "fp8_scale_shape",
        |t| {
            let s = t.get_mut(&format!("{kv_a}.weight_scale_inv")).unwrap();
            s.1 = vec![1, 2];
            s.2.truncate(8);
        },
        |_| {},
    );
    let e = open_err(&dir);
    assert_names(
        &e,
        &[&format!("{kv_a}.weight_scale_inv"), "f32 [2, 2]", "[1, 2]"],
    );
    let dir = variant(
        "deepseek_v3_fp8",
        "fp8_scale_dtype",
        |t| {
            let s = t.get_mut(&format!("{kv_a}.weight_scale_inv")).unwrap();
            s.0 = Dtype::BF16;
            s.2.truncate(8);
        },
        |_| {},
    );
    let e = open_err(&dir);
    assert_names(
        &e,
        &[&format!("{kv_a}.weight_scale_inv"), "f32 [2, 2]", "bf16"],
    );
    let dir = variant(
        "deepseek_v3_fp8",
        "fp8_no_scale",
        |t| {
            t.remove(&format!("{kv_a}.weight_scale_inv"));
        },
        |_| {},
    );
    let e = open_err(&dir);
    assert_names(&e, &[&format!("{kv_a}.weight_scale_inv"), "no such tensor"]);
}

#[test]
fn fp8_block_size_other_than_128() {
    let dir = variant(
        "deepseek_v3_fp8",
        "fp8_block",
        |_| {},
        |c| c["quantization_config"]["weight_block_size"] = serde_json::json!([64, 64]),
    );
    let e = open_err(&dir);
    assert_names(&e, &["quantization_config.weight_block_size", "[128, 128]"]);
}
