//! Engines through the `specc` binary on the CPU backend: `specc compile` of a model with a
//! spec writes an engine that `specc run` executes with the same output as running the
//! model directory with that spec; and an engine that is damaged, from another specc, short
//! of a cubin, or built from a checkpoint that has since changed is refused with one
//! `error:` line naming the file, never a panic.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

mod cli_common;
mod common;

use cli_common::{assert_mentions, copy_dir, fails, s, specc, tmp};
use common::default_model;

const PROMPT: &str = "def __init__(self";
/// KV slots of the engines here (small: fewer prefill plans to build).
const CTX: &str = "128";

fn run_args(what: &str) -> Vec<&str> {
    vec!["run", what, "--prompt", PROMPT, "--max-tokens", "16"]
}

/// The default model with its spec.toml compiled once for this test process.
fn spec_engine() -> &'static Path {
    static E: OnceLock<PathBuf> = OnceLock::new();
    E.get_or_init(|| {
        let e = tmp("spec-engine");
        let model = default_model();
        specc(&[
            "compile",
            s(&model),
            "--spec",
            s(&model.join("spec.toml")),
            "--max-context",
            CTX,
            "-o",
            s(&e),
        ]);
        e
    })
}

/// A private copy of the spec engine a test may break.
fn engine_copy(name: &str) -> PathBuf {
    let dir = tmp(name);
    copy_dir(spec_engine(), &dir);
    dir
}

fn manifest(engine: &Path) -> serde_json::Value {
    serde_json::from_str(&fs::read_to_string(engine.join("engine.json")).unwrap()).unwrap()
}

fn write_manifest(engine: &Path, v: &serde_json::Value) {
    fs::write(
        engine.join("engine.json"),
        serde_json::to_string_pretty(v).unwrap(),
    )
    .unwrap();
}

/// The cubin files the engine lists (none when NVRTC was unavailable at compile time).
fn cubins(engine: &Path) -> Vec<String> {
    manifest(engine)["modules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["cubins"].as_array().unwrap().iter())
        .map(|c| c["file"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_compiled_spec_engine_runs_like_the_model_with_its_spec() {
    let model = default_model();
    let e = spec_engine();
    for f in ["engine.json", "plan.txt"] {
        assert!(e.join(f).is_file(), "{f} missing");
    }
    for f in cubins(e) {
        assert!(e.join(&f).is_file(), "{f} missing");
    }
    let m = manifest(e);
    assert_eq!(m["spec"]["method"], "draft_model", "{}", m["spec"]);
    let via_engine = specc(&run_args(s(e)));
    let spec = model.join("spec.toml");
    let mut direct = run_args(s(&model));
    direct.extend(["--spec", s(&spec), "--max-context", CTX]);
    let direct = specc(&direct);
    let (a, b) = (
        String::from_utf8_lossy(&via_engine.stdout),
        String::from_utf8_lossy(&direct.stdout),
    );
    assert!(a.starts_with(PROMPT) && a.len() > PROMPT.len() + 1, "{a}");
    assert_eq!(a, b, "engine vs model directory + spec");
    for err in [&via_engine.stderr, &direct.stderr] {
        let err = String::from_utf8_lossy(err);
        assert!(err.contains("draft_model k=5"), "{err}");
        assert!(err.contains("mean acceptance length"), "{err}");
    }
    // The engine carries its spec: another one is refused, naming the flag.
    let mut again = run_args(s(e));
    again.extend(["--spec", s(&spec)]);
    assert_mentions(&fails(&again), &["--spec"]);
}

#[test]
fn a_damaged_manifest_is_refused() {
    let e = engine_copy("damaged-json");
    let json = fs::read_to_string(e.join("engine.json")).unwrap();
    fs::write(e.join("engine.json"), &json[..json.len() / 2]).unwrap();
    let err = fails(&run_args(s(&e)));
    assert_mentions(&err, &[s(&e.join("engine.json"))]);
    // Valid JSON that is no engine: a field missing.
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v.as_object_mut().unwrap().remove("plans");
    write_manifest(&e, &v);
    assert_mentions(&fails(&run_args(s(&e))), &[s(&e.join("engine.json"))]);
    fs::remove_dir_all(&e).ok();
}

#[test]
fn an_engine_of_another_format_or_specc_is_refused() {
    let e = engine_copy("versions");
    let v = manifest(&e);
    let mut other = v.clone();
    let fv = other["format_version"].as_u64().unwrap();
    other["format_version"] = (fv + 1).into();
    write_manifest(&e, &other);
    let err = fails(&run_args(s(&e)));
    assert_mentions(&err, &[s(&e.join("engine.json")), "format_version"]);

    let mut other = v.clone();
    other["specc_version"] = "0.0.0-other".into();
    write_manifest(&e, &other);
    let err = fails(&run_args(s(&e)));
    assert_mentions(&err, &[s(&e.join("engine.json")), "specc_version"]);
    fs::remove_dir_all(&e).ok();
}

#[test]
fn a_missing_or_altered_cubin_is_refused() {
    let e = engine_copy("cubins");
    let files = cubins(&e);
    let Some(file) = files.first() else {
        specc_ir::testing::skip(
            "the engine lists no cubins (NVRTC was unavailable to `specc compile`)",
        );
        return;
    };
    let path = e.join(file);
    let bytes = fs::read(&path).unwrap();
    let mut altered = bytes.clone();
    let mid = altered.len() / 2;
    altered[mid] ^= 0x5a;
    fs::write(&path, &altered).unwrap();
    assert_mentions(&fails(&run_args(s(&e))), &[s(&path)]);
    fs::remove_file(&path).unwrap();
    assert_mentions(&fails(&run_args(s(&e))), &[s(&path)]);
    fs::write(&path, &bytes).unwrap();
    specc(&run_args(s(&e)));
    fs::remove_dir_all(&e).ok();
}

/// The tensors of a safetensors file: (name, dtype, shape, bytes), sorted by name.
type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

fn read_tensors(file: &Path) -> Tensors {
    let bytes = fs::read(file).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Tensors = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn write_tensors(file: &Path, t: &Tensors, metadata: Option<HashMap<String, String>>) {
    let views: HashMap<String, TensorView> = t
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(&views, &metadata, file).unwrap();
}

#[test]
fn an_engine_whose_checkpoint_changed_is_refused() {
    let model = tmp("changed-model");
    copy_dir(&default_model(), &model);
    let e = tmp("changed-engine");
    specc(&["compile", s(&model), "--max-context", CTX, "-o", s(&e)]);
    specc(&run_args(s(&e)));
    let file = model.join("model.safetensors");
    let original = read_tensors(&file);

    // One tensor renamed.
    let renamed = "model.norm.weight";
    let mut t = original.clone();
    let x = t.iter_mut().find(|x| x.0 == renamed).unwrap();
    x.0 = "model.norm.weight_renamed".into();
    write_tensors(&file, &t, None);
    let err = fails(&run_args(s(&e)));
    assert_mentions(&err, &[s(&file), renamed]);

    // The same tensors under another header (other metadata).
    let meta = HashMap::from([("specc-test".to_string(), "changed".to_string())]);
    write_tensors(&file, &original, Some(meta));
    let err = fails(&run_args(s(&e)));
    assert_mentions(&err, &[s(&file)]);

    fs::remove_dir_all(&e).ok();
    fs::remove_dir_all(&model).ok();
}
