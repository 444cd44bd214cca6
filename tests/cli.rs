//! The `specc` binary end to end on the CPU backend.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use safetensors::SafeTensors;

fn specc(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_specc"))
        .args(args)
        .env(
            "SPECC_CACHE_DIR",
            std::env::temp_dir().join("specc-cli-cache"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "specc {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("specc-cli-{name}-{}", std::process::id()))
}

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
    specc(&[
        "compile",
        "-o",
        engine.to_str().unwrap(),
        "--max-context",
        "256",
    ]);
    for f in ["engine.json", "graph.ir", "plan.txt"] {
        assert!(engine.join(f).is_file(), "{f} missing");
    }
    let out = specc(&["inspect", engine.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("parameters:"), "{text}");
    assert!(text.contains("kv cache: 3072 bytes per token"), "{text}");
    assert!(text.contains("attention"), "{text}");
    let direct = specc(&["run", "--prompt", "def f", "--max-tokens", "8"]);
    let via_engine = specc(&[
        "run",
        engine.to_str().unwrap(),
        "--prompt",
        "def f",
        "--max-tokens",
        "8",
    ]);
    assert_eq!(direct.stdout, via_engine.stdout);
}

/// `specc logits` on an HF fixture reproduces the transformers logits.
#[test]
fn logits_match_hf_fixture() {
    for name in ["llama3_scaled_untied", "llama_tied", "qwen3_headdim"] {
        let dir = root().join("tests/fixtures").join(name);
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
            dir.to_str().unwrap(),
            "--ids",
            &ids_arg,
            "--out",
            out_file.to_str().unwrap(),
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
        assert!(Path::new(&root()).join("models/default").join(f).is_file());
    }
}
