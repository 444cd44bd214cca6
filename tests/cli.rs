//! The `specc` binary end to end on the CPU backend.

use safetensors::SafeTensors;

mod cli_common;
mod common;

use cli_common::{s as path_str, specc, tmp};
use common::{default_model, fixture};

#[test]
fn run_the_embedded_default() {
    let out = specc(&["run", "--prompt", "Hello", "--max-tokens", "12"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Hello"), "{text}");
    assert!(text.len() > "Hello".len(), "no generated text: {text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tok/s"), "{err}");
}

#[test]
fn compile_inspect_and_run_an_engine() {
    let engine = tmp("engine");
    specc(&["compile", "-o", path_str(&engine), "--max-context", "256"]);
    for f in ["engine.json", "plan.txt"] {
        assert!(engine.join(f).is_file(), "{f} missing");
    }
    // Every cubin the manifest lists lies beside it.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(engine.join("engine.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["max_context"], 256);
    // Every bucket plan states its physical floor beside the plan's own bytes.
    let plan = std::fs::read_to_string(engine.join("plan.txt")).unwrap();
    let plans = plan.lines().filter(|l| l.starts_with("== ")).count();
    let floors = plan
        .lines()
        .filter(|l| l.starts_with("physical floor at a full context: "))
        .count();
    assert_eq!(floors, plans, "{plan}");
    for m in manifest["modules"].as_array().unwrap() {
        for c in m["cubins"].as_array().unwrap() {
            let f = c["file"].as_str().unwrap();
            assert!(f.starts_with("kernels/") && f.ends_with(".cubin"), "{f}");
            assert!(engine.join(f).is_file(), "{f} missing");
        }
    }
    let out = specc(&["inspect", path_str(&engine)]);
    let text = String::from_utf8_lossy(&out.stdout);
    for part in [
        "architecture: LlamaForCausalLM",
        "max context: 256",
        "parameters:",
        "kv cache: 3072 bytes per token",
        "attention",
    ] {
        assert!(text.contains(part), "inspect should print {part:?}: {text}");
    }
    let direct = specc(&["run", "--prompt", "def f", "--max-tokens", "8"]);
    let via_engine = specc(&[
        "run",
        path_str(&engine),
        "--prompt",
        "def f",
        "--max-tokens",
        "8",
    ]);
    assert_eq!(direct.stdout, via_engine.stdout);
    std::fs::remove_dir_all(&engine).ok();
}

/// `specc logits` on an HF fixture reproduces the transformers logits (quantised checkpoints
/// included: streamed shard by shard, dequantised by the interpreter).
#[test]
fn logits_match_hf_fixture() {
    for name in [
        "llama3_scaled_untied",
        "llama_tied",
        "qwen3_headdim",
        "deepseek_v3_int4",
        "deepseek_v3_fp8",
    ] {
        let dir = fixture(name);
        let reference = std::fs::read(dir.join("reference.safetensors")).unwrap();
        let reference = SafeTensors::deserialize(&reference).unwrap();
        let ids: Vec<i64> = [
            reference.tensor("prompt_ids").unwrap(),
            reference.tensor("greedy_ids").unwrap(),
        ]
        .iter()
        .flat_map(|t| {
            t.data()
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>()
        })
        .collect();
        let ids_arg = ids
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let out_file = tmp(&format!("logits-{name}.safetensors"));
        specc(&[
            "logits",
            path_str(&dir),
            "--ids",
            &ids_arg,
            "--out",
            path_str(&out_file),
        ]);
        let got = std::fs::read(&out_file).unwrap();
        let got = SafeTensors::deserialize(&got).unwrap();
        let got = got.tensor("logits").unwrap();
        let want = reference.tensor("logits").unwrap();
        assert_eq!(got.shape(), want.shape());
        let f = |d: &[u8]| {
            d.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect::<Vec<_>>()
        };
        let (g, w) = (f(got.data()), f(want.data()));
        let num: f64 = g.iter().zip(&w).map(|(a, b)| (a - b).powi(2)).sum();
        let den: f64 = w.iter().map(|b| b * b).sum();
        let rel = (num / den).sqrt();
        assert!(rel <= 1e-4, "{name}: rel L2 {rel}");
    }
}

#[test]
fn default_model_files_exist() {
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(default_model().join(f).is_file(), "{f}");
    }
}
