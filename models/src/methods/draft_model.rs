//! `method = "draft_model"`: a standalone draft model (any model directory with the
//! target's vocabulary) drafts k tokens one forward at a time.
//!
//! Draft-cache invariant: at a step's start the draft cache `draft/kv.{l}.{k,v}` holds
//! slots `0..n-1`; the first draft forward re-reads `[x(n-1), x(n)]` at `[n-1, n]`, so
//! whether the previous step accepted everything or nothing, the draft sees every committed
//! token once.
//!
//! Variants (adaptive speculation): the same step at a smaller k keeps that invariant and
//! every state shape, and so does plain decoding (k = 0) except that it leaves the draft
//! cache behind: after plain steps from length `n0` on, the cache holds slots `0..n0-1`
//! only. The host re-primes it before the next speculative step by running the draft
//! prefill over the committed tokens of slots `n0-1 .. len-1` (it has them all: the prompt
//! and the emitted tokens), which restores the invariant. Exactness never depends on the
//! draft cache: verify accepts only tokens equal to the target's own.

use std::path::Path;

use specc_ir::engine::DraftKind;
use specc_ir::engine::Phase;
use specc_ir::op::B;
use specc_ir::{BinaryOp, Graph, IrError, Op};

use super::sampling::choose;
use super::step::{
    begin, commit_all, forward, lower_target_prefill, verify_and_commit, Builder, Drafted,
};
use super::variants::lower_variants;
use super::{
    chain_label, draft_checkpoint, lower_decode_step, lower_err, Opened, SpecMethod, StepShape,
    TreeKnobs,
};
use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::spec_bundle::DraftSide;
use crate::spec_config::{field, SpecConfig};
use crate::{lower_dense_prefixed, Model};

/// Prefix of every draft weight and state name in the graphs.
pub const DRAFT_PREFIX: &str = "draft/";

pub(super) struct DraftModel;

impl SpecMethod for DraftModel {
    fn name(&self) -> &'static str {
        "draft_model"
    }

    fn variants(
        &self,
        target: &ModelSpec,
        draft: &DraftSide,
        shape: &StepShape,
        _tree: Option<TreeKnobs>,
        ks: &[u64],
    ) -> Result<Vec<(u64, Graph)>, ModelError> {
        let DraftSide::Model(d) = draft else {
            return Ok(Vec::new());
        };
        lower_variants(shape, "draft_model step variant", ks, |k, at| match k {
            0 => lower_decode_step(target, at),
            _ => lower_draft_model_step(target, d.spec(), at),
        })
    }

    fn open(
        &self,
        target: &Model,
        cfg: &SpecConfig,
        draft_dir: &Path,
        shape: &StepShape,
        random_seed: Option<u64>,
    ) -> Result<Opened, ModelError> {
        let draft = match random_seed {
            Some(seed) => Model::open_random(draft_dir, seed ^ 0xd4af)?,
            None => Model::open(draft_dir)?,
        };
        check_vocab(&cfg.file, target.spec(), draft.spec())?;
        let step = lower_draft_model_step(target.spec(), draft.spec(), shape)
            .map_err(|e| lower_err("draft_model step", e))?;
        let draft_prefill = lower_dense_prefixed(draft.spec(), DRAFT_PREFIX, Phase::Draft)?;
        let target_prefill = lower_target_prefill(target.spec(), &[], &shape.acceptance)
            .map_err(|e| lower_err("target prefill", e))?;
        let draft_checkpoint = draft_checkpoint(draft_dir, &step, DRAFT_PREFIX, random_seed)?;
        Ok(Opened {
            draft: DraftSide::Model(Box::new(draft)),
            draft_checkpoint,
            prefix: DRAFT_PREFIX,
            target_prefill,
            draft_prefill,
            step,
            kind: DraftKind::Model,
            label: chain_label(self.name(), shape.num_steps),
        })
    }
}

/// The draft proposes target token ids: its vocabulary must be the target's (errors name
/// the spec key `draft`).
fn check_vocab(file: &Path, target: &ModelSpec, draft: &ModelSpec) -> Result<(), ModelError> {
    if draft.vocab != target.vocab {
        return Err(field(
            file,
            "draft",
            &format!("a draft with the target's vocabulary of {}", target.vocab),
            format!("vocab_size {}", draft.vocab),
        ));
    }
    Ok(())
}

/// Lowers one speculative step with a standalone draft model (`draft_model`).
pub fn lower_draft_model_step(
    target: &ModelSpec,
    draft: &ModelSpec,
    shape: &StepShape,
) -> Result<Graph, IrError> {
    let k = shape.num_steps;
    let mut g = Graph::new("spec_step_draft_model");
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, shape)?;
    // draft: catch up on [x(n-1), x(n)], then k - 1 single-token steps.
    let len_m1 = b.bin(BinaryOp::Sub, c.len, c.one_b)?;
    let pos0 = b.positions(len_m1, 2, c.live)?;
    let logits0 = b.g.with_phase(Phase::Draft, |g| {
        forward(g, draft, DRAFT_PREFIX, c.pending, pos0)
    })?;
    let mut row = b.g.add(
        Op::Slice {
            axis: 1,
            start: 1,
            len: 1,
        },
        &[logits0],
    )?;
    let mut d = Drafted {
        tokens: Vec::new(),
        dists: Vec::new(),
    };
    for j in 0..k {
        let tok = choose(&mut b, shape, &c, row, k + 1 + j, &mut d.dists)?;
        d.tokens.push(tok);
        if j + 1 < k {
            let offset = b.fill_i32(j as i64 + 1, &[B])?;
            let start = b.bin(BinaryOp::Add, c.len, offset)?;
            let pos = b.positions(start, 1, c.live)?;
            row =
                b.g.with_phase(Phase::Draft, |g| forward(g, draft, DRAFT_PREFIX, tok, pos))?;
        }
    }
    let v = verify_and_commit(&mut b, &c, target, shape, d, &[])?;
    commit_all(&mut b, &v.commits)?;
    Ok(g)
}
