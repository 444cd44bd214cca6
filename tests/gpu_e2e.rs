//! The CUDA backend end to end on the device: the same graphs as the CPU backend, compiled to
//! generated kernels and replayed as one captured graph per step. Run with
//! `--features cuda`; without a driver every test prints why it skipped and passes.

#![cfg(feature = "cuda")]

mod common;
mod gpu_common;

use gpu_common::{
    build_engine, build_logits_engine, default_model, drive, fixture, gpu, greedy_cpu,
    hf_reference, rel_l2, rel_l2_f32, session, spread_prompts,
};
use specc_models::{Model, RandomWeights, SpecConfig};
use specc_runtime::DraftKind;

fn prompts(b: usize) -> Vec<Vec<u32>> {
    spread_prompts(b, 5, (37, 11, 3), 300)
}

/// Plain decoding (the engine's k = 0 contract) of `prompts` on the device, KV capacity 256:
/// tokens, graph launches and steps.
fn decode_tokens(target: &Model, prompts: &[Vec<u32>], n: usize) -> (Vec<Vec<u32>>, u64, usize) {
    let (engine, _) = build_engine(target, None, &[prompts.len() as u32], 256);
    let mut s = session(&engine, target, None, prompts.len());
    assert_eq!(s.contract().kind, DraftKind::None);
    let toks = drive(&mut s, prompts, n);
    // Graph launches that are steps (prefills are captured graphs too).
    let launches = s.engine.dev.counters().graph_launches() - s.prefill_replays();
    (toks, launches, s.stats.steps)
}

#[test]
fn decode_matches_cpu_on_every_fixture_and_the_default_model() {
    if !gpu() {
        return;
    }
    let dirs = [
        fixture("llama3_scaled_untied"),
        fixture("llama_tied"),
        fixture("qwen3_headdim"),
        default_model(),
    ];
    for dir in dirs {
        let target = Model::open(&dir).unwrap();
        let ps = prompts(1);
        let n = 32;
        let (got, launches, steps) = decode_tokens(&target, &ps, n);
        assert_eq!(got[0], greedy_cpu(&target, &ps[0], n), "{}", dir.display());
        // One cuGraphLaunch per step.
        assert_eq!(launches as usize, steps, "{}", dir.display());
        eprintln!(
            "{}: 32 tokens identical to the CPU backend; {steps} steps, {launches} graph launches",
            dir.display()
        );
    }
}

#[test]
fn decode_batch4_matches_cpu() {
    if !gpu() {
        return;
    }
    let target = Model::open(fixture("qwen3_headdim")).unwrap();
    let ps = prompts(4);
    let (got, _, _) = decode_tokens(&target, &ps, 16);
    for (b, p) in ps.iter().enumerate() {
        assert_eq!(got[b], greedy_cpu(&target, p, 16), "lane {b}");
    }
}

#[test]
fn prefill_logits_match_hf_transformers() {
    if !gpu() {
        return;
    }
    for name in ["llama3_scaled_untied", "llama_tied", "qwen3_headdim"] {
        let target = Model::open(fixture(name)).unwrap();
        let (ids, want) = hf_reference(&fixture(name));
        let engine = build_logits_engine(&target, 256, None);
        let mut s = session(&engine, &target, None, 1);
        let got = s.prefill_logits(&ids).unwrap();
        assert_eq!(got.len(), want.len());
        let rel = rel_l2(&got, &want);
        eprintln!("{name}: CUDA logits vs HF transformers rel L2 = {rel:.2e}");
        assert!(rel <= 1e-2, "{name}: rel L2 {rel}");
    }
}

/// A spec next to the target (nothing is written) naming `draft` by its absolute path.
fn spec_cfg(target_dir: &std::path::Path, body: &str) -> SpecConfig {
    SpecConfig::from_toml(&target_dir.join("spec.gpu-e2e.toml"), body).unwrap()
}

fn check_draft_model(target_name: &str, draft_name: &str, lanes: usize, k: u64) -> f64 {
    let target = Model::open(fixture(target_name)).unwrap();
    let cfg = spec_cfg(
        &fixture(target_name),
        &format!(
            "method = \"draft_model\"\ndraft = {:?}\nnum_steps = {k}\n",
            fixture(draft_name)
        ),
    );
    let (engine, bundle) = build_engine(&target, Some(&cfg), &[lanes as u32], 256);
    let bundle = bundle.unwrap();
    let mut s = session(&engine, &target, Some(&bundle), lanes);
    assert_eq!(s.contract().kind, DraftKind::Model);
    assert_eq!(s.contract().num_steps, k as usize);
    let ps = prompts(lanes);
    let n = 24;
    let got = drive(&mut s, &ps, n);
    for (b, p) in ps.iter().enumerate() {
        assert_eq!(got[b], greedy_cpu(&target, p, n), "lane {b}");
    }
    assert_eq!(
        (s.engine.dev.counters().graph_launches() - s.prefill_replays()) as usize,
        s.stats.steps
    );
    let mean = s.stats.mean_accept_len();
    eprintln!("{target_name} <- {draft_name} k={k} B={lanes}: exact; mean acceptance {mean:.2}; {} kernels per step graph", s.step_plan().launches.len());
    mean
}

