//! `method = "ddtree"`: a DFlash drafter's block log-probs expanded into a draft tree of
//! `budget` nodes on device, verified in one target forward under a tree mask, accepted
//! along one root-to-node path, and committed by moving the path's cache rows (the shared
//! tree verify and commit: `methods::tree`).
//!
//! States: the common ones (`methods::step` module docs) and DFlash's `dflash.{hidden,
//! count, base}` (the drafter's pending context), with `hidden` holding `L + 1` rows, L =
//! the drafter's `block_size − 1` = the deepest tree level. The prefill is DFlash's.

use std::path::Path;

use specc_ir::engine::DraftKind;
use specc_ir::op::B;
use specc_ir::{Graph, IrError, Op};

use super::dflash::{self, draft_block, DFlashSpec, DFLASH_PREFIX};
use super::step::{begin, commit_all, Builder};
use super::tree::{accept_and_commit, verify_tree, MAX_TREE_BUDGET};
use super::variants::{lower_variants, scaled_budget, tree_nodes};
use super::{draft_checkpoint, lower_err, Opened, SpecMethod, StepShape, TreeKeys, TreeKnobs};
use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::spec_bundle::DraftSide;
use crate::spec_config::{field, SpecConfig};
use crate::Model;

pub const MIN_TREE_BUDGET: u32 = 16;
pub const MAX_TREE_TOPK: u32 = 64;
pub const DEFAULT_TREE_BUDGET: u32 = 64;
pub const DEFAULT_TREE_TOPK: u32 = 8;

pub(super) struct DDTree;

impl SpecMethod for DDTree {
    fn name(&self) -> &'static str {
        "ddtree"
    }

    fn default_num_steps(&self, draft: Option<&Path>) -> Result<u32, ModelError> {
        dflash::default_num_steps(draft)
    }

    /// `budget` and `topk` (defaulted); `num_draft_tokens` is EAGLE-3's name for a tree's
    /// size and has no place here.
    fn tree_knobs(
        &self,
        file: &Path,
        keys: TreeKeys,
        _num_steps: u32,
    ) -> Result<Option<TreeKnobs>, ModelError> {
        let budget = keys.budget.unwrap_or(DEFAULT_TREE_BUDGET);
        if !(MIN_TREE_BUDGET..=MAX_TREE_BUDGET).contains(&budget) {
            return Err(field(
                file,
                "budget",
                &format!("a node budget in {MIN_TREE_BUDGET}..={MAX_TREE_BUDGET}"),
                budget,
            ));
        }
        let topk = keys.topk.unwrap_or(DEFAULT_TREE_TOPK);
        if !(1..=MAX_TREE_TOPK).contains(&topk) {
            return Err(field(
                file,
                "topk",
                &format!("candidates per depth in 1..={MAX_TREE_TOPK}"),
                topk,
            ));
        }
        if let Some(v) = keys.num_draft_tokens {
            let msg = "absent with method = \"ddtree\" (its tree size is `budget`)";
            return Err(field(file, "num_draft_tokens", msg, v));
        }
        Ok(Some(TreeKnobs { budget, topk }))
    }

    fn verify_margin(&self, num_steps: u32, tree: Option<TreeKnobs>) -> usize {
        match tree {
            Some(t) => t.budget as usize - 1,
            None => num_steps as usize,
        }
    }

    fn context_width(&self, num_steps: u32, tree: Option<TreeKnobs>) -> (u32, String) {
        match tree {
            Some(t) => (t.budget, format!("budget = {}", t.budget)),
            None => super::chain_context_width(num_steps),
        }
    }

    /// Depths 0, 1, ⌈L/2⌉ (L = the block's drafts): the same block drafted, a tree over
    /// its first rows with the same `topk` and a budget scaled with the depth, over the
    /// configured step's `L + 1` pending context rows; depth 0 is DFlash's plain step,
    /// which queues its rows for the catch-up (`methods::variants`).
    fn variants(
        &self,
        target: &ModelSpec,
        draft: &DraftSide,
        shape: &StepShape,
        tree: Option<TreeKnobs>,
        ks: &[u64],
    ) -> Result<Vec<(u64, Graph)>, ModelError> {
        let (DraftSide::DFlash(dflash), Some(t)) = (draft, tree) else {
            return Ok(Vec::new());
        };
        let full = shape.num_steps;
        lower_variants(shape, "ddtree step variant", ks, |d, at| match d {
            0 => dflash::lower_dflash_plain(target, dflash, at),
            _ => {
                let nodes = tree_nodes(d, t.topk as u64);
                let budget = scaled_budget(t.budget as u64, d, full, nodes) as u32;
                lower_ddtree(target, dflash, at, TreeKnobs { budget, ..t })
            }
        })
    }

    /// DFlash's catch-up: the plain variant is DFlash's.
    fn catch_up(
        &self,
        target: &ModelSpec,
        draft: &DraftSide,
        shape: &StepShape,
    ) -> Result<Option<Graph>, ModelError> {
        let DraftSide::DFlash(dflash) = draft else {
            return Ok(None);
        };
        dflash::lower_dflash_catch_up(target, dflash, shape)
            .map(Some)
            .map_err(|e| lower_err("ddtree catch-up", e))
    }

    fn open(
        &self,
        target: &Model,
        cfg: &SpecConfig,
        draft_dir: &Path,
        shape: &StepShape,
        random_seed: Option<u64>,
    ) -> Result<Opened, ModelError> {
        let tree = cfg.tree.ok_or_else(|| {
            ModelError::field(&cfg.file, "budget", "a DDTree's tree knobs", "nothing")
        })?;
        let drafter = dflash::open_drafter(target, cfg, draft_dir)?;
        let step = lower_ddtree_step(target.spec(), &drafter, shape, tree)
            .map_err(|e| lower_err("ddtree step", e))?;
        let (draft_prefill, target_prefill) =
            dflash::prefills(target, &drafter, &shape.acceptance)?;
        let draft_checkpoint = draft_checkpoint(draft_dir, &step, DFLASH_PREFIX, random_seed)?;
        let kind = DraftKind::DDTree {
            taps_width: drafter.taps_width(),
            depth: drafter.num_steps(),
        };
        let label = format!(
            "{} depth={} budget={} topk={}",
            self.name(),
            shape.num_steps,
            tree.budget,
            tree.topk
        );
        Ok(Opened {
            draft: DraftSide::DFlash(Box::new(drafter)),
            draft_checkpoint,
            prefix: DFLASH_PREFIX,
            target_prefill,
            draft_prefill,
            step,
            kind,
            label,
        })
    }
}

