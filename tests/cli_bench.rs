//! `specc bench` argument errors through the binary: each exits non-zero with an `error:` line
//! naming the flag, before any device is touched, and never panics.

use std::process::Command;

mod common;

use common::repo_path;

/// Runs `specc bench args...`, asserts failure without a panic, returns stderr.
fn bench_fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_specc"))
        .arg("bench")
        .args(args)
        .current_dir(repo_path("."))
        .env(
            "SPECC_CACHE_DIR",
            std::env::temp_dir().join("specc-cli-cache"),
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "expected failure for {args:?}, stderr: {err}"
    );
    assert!(!err.contains("panicked"), "panic for {args:?}: {err}");
    assert!(err.starts_with("error: "), "{err}");
    err
}

const CONFIG: &str = "bench/configs/llama-3.1-8b/config.json";

#[test]
fn compare_without_cuda_backend_says_so() {
    if cfg!(feature = "cuda") {
        specc_ir::testing::skip(
            "this build has the CUDA backend (the device run covers --compare)",
        );
        return;
    }
    let err = bench_fails(&[CONFIG, "--random-weights", "--compare"]);
    assert!(err.contains("built without CUDA support"), "{err}");
    assert!(err.contains("--features cuda"), "{err}");
    assert!(err.contains("--compare"), "{err}");
    let suite = bench_fails(&[CONFIG, "--random-weights", "--suite"]);
    assert!(suite.contains("built without CUDA support"), "{suite}");
}

#[test]
fn too_few_iterations() {
    let err = bench_fails(&[CONFIG, "--random-weights", "--compare", "--iters", "5"]);
    assert!(
        err.contains("--iters: expected at least 10, found 5"),
        "{err}"
    );
}

#[test]
fn unknown_torch_mode() {
    let err = bench_fails(&[
        CONFIG,
        "--random-weights",
        "--compare",
        "--torch-modes",
        "eager,fast",
    ]);
    assert!(
        err.contains("--torch-modes eager,fast: expected a comma-separated subset of eager,graph,compile,compile-layers"),
        "{err}"
    );
}

#[test]
fn torch_modes_need_compare() {
    let err = bench_fails(&[CONFIG, "--random-weights", "--torch-modes", "eager"]);
    assert!(err.contains("--compare"), "{err}");
}

#[test]
fn suite_fixes_the_shapes() {
    for flag in [["--tokens", "8"], ["--batch", "4"], ["--context", "512"]] {
        let err = bench_fails(&[CONFIG, "--random-weights", "--suite", flag[0], flag[1]]);
        assert!(
            err.contains("cannot be used with") && err.contains(flag[0]),
            "{err}"
        );
    }
}

#[test]
fn zero_tokens_or_batch() {
    let err = bench_fails(&[CONFIG, "--random-weights", "--compare", "--tokens", "0"]);
    assert!(err.contains("--tokens: expected at least 1"), "{err}");
    let err = bench_fails(&[CONFIG, "--random-weights", "--batch", "0"]);
    assert!(err.contains("--batch: expected at least 1"), "{err}");
}

#[test]
fn missing_spec_file_is_named() {
    let err = bench_fails(&[
        CONFIG,
        "--random-weights",
        "--compare",
        "--spec",
        "bench/configs/nope.toml",
    ]);
    assert!(err.contains("nope.toml"), "{err}");
}
