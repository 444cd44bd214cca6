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

/// The int4 fixture as Kimi-K2.5 ships it: `KimiK25ForConditionalGeneration` with the text
/// config under `text_config` and `quantization_config` at the top level, tensors under
/// `language_model.`, a vision tower and projector, an int4 MTP layer, and the tensors spread
/// over 40 shards of a `model.safetensors.index.json`: the same logits, the tower, projector
/// and MTP layer skipped with a note.
#[test]
fn kimi_k25_int4_layout_over_many_shards() {
    let dir = k25_sharded("k25_shards");
    check_dir("kimi_k25 int4 sharded", &dir, TOL, false);
    let model = Model::open(&dir).unwrap();
    assert_eq!(model.spec().weight_prefix, "language_model.");
    assert_eq!(
        model.spec().quant.scheme,
        QuantScheme::Int4Pack { group: 32 }
    );
    assert!(model
        .spec()
        .quant
        .formats
        .contains_key("language_model.model.layers.2.mlp.experts.7.down_proj"));
    let note = model
        .checkpoint()
        .note()
        .expect("skipped tensors are noted");
    assert!(note.contains("MTP layers"), "{note}");
    assert!(note.contains("2 × vision tower and projector"), "{note}");
}

/// The Kimi-K2.5 layout of the int4 fixture over 40 shards, in a fresh directory `tag`.
fn k25_sharded(tag: &str) -> PathBuf {
    let src = fixture("deepseek_v3_int4");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hf_parity_quant_{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let obj = text.as_object_mut().unwrap();
    obj.remove("architectures");
    obj.insert("model_type".into(), "kimi_k2".into());
    obj.insert("num_nextn_predict_layers".into(), 1.into());
    let qc = obj.remove("quantization_config").unwrap();
    let dtype = obj.remove("torch_dtype").unwrap();
    let config = serde_json::json!({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "torch_dtype": dtype,
        "quantization_config": qc,
        "text_config": text,
        "vision_config": {"hidden_size": 8},
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut all: Vec<(String, TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .map(|(k, v)| (format!("language_model.{k}"), v))
        .collect();
    // MTP layer 3: an int4 expert projection (checked like any other) and a norm; the
    // vision tower and projector: bf16-like copies under their names.
    let e = "model.layers.1.mlp.experts.0.gate_proj";
    for s in [".weight_packed", ".weight_scale", ".weight_shape"] {
        all.push((
            format!("language_model.model.layers.3.mlp.experts.0.gate_proj{s}"),
            st.tensor(&format!("{e}{s}")).unwrap(),
        ));
    }
    let norm = st.tensor("model.norm.weight").unwrap();
    all.push((
        "language_model.model.layers.3.input_layernorm.weight".into(),
        norm.clone(),
    ));
    all.push(("vision_tower.blocks.0.norm.weight".into(), norm.clone()));
    all.push(("mm_projector.proj.0.weight".into(), norm));
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let shards = 40;
    let per = all.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in all.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", i + 1);
        for (name, _) in chunk {
            weight_map.insert(name.clone(), file.clone().into());
        }
        let data = safetensors::serialize(chunk.iter().cloned(), &None).unwrap();
        std::fs::write(dir.join(&file), data).unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::copy(
        src.join("reference.safetensors"),
        dir.join("reference.safetensors"),
    )
    .unwrap();
    dir
}

/// Streaming visits every tensor once, shard by shard in file order, with byte progress
/// ending at the total; its bytes are the tensors'.
#[test]
fn stream_goes_shard_by_shard() {
    let dir = k25_sharded("k25_stream");
    let model = Model::open(&dir).unwrap();
    let ck = model.checkpoint();
    let names: Vec<&str> = model.graph().weights().map(|(_, n, _)| n).collect();
    let mut seen = Vec::new();
    let mut last = (0u64, 0u64);
    ck.stream::<specc_models::ModelError>(
        &names,
        |n, e, bytes| {
            assert_eq!(bytes, ck.bytes(n).unwrap());
            seen.push((e.file, e.range.start, n.to_string()));
            Ok(())
        },
        |done, total| {
            assert!(done >= last.0 && done <= total);
            last = (done, total);
        },
    )
    .unwrap();
    assert_eq!(seen.len(), names.len());
    assert!(seen.windows(2).all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1)));
    let files: std::collections::BTreeSet<usize> = seen.iter().map(|s| s.0).collect();
    assert!(files.len() >= 30, "{} shards visited", files.len());
    let total: u64 = names
        .iter()
        .map(|n| ck.tensor(n).unwrap().range.len() as u64)
        .sum();
    assert_eq!(last, (total, total));
    let e = ck
        .stream::<specc_models::ModelError>(&["nope"], |_, _, _| Ok(()), |_, _| {})
        .unwrap_err();
    assert!(e.to_string().contains("\"nope\""), "{e}");
}

/// A rank's part of a tensor equals the same part of the whole, for int4 words, fp8, bf16
/// scales and f32; misaligned int4 columns are refused.
#[test]
fn tensor_parts_equal_parts_of_the_whole() {
    use specc_models::checkpoint::scale_part;
    let part_of = |t: &specc_ir::interp::Tensor,
                   rows: std::ops::Range<usize>,
                   cols: std::ops::Range<usize>| {
        let k = t.shape[1];
        let pick = |i: usize| rows.contains(&(i / k)) && cols.contains(&(i % k));
        match &t.data {
            specc_ir::interp::Data::F32(v) => format!(
                "{:?}",
                v.iter()
                    .enumerate()
                    .filter(|(i, _)| pick(*i))
                    .map(|(_, x)| *x)
                    .collect::<Vec<_>>()
            ),
            specc_ir::interp::Data::I64(v) => format!(
                "{:?}",
                v.iter()
                    .enumerate()
                    .filter(|(i, _)| pick(*i))
                    .map(|(_, x)| *x)
                    .collect::<Vec<_>>()
            ),
        }
    };
    let show = |t: &specc_ir::interp::Tensor| match &t.data {
        specc_ir::interp::Data::F32(v) => format!("{v:?}"),
        specc_ir::interp::Data::I64(v) => format!("{v:?}"),
    };
    let int4 = Model::open(fixture("deepseek_v3_int4")).unwrap();
    let fp8 = Model::open(fixture("deepseek_v3_fp8")).unwrap();
    let cases: [(&Model, &str, std::ops::Range<usize>, std::ops::Range<usize>); 5] = [
        (
            &int4,
            "model.layers.1.mlp.experts.2.gate_proj.weight_packed",
            4..20,
            16..48,
        ),
        (
            &int4,
            "model.layers.1.mlp.experts.2.gate_proj.weight_scale",
            4..20,
            1..2,
        ),
        (
            &int4,
            "model.layers.0.self_attn.o_proj.weight",
            0..64,
            32..64,
        ),
        (
            &fp8,
            "model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
            128..144,
            0..160,
        ),
        (
            &fp8,
            "model.layers.1.self_attn.kv_a_proj_with_mqa.weight_scale_inv",
            1..2,
            0..2,
        ),
    ];
    for (m, name, rows, cols) in cases {
        let ck = m.checkpoint();
        let whole = ck.load_f32(name).unwrap();
        let part = ck.load_f32_part(name, rows.clone(), cols.clone()).unwrap();
        assert_eq!(part.dtype, whole.dtype, "{name}");
        assert_eq!(part.shape, vec![rows.len(), cols.len()], "{name}");
        assert_eq!(show(&part), part_of(&whole, rows, cols), "{name}");
    }
    // The scale part of int4 columns 32..64 is group 1; of fp8 rows 128..144, block row 1.
    let i4 = DType::Int4Group { group: 32 };
    assert_eq!(scale_part(i4, [32, 64], 4..20, 32..64), Ok((4..20, 1..2)));
    assert_eq!(
        scale_part(DType::Fp8E4M3, [144, 160], 128..144, 0..160),
        Ok((1..2, 0..2))
    );
    let e = int4
        .checkpoint()
        .load_f32_part(
            "model.layers.1.mlp.experts.2.gate_proj.weight_packed",
            0..4,
            4..12,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiples of 8"), "{e}");
}

/// Random weights for a quantised config take the published layout (int4 routed experts;
/// fp8 every Linear but the router) and run to finite logits.
#[test]
fn random_weights_of_quantised_configs() {
    for (name, want) in [("deepseek_v3_int4", 48), ("deepseek_v3_fp8", 72)] {
        let model = Model::open_random(fixture(name).join("config.json"), 7).unwrap();
        assert_eq!(model.spec().quant.formats.len(), want, "{name}");
        let weights = model.load_weights_f32();
        let (_, logits) = model.logits(&weights, &[1, 2, 3]).unwrap();
        assert!(logits.iter().all(|v| v.is_finite()), "{name}");
    }
}
