//! `method = "eagle3"`: an EAGLE-3 head (its published format and forward: `head`) drafts
//! from the target's tapped hidden states, either as a chain of `num_steps` tokens
//! (`topk = 1`) or as a dynamic draft tree (`topk > 1`) of `num_draft_tokens` nodes verified
//! like DDTree's.

mod chain;
mod head;
mod pairs;
mod tree;

use std::path::Path;

use specc_ir::engine::DraftKind;
use specc_ir::Graph;

use super::step::lower_target_prefill;
use super::tree::MAX_TREE_BUDGET;
use super::variants::{lower_variants, scaled_budget};
use super::{
    chain_context_width, chain_label, draft_checkpoint, lower_err, Opened, SpecMethod, StepShape,
    TreeKeys, TreeKnobs,
};
use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::spec_bundle::DraftSide;
use crate::spec_config::{field, SpecConfig};
use crate::Model;

pub use chain::lower_eagle3_step;
pub use head::{
    default_taps, draft_logits, fc, midlayer, midlayer_masked, next_token, to_target, Eagle3Spec,
    HeadAttn, ARCHITECTURE, EAGLE_PREFIX,
};
pub use pairs::{
    lower_eagle3_prefill, EAGLE_BASE, EAGLE_COUNT, EAGLE_HIDDEN, EAGLE_RING_HIDDEN,
    EAGLE_RING_TOKENS, EAGLE_TOKENS,
};
pub use tree::lower_eagle3_tree_step;

/// EAGLE-3 trees: `topk` children per frontier node (1 = the chain).
pub const MAX_EAGLE_TOPK: u32 = 16;
/// EAGLE-3 trees: default `num_draft_tokens` (capped at the candidates + 1).
pub const DEFAULT_EAGLE_TREE_NODES: u32 = 32;

/// Candidates of an EAGLE-3 tree of `depth` levels: `topk` at depth 1, `topk²` below.
pub fn eagle_tree_candidates(depth: u32, topk: u32) -> u64 {
    topk as u64 + (depth as u64 - 1) * (topk as u64).pow(2)
}

/// Cache slots an EAGLE-3 tree step writes past `len`, minus one: the verify's
/// `num_draft_tokens − 1` or the head's `(depth − 1) · topk` draft rows.
pub fn eagle_tree_margin(depth: u32, tree: TreeKnobs) -> usize {
    (tree.budget as usize - 1).max((depth as usize - 1) * tree.topk as usize)
}

pub(super) struct Eagle3;

