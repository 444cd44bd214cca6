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
