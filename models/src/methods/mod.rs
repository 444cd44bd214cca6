//! One module per speculative method: its `spec.toml` knobs, the graphs it lowers and its
//! step contract. What every method shares lives beside them: the step skeleton
//! ([`step`]: states, verify, acceptance, commit, emit), sampled acceptance, and the tree
//! verify/commit of [`tree`].
//!
//! [`Method::imp`] is the one place that maps a method to its module: a new method is one
//! module implementing [`SpecMethod`] plus one match arm there.

use std::path::Path;

use serde::Deserialize;
use specc_ir::engine::DraftKind;
use specc_ir::{Graph, IrError};

use crate::checkpoint::Checkpoint;
use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::spec_bundle::DraftSide;
use crate::spec_config::{field, SpecConfig, MAX_STEPS};
use crate::Model;

pub mod ddtree;
pub mod dflash;
pub mod draft_model;
pub mod eagle3;
mod plain;
mod sampling;
mod step;
mod tree;
mod variants;

pub use ddtree::lower_ddtree_step;
pub use dflash::{
    lower_dflash_prefill, lower_dflash_step, DFLASH_BASE, DFLASH_COUNT, DFLASH_HIDDEN,
    DFLASH_RING_HIDDEN,
};
pub use draft_model::{lower_draft_model_step, DRAFT_PREFIX};
pub use eagle3::{
    lower_eagle3_prefill, lower_eagle3_step, lower_eagle3_tree_step, EAGLE_BASE, EAGLE_COUNT,
    EAGLE_HIDDEN, EAGLE_RING_HIDDEN, EAGLE_RING_TOKENS, EAGLE_TOKENS,
};
pub use plain::{lower_decode_step, lower_plain, lower_plain_greedy};
pub use sampling::{FIRST_TOKEN, SAMPLING};
pub use step::{
    forward, forward_with_taps, lower_target_prefill, StepShape, ACCEPTED, BUDGET, EMITTED, HIDDEN,
    LEN, PENDING, RING, STEP, STREAM, VERIFY_TOKENS,
};
pub use tree::{TreeKnobs, MAX_TREE_BUDGET, TREE};
pub use variants::{variant_ks, CATCH_UP_ROWS};

/// `spec.toml`'s `method`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    None,
    DraftModel,
    Eagle3,
    /// A DFlash block drafter: k = its `block_size` − 1, drafted in one forward.
    #[serde(rename = "dflash")]
    DFlash,
    /// DDTree: a draft tree of `budget` nodes built from a DFlash drafter's block
    /// log-probs, verified with a tree mask, accepted greedily along one path.
    #[serde(rename = "ddtree")]
    DDTree,
}

impl Method {
    /// The module that implements this method.
    pub(crate) fn imp(self) -> &'static dyn SpecMethod {
        match self {
            Method::None => &plain::Plain,
            Method::DraftModel => &draft_model::DraftModel,
            Method::Eagle3 => &eagle3::Eagle3,
            Method::DFlash => &dflash::DFlash,
            Method::DDTree => &ddtree::DDTree,
        }
    }

    /// The method's name as spec.toml spells it.
    pub fn name(self) -> &'static str {
        self.imp().name()
    }

    /// Cache slots one step writes past `len`, minus one: the context margin the host keeps
    /// (`num_steps` for chains and blocks, `budget − 1` for DDTree, and for EAGLE-3 trees
    /// [`eagle3::eagle_tree_margin`]).
    pub fn verify_margin(self, tree: Option<TreeKnobs>, num_steps: u32) -> usize {
        self.imp().verify_margin(num_steps, tree)
    }
}

/// `num_steps` when spec.toml leaves it out (and the method's draft does not fix it).
pub const DEFAULT_NUM_STEPS: u32 = 4;

/// The tree keys of spec.toml as written; each method takes the ones it knows.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TreeKeys {
    pub budget: Option<u32>,
    pub topk: Option<u32>,
    pub num_draft_tokens: Option<u32>,
}

/// What a method opens for [`crate::SpecBundle`]: its draft and checkpoint, the three
/// graphs, and the method's part of the step contract.
pub(crate) struct Opened {
    pub draft: DraftSide,
    pub draft_checkpoint: Checkpoint,
    /// Name prefix of the draft's weights and states inside the graphs.
    pub prefix: &'static str,
    pub target_prefill: Graph,
    pub draft_prefill: Graph,
    pub step: Graph,
    /// How admission primes the draft.
    pub kind: DraftKind,
    /// A one-line description for reports.
    pub label: String,
}

/// One speculative method. The defaults describe a chain of `num_steps` draft tokens with a
/// draft checkpoint and no tree.
pub(crate) trait SpecMethod: Sync {
    /// The method's name as spec.toml spells it.
    fn name(&self) -> &'static str;

