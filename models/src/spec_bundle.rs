//! Everything one speculative method needs, opened and validated together: the target,
//! the draft checkpoint, and the three graphs (target prefill, draft prefill, step).

use std::collections::HashMap;

use std::path::PathBuf;

use specc_ir::engine::{BuildInput, DraftKind, GraphRole, RoleGraph, StepContract};
use specc_ir::interp::Tensor;
use specc_ir::{Bindings, Graph};

use crate::checkpoint::Checkpoint;
use crate::dflash::{DFlashSpec, DFLASH_PREFIX};
use crate::eagle3::{Eagle3Spec, EAGLE_PREFIX};
use crate::error::ModelError;
use crate::spec_config::{Method, SpecConfig, TreeKnobs};
use crate::spec_step::{
    lower_ddtree_step, lower_dflash_prefill, lower_dflash_step, lower_draft_model_step,
    lower_eagle3_prefill, lower_eagle3_step, lower_eagle3_tree_step, lower_target_prefill,
    StepShape, DRAFT_PREFIX,
};
use crate::{lower_dense_prefixed, Model};

/// The draft side of a bundle.
pub enum DraftSide {
    Model(Box<Model>),
    Eagle3(Box<Eagle3Spec>),
    DFlash(Box<DFlashSpec>),
}

pub struct SpecBundle {
    pub method: Method,
    pub draft: DraftSide,
    pub draft_checkpoint: Checkpoint,
    /// Name prefix of the draft's weights and states inside the graphs.
    pub prefix: &'static str,
    pub target_prefill: Graph,
    pub draft_prefill: Graph,
    pub step: Graph,
    pub shape: StepShape,
    /// The draft tree's knobs (`method = "ddtree"`, or `"eagle3"` with `topk > 1`).
    pub tree: Option<TreeKnobs>,
}

/// A random checkpoint holding the weights of `step` named `prefix` + name (prefix
/// stripped), as the draft's own checkpoint would.
pub fn random_draft(dir: &std::path::Path, step: &Graph, prefix: &str, seed: u64) -> Checkpoint {
    let mut g = Graph::new("draft weights");
    for (_, name, ty) in step.weights() {
        if let Some(n) = name.strip_prefix(prefix) {
            g.weight(n, ty.clone())
                .expect("a weight leaf always type-checks");
        }
    }
    Checkpoint::random(dir, &g, seed ^ 0xe461)
}

/// Smallest prefill bucket: prompts are padded to a power of two at least this long, so a
/// handful of prefill plans serve every prompt.
pub const MIN_PREFILL_T: usize = 16;

/// Token-ring capacity per lane of plain decoding (k = 0).
pub const DECODE_RING: u64 = 64;

/// Default token-ring capacity per lane.
pub const RING: u64 = 256;

fn lower_err(what: &str, source: specc_ir::IrError) -> ModelError {
    ModelError::Lower {
        model: what.into(),
        source,
    }
}

impl SpecBundle {
    /// Opens the draft named by `cfg` and lowers the step for `target`. Fails before
    /// anything runs if the draft does not fit the target or its checkpoint lacks a tensor.
    pub fn open(target: &Model, cfg: &SpecConfig) -> Result<SpecBundle, ModelError> {
        Self::open_with(target, cfg, None)
    }