/// Lowers one DDTree step (greedy or sampled acceptance: see [`accept_and_commit`]).
///
/// 1. Draft: the DFlash block forward (context catch-up + block `[x(n), MASK × L]`), rows
///    `1..=L` → log-softmax → top-K per depth → `tree_build` (node 0 = x(n)).
/// 2. Verify: the target over the `budget` tree tokens (tree mask, RoPE at `n + depth`,
///    cache slots `n + node`), taps = the drafter's `target_layer_ids`.
/// 3. Accept: `tree_accept` over the target's token at every node (argmax, or a draw).
/// 4. Commit: cache rows of the path moved to `n + depth` (`kv_move`), the path's taps
///    become the drafter's pending context (`count = a + 1`, `base = n`), tokens emitted.
///
/// Panics unless `shape.num_steps == block_size − 1` ([`crate::SpecBundle`] checks it).
pub fn lower_ddtree_step(
    target: &ModelSpec,
    dflash: &DFlashSpec,
    shape: &StepShape,
    tree: TreeKnobs,
) -> Result<Graph, IrError> {
    assert_eq!(
        shape.num_steps as usize,
        dflash.num_steps(),
        "a DDTree step's depth is the drafter's block_size - 1"
    );
    lower_ddtree(target, dflash, shape, tree)
}

/// A DDTree step whose tree takes the block's first `shape.num_steps` rows, `1 ..= L`
/// (fewer: a shallower variant over the configured step's states, `methods::variants`).
/// The drafter still runs its whole block.
fn lower_ddtree(
    target: &ModelSpec,
    dflash: &DFlashSpec,
    shape: &StepShape,
    tree: TreeKnobs,
) -> Result<Graph, IrError> {
    let l = shape.num_steps;
    let full = dflash.num_steps() as u64;
    assert!((1..=full).contains(&l), "a tree of 1..=L levels");
    let (n, k) = (tree.budget as u64, tree.topk as u64);
    let mut g = Graph::new("spec_step_ddtree");
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, shape)?;

    // 1. draft: block logits, log-probs of rows 1..=l, top-K, tree.
    let block = draft_block(&mut b, &c, target, dflash, full)?;
    let rows = b.slice_cols(block.logits, 1, l)?;
    let probs = b.g.add(Op::Softmax, &[rows])?;
    let logp = b.g.add(Op::Unary(specc_ir::UnaryOp::Log), &[probs])?;
    let ids = b.g.add(Op::TopK { k }, &[logp])?;
    let top = b.g.add(Op::Gather { axis: 2 }, &[logp, ids])?;
    let root = b.reshape(block.bonus, &[B])?;
    let tree_v = b.g.add(Op::TreeBuild { budget: n }, &[top, ids, root])?;

    // 2.–4. verify, accept, commit.
    let v = verify_tree(&mut b, &c, target, tree_v, n, &dflash.taps)?;
    let t = accept_and_commit(&mut b, &c, shape, tree_v, v, l)?;
    let mut commits = block
        .pending()
        .commits(&mut b, &c, t.path_taps, None, t.a1)?;
    commits.extend(t.commits);
    commit_all(&mut b, &commits)?;
    Ok(g)
}