#[test]
fn draft_model_identical_accepts_everything() {
    if !gpu() {
        return;
    }
    let m = check_draft_model("llama3_scaled_untied", "llama3_scaled_untied", 1, 4);
    assert!((m - 5.0).abs() < 1e-9, "{m}");
    check_draft_model("llama3_scaled_untied", "llama3_scaled_untied", 4, 3);
}

#[test]
fn draft_model_unrelated_accepts_almost_nothing() {
    if !gpu() {
        return;
    }
    let m = check_draft_model("llama3_scaled_untied", "qwen3_headdim", 1, 4);
    assert!(m < 1.6, "{m}");
    check_draft_model("llama3_scaled_untied", "qwen3_headdim", 4, 3);
}

#[test]
fn eagle3_head_is_exact() {
    if !gpu() {
        return;
    }
    for lanes in [1, 4] {
        let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
        let cfg = spec_cfg(
            &fixture("llama3_scaled_untied"),
            &format!(
                "method = \"eagle3\"\ndraft = {:?}\nnum_steps = 3\n",
                fixture("eagle3_random")
            ),
        );
        let (engine, bundle) = build_engine(&target, Some(&cfg), &[lanes as u32], 256);
        let bundle = bundle.unwrap();
        let mut s = session(&engine, &target, Some(&bundle), lanes);
        assert!(
            matches!(s.contract().kind, DraftKind::Eagle3 { .. }),
            "{:?}",
            s.contract().kind
        );
        let ps = prompts(lanes);
        let got = drive(&mut s, &ps, 20);
        for (b, p) in ps.iter().enumerate() {
            assert_eq!(got[b], greedy_cpu(&target, p, 20), "eagle lane {b}");
        }
        eprintln!(
            "eagle3 B={lanes}: exact; mean acceptance {:.2}",
            s.stats.mean_accept_len()
        );
    }
}

#[test]
fn llama8b_shaped_first_step_logits_match_cpu() {
    if !gpu() {
        return;
    }
    // Llama-3.1-8B widths with 2 layers (the CPU reference of 32 layers would take minutes).
    let dir = std::env::temp_dir().join("specc-gpu-8b2");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 2, "vocab_size": 128256,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let target = Model::open_random(&dir, 7).unwrap();
    let ids: Vec<u32> = vec![128000, 791, 4062, 14198, 39935, 35308, 927, 279];
    let (_, cpu) = target.logits(&target.load_weights_f32(), &ids).unwrap();
    let engine = build_logits_engine(&target, 1024, Some(RandomWeights::seeded(7)));
    let mut s = session(&engine, &target, None, 1);
    let gpu = s.prefill_logits(&ids).unwrap();
    let rel = rel_l2_f32(&gpu, &cpu);
    eprintln!("8B-shaped (2 layers) logits: CUDA vs CPU interpreter rel L2 = {rel:.2e}");
    assert!(rel < 2e-2, "{rel}");
}

/// A random f32 Llama whose heads are `head_dim` wide, in a fresh directory. f32, so the
/// CUDA and CPU logits agree to ~1e-6 and greedy tokens cannot flip at the near-ties that a
/// random bf16 model's flat logits are full of (the bf16 kernels at these head dims are
/// checked against the interpreter in `kernels-gen`'s `gpu_parity_attn`).
fn random_llama_with_head_dim(head_dim: usize) -> Model {
    let dir = std::env::temp_dir().join(format!("specc-gpu-hd{head_dim}"));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": {head_dim},
        "num_hidden_layers": 2, "vocab_size": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 1024, "tie_word_embeddings": false, "torch_dtype": "float32"}}"#
    );
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    Model::open_random(&dir, 11).unwrap()
}

/// Head dims the split attention kernel once refused (96: "head_dim_v must divide or be a
/// multiple of 128") prefill and decode like the CPU backend: prefill logits within bf16
/// rounding, and plain decoding's tokens identical at B = 1 and 4 (40 is no multiple of 16,
/// so its prefill runs the split kernel at T rows too).
#[test]
fn uncommon_head_dims_match_cpu() {
    if !gpu() {
        return;
    }
    for head_dim in [96, 80, 40] {
        let target = random_llama_with_head_dim(head_dim);
        let ids: Vec<u32> = vec![1, 17, 300, 41, 5, 77, 200, 9];
        let (_, cpu) = target.logits(&target.load_weights_f32(), &ids).unwrap();
        let engine = build_logits_engine(&target, 256, Some(RandomWeights::seeded(11)));
        let mut s = session(&engine, &target, None, 1);
        let gpu = s.prefill_logits(&ids).unwrap();
        let rel = rel_l2_f32(&gpu, &cpu);
        assert!(
            rel < 2e-2,
            "head_dim {head_dim}: prefill logits rel L2 {rel}"
        );
        for b in [1, 4] {
            let ps = prompts(b);
            let (got, _, _) = decode_tokens(&target, &ps, 24);
            for (lane, p) in ps.iter().enumerate() {
                let want = greedy_cpu(&target, p, 24);
                assert_eq!(got[lane], want, "head_dim {head_dim} B={b} lane {lane}");
            }
        }
        eprintln!("head_dim {head_dim}: prefill logits rel L2 {rel:.2e}; decode B=1,4 identical to the CPU backend");
    }
}
