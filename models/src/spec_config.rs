//! `spec.toml`: how to speculate. Parsed raw with serde (unknown keys are errors), then
//! resolved into a validated [`SpecConfig`]; the method's own module
//! ([`crate::methods`]) defaults and checks the keys that depend on the method.
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
//! top_k = 40                # sample only: keep the 40 largest logits (absent: all)
//! top_p = 0.9               # sample only: then the nucleus of mass 0.9 (default 1.0)
//! seed = 0                  # sample only: counter-based device RNG seed
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::ModelError;
use crate::methods::{Method, TreeKeys, TreeKnobs};

pub use specc_ir::engine::Acceptance;

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
    top_k: Option<u64>,
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

/// The sampling knobs as written (spec.toml's `[acceptance]` or the CLI's flags), each
/// optional: one set of rules for both.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingKnobs {
    pub temperature: Option<f64>,
    pub top_k: Option<u64>,
    pub top_p: Option<f64>,
    pub seed: Option<u64>,
}

impl SamplingKnobs {
    /// Whether any knob is given.
    pub fn any(&self) -> bool {
        *self != SamplingKnobs::default()
    }

    /// The first knob out of range: its key (`temperature`, `top_k`, `top_p`), what it
    /// must be, and the value found.
    pub fn invalid(&self) -> Option<(&'static str, &'static str, String)> {
        if let Some(t) = self.temperature.filter(|t| !(*t > 0.0 && t.is_finite())) {
            return Some(("temperature", "a finite number > 0", t.to_string()));
        }
        if let Some(k) = self.top_k.filter(|&k| k == 0) {
            return Some(("top_k", "an integer >= 1", k.to_string()));
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Some(("top_p", "a number in (0, 1]", p.to_string()));
        }
        None
    }

    /// Sampled acceptance with these knobs where given and `base`'s elsewhere (for a greedy
    /// base: temperature 1, every token, seed 0). The knobs must be valid.
    pub fn over(&self, base: &Acceptance) -> Acceptance {
        let (temperature, top_k, top_p, seed) = match *base {
            Acceptance::Greedy => (1.0, None, 1.0, 0),
            Acceptance::Sample {
                temperature,
                top_k,
                top_p,
                seed,
            } => (temperature, top_k, top_p, seed),
        };
        Acceptance::Sample {
            temperature: self.temperature.unwrap_or(temperature),
            top_k: self.top_k.or(top_k),
            top_p: self.top_p.unwrap_or(top_p),
            seed: self.seed.unwrap_or(seed),
        }
    }
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

/// A field error that names `found` in full.
pub(crate) fn field(file: &Path, field: &str, expected: &str, found: impl ToString) -> ModelError {
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
        let method = raw.method.imp();
        let base = file.parent().unwrap_or(Path::new("."));
        let draft = raw.draft.as_ref().map(|d| base.join(d));
        let num_steps = match raw.num_steps {
            Some(n) => n,
            None => method.default_num_steps(draft.as_deref())?,
        };
        method.check_num_steps(file, num_steps)?;
        method.check_draft_key(file, raw.draft.as_deref())?;
        let keys = TreeKeys {
            budget: raw.budget,
            topk: raw.topk,
            num_draft_tokens: raw.num_draft_tokens,
        };
        let tree = method.tree_knobs(file, keys, num_steps)?;
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
            let (width, what) = method.context_width(num_steps, tree);
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
                    let given = [
                        ("temperature", a.temperature.map(|v| v.to_string())),
                        ("top_k", a.top_k.map(|v| v.to_string())),
                        ("top_p", a.top_p.map(|v| v.to_string())),
                    ];
                    if let Some((k, Some(v))) = given.into_iter().find(|(_, v)| v.is_some()) {
                        return Err(field(
                            file,
                            &format!("acceptance.{k}"),
                            "absent when acceptance.mode = \"greedy\"",
                            v,
                        ));
                    }
                    Acceptance::Greedy
                }
                AcceptMode::Sample => {
                    let knobs = SamplingKnobs {
                        temperature: a.temperature,
                        top_k: a.top_k,
                        top_p: a.top_p,
                        seed: a.seed,
                    };
                    if let Some((k, expected, found)) = knobs.invalid() {
                        return Err(field(file, &format!("acceptance.{k}"), expected, found));
                    }
                    knobs.over(&Acceptance::Greedy)
                }
            },
        };
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
    /// keeps ([`Method::verify_margin`]).
    pub fn verify_margin(&self) -> usize {
        self.method.verify_margin(self.tree, self.num_steps)
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, column)
}