    /// [`SpecBundle::open`], or with `random_seed` the draft's weights synthesised from its
    /// config alone (benchmarks of full-size shapes without downloads).
    pub fn open_with(
        target: &Model,
        cfg: &SpecConfig,
        random_seed: Option<u64>,
    ) -> Result<SpecBundle, ModelError> {
        let shape = StepShape {
            num_steps: cfg.num_steps as u64,
            ring: RING.max(2 * (cfg.num_steps as u64 + 1)),
            acceptance: cfg.acceptance.clone(),
        };
        let dir = cfg.draft.clone().ok_or_else(|| {
            ModelError::field(
                &cfg.file,
                "draft",
                "a draft checkpoint directory",
                "nothing",
            )
        })?;
        let mut bundle = match cfg.method {
            Method::None => {
                return Err(ModelError::field(
                    &cfg.file,
                    "method",
                    "draft_model, eagle3, dflash or ddtree for speculative decoding",
                    "\"none\"",
                ))
            }
            Method::DraftModel => {
                let draft = match random_seed {
                    Some(seed) => Model::open_random(&dir, seed ^ 0xd4af)?,
                    None => Model::open(&dir)?,
                };
                cfg.check_draft(target.spec(), draft.spec())?;
                let step = lower_draft_model_step(target.spec(), draft.spec(), &shape)
                    .map_err(|e| lower_err("draft_model step", e))?;
                let draft_prefill = lower_dense_prefixed(draft.spec(), DRAFT_PREFIX)?;
                let target_prefill = lower_target_prefill(target.spec(), &[])
                    .map_err(|e| lower_err("target prefill", e))?;
                let ck = match random_seed {
                    Some(seed) => random_draft(&dir, &step, DRAFT_PREFIX, seed),
                    None => Checkpoint::open(&dir)?,
                };
                SpecBundle {
                    method: cfg.method,
                    draft: DraftSide::Model(Box::new(draft)),
                    draft_checkpoint: ck,
                    prefix: DRAFT_PREFIX,
                    target_prefill,
                    draft_prefill,
                    step,
                    shape,
                    tree: None,
                }
            }
            Method::Eagle3 => {
                let eagle = Eagle3Spec::from_dir(&dir, target.spec())?;
                let step = match cfg.tree {
                    Some(tree) => lower_eagle3_tree_step(target.spec(), &eagle, &shape, tree)
                        .map_err(|e| lower_err("eagle3 tree step", e))?,
                    None => lower_eagle3_step(target.spec(), &eagle, &shape)
                        .map_err(|e| lower_err("eagle3 step", e))?,
                };
                let draft_prefill = lower_eagle3_prefill(target.spec(), &eagle)
                    .map_err(|e| lower_err("eagle3 prefill", e))?;
                let target_prefill = lower_target_prefill(target.spec(), &eagle.taps)
                    .map_err(|e| lower_err("target prefill", e))?;
                let ck = match random_seed {
                    Some(seed) => random_draft(&dir, &step, EAGLE_PREFIX, seed),
                    None => Checkpoint::open(&dir)?,
                };
                SpecBundle {
                    method: cfg.method,
                    draft: DraftSide::Eagle3(Box::new(eagle)),
                    draft_checkpoint: ck,
                    prefix: EAGLE_PREFIX,
                    target_prefill,
                    draft_prefill,
                    step,
                    shape,
                    tree: cfg.tree,
                }
            }
            Method::DFlash | Method::DDTree => {
                let dflash = DFlashSpec::from_dir(&dir, target.spec())?;
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
                let step = match cfg.tree {
                    Some(tree) => lower_ddtree_step(target.spec(), &dflash, &shape, tree)
                        .map_err(|e| lower_err("ddtree step", e))?,
                    None => lower_dflash_step(target.spec(), &dflash, &shape)
                        .map_err(|e| lower_err("dflash step", e))?,
                };
                let draft_prefill = lower_dflash_prefill(target.spec(), &dflash)
                    .map_err(|e| lower_err("dflash prefill", e))?;
                let target_prefill = lower_target_prefill(target.spec(), &dflash.taps)
                    .map_err(|e| lower_err("target prefill", e))?;
                let ck = match random_seed {
                    Some(seed) => random_draft(&dir, &step, DFLASH_PREFIX, seed),
                    None => Checkpoint::open(&dir)?,
                };
                SpecBundle {
                    method: cfg.method,
                    draft: DraftSide::DFlash(Box::new(dflash)),
                    draft_checkpoint: ck,
                    prefix: DFLASH_PREFIX,
                    target_prefill,
                    draft_prefill,
                    step,
                    shape,
                    tree: cfg.tree,
                }
            }
        };
        crate::coverage::check_draft(&mut bundle)?;
        target
            .checkpoint()
            .validate_unprefixed(&bundle.step, &["draft/", "eagle/", "dflash/"])?;
        Ok(bundle)
    }

    /// Every weight of the three graphs as interpreter tensors: the target's under their
    /// own names, the draft's under the bundle prefix.
    pub fn load_weights_f32(&self, target: &Model) -> Result<HashMap<String, Tensor>, ModelError> {
        let mut out = HashMap::new();
        for g in [&self.target_prefill, &self.draft_prefill, &self.step] {
            for (_, name, _) in g.weights() {
                if out.contains_key(name) {
                    continue;
                }
                let t = match name.strip_prefix(self.prefix) {
                    Some(n) => self.draft_checkpoint.load_f32(n)?,
                    None => target.checkpoint().load_f32(name)?,
                };
                out.insert(name.to_string(), t);
            }
        }
        Ok(out)
    }

