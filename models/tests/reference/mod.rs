//! Reading the HF reference outputs of `tests/fixtures/*/reference.safetensors`.

#![allow(dead_code)] // each test crate uses part of it

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use specc_models::Model;

pub struct Reference {
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    pub logits: Vec<f32>,
    pub shape: Vec<usize>,
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

pub fn read_reference(dir: &Path) -> Reference {
    let path = dir.join("reference.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = |name: &str| -> Vec<u32> {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), Dtype::I64, "{name}");
        t.data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect()
    };
    let l = st.tensor("logits").unwrap();
    assert_eq!(l.dtype(), Dtype::F32);
    Reference {
        prompt: ids("prompt_ids"),
        greedy: ids("greedy_ids"),
        logits: l
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        shape: l.shape().to_vec(),
    }
}

pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Checks the interpreter's logits over `prompt ++ greedy` against HF's (relative L2 ≤ `tol`)
/// and, when `greedy`, its greedy decoding through the KV cache token for token; returns the
/// relative L2 error.
pub fn check_dir(name: &str, dir: &Path, tol: f64, greedy: bool) -> f64 {
    if !dir.join("reference.safetensors").is_file() {
        panic!(
            "fixture {} is missing: run scripts/make_hf_fixtures.py",
            dir.display()
        );
    }
    let model = Model::open(dir).unwrap();
    let weights = model.load_weights_f32();
    let r = read_reference(dir);
    let p = r.prompt.len();
    assert_eq!(r.shape, vec![p + r.greedy.len(), model.spec().vocab]);

    let ids: Vec<u32> = r.prompt.iter().chain(&r.greedy).copied().collect();
    let (shape, got) = model.logits(&weights, &ids).unwrap();
    assert_eq!(shape, r.shape);
    let v = shape[1];
    let worst = (0..shape[0])
        .map(|t| {
            (
                t,
                rel_l2(&got[t * v..(t + 1) * v], &r.logits[t * v..(t + 1) * v]),
            )
        })
        .fold((0, 0f64), |a, b| if b.1 > a.1 { b } else { a });
    let err = rel_l2(&got, &r.logits);
    eprintln!(
        "{name}: logits rel L2 {err:.3e} (worst row {} at {:.3e})",
        worst.0, worst.1
    );
    assert!(
        err <= tol,
        "{name}: logits relative L2 {err:.3e} > tolerance {tol:.0e}; worst position {} ({:.3e})",
        worst.0,
        worst.1
    );

    if !greedy {
        return err;
    }
    let n = r.greedy.len();
    let generated = model
        .greedy_generate(&weights, &r.prompt, n, p + n)
        .unwrap();
    if let Some(i) = (0..n).find(|&i| generated[i] != r.greedy[i]) {
        panic!(
            "{name}: greedy token {i}: got {}, want {} (got {:?}, want {:?})",
            generated[i], r.greedy[i], generated, r.greedy
        );
    }
    err
}