    /// `num_steps` when spec.toml has none; `draft` is the draft directory, if named.
    fn default_num_steps(&self, _draft: Option<&Path>) -> Result<u32, ModelError> {
        Ok(DEFAULT_NUM_STEPS)
    }

    /// Checks `num_steps` (explicit or defaulted).
    fn check_num_steps(&self, file: &Path, num_steps: u32) -> Result<(), ModelError> {
        if !(1..=MAX_STEPS).contains(&num_steps) {
            return Err(field(
                file,
                "num_steps",
                &format!("1..={MAX_STEPS}"),
                num_steps,
            ));
        }
        Ok(())
    }

    /// Checks spec.toml's `draft` as written.
    fn check_draft_key(&self, file: &Path, draft: Option<&Path>) -> Result<(), ModelError> {
        match draft {
            Some(_) => Ok(()),
            None => Err(field(
                file,
                "draft",
                "the draft checkpoint directory",
                "nothing",
            )),
        }
    }

    /// The draft tree this method builds from the tree keys, `None` for a chain.
    fn tree_knobs(
        &self,
        file: &Path,
        keys: TreeKeys,
        _num_steps: u32,
    ) -> Result<Option<TreeKnobs>, ModelError> {
        for (key, v) in [
            ("budget", keys.budget),
            ("topk", keys.topk),
            ("num_draft_tokens", keys.num_draft_tokens),
        ] {
            if let Some(v) = v {
                let msg = "absent unless method = \"ddtree\" or \"eagle3\"";
                return Err(field(file, key, msg, v));
            }
        }
        Ok(None)
    }

    /// Cache slots one step writes past `len`, minus one.
    fn verify_margin(&self, num_steps: u32, _tree: Option<TreeKnobs>) -> usize {
        num_steps as usize
    }

    /// The step width that sizes the smallest `max_context`, `2 · (width + 2)`, and the
    /// keys it comes from (for the error).
    fn context_width(&self, num_steps: u32, _tree: Option<TreeKnobs>) -> (u32, String) {
        chain_context_width(num_steps)
    }

    /// The step at each draft size of `ks` (ascending; [`variant_ks`] gives those an
    /// adaptive policy may switch to besides the configured `shape.num_steps`, a tree's
    /// depth; `tree`: the configured tree): graphs over exactly the configured step's states
    /// (`k = 0`: plain decoding over them), so any step may follow any other ([`variants`]
    /// module docs); at `k = shape.num_steps`, the configured step's draft. Empty (the
    /// default) where a switch could not keep the draft's state whole.
    fn variants(
        &self,
        _target: &ModelSpec,
        _draft: &DraftSide,
        _shape: &StepShape,
        _tree: Option<TreeKnobs>,
        _ks: &[u64],
    ) -> Result<Vec<(u64, Graph)>, ModelError> {
        Ok(Vec::new())
    }

    /// The catch-up of the rows its plain variant (k = 0) queues, over the configured
    /// step's states, where the draft reads the target's hidden states
    /// ([`specc_ir::engine::CatchUp`]); `None` (the default) for the others.
    fn catch_up(
        &self,
        _target: &ModelSpec,
        _draft: &DraftSide,
        _shape: &StepShape,
    ) -> Result<Option<Graph>, ModelError> {
        Ok(None)
    }

    /// Opens the draft in `draft_dir` for `target` and lowers the method's graphs.
    fn open(
        &self,
        target: &Model,
        cfg: &SpecConfig,
        draft_dir: &Path,
        shape: &StepShape,
        random_seed: Option<u64>,
    ) -> Result<Opened, ModelError>;
}

/// [`SpecMethod::context_width`] of a chain: its `num_steps`.
fn chain_context_width(num_steps: u32) -> (u32, String) {
    (num_steps, format!("num_steps = {num_steps}"))
}

/// The report label of a chain of `k` draft tokens.
fn chain_label(name: &str, k: u64) -> String {
    format!("{name} k={k}")
}

fn lower_err(what: &str, source: IrError) -> ModelError {
    ModelError::Lower {
        model: what.into(),
        source,
    }
}

/// The draft's checkpoint in `dir`, or with `random_seed` one synthesised for the draft
/// weights of `step` (named `prefix` + name).
fn draft_checkpoint(
    dir: &Path,
    step: &Graph,
    prefix: &str,
    random_seed: Option<u64>,
) -> Result<Checkpoint, ModelError> {
    match random_seed {
        Some(seed) => Ok(crate::spec_bundle::random_draft(dir, step, prefix, seed)),
        None => Checkpoint::open(dir),
    }
}
