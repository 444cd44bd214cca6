//! Every speculative method with a DeepSeek-V3 target (MLA attention over the latent cache,
//! MoE layers) inside the one-graph step, on the interpreter: greedy output equals the
//! target's own greedy tokens exactly (issue 19 item 5), at batch 1 and 4 with prompts of
//! different lengths. draft_model with full (identical draft), partial (perturbed MoE
//! weights) and near-zero (unrelated random DeepSeek-V3) acceptance; EAGLE-3 chain and tree,
//! DFlash and DDTree with random drafters sized for the target (near-zero acceptance).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use specc_models::{Model, SpecBundle, SpecConfig};

mod common;
mod spec_common;

use spec_common::{fixture, Outcome};

const CTX: u64 = 256;
const TARGET: &str = "deepseek_v3_qlora";

fn target() -> Model {
    Model::open(fixture(TARGET)).unwrap()
}

/// `b` prompts of different lengths inside the fixture's 256-token vocabulary.
fn prompts(b: usize) -> Vec<Vec<u32>> {
    (0..b)
        .map(|i| {
            (0..(5 + 3 * i))
                .map(|j| ((j * 37 + i * 11 + 3) % 256) as u32)
                .collect()
        })
        .collect()
}

fn bundle(target: &Model, body: &str) -> SpecBundle {
    let cfg = SpecConfig::from_toml(&fixture(TARGET).join("spec.test.toml"), body)
        .unwrap_or_else(|e| panic!("{e}"));
    SpecBundle::open(target, &cfg).unwrap_or_else(|e| panic!("{e}"))
}

fn exact(target: &Model, b: &SpecBundle, lanes: usize, n: usize) -> Outcome {
    let out = spec_common::check_exact(target, b, &prompts(lanes), n, CTX);
    eprintln!(
        "B={lanes}: mean acceptance length {:.2}, histogram {:?}",
        out.mean_accept, out.histogram
    );
    out
}

