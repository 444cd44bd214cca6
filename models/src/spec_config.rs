//! `spec.toml`: how to speculate. Parsed raw with serde (unknown keys are errors), then
//! resolved against the target's and the draft's [`ModelSpec`]s into a [`SpecPlan`].
//!
//! ```toml
//! method = "draft_model"    # none | draft_model | eagle3 | dflash | ddtree
//! target = "."              # optional: the target dir (for SPECC_SPEC=... cargo build)
//! draft = "../tiny-draft"   # draft checkpoint dir, relative to this file
//! num_steps = 7             # k: draft tokens per step; verify reads k + 1
//! batch_buckets = [1, 4]    # one captured step graph per bucket
//! max_context = 512         # KV slots per sequence
//! budget = 64               # ddtree only: draft-tree nodes verified per step, 16..=256
//! topk = 8                  # ddtree: candidate tokens per depth, 1..=64;
//!                           # eagle3: children per frontier node, 1..=16 (> 1: a tree)
//! num_draft_tokens = 32     # eagle3 with topk > 1: tree nodes verified, the root included
//!
//! [acceptance]
//! mode = "greedy"           # greedy | sample
//! temperature = 1.0         # sample only
//! top_p = 1.0               # sample only
//! seed = 0                  # sample only: counter-based device RNG seed
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::ModelSpec;
use crate::error::ModelError;

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

/// DDTree knobs (spec keys `budget`, `topk`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeKnobs {
    /// Nodes per tree, the root (bonus token) included: the verify width.
    pub budget: u32,
    /// Candidate tokens per depth (the top-K of each block row).
    pub topk: u32,
}

pub const MIN_TREE_BUDGET: u32 = 16;
pub const MAX_TREE_BUDGET: u32 = 256;
pub const MAX_TREE_TOPK: u32 = 64;
pub const DEFAULT_TREE_BUDGET: u32 = 64;
pub const DEFAULT_TREE_TOPK: u32 = 8;
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

