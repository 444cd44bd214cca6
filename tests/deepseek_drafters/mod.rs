//! Drafters for the DeepSeek-V3 fixture target (`tests/fixtures/deepseek_v3_qlora`, 256-token
//! vocabulary, 3 layers), derived from the repository's random drafter fixtures, for the
//! method tests on the interpreter (`deepseek_methods.rs`) and on the GPU (`gpu_deepseek.rs`).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::common::fixture;

/// A fresh directory for a derived drafter.
pub fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deepseek_methods_{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `src`'s tensors, each passed through `edit` (which may drop it or give new bytes), into
/// `dst/model.safetensors`.
pub fn rewrite(
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

pub fn keep(v: &TensorView) -> Option<(Dtype, Vec<usize>, Vec<u8>)> {
    Some((v.dtype(), v.shape().to_vec(), v.data().to_vec()))
}

/// The random EAGLE-3 head of tests/fixtures/eagle3_random over this target's vocabulary
/// (256 draft ids mapping to themselves: `d2t` zeros), in a directory of its own (`name`:
/// tests run in parallel).
pub fn eagle3_head(name: &str) -> PathBuf {
    eagle3_head_as(name, false)
}

/// [`eagle3_head`] with its float weights rounded to bf16 (for a bf16 target).
pub fn eagle3_head_bf16(name: &str) -> PathBuf {
    eagle3_head_as(name, true)
}

fn eagle3_head_as(name: &str, bf16: bool) -> PathBuf {
    let src = fixture("eagle3_random");
    let dir = tmp(name);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["vocab_size"] = 256.into();
    if bf16 {
        cfg["torch_dtype"] = "bfloat16".into();
    }
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    rewrite(&src, &dir, |name, v| match name {
        "d2t" => Some((Dtype::I64, vec![256], vec![0u8; 256 * 8])),
        "t2d" => Some((Dtype::BOOL, vec![256], vec![1u8; 256])),
        _ if bf16 && v.dtype() == Dtype::F32 => Some(to_bf16(v)),
        _ => keep(v),
    });
    dir
}

/// An f32 tensor rounded to bf16 (round to nearest even).
fn to_bf16(v: &TensorView) -> (Dtype, Vec<usize>, Vec<u8>) {
    let bytes = v
        .data()
        .chunks_exact(4)
        .flat_map(|c| {
            half::bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes()
        })
        .collect();
    (Dtype::BF16, v.shape().to_vec(), bytes)
}

/// The random DFlash drafter of tests/fixtures/dflash_random for this target: its mask
/// token inside the 256-token vocabulary, tapping layers 1 and 0 of 3; in directory `name`.
pub fn dflash_drafter(name: &str) -> PathBuf {
    let src = fixture("dflash_random");
    let dir = tmp(name);
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

/// The fixture every derived drafter comes from.
pub const TARGET: &str = "deepseek_v3_qlora";

/// The target with a deterministic perturbation of its MLP and MoE weights: a draft that
/// agrees with the target often but not always.
pub fn perturbed_draft(noise: f32) -> PathBuf {
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

/// The token every member of the derived family predicts.
const TOKEN: usize = 197;
/// Added to hidden dim 0 of every token embedding: the residual stream is ≈ `SHARED · e0`
/// whatever the (RMS-normed, O(1)) layers add.
const SHARED: f32 = 100.0;
/// The lm_head weight that reads dim 0 into [`TOKEN`]'s logit (≈ GAIN · √64 = 16 above the rest).
const GAIN: f32 = 2.0;

/// f32 values of a tensor view.
fn f32s(v: &TensorView) -> Vec<f32> {
    v.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f32_tensor(v: &TensorView, x: Vec<f32>) -> Option<(Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = x.iter().flat_map(|f| f.to_le_bytes()).collect();
    Some((Dtype::F32, v.shape().to_vec(), bytes))
}

/// `[rows, cols]` with column 0 zeroed except `GAIN` at row `row`.
fn head_reads_dim0(v: &TensorView, row: usize) -> Option<(Dtype, Vec<usize>, Vec<u8>)> {
    let cols = v.shape()[1];
    let mut x = f32s(v);
    for r in 0..v.shape()[0] {
        x[r * cols] = if r == row { GAIN } else { 0.0 };
    }
    f32_tensor(v, x)
}

/// A final norm whose dim-0 gain is `gain`.
fn dim0_gain(v: &TensorView, gain: f32) -> Option<(Dtype, Vec<usize>, Vec<u8>)> {
    let mut x = f32s(v);
    x[0] = gain;
    f32_tensor(v, x)
}

/// The derived family: `(target, eagle3 head, dflash drafter)` directories under names
/// starting with `name`. The drafters' final norms read dim 0 with `gains` (EAGLE-3 head,
/// DFlash drafter): 1 makes
/// their top-1 [`TOKEN`] by a wide margin (full acceptance); a small gain leaves it near the
/// other logits, so they propose it only sometimes (partial acceptance).
pub fn derived_family(name: &str, gains: (f32, f32)) -> (PathBuf, PathBuf, PathBuf) {
    let target = tmp(&format!("{name}_target"));
    std::fs::copy(
        fixture(TARGET).join("config.json"),
        target.join("config.json"),
    )
    .unwrap();
    rewrite(&fixture(TARGET), &target, |name, v| match name {
        "model.embed_tokens.weight" => {
            let cols = v.shape()[1];
            let mut x = f32s(v);
            for r in 0..v.shape()[0] {
                x[r * cols] += SHARED;
            }
            f32_tensor(v, x)
        }
        "model.norm.weight" => dim0_gain(v, 1.0),
        "lm_head.weight" => head_reads_dim0(v, TOKEN),
        _ => keep(v),
    });
    let eagle = eagle3_head(&format!("{name}_eagle3"));
    let eagle_src = tmp(&format!("{name}_eagle3_src"));
    std::fs::rename(
        eagle.join("model.safetensors"),
        eagle_src.join("model.safetensors"),
    )
    .unwrap();
    rewrite(&eagle_src, &eagle, |name, v| match name {
        // fc row 0 averages the three taps' dim 0; no other row reads them.
        "fc.weight" => {
            let cols = v.shape()[1];
            let h = cols / 3;
            let mut x = f32s(v);
            for r in 0..v.shape()[0] {
                for tap in 0..3 {
                    x[r * cols + tap * h] = if r == 0 { 1.0 / 3.0 } else { 0.0 };
                }
            }
            f32_tensor(v, x)
        }
        "norm.weight" => dim0_gain(v, gains.0),
        // d2t is zero: draft id TOKEN is target id TOKEN.
        "lm_head.weight" => head_reads_dim0(v, TOKEN),
        _ => keep(v),
    });
    let dflash = dflash_drafter(&format!("{name}_dflash"));
    let dflash_src = tmp(&format!("{name}_dflash_src"));
    std::fs::rename(
        dflash.join("model.safetensors"),
        dflash_src.join("model.safetensors"),
    )
    .unwrap();
    rewrite(&dflash_src, &dflash, |name, v| match name {
        "norm.weight" => dim0_gain(v, gains.1),
        _ => keep(v),
    });
    (target, eagle, dflash)
}

/// The drafters' dim-0 gains (EAGLE-3, DFlash) of the partial-acceptance family: measured
/// mean acceptance EAGLE-3 chain 1.25 / 1.18 (B = 1 / 4), tree 3.00 / 2.93 of 4, DFlash
/// 2.88 / 3.61 of 4, DDTree 3.00 / 3.00 of 4 (full acceptance from gain ≈ 0.025 / 0.032 on,
/// none below ≈ 0.01 / 0.028).
pub const WEAK_GAINS: (f32, f32) = (0.02, 0.03);
