//! `method = "none"`: plain decoding, k = 0. Its step is the shared skeleton with nothing
//! drafted; it opens no draft and takes no method knobs.

use std::path::Path;

use specc_ir::{Graph, IrError};

use super::step::{begin, commit_all, lower_target_prefill, verify_and_commit, Builder, Drafted};
use super::{Opened, SpecMethod, StepShape};
use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::spec_config::{field, Acceptance, SpecConfig};
use crate::Model;

pub(super) struct Plain;

impl SpecMethod for Plain {
    fn name(&self) -> &'static str {
        "none"
    }

    fn default_num_steps(&self, _draft: Option<&Path>) -> Result<u32, ModelError> {
        Ok(0)
    }

    fn check_num_steps(&self, file: &Path, num_steps: u32) -> Result<(), ModelError> {
        if num_steps != 0 {
            return Err(field(
                file,
                "num_steps",
                "0 or absent when method = \"none\"",
                num_steps,
            ));
        }
        Ok(())
    }

    fn check_draft_key(&self, file: &Path, draft: Option<&Path>) -> Result<(), ModelError> {
        match draft {
            Some(d) => Err(field(
                file,
                "draft",
                "absent when method = \"none\"",
                d.display(),
            )),
            None => Ok(()),
        }
    }

    fn open(
        &self,
        _target: &Model,
        cfg: &SpecConfig,
        _draft_dir: &Path,
        _shape: &StepShape,
        _random_seed: Option<u64>,
    ) -> Result<Opened, ModelError> {
        Err(ModelError::field(
            &cfg.file,
            "method",
            "draft_model, eagle3, dflash or ddtree for speculative decoding",
            "\"none\"",
        ))
    }
}

/// Plain decoding of `target` under `acceptance`: its prefill (no taps) and its
/// [`lower_decode_step`] with a ring of `ring` tokens per sequence — the graphs of
/// `method = "none"` and of every engine's plain decoding.
pub fn lower_plain(
    target: &ModelSpec,
    ring: u64,
    acceptance: &Acceptance,
) -> Result<(Graph, Graph), IrError> {
    let shape = StepShape {
        num_steps: 0,
        ring,
        acceptance: acceptance.clone(),
    };
    Ok((
        lower_target_prefill(target, &[], acceptance)?,
        lower_decode_step(target, &shape)?,
    ))
}

/// [`lower_plain`] with greedy acceptance.
pub fn lower_plain_greedy(target: &ModelSpec, ring: u64) -> Result<(Graph, Graph), IrError> {
    lower_plain(target, ring, &Acceptance::Greedy)
}

/// Plain decoding as a self-feeding step graph (k = 0): one target token per step, chosen
/// on device and emitted into the ring, with the same states and host contract as the
/// speculative steps. This is the graph the CUDA backend captures for `--spec none`.
pub fn lower_decode_step(target: &ModelSpec, shape: &StepShape) -> Result<Graph, IrError> {
    let mut shape = shape.clone();
    shape.num_steps = 0;
    let mut g = Graph::new("decode_step");
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, &shape)?;
    let d = Drafted {
        tokens: Vec::new(),
        dists: Vec::new(),
    };
    let v = verify_and_commit(&mut b, &c, target, &shape, d, &[])?;
    commit_all(&mut b, &v.commits)?;
    Ok(g)
}