/// Cache slots one step writes past `len`, minus one: the context margin the host keeps
/// (`num_steps` for chains and blocks, `budget − 1` for DDTree, [`eagle_tree_margin`]).
pub fn verify_margin(method: Method, tree: Option<TreeKnobs>, num_steps: u32) -> usize {
    match (method, tree) {
        (Method::Eagle3, Some(t)) => eagle_tree_margin(num_steps, t),
        (_, Some(t)) => t.budget as usize - 1,
        (_, None) => num_steps as usize,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AcceptMode {
    #[default]
    Greedy,
    Sample,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAcceptance {
    #[serde(default)]
    mode: AcceptMode,
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: Option<u64>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    method: Method,
    target: Option<PathBuf>,
    draft: Option<PathBuf>,
    num_steps: Option<u32>,
    batch_buckets: Option<Vec<u32>>,
    max_context: Option<u64>,
    acceptance: Option<RawAcceptance>,
    budget: Option<u32>,
    topk: Option<u32>,
    num_draft_tokens: Option<u32>,
}

/// Acceptance rule with its knobs.
#[derive(Clone, Debug, PartialEq)]
pub enum Acceptance {
    Greedy,
    Sample {
        temperature: f64,
        top_p: f64,
        seed: u64,
    },
}

/// A validated spec file.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecConfig {
    pub file: PathBuf,
    pub method: Method,
    /// The target model directory, when the spec names one (relative to the spec file). Used
    /// when the spec is compiled on its own (`SPECC_SPEC=spec.toml cargo build`); on the CLI the
    /// model argument names the target.
    pub target: Option<PathBuf>,
    /// Absolute or relative-to-cwd path of the draft checkpoint (resolved against the
    /// spec file's folder).
    pub draft: Option<PathBuf>,
    pub num_steps: u32,
    pub batch_buckets: Vec<u32>,
    pub max_context: Option<u64>,
    pub acceptance: Acceptance,
    /// `Some` exactly when `method = "ddtree"`, or `method = "eagle3"` with `topk > 1`
    /// (then `budget` = `num_draft_tokens`).
    pub tree: Option<TreeKnobs>,
    /// The file's text as read (an engine records it).
    pub text: String,
}

/// Largest k: tree masks hold 64 nodes, and k + 1 verify tokens must fit.
pub const MAX_STEPS: u32 = 63;
pub const MAX_BUCKET: u32 = 256;

fn field(file: &Path, field: &str, expected: &str, found: impl ToString) -> ModelError {
    ModelError::Field {
        file: file.to_path_buf(),
        field: field.into(),
        expected: expected.into(),
        found: found.to_string(),
    }
}

impl SpecConfig {
    pub fn from_file(file: &Path) -> Result<SpecConfig, ModelError> {
        let text = std::fs::read_to_string(file).map_err(|source| ModelError::Io {
            file: file.to_path_buf(),
            source,
        })?;
        Self::from_toml(file, &text)
    }

    pub fn from_toml(file: &Path, text: &str) -> Result<SpecConfig, ModelError> {
        let raw: RawSpec = toml::from_str(text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((0, 0));
            ModelError::Toml {
                file: file.to_path_buf(),
                line,
                column,
                msg,
            }
        })?;
        let num_steps = match (raw.method, raw.num_steps, &raw.draft) {
            (_, Some(n), _) => n,
            (Method::None, None, _) => 0,
            // The drafter's block fixes k; a missing draft is reported below.
            (Method::DFlash | Method::DDTree, None, Some(d)) => {
                let dir = file.parent().unwrap_or(Path::new(".")).join(d);
                crate::dflash::block_size_of(&dir)? as u32 - 1
            }
            (_, None, _) => 4,
        };
        if raw.method != Method::None && !(1..=MAX_STEPS).contains(&num_steps) {
            return Err(field(
                file,
                "num_steps",
                &format!("1..={MAX_STEPS}"),
                num_steps,
            ));
        }
        if raw.method == Method::None && num_steps != 0 {
            return Err(field(
                file,
                "num_steps",
                "0 or absent when method = \"none\"",
                num_steps,
            ));
        }
        let draft = match (raw.method, raw.draft) {
            (Method::None, Some(d)) => {
                return Err(field(
                    file,
                    "draft",
                    "absent when method = \"none\"",
                    d.display(),
                ))
            }
            (Method::None, None) => None,
            (_, None) => {
                return Err(field(
                    file,
                    "draft",
                    "the draft checkpoint directory",
                    "nothing",
                ))
            }
            (_, Some(d)) => Some(file.parent().unwrap_or(Path::new(".")).join(d)),
        };
        let tree = if raw.method == Method::DDTree {
            let budget = raw.budget.unwrap_or(DEFAULT_TREE_BUDGET);
            if !(MIN_TREE_BUDGET..=MAX_TREE_BUDGET).contains(&budget) {
                return Err(field(
                    file,
                    "budget",
                    &format!("a node budget in {MIN_TREE_BUDGET}..={MAX_TREE_BUDGET}"),
                    budget,
                ));
            }
            let topk = raw.topk.unwrap_or(DEFAULT_TREE_TOPK);
            if !(1..=MAX_TREE_TOPK).contains(&topk) {
                return Err(field(
                    file,
                    "topk",
                    &format!("candidates per depth in 1..={MAX_TREE_TOPK}"),
                    topk,
                ));
            }
            Some(TreeKnobs { budget, topk })
        } else if raw.method == Method::Eagle3 {
            if let Some(v) = raw.budget {
                let msg = "absent unless method = \"ddtree\" (eagle3 trees: num_draft_tokens)";
                return Err(field(file, "budget", msg, v));
            }
            eagle_tree_knobs(file, num_steps, raw.topk, raw.num_draft_tokens)?
        } else {
            for (key, v) in [
                ("budget", raw.budget),
                ("topk", raw.topk),
                ("num_draft_tokens", raw.num_draft_tokens),
            ] {
                if let Some(v) = v {
                    let msg = "absent unless method = \"ddtree\" or \"eagle3\"";
                    return Err(field(file, key, msg, v));
                }
            }
            None
        };
        if raw.method == Method::DDTree {
            if let Some(v) = raw.num_draft_tokens {
                let msg = "absent with method = \"ddtree\" (its tree size is `budget`)";
                return Err(field(file, "num_draft_tokens", msg, v));
            }
        }
        let mut buckets = raw.batch_buckets.unwrap_or_else(|| vec![1]);
        if buckets.is_empty() || buckets.iter().any(|&b| b == 0 || b > MAX_BUCKET) {
            return Err(field(
                file,
                "batch_buckets",
                &format!("a non-empty list of sizes in 1..={MAX_BUCKET}"),
                format!("{buckets:?}"),
            ));
        }
        buckets.sort_unstable();
        buckets.dedup();
        if let Some(c) = raw.max_context {
            let (width, what) = match (raw.method, tree) {
                (Method::Eagle3, Some(t)) => (
                    eagle_tree_margin(num_steps, t) as u32 + 1,
                    format!(
                        "num_draft_tokens = {}, topk = {}, num_steps = {num_steps}",
                        t.budget, t.topk
                    ),
                ),
                (_, Some(t)) => (t.budget, format!("budget = {}", t.budget)),
                (_, None) => (num_steps, format!("num_steps = {num_steps}")),
            };
            if c < 2 * (width as u64 + 2) {
                return Err(field(
                    file,
                    "max_context",
                    &format!("at least {} for {what}", 2 * (width + 2)),
                    c,
                ));
            }
        }
        let acceptance = match raw.acceptance {
            None => Acceptance::Greedy,
            Some(a) => match a.mode {
                AcceptMode::Greedy => {
                    for (k, v) in [("temperature", a.temperature), ("top_p", a.top_p)] {
                        if let Some(v) = v {
                            return Err(field(
                                file,
                                &format!("acceptance.{k}"),
                                "absent when acceptance.mode = \"greedy\"",
                                v,
                            ));
                        }
                    }
                    Acceptance::Greedy
                }
                AcceptMode::Sample => {
                    let temperature = a.temperature.unwrap_or(1.0);
                    if !(temperature > 0.0 && temperature.is_finite()) {
                        return Err(field(
                            file,
                            "acceptance.temperature",
                            "a number > 0",
                            temperature,
                        ));
                    }
                    let top_p = a.top_p.unwrap_or(1.0);
                    if !(top_p > 0.0 && top_p <= 1.0) {
                        return Err(field(file, "acceptance.top_p", "a number in (0, 1]", top_p));
                    }
                    if top_p < 1.0 {
                        return Err(field(
                            file,
                            "acceptance.top_p",
                            "1.0 (nucleus truncation inside the step graph is not implemented)",
                            top_p,
                        ));
                    }
                    Acceptance::Sample {
                        temperature,
                        top_p,
                        seed: a.seed.unwrap_or(0),
                    }
                }
            },
        };
        let base = file.parent().unwrap_or(Path::new("."));
        Ok(SpecConfig {
            file: file.to_path_buf(),
            method: raw.method,
            target: raw.target.map(|t| base.join(t)),
            draft,
            num_steps,
            batch_buckets: buckets,
            max_context: raw.max_context,
            acceptance,
            tree,
            text: text.to_string(),
        })
    }

    /// Cache slots one step writes past `len`, minus one: the context margin the host
    /// keeps (`k` for chains and blocks, `budget − 1` for DDTree, [`eagle_tree_margin`]).
    pub fn verify_margin(&self) -> usize {
        verify_margin(self.method, self.tree, self.num_steps)
    }

    /// Checks the draft against the target for this method; errors name the spec key.
    pub fn check_draft(&self, target: &ModelSpec, draft: &ModelSpec) -> Result<(), ModelError> {
        if self.method == Method::DraftModel && draft.vocab != target.vocab {
            return Err(field(
                &self.file,
                "draft",
                &format!("a draft with the target's vocabulary of {}", target.vocab),
                format!("vocab_size {}", draft.vocab),
            ));
        }
        Ok(())
    }
}

/// `topk` / `num_draft_tokens` of `method = "eagle3"`: `None` for the chain (topk = 1).
fn eagle_tree_knobs(
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

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, column)
}