impl SpecMethod for Eagle3 {
    fn name(&self) -> &'static str {
        "eagle3"
    }

    fn tree_knobs(
        &self,
        file: &Path,
        keys: TreeKeys,
        num_steps: u32,
    ) -> Result<Option<TreeKnobs>, ModelError> {
        if let Some(v) = keys.budget {
            let msg = "absent unless method = \"ddtree\" (eagle3 trees: num_draft_tokens)";
            return Err(field(file, "budget", msg, v));
        }
        tree_knobs(file, num_steps, keys.topk, keys.num_draft_tokens)
    }

    fn verify_margin(&self, num_steps: u32, tree: Option<TreeKnobs>) -> usize {
        match tree {
            Some(t) => eagle_tree_margin(num_steps, t),
            None => num_steps as usize,
        }
    }

    fn context_width(&self, num_steps: u32, tree: Option<TreeKnobs>) -> (u32, String) {
        match tree {
            Some(t) => (
                eagle_tree_margin(num_steps, t) as u32 + 1,
                format!(
                    "num_draft_tokens = {}, topk = {}, num_steps = {num_steps}",
                    t.budget, t.topk
                ),
            ),
            None => chain_context_width(num_steps),
        }
    }

    /// Chains: k = 0, 1, ⌈k/2⌉; trees: depths 0, 1, ⌈depth/2⌉ with the same `topk` and
    /// a budget scaled with the depth. All over the configured step's `depth + 1` pending
    /// pairs; k = 0 queues its pairs for the catch-up (`methods::variants`).
    fn variants(
        &self,
        target: &ModelSpec,
        draft: &DraftSide,
        shape: &StepShape,
        tree: Option<TreeKnobs>,
        ks: &[u64],
    ) -> Result<Vec<(u64, Graph)>, ModelError> {
        let DraftSide::Eagle3(eagle) = draft else {
            return Ok(Vec::new());
        };
        let full = shape.num_steps;
        let rows = full + 1;
        lower_variants(shape, "eagle3 step variant", ks, |k, at| match (k, tree) {
            (0, _) => chain::lower_eagle3_plain(target, eagle, at, rows),
            (_, None) => chain::lower_eagle3_chain(target, eagle, at, rows),
            (_, Some(t)) => {
                let nodes = eagle_tree_candidates(k as u32, t.topk) + 1;
                let budget = scaled_budget(t.budget as u64, k, full, nodes) as u32;
                let t = TreeKnobs { budget, ..t };
                tree::lower_eagle3_tree(target, eagle, at, t, rows)
            }
        })
    }

    /// The catch-up of the plain variant's queued pairs, over the configured step's
    /// `depth + 1` pending pairs.
    fn catch_up(
        &self,
        target: &ModelSpec,
        draft: &DraftSide,
        shape: &StepShape,
    ) -> Result<Option<Graph>, ModelError> {
        let DraftSide::Eagle3(eagle) = draft else {
            return Ok(None);
        };
        chain::lower_eagle3_catch_up(target, eagle, shape, shape.num_steps + 1)
            .map(Some)
            .map_err(|e| lower_err("eagle3 catch-up", e))
    }

    fn open(
        &self,
        target: &Model,
        cfg: &SpecConfig,
        draft_dir: &Path,
        shape: &StepShape,
        random_seed: Option<u64>,
    ) -> Result<Opened, ModelError> {
        let eagle = Eagle3Spec::from_dir(draft_dir, target.spec())?;
        let step = match cfg.tree {
            Some(tree) => lower_eagle3_tree_step(target.spec(), &eagle, shape, tree)
                .map_err(|e| lower_err("eagle3 tree step", e))?,
            None => lower_eagle3_step(target.spec(), &eagle, shape)
                .map_err(|e| lower_err("eagle3 step", e))?,
        };
        let draft_prefill = lower_eagle3_prefill(target.spec(), &eagle)
            .map_err(|e| lower_err("eagle3 prefill", e))?;
        let target_prefill = lower_target_prefill(target.spec(), &eagle.taps, &shape.acceptance)
            .map_err(|e| lower_err("target prefill", e))?;
        let draft_checkpoint = draft_checkpoint(draft_dir, &step, EAGLE_PREFIX, random_seed)?;
        let taps_width = 3 * eagle.hidden();
        let k = shape.num_steps;
        let (kind, label) = match cfg.tree {
            Some(t) => (
                DraftKind::Eagle3Tree {
                    taps_width,
                    depth: k as usize,
                },
                format!(
                    "{} tree depth={k} num_draft_tokens={} topk={}",
                    self.name(),
                    t.budget,
                    t.topk
                ),
            ),
            None => (
                DraftKind::Eagle3 { taps_width },
                chain_label(self.name(), k),
            ),
        };
        Ok(Opened {
            draft: DraftSide::Eagle3(Box::new(eagle)),
            draft_checkpoint,
            prefix: EAGLE_PREFIX,
            target_prefill,
            draft_prefill,
            step,
            kind,
            label,
        })
    }
}

/// `topk` / `num_draft_tokens` of `method = "eagle3"`: `None` for the chain (topk = 1).
fn tree_knobs(
    file: &Path,
    depth: u32,
    topk: Option<u32>,
    nodes: Option<u32>,
) -> Result<Option<TreeKnobs>, ModelError> {
    let topk = topk.unwrap_or(1);
    if !(1..=MAX_EAGLE_TOPK).contains(&topk) {
        let msg = format!("children per frontier node in 1..={MAX_EAGLE_TOPK} (1 = chain)");
        return Err(field(file, "topk", &msg, topk));
    }
    if topk == 1 {
        if let Some(n) = nodes {
            let msg = "absent when topk = 1 (a chain verifies num_steps + 1 tokens)";
            return Err(field(file, "num_draft_tokens", msg, n));
        }
        return Ok(None);
    }
    let candidates = eagle_tree_candidates(depth, topk);
    if candidates > specc_ir::op::MAX_TREE_CANDIDATES {
        let msg = format!(
            "topk + (num_steps - 1) * topk^2 <= {} candidates (topk = {topk})",
            specc_ir::op::MAX_TREE_CANDIDATES
        );
        return Err(field(file, "num_steps", &msg, depth));
    }
    let most = (candidates + 1).min(MAX_TREE_BUDGET as u64) as u32;
    let n = nodes.unwrap_or(DEFAULT_EAGLE_TREE_NODES.min(most));
    if !(2..=most).contains(&n) {
        let msg = format!(
            "tree nodes verified, the root included, in 2..={most} (at most 1 + topk + (num_steps - 1) * topk^2 and {MAX_TREE_BUDGET})"
        );
        return Err(field(file, "num_draft_tokens", &msg, n));
    }
    Ok(Some(TreeKnobs { budget: n, topk }))
}
