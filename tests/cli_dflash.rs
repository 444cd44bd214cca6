//! `specc run --spec` with the trained DFlash drafter of the embedded default target on the
//! CPU backend: `method = "dflash"` (one block per step) and `method = "ddtree"` (draft trees
//! from the same drafter), each with output identical to plain greedy decoding and the
//! method's knobs in the run's label.

use std::path::PathBuf;

mod cli_common;
mod common;

use cli_common::specc;
use common::default_model;

fn tmp(name: &str) -> PathBuf {
    cli_common::tmp(&format!("dflash-{name}"))
}

/// Runs the default target with a spec of `method_lines` + the trained drafter, and plain;
/// asserts identical text and ids and that stderr names `label`.
fn spec_run_equals_plain(tag: &str, method_lines: &str, label: &str) {
    let model = default_model();
    let spec = tmp(&format!("{tag}-spec.toml"));
    std::fs::write(
        &spec,
        format!(
            "{method_lines}draft = {:?}\n",
            model.join("dflash").to_str().unwrap()
        ),
    )
    .unwrap();
    let (ids_spec, ids_plain) = (
        tmp(&format!("{tag}-ids-spec.json")),
        tmp(&format!("{tag}-ids-plain.json")),
    );
    let common = [
        "run",
        model.to_str().unwrap(),
        "--prompt",
        "def __init__(self",
        "--max-tokens",
        "24",
        "--backend",
        "cpu",
    ];
    let mut a = common.to_vec();
    a.extend([
        "--spec",
        spec.to_str().unwrap(),
        "--ids-out",
        ids_spec.to_str().unwrap(),
    ]);
    let out = specc(&a);
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("{err}");
    assert!(err.contains(label), "{err}");
    assert!(err.contains("mean acceptance length"), "{err}");
    let mut b = common.to_vec();
    b.extend(["--no-spec", "--ids-out", ids_plain.to_str().unwrap()]);
    let plain = specc(&b);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&plain.stdout)
    );
    let read = |p: &PathBuf| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    assert_eq!(read(&ids_spec), read(&ids_plain));
    for f in [spec, ids_spec, ids_plain] {
        std::fs::remove_file(f).ok();
    }
}

#[test]
fn run_with_the_trained_dflash_drafter_equals_plain_decoding() {
    // k comes from the drafter's block_size (8 → 7 drafts per step).
    spec_run_equals_plain("dflash", "method = \"dflash\"\n", "dflash k=7");
}

#[test]
fn run_with_ddtree_trees_equals_plain_decoding() {
    // Depth from the drafter's block_size (8 → 7); 48 nodes per tree.
    spec_run_equals_plain(
        "ddtree",
        "method = \"ddtree\"\nbudget = 48\n",
        "ddtree depth=7 budget=48 topk=8",
    );
}