    /// k: draft tokens per step (a tree's depth for DDTree and EAGLE-3 trees).
    pub fn num_steps(&self) -> usize {
        self.shape.num_steps as usize
    }

    /// Cache slots one step writes past `len`, minus one: the context margin the host keeps
    /// (`k` for chains and blocks, `budget − 1` for DDTree, and for EAGLE-3 trees the
    /// larger of `num_draft_tokens − 1` and the head's `(depth − 1) · topk` draft rows).
    pub fn verify_margin(&self) -> usize {
        crate::spec_config::verify_margin(self.method, self.tree, self.shape.num_steps as u32)
    }

    /// Width of the EAGLE-3 taps (3 × hidden), if this is an EAGLE-3 bundle.
    pub fn taps_width(&self) -> Option<usize> {
        match &self.draft {
            DraftSide::Eagle3(e) => Some(3 * e.hidden()),
            DraftSide::Model(_) | DraftSide::DFlash(_) => None,
        }
    }

    /// Width of the DFlash taps (n_tap × hidden), if this is a DFlash bundle.
    pub fn dflash_taps_width(&self) -> Option<usize> {
        match &self.draft {
            DraftSide::DFlash(d) => Some(d.taps_width()),
            _ => None,
        }
    }
}

/// Prompt-chunk token counts an engine plans its prefills at: powers of two from
/// [`MIN_PREFILL_T`] up to `max_context` (a prompt is padded to the next one).
pub fn prefill_buckets(max_context: u64) -> Vec<u32> {
    let mut ts = Vec::new();
    let mut t = MIN_PREFILL_T as u64;
    while t <= max_context {
        ts.push(t as u32);
        t *= 2;
    }
    ts
}

/// The method's name as spec.toml spells it.
pub fn method_name(m: Method) -> &'static str {
    match m {
        Method::None => "none",
        Method::DraftModel => "draft_model",
        Method::Eagle3 => "eagle3",
        Method::DFlash => "dflash",
        Method::DDTree => "ddtree",
    }
}

impl SpecBundle {
    /// How the draft of this bundle is primed at admission.
    pub fn draft_kind(&self) -> DraftKind {
        match &self.draft {
            DraftSide::Model(_) => DraftKind::Model,
            DraftSide::Eagle3(e) if self.tree.is_some() => DraftKind::Eagle3Tree {
                taps_width: 3 * e.hidden(),
                depth: self.num_steps(),
            },
            DraftSide::Eagle3(e) => DraftKind::Eagle3 {
                taps_width: 3 * e.hidden(),
            },
            DraftSide::DFlash(d) if self.tree.is_some() => DraftKind::DDTree {
                taps_width: d.taps_width(),
                depth: d.num_steps(),
            },
            DraftSide::DFlash(d) => DraftKind::DFlash {
                taps_width: d.taps_width(),
            },
        }
    }

    /// The step contract of this bundle's method.
    pub fn contract(&self) -> StepContract {
        let name = method_name(self.method);
        let k = self.num_steps();
        let label = match self.tree {
            Some(t) if self.method == Method::Eagle3 => format!(
                "{name} tree depth={k} num_draft_tokens={} topk={}",
                t.budget, t.topk
            ),
            Some(t) => format!("{name} depth={k} budget={} topk={}", t.budget, t.topk),
            None => format!("{name} k={k}"),
        };
        StepContract {
            method: name.to_string(),
            label,
            kind: self.draft_kind(),
            num_steps: self.verify_margin(),
            ring: self.shape.ring as usize,
            step: GraphRole::SpecStep,
            target_prefill: GraphRole::SpecTargetPrefill,
            draft_prefill: Some(GraphRole::DraftPrefill),
        }
    }
}

