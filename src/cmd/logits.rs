use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, TensorView};
use specc_runtime::CpuSession;

use super::engine::{resolve, Source};
use crate::cli::Backend;

pub fn logits(model: Source, ids: &[u32], backend: Backend, out: &Path) -> Result<()> {
    let r = resolve(model, None)?;
    let vocab = r.model.spec().vocab;
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        bail!("--ids: token id {bad} is outside the vocabulary (expected < {vocab})");
    }
    if ids.len() as u64 > r.max_context {
        bail!(
            "--ids: {} tokens exceed the maximum context of {}",
            ids.len(),
            r.max_context
        );
    }
    let weights = match backend {
        Backend::Cpu => r.model.load_weights_f32(),
    };
    let mut session = CpuSession::new(r.model.graph(), &weights, r.max_context);
    let step = session.step(ids)?;
    let bytes: Vec<u8> = step.logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::F32, vec![ids.len(), step.vocab], &bytes)?;
    let tensors: HashMap<String, TensorView> = [("logits".to_string(), view)].into();
    safetensors::serialize_to_file(&tensors, &None, out)
        .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "wrote {} (logits f32 [{}, {}])",
        out.display(),
        ids.len(),
        step.vocab
    );
    Ok(())
}
