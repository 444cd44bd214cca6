//! `specc run --spec` with `method = "ddtree"` on the CPU backend: draft trees from the
//! trained DFlash drafter of the embedded default target, output identical to plain greedy
//! decoding, and the tree's knobs in the run's label.

use std::path::PathBuf;
use std::process::{Command, Output};

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
    std::env::temp_dir().join(format!("specc-cli-ddtree-{name}-{}", std::process::id()))
}

#[test]
fn run_with_ddtree_trees_equals_plain_decoding() {
    let model = root().join("models/default");
    let spec = tmp("spec.toml");
    // Depth from the drafter's block_size (8 → 7); 48 nodes per tree.
    std::fs::write(
        &spec,
        format!(
            "method = \"ddtree\"\ndraft = {:?}\nbudget = 48\n",
            model.join("dflash").to_str().unwrap()
        ),
    )
    .unwrap();
    let (ids_spec, ids_plain) = (tmp("ids-spec.json"), tmp("ids-plain.json"));
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
    assert!(err.contains("DDTree depth=7 budget=48 topk=8"), "{err}");
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