/// A fresh directory for a derived drafter.
fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deepseek_methods_{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `src`'s tensors, each passed through `edit` (which may drop it or give new bytes), into
/// `dst/model.safetensors`.
fn rewrite(
    src: &Path,
    dst: &Path,
    edit: impl Fn(&str, &TensorView) -> Option<(Dtype, Vec<usize>, Vec<u8>)>,
) {
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let owned: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter_map(|(k, v)| edit(&k, &v).map(|t| (k, t)))
        .collect();
    let views: BTreeMap<String, TensorView> = owned
        .iter()
        .map(|(k, (d, s, b))| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(
        dst.join("model.safetensors"),
        safetensors::serialize(views, &None).unwrap(),
    )
    .unwrap();
}

fn keep(v: &TensorView) -> Option<(Dtype, Vec<usize>, Vec<u8>)> {
    Some((v.dtype(), v.shape().to_vec(), v.data().to_vec()))
}

/// The target with a deterministic perturbation of its MLP and MoE weights: a draft that
/// agrees with the target often but not always.
fn perturbed_draft(noise: f32) -> PathBuf {
    let dir = tmp("perturbed");
    std::fs::copy(fixture(TARGET).join("config.json"), dir.join("config.json")).unwrap();
    rewrite(&fixture(TARGET), &dir, |name, v| {
        if !name.contains(".mlp.") || v.dtype() != Dtype::F32 {
            return keep(v);
        }
        let data = v
            .data()
            .chunks_exact(4)
            .enumerate()
            .flat_map(|(i, c)| {
                let x = f32::from_le_bytes(c.try_into().unwrap());
                let h = (i as u32).wrapping_mul(2_654_435_761) >> 16;
                (x + noise * ((h % 2001) as f32 / 1000.0 - 1.0)).to_le_bytes()
            })
            .collect();
        Some((v.dtype(), v.shape().to_vec(), data))
    });
    dir
}

fn draft_model(draft: &Path, k: u64) -> String {
    format!(
        "method = \"draft_model\"\ndraft = \"{}\"\nnum_steps = {k}",
        draft.display()
    )
}

#[test]
fn draft_model_identical_draft_accepts_everything() {
    let t = target();
    let k = 4;
    let b = bundle(&t, &draft_model(&fixture(TARGET), k));
    for lanes in [1, 4] {
        let out = exact(&t, &b, lanes, 20);
        // Lanes end when their budget runs out mid-step; every full step accepts all k.
        assert!(out.mean_accept > k as f64, "B={lanes}: {}", out.mean_accept);
    }
}

#[test]
fn draft_model_perturbed_draft_accepts_partially() {
    let t = target();
    let k = 4;
    let b = bundle(&t, &draft_model(&perturbed_draft(0.02), k));
    for lanes in [1, 4] {
        let m = exact(&t, &b, lanes, 24).mean_accept;
        assert!(m > 1.3 && m < k as f64 + 0.5, "B={lanes}: {m}");
    }
}

#[test]
fn draft_model_unrelated_draft_is_exact() {
    let t = target();
    let b = bundle(&t, &draft_model(&fixture("deepseek_v3_no_qlora"), 3));
    for lanes in [1, 4] {
        let m = exact(&t, &b, lanes, 20).mean_accept;
        assert!(m < 1.6, "B={lanes}: {m}");
    }
}

/// The random EAGLE-3 head of tests/fixtures/eagle3_random over this target's vocabulary
/// (256 draft ids mapping to themselves: `d2t` zeros).
fn eagle3_head() -> PathBuf {
    let src = fixture("eagle3_random");
    let dir = tmp("eagle3");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["vocab_size"] = 256.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    rewrite(&src, &dir, |name, v| match name {
        "d2t" => Some((Dtype::I64, vec![256], vec![0u8; 256 * 8])),
        "t2d" => Some((Dtype::BOOL, vec![256], vec![1u8; 256])),
        _ => keep(v),
    });
    dir
}

#[test]
fn eagle3_chain_is_exact() {
    let t = target();
    let body = format!(
        "method = \"eagle3\"\ndraft = \"{}\"\nnum_steps = 4",
        eagle3_head().display()
    );
    let b = bundle(&t, &body);
    for lanes in [1, 4] {
        exact(&t, &b, lanes, 20);
    }
}

#[test]
fn eagle3_tree_is_exact() {
    let t = target();
    let body = format!(
        "method = \"eagle3\"\ndraft = \"{}\"\nnum_steps = 3\ntopk = 4\nnum_draft_tokens = 12",
        eagle3_head().display()
    );
    let b = bundle(&t, &body);
    for lanes in [1, 4] {
        exact(&t, &b, lanes, 16);
    }
}

/// The random DFlash drafter of tests/fixtures/dflash_random for this target: its mask
/// token inside the 256-token vocabulary, tapping layers 1 and 0 of 3.
fn dflash_drafter() -> PathBuf {
    let src = fixture("dflash_random");
    let dir = tmp("dflash");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["vocab_size"] = 256.into();
    cfg["mask_token_id"] = 255.into();
    cfg["dflash_config"]["mask_token_id"] = 255.into();
    cfg["num_target_layers"] = 3.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    rewrite(&src, &dir, |_, v| keep(v));
    dir
}

#[test]
fn dflash_is_exact() {
    let t = target();
    let body = format!(
        "method = \"dflash\"\ndraft = \"{}\"",
        dflash_drafter().display()
    );
    let b = bundle(&t, &body);
    for lanes in [1, 4] {
        let m = exact(&t, &b, lanes, 20).mean_accept;
        assert!(m < 1.6, "B={lanes}: {m}");
    }
}

#[test]
fn ddtree_is_exact() {
    let t = target();
    let body = format!(
        "method = \"ddtree\"\ndraft = \"{}\"\nbudget = 16\ntopk = 4",
        dflash_drafter().display()
    );
    let b = bundle(&t, &body);
    for lanes in [1, 4] {
        exact(&t, &b, lanes, 16);
    }
}