/// What else an engine is built for beyond a spec's own buckets.
#[derive(Clone, Debug, Default)]
pub struct EngineExtras {
    /// Batch buckets instead of the spec's (bench, tests).
    pub batch_buckets: Option<Vec<u32>>,
    /// Further token counts of the target prefill (verify-width timings).
    pub verify_tokens: Vec<u32>,
    /// Plan prompt chunks at the smallest bucket only (timings that never admit a long
    /// prompt: fewer kernels to compile).
    pub smallest_chunk_only: bool,
}

/// How the engine names a model directory: relative to the engine directory where it lies
/// below it, else as given.
pub type DirRef<'a> = &'a dyn Fn(&std::path::Path) -> PathBuf;

/// The build input of an engine for `model` and (optionally) a speculative `cfg`: the plain
/// prefill and decode step, and with a method its step, the target prefill that records the
/// draft's inputs and the draft prefill; prefills at every [`prefill_buckets`] of
/// `max_context`, steps at each batch bucket. `random_seed` synthesises every weight.
pub fn engine_input(
    model: &Model,
    cfg: Option<&SpecConfig>,
    max_context: u64,
    random_seed: Option<u64>,
    extras: &EngineExtras,
    dir_ref: DirRef,
) -> Result<(BuildInput, Option<SpecBundle>), ModelError> {
    let spec = model.spec();
    let (prefill, decode) = crate::spec_step::lower_plain_greedy(spec, DECODE_RING)
        .map_err(|e| lower_err(spec.arch.hf_name(), e))?;
    let bundle = match cfg {
        Some(c) if c.method != Method::None => Some(SpecBundle::open_with(model, c, random_seed)?),
        _ => None,
    };
    let batches = extras
        .batch_buckets
        .clone()
        .or_else(|| cfg.map(|c| c.batch_buckets.clone()))
        .unwrap_or_else(|| vec![1]);
    let mut chunk_ts = prefill_buckets(max_context);
    if extras.smallest_chunk_only {
        chunk_ts.truncate(1);
    }
    let mut prefill_ts = chunk_ts.clone();
    prefill_ts.extend(extras.verify_tokens.iter().copied());
    prefill_ts.sort_unstable();
    prefill_ts.dedup();
    let at = |ts: &[u32]| -> Vec<Bindings> {
        batches
            .iter()
            .flat_map(|&b| {
                ts.iter()
                    .map(move |&t| Bindings::new(b as u64, t as u64, max_context))
            })
            .collect()
    };
    let mut graphs = vec![
        RoleGraph {
            role: GraphRole::Prefill,
            graph: prefill,
            buckets: at(&prefill_ts),
        },
        RoleGraph {
            role: GraphRole::Decode,
            graph: decode,
            buckets: at(&[1]),
        },
    ];
    let target_dir = model.dir();
    let mut target_ref = model
        .checkpoint()
        .reference("", target_dir, dir_ref(target_dir));
    let mut checkpoints = Vec::new();
    let mut contract = None;
    if let Some(bu) = &bundle {
        contract = Some(bu.contract());
        graphs.push(RoleGraph {
            role: GraphRole::SpecStep,
            graph: bu.step.clone(),
            buckets: at(&[1]),
        });
        graphs.push(RoleGraph {
            role: GraphRole::SpecTargetPrefill,
            graph: bu.target_prefill.clone(),
            buckets: at(&prefill_ts),
        });
        graphs.push(RoleGraph {
            role: GraphRole::DraftPrefill,
            graph: bu.draft_prefill.clone(),
            buckets: at(&chunk_ts),
        });
    }
    if random_seed.is_some() {
        target_ref.config = Some(dir_ref(model.config_file()));
    }
    checkpoints.push(target_ref);
    if let (Some(bu), Some(c)) = (&bundle, cfg) {
        let dir = c.draft.clone().unwrap_or_default();
        let mut r = bu
            .draft_checkpoint
            .reference(bu.prefix, &dir, dir_ref(&dir));
        if random_seed.is_some() {
            r.config = Some(dir_ref(&dir));
        }
        checkpoints.push(r);
    }
    let input = BuildInput {
        architecture: spec.arch.hf_name().to_string(),
        max_context,
        graphs,
        plain: StepContract::plain(DECODE_RING as usize),
        spec: contract,
        spec_toml: cfg
            .filter(|c| c.method != Method::None)
            .map(|c| c.text.clone()),
        checkpoints,
        random_seed,
    };
    Ok((input, bundle))
}
