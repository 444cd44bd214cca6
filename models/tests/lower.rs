//! Structure of the lowered dense graph: its interface and the weights it names.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use specc_ir::op::{B, CTX, T};
use specc_ir::{DType, Dim, Op, TensorType};
use specc_models::{lower_dense, ModelSpec};

fn spec(text: &str) -> ModelSpec {
    ModelSpec::from_json(Path::new("config.json"), text).unwrap()
}

fn weights(text: &str) -> BTreeMap<String, TensorType> {
    let g = lower_dense(&spec(text)).unwrap();
    g.weights()
        .map(|(_, n, t)| (n.to_string(), t.clone()))
        .collect()
}

fn st(dtype: DType, d: &[u64]) -> TensorType {
    TensorType::new(dtype, d.iter().map(|&n| Dim::Static(n)))
}

#[test]
fn interface() {
    let s = spec(&common::tiny_llama_config(false, "bfloat16"));
    let g = lower_dense(&s).unwrap();
    let ids = TensorType::new(DType::I32, [B, T]);
    let inputs: Vec<_> = g
        .inputs()
        .map(|(_, n, t)| (n.to_string(), t.clone()))
        .collect();
    assert_eq!(
        inputs,
        vec![
            ("tokens".into(), ids.clone()),
            ("positions".into(), ids.clone())
        ]
    );
    let cache = TensorType::new(DType::BF16, [B, CTX, Dim::Static(2), Dim::Static(8)]);
    let states: Vec<_> = g
        .states()
        .map(|(_, n, t)| (n.to_string(), t.clone()))
        .collect();
    assert_eq!(
        states,
        vec![
            ("kv.0.k".into(), cache.clone()),
            ("kv.0.v".into(), cache.clone()),
            ("kv.1.k".into(), cache.clone()),
            ("kv.1.v".into(), cache),
        ]
    );
    let logits = g.output("logits").unwrap();
    assert_eq!(
        g.ty(logits),
        &TensorType::new(DType::F32, [B, T, Dim::Static(64)])
    );
    assert_eq!(g.ty(g.output("next_token").unwrap()), &ids);
    assert_eq!(g.outputs().len(), 2);
    let kv_writes = g.nodes().filter(|(_, n)| n.op == Op::KvWrite).count();
    assert_eq!(kv_writes, 4);
}

#[test]
fn llama_weights_untied_and_tied() {
    let w = weights(&common::tiny_llama_config(false, "float32"));
    let f = DType::F32;
    let mut want = BTreeMap::from([
        ("model.embed_tokens.weight".to_string(), st(f, &[64, 32])),
        ("model.norm.weight".into(), st(f, &[32])),
        ("lm_head.weight".into(), st(f, &[64, 32])),
    ]);
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for (n, shape) in [
            ("input_layernorm", &[32u64][..]),
            ("post_attention_layernorm", &[32]),
            ("self_attn.q_proj", &[32, 32]),
            ("self_attn.k_proj", &[16, 32]),
            ("self_attn.v_proj", &[16, 32]),
            ("self_attn.o_proj", &[32, 32]),
            ("mlp.gate_proj", &[48, 32]),
            ("mlp.up_proj", &[48, 32]),
            ("mlp.down_proj", &[32, 48]),
        ] {
            want.insert(format!("{p}.{n}.weight"), st(f, shape));
        }
    }
    assert_eq!(w, want);
    let tied = weights(&common::tiny_llama_config(true, "float32"));
    want.remove("lm_head.weight");
    assert_eq!(tied, want);
}

#[test]
fn qwen3_weights_use_head_dim() {
    // Qwen3-0.6B-like widths at 2 layers: 16 heads x 128 != hidden 1024.
    let text = r#"{
      "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 1024,
      "intermediate_size": 3072, "max_position_embeddings": 40960, "num_attention_heads": 16,
      "num_hidden_layers": 2, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
      "vocab_size": 151936
    }"#;
    let w = weights(text);
    let b = DType::BF16;
    let p = "model.layers.1.self_attn";
    assert_eq!(w[&format!("{p}.q_proj.weight")], st(b, &[2048, 1024]));
    assert_eq!(w[&format!("{p}.k_proj.weight")], st(b, &[1024, 1024]));
    assert_eq!(w[&format!("{p}.o_proj.weight")], st(b, &[1024, 2048]));
    assert_eq!(w[&format!("{p}.q_norm.weight")], st(b, &[128]));
    assert_eq!(w[&format!("{p}.k_norm.weight")], st(b, &[128]));
    assert!(!w.contains_key("lm_head.weight"));
    assert_eq!(w.len(), 2 + 2 * 11);
}

#[test]
fn rope_and_attention_parameters() {
    let text = common::tiny_llama_config(false, "float32").replace(
        "\"rope_scaling\": null",
        r#""rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}"#,
    );
    let s = spec(&text);
    let g = lower_dense(&s).unwrap();
    let ropes: Vec<_> = g
        .nodes()
        .filter_map(|(_, n)| match &n.op {
            Op::Rope {
                theta,
                scaling,
                style,
                rotary_dim,
            } => Some((*theta, scaling.clone(), *style, *rotary_dim)),
            _ => None,
        })
        .collect();
    assert_eq!(ropes.len(), 4, "q and k in each of 2 layers");
    for r in &ropes {
        assert_eq!(
            r,
            &(
                10000.0,
                s.rope_scaling.clone(),
                specc_ir::RopeStyle::Half,
                8
            )
        );
    }
    for (_, n) in g.nodes() {
        if let Op::Attention { scale, mask } = &n.op {
            assert_eq!(*scale, 1.0 / 8f64.sqrt());
            assert_eq!(*mask, specc_ir::AttnMask::Causal);
        }
    }
}

/// Lowering is linear in the layer count: 10 000 layers (a config no checkpoint would
/// pass, lowered straight from the config) lower and verify well under a second on an
/// idle machine; the bound leaves room for a loaded CI machine.
#[test]
fn ten_thousand_layers_lower_in_linear_time() {
    let mut times = Vec::new();
    for layers in [1_000, 4_000, 10_000] {
        let text = common::tiny_llama_config(false, "bfloat16").replace(
            "\"num_hidden_layers\": 2",
            &format!("\"num_hidden_layers\": {layers}"),
        );
        let s = spec(&text);
        let t = std::time::Instant::now();
        let g = lower_dense(&s).unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(g.states().count(), 2 * layers);
        println!(
            "lower_dense, {layers} layers ({} nodes): {secs:.3} s",
            g.len()
        );
        times.push(secs);
    }
    assert!(times[2] < 5.0, "10 000 layers took {:.1} s", times[2]);
}
