use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, TensorView};
use specc_runtime::CpuSession;

use specc_models::Model;

use super::engine::{Source, RANDOM_SEED};
use crate::cli::Backend;
use crate::embedded;

pub fn logits(model: Source, ids: &[u32], backend: Backend, out: &Path) -> Result<()> {
    let path = match &model.path {
        Some(p) => p.clone(),
        None => embedded::default_model_dir()?,
    };
    let m = if model.random_weights {
        Model::open_random(&path, RANDOM_SEED)?
    } else {
        if !path.is_dir() {
            bail!("{}: no such model directory", path.display());
        }
        Model::open(&path)?
    };
    let max_context = m.spec().max_position as u64;
    let vocab = m.spec().vocab;
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        bail!("--ids: token id {bad} is outside the vocabulary (expected < {vocab})");
    }
    if ids.len() as u64 > max_context {
        bail!(
            "--ids: {} tokens exceed the maximum context of {}",
            ids.len(),
            max_context
        );
    }
    let logits = match backend {
        Backend::Cpu => {
            let weights = m.load_weights_f32();
            let mut session = CpuSession::new(m.graph(), &weights, max_context);
            session.step(ids)?.logits
        }
        // Built for the one prefill bucket that holds the ids.
        Backend::Cuda => {
            let ctx = (ids.len().next_power_of_two().max(16) as u64).min(max_context);
            cuda_logits(model, ids, ctx)?
        }
    };
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::F32, vec![ids.len(), vocab], &bytes)?;
    let tensors: HashMap<String, TensorView> = [("logits".to_string(), view)].into();
    safetensors::serialize_to_file(&tensors, &None, out)
        .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "wrote {} (logits f32 [{}, {}])",
        out.display(),
        ids.len(),
        vocab
    );
    Ok(())
}

/// One prefill over `ids` on the GPU: the plain engine's prefill plan of the smallest
/// bucket that holds them, built for this device.
#[cfg(feature = "cuda")]
fn cuda_logits(model: Source, ids: &[u32], max_context: u64) -> Result<Vec<f32>> {
    use super::engine::{build_for, target_for, Want};
    let r = build_for(
        model,
        Want {
            spec: None,
            max_context: Some(max_context),
            target: target_for(true)?,
            extras: Default::default(),
        },
    )?;
    let sources = r.weight_sources();
    let mut s = specc_runtime::cuda::CudaSpecSession::new(&r.engine, false, &sources, 1)?;
    Ok(s.prefill_logits(ids)?)
}

#[cfg(not(feature = "cuda"))]
fn cuda_logits(_: Source, _: &[u32], _: u64) -> Result<Vec<f32>> {
    Err(super::gpu::unavailable())
}
