//! `method = "dflash"`: a DFlash block drafter (its published format and forward:
//! `drafter`) drafts k = `block_size − 1` tokens in one forward from the target's tapped
//! hidden states, verified as a chain. DDTree drafts with the same drafter: it shares
//! [`open_drafter`], the default `num_steps` and the block forward.

mod context;
mod drafter;
mod step;

use std::path::Path;

use specc_ir::engine::DraftKind;
use specc_ir::Graph;

use super::step::lower_target_prefill;
use super::variants::lower_variants;
use super::{
    chain_label, draft_checkpoint, lower_err, Opened, SpecMethod, StepShape, TreeKnobs,
    DEFAULT_NUM_STEPS,
};
use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::spec_bundle::DraftSide;
use crate::spec_config::{Acceptance, SpecConfig};
use crate::Model;

pub(super) use context::draft_block;
pub use context::{
    lower_dflash_prefill, DFLASH_BASE, DFLASH_COUNT, DFLASH_HIDDEN, DFLASH_RING_HIDDEN,
};
pub use drafter::{
    block_logits, block_size_of, context, kv_state_names, write_context, DFlashSpec, ARCHITECTURE,
    DFLASH_PREFIX,
};
use step::lower_dflash_prefix;
pub use step::lower_dflash_step;
pub(super) use step::{lower_dflash_catch_up, lower_dflash_plain};

pub(super) struct DFlash;

impl SpecMethod for DFlash {
    fn name(&self) -> &'static str {
        "dflash"
    }

    fn default_num_steps(&self, draft: Option<&Path>) -> Result<u32, ModelError> {
        default_num_steps(draft)
    }

    /// k = 0, 1, ⌈k/2⌉: the same block drafted, its first k drafts verified, over the
    /// configured step's `k + 1` pending context rows; k = 0 queues its rows for the
    /// catch-up (`methods::variants`).
    fn variants(
        &self,
        target: &ModelSpec,
        draft: &DraftSide,
        shape: &StepShape,
        _tree: Option<TreeKnobs>,
        ks: &[u64],
    ) -> Result<Vec<(u64, Graph)>, ModelError> {
        let DraftSide::DFlash(dflash) = draft else {
            return Ok(Vec::new());
        };
        lower_variants(shape, "dflash step variant", ks, |k, at| match k {
            0 => lower_dflash_plain(target, dflash, at),
            _ => lower_dflash_prefix(target, dflash, at),
        })
    }

    /// The catch-up of the plain variant's queued context rows.
    fn catch_up(
        &self,
        target: &ModelSpec,
        draft: &DraftSide,
        shape: &StepShape,
    ) -> Result<Option<Graph>, ModelError> {
        let DraftSide::DFlash(dflash) = draft else {
            return Ok(None);
        };
        lower_dflash_catch_up(target, dflash, shape)
            .map(Some)
            .map_err(|e| lower_err("dflash catch-up", e))
    }

    fn open(
        &self,
        target: &Model,
        cfg: &SpecConfig,
        draft_dir: &Path,
        shape: &StepShape,
        random_seed: Option<u64>,
    ) -> Result<Opened, ModelError> {
        let dflash = open_drafter(target, cfg, draft_dir)?;
        let step = lower_dflash_step(target.spec(), &dflash, shape)
            .map_err(|e| lower_err("dflash step", e))?;
        let (draft_prefill, target_prefill) = prefills(target, &dflash, &shape.acceptance)?;
        let draft_checkpoint = draft_checkpoint(draft_dir, &step, DFLASH_PREFIX, random_seed)?;
        let kind = DraftKind::DFlash {
            taps_width: dflash.taps_width(),
        };
        Ok(Opened {
            draft: DraftSide::DFlash(Box::new(dflash)),
            draft_checkpoint,
            prefix: DFLASH_PREFIX,
            target_prefill,
            draft_prefill,
            step,
            kind,
            label: chain_label(self.name(), shape.num_steps),
        })
    }
}

/// The drafter's block fixes k: `block_size − 1` of the drafter in `draft` (a missing
/// draft is reported by the spec's `draft` check).
pub(super) fn default_num_steps(draft: Option<&Path>) -> Result<u32, ModelError> {
    match draft {
        Some(dir) => Ok(block_size_of(dir)? as u32 - 1),
        None => Ok(DEFAULT_NUM_STEPS),
    }
}

/// The drafter in `dir`, checked against the target and against the spec's `num_steps`
/// (which must be its `block_size − 1`).
pub(super) fn open_drafter(
    target: &Model,
    cfg: &SpecConfig,
    dir: &Path,
) -> Result<DFlashSpec, ModelError> {
    let dflash = DFlashSpec::from_dir(dir, target.spec())?;
    if cfg.num_steps as usize != dflash.num_steps() {
        return Err(ModelError::field(
            &cfg.file,
            "num_steps",
            format!(
                "{} (block_size - 1 of {}) or absent",
                dflash.num_steps(),
                dflash.config_file.display()
            ),
            cfg.num_steps,
        ));
    }
    Ok(dflash)
}

/// The drafter's prefill and the target prefill that taps what it reads.
pub(super) fn prefills(
    target: &Model,
    dflash: &DFlashSpec,
    acceptance: &Acceptance,
) -> Result<(specc_ir::Graph, specc_ir::Graph), ModelError> {
    let draft_prefill =
        lower_dflash_prefill(target.spec(), dflash).map_err(|e| lower_err("dflash prefill", e))?;
    let target_prefill = lower_target_prefill(target.spec(), &dflash.taps, acceptance)
        .map_err(|e| lower_err("target prefill", e))?;
    Ok((draft_prefill, target_prefill))
}
