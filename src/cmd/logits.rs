//! `specc logits`: f32 logits of every position of `--ids`, written as safetensors.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use safetensors::tensor::{Dtype, TensorView};
use specc_models::{Model, ModelSpec, CONFIG_FILE};
use specc_runtime::CpuSession;

use super::engine::Source;
use super::fit::{self, open_model, Fit};
use crate::cli::Backend;
use crate::embedded;

pub fn logits(model: Source, ids: &[u32], backend: Backend, out: &Path) -> Result<()> {
    let path = match &model.path {
        Some(p) => p.clone(),
        None => embedded::default_model_dir()?,
    };
    let n = ids.len() as u64;
    let (logits, vocab) = match backend {
        // One forward over the ids: a KV cache of exactly their length.
        Backend::Cpu => {
            let f = Fit::of_backend(false, 1)?;
            let m = open_model(&path, model.random(), model.layers, f.as_ref())?;
            check_ids(m.spec(), m.config_file(), ids)?;
            if let Some(f) = &f {
                fit::estimate(m.graph(), f, n, n).check(
                    &f.budget,
                    &format!("it grows with the number of --ids ({n})"),
                )?;
            }
            let weights = m.weights_f32()?;
            let mut session = CpuSession::new(m.graph(), &weights, n);
            (session.step(ids)?.logits, m.spec().vocab)
        }
        // Built for the one prefill bucket that holds the ids; the build opens and validates
        // the model, its config bounds the ids first.
        Backend::Cuda => {
            let config = match model.random_weights {
                true => Model::random_paths(&path).1,
                false => path.join(CONFIG_FILE),
            };
            let spec = ModelSpec::from_file(&config)?;
            check_ids(&spec, &config, ids)?;
            let ctx = (ids.len().next_power_of_two().max(16) as u64).min(spec.max_position as u64);
            (cuda_logits(model, ids, ctx)?, spec.vocab)
        }
    };
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::F32, vec![ids.len(), vocab], &bytes)
        .map_err(|e| anyhow!("logits [{}, {vocab}]: {e}", ids.len()))?;
    let tensors: HashMap<String, TensorView> = [("logits".to_string(), view)].into();
    let file = safetensors::serialize(&tensors, &None)
        .map_err(|e| anyhow!("logits [{}, {vocab}]: {e}", ids.len()))?;
    std::fs::write(out, file).map_err(|e| anyhow!("--out {}: cannot write: {e}", out.display()))?;
    println!(
        "wrote {} (logits f32 [{}, {}])",
        out.display(),
        ids.len(),
        vocab
    );
    Ok(())
}

/// `--ids` lie inside the vocabulary and the positions of the model configured in `config`.
fn check_ids(spec: &ModelSpec, config: &Path, ids: &[u32]) -> Result<()> {
    spec.check_token_ids(config, "--ids", ids)?;
    if ids.len() > spec.max_position {
        bail!(
            "--ids: expected at most {} tokens (max_position_embeddings of {}), found {}",
            spec.max_position,
            config.display(),
            ids.len()
        );
    }
    Ok(())
}

/// One forward over `ids` on the GPU: the all-row forward ([`GraphRole::Logits`]) of the
/// smallest prompt bucket that holds them, in an engine built for this device with it.
///
/// [`GraphRole::Logits`]: specc_ir::engine::GraphRole::Logits
#[cfg(feature = "cuda")]
fn cuda_logits(model: Source, ids: &[u32], max_context: u64) -> Result<Vec<f32>> {
    use super::engine::{build_for, target_for, Want};
    use specc_models::spec_bundle::EngineExtras;
    let r = build_for(
        model,
        Want {
            spec: None,
            max_context: Some(max_context),
            target: target_for(true)?,
            extras: EngineExtras {
                all_logits: true,
                ..EngineExtras::default()
            },
            fit: Fit::of_backend(true, 1)?,
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
