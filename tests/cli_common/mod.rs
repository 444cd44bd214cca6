//! What the tests of the `specc` binary share: running it (with a private cache for the
//! embedded model and NVRTC), expecting success or a one-line error, scratch paths and
//! scratch copies of the embedded model to break.
//! (A test crate that includes it declares `mod common;` too.)

#![allow(dead_code)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

/// The binary under test.
pub fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_specc"));
    c.args(args).env(
        "SPECC_CACHE_DIR",
        std::env::temp_dir().join("specc-cli-cache"),
    );
    c
}

/// Runs `specc args...`, asserting success.
pub fn specc(args: &[&str]) -> Output {
    let out = command(args).output().unwrap();
    assert!(
        out.status.success(),
        "specc {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `specc args...` and returns stderr, asserting a non-zero exit with exactly one
/// non-empty stderr line, `error: ...`, and no panic.
pub fn fails(args: &[&str]) -> String {
    let out = command(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "expected failure for {args:?}, stderr: {err}"
    );
    assert!(!err.contains("panicked"), "panic for {args:?}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one error line for {args:?}, got: {err}"
    );
    assert!(lines[0].starts_with("error: "), "{err}");
    err
}

pub fn assert_mentions(err: &str, parts: &[&str]) {
    for p in parts {
        assert!(err.contains(p), "error should mention {p:?}: {err}");
    }
}

/// A scratch path unique to this test process (removed first if it exists).
pub fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("specc-cli-{name}-{}", std::process::id()));
    if p.is_dir() {
        std::fs::remove_dir_all(&p).ok();
    } else if p.exists() {
        std::fs::remove_file(&p).ok();
    }
    p
}

/// Copies directory `from` (recursively) to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("scratch paths are UTF-8")
}

/// A scratch copy of the embedded model's target (config, weights, tokenizer) that a test
/// may break.
pub fn scratch(name: &str) -> PathBuf {
    let dir = tmp(name);
    fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        fs::copy(crate::common::default_model().join(f), dir.join(f)).unwrap();
    }
    dir
}

/// One stored tensor: name, dtype, shape, bytes.
pub type StoredTensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// Rewrites `dir/model.safetensors` through `edit`, which gets its tensors sorted by name.
pub fn rewrite_weights(dir: &Path, edit: impl Fn(&mut Vec<StoredTensor>)) {
    let bytes = fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<StoredTensor> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    edit(&mut tensors);
    let views: HashMap<String, TensorView> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(&views, &None, &dir.join("model.safetensors")).unwrap();
}

/// Sets `key` of the JSON file `path` to `value` (JSON text).
pub fn set_json(path: &Path, key: &str, value: &str) {
    let mut v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
    v[key] = serde_json::from_str(value).unwrap();
    fs::write(path, v.to_string()).unwrap();
}
