//! Everything one speculative method needs, opened and validated together: the target,
//! the draft checkpoint, and the three graphs (target prefill, draft prefill, step).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use specc_ir::engine::{
    BuildInput, CatchUp, DraftKind, GraphRole, Priming, RoleGraph, StepContract, StepVariant,
};
use specc_ir::interp::Tensor;
use specc_ir::{Bindings, Graph};

use crate::checkpoint::{Checkpoint, PlantRole};
use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::methods::dflash::DFlashSpec;
use crate::methods::eagle3::Eagle3Spec;
use crate::methods::{lower_plain, variant_ks, Method, StepShape, TreeKnobs, CATCH_UP_ROWS};
use crate::spec_config::{Acceptance, SpecConfig};
use crate::{Model, RandomWeights};

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
    /// The step at other draft sizes over the same states, ascending by k (empty where the
    /// method cannot switch): the contract's variants.
    pub variants: Vec<(u64, Graph)>,
    /// Under sampled acceptance, each step of `k` (the variants' and the configured one's)
    /// lowered for greedy acceptance, ascending by k: the contract's greedy twins.
    pub greedy: Vec<(u64, Graph)>,
    /// The catch-up of the rows the plain variant queues (a draft that reads the target's
    /// hidden states and has a plain variant): the contract's `catch_up`.
    pub catch_up: Option<Graph>,
    pub shape: StepShape,
    /// The draft tree's knobs (`method = "ddtree"`, or `"eagle3"` with `topk > 1`).
    pub tree: Option<TreeKnobs>,
    /// How the host drives this bundle's step (the engine records it).
    pub contract: StepContract,
}

/// A random checkpoint holding the weights of `step` named `prefix` + name (prefix
/// stripped), as the draft's own checkpoint would.
pub fn random_draft(dir: &Path, step: &Graph, prefix: &str, seed: u64) -> Checkpoint {
    let mut g = Graph::new("draft weights");
    for (_, name, ty) in step.weights() {
        if let Some(n) = name.strip_prefix(prefix) {
            g.weight(n, ty.clone())
                .expect("a weight leaf always type-checks");
        }
    }
    Checkpoint::random(dir, &g, seed ^ 0xe461)
}

/// The draft's random checkpoint for `random` (as [`random_draft`], planted when `random`
/// has a synthetic acceptance: `target` is the pair's target). `dir` is the draft's model
/// directory or config file.
pub fn synthetic_draft(
    dir: &Path,
    step: &Graph,
    prefix: &str,
    random: RandomWeights,
    target: &ModelSpec,
) -> Result<Checkpoint, ModelError> {
    let Some(plant) = random.plant(target, PlantRole::Draft) else {
        return Ok(random_draft(dir, step, prefix, random.seed));
    };
    let (dir, config) = Model::random_paths(dir);
    let mut g = Graph::new("draft weights");
    for (_, name, ty) in step.weights() {
        if let Some(n) = name.strip_prefix(prefix) {
            g.weight(n, ty.clone())
                .expect("a weight leaf always type-checks");
        }
    }
    Checkpoint::random_planted(&dir, &config, &g, random.seed ^ 0xe461, plant)
}

/// Smallest prefill bucket: prompts are padded to a power of two at least this long, so a
/// handful of prefill plans serve every prompt.
pub const MIN_PREFILL_T: usize = 16;

/// Token-ring capacity per lane of plain decoding (k = 0).
pub const DECODE_RING: u64 = 64;

/// Default token-ring capacity per lane.
pub const RING: u64 = 256;

impl SpecBundle {
    /// Opens the draft named by `cfg` and lowers the step for `target`. Fails before
    /// anything runs if the draft does not fit the target or its checkpoint lacks a tensor.
    pub fn open(target: &Model, cfg: &SpecConfig) -> Result<SpecBundle, ModelError> {
        Self::open_with(target, cfg, None)
    }

    /// [`SpecBundle::open`], or with `random` the draft's weights synthesised from its
    /// config alone (benchmarks of full-size shapes without downloads). A synthetic
    /// acceptance plants a `draft_model` draft only: the other methods' drafters read the
    /// target's hidden states, which the plant does not shape.
    pub fn open_with(
        target: &Model,
        cfg: &SpecConfig,
        random: Option<RandomWeights>,
    ) -> Result<SpecBundle, ModelError> {
        let planted = random.filter(|r| r.synthetic_acceptance.is_some());
        if planted.is_some() && cfg.method != Method::DraftModel {
            return Err(ModelError::SyntheticAcceptance {
                file: cfg.file.clone(),
                why: format!(
                    "plants a draft model's embedding and head: method \"{}\" drafts from the target's hidden states (use method = \"draft_model\")",
                    cfg.method.name()
                ),
            });
        }
        let random_seed = random.map(|r| r.seed);
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
        let method = cfg.method.imp();
        let mut o = method.open(target, cfg, &dir, &shape, random_seed)?;
        if let Some(r) = planted {
            o.draft_checkpoint = synthetic_draft(&dir, &o.step, o.prefix, r, target.spec())?;
        }
        let ks = variant_ks(shape.num_steps);
        let variants = method.variants(target.spec(), &o.draft, &shape, cfg.tree, &ks)?;
        // Greedy twins of every step a policy may pick (the configured k among them), where
        // the steps sample: the same draft at each k, over the same states.
        let greedy = match shape.acceptance {
            Acceptance::Greedy => Vec::new(),
            Acceptance::Sample { .. } => {
                let at = StepShape {
                    acceptance: Acceptance::Greedy,
                    ..shape.clone()
                };
                let all: Vec<u64> = variants
                    .iter()
                    .map(|(k, _)| *k)
                    .chain([shape.num_steps])
                    .collect();
                method.variants(target.spec(), &o.draft, &at, cfg.tree, &all)?
            }
        };
        let mut contract = StepContract::speculative(
            method.name(),
            o.label,
            o.kind,
            method.verify_margin(cfg.num_steps, cfg.tree),
            shape.ring as usize,
        );
        let steps = |gs: &[(u64, Graph)], role: fn(u32) -> GraphRole| -> Vec<StepVariant> {
            gs.iter()
                .map(|(k, _)| StepVariant {
                    k: *k as usize,
                    role: role(*k as u32),
                })
                .collect()
        };
        contract.variants = steps(&variants, GraphRole::SpecVariant);
        contract.greedy = steps(&greedy, GraphRole::GreedySpecStep);
        let catch_up = match variants.iter().any(|(k, _)| *k == 0) {
            true => method.catch_up(target.spec(), &o.draft, &shape)?,
            false => None,
        };
        contract.catch_up = catch_up.as_ref().map(|_| CatchUp {
            role: GraphRole::DraftCatchUp,
            rows: CATCH_UP_ROWS as usize,
        });
        let mut bundle = SpecBundle {
            method: cfg.method,
            draft: o.draft,
            draft_checkpoint: o.draft_checkpoint,
            prefix: o.prefix,
            target_prefill: o.target_prefill,
            draft_prefill: o.draft_prefill,
            step: o.step,
            variants,
            greedy,
            catch_up,
            shape,
            tree: cfg.tree,
            contract,
        };
        crate::coverage::check_draft(&mut bundle)?;
        target
            .checkpoint()
            .validate_unprefixed(&bundle.step, &[bundle.prefix])?;
        Ok(bundle)
    }

    /// Every weight of the three graphs as interpreter tensors: the target's under their
    /// own names, the draft's under the bundle prefix.
    pub fn load_weights_f32(&self, target: &Model) -> Result<HashMap<String, Tensor>, ModelError> {
        let mut out = HashMap::new();
        let fixed = [&self.target_prefill, &self.draft_prefill, &self.step];
        for g in fixed
            .into_iter()
            .chain(self.variants.iter().map(|(_, g)| g))
            .chain(self.greedy.iter().map(|(_, g)| g))
            .chain(&self.catch_up)
        {
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
    /// ([`Method::verify_margin`]).
    pub fn verify_margin(&self) -> usize {
        self.contract.num_steps
    }

    /// Width of the EAGLE-3 taps (3 × hidden), if this is an EAGLE-3 bundle.
    pub fn taps_width(&self) -> Option<usize> {
        match self.contract.priming() {
            Priming::Pairs { taps_width, .. } => Some(taps_width),
            _ => None,
        }
    }

    /// Width of the DFlash taps (n_tap × hidden), if this is a DFlash bundle.
    pub fn dflash_taps_width(&self) -> Option<usize> {
        match self.contract.priming() {
            Priming::Context { taps_width, .. } => Some(taps_width),
            _ => None,
        }
    }

    /// How the draft of this bundle is primed at admission.
    pub fn draft_kind(&self) -> DraftKind {
        self.contract.kind
    }

    /// The step contract of this bundle's method.
    pub fn contract(&self) -> StepContract {
        self.contract.clone()
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

/// What else an engine is built for beyond a spec's own buckets.
#[derive(Clone, Debug, Default)]
pub struct EngineExtras {
    /// Batch buckets instead of the spec's (bench, tests).
    pub batch_buckets: Option<Vec<u32>>,
    /// Token counts of the all-row target forward ([`GraphRole::Logits`]: verify-width
    /// timings), at every batch bucket.
    pub verify_tokens: Vec<u32>,
    /// Plan the all-row target forward at every prompt chunk and batch bucket too (engines
    /// for `specc logits` and parity tests; serving engines leave it off: its logits take
    /// `B·T·V` floats).
    pub all_logits: bool,
    /// Plan prompt chunks at the smallest bucket only (timings that never admit a long
    /// prompt: fewer kernels to compile).
    pub smallest_chunk_only: bool,
    /// Acceptance instead of the spec's (the CLI's sampling flags); it is also plain
    /// decoding's, which otherwise takes the spec's (greedy without a spec).
    pub acceptance: Option<Acceptance>,
}

/// How the engine names a model directory: relative to the engine directory where it lies
/// below it, else as given.
pub type DirRef<'a> = &'a dyn Fn(&Path) -> PathBuf;

/// The build input of an engine for `model` and (optionally) a speculative `cfg`: the plain
/// prefill and decode step, and with a method its step, the target prefill that records the
/// draft's inputs and the draft prefill; prefills at every [`prefill_buckets`] of
/// `max_context`, steps at each batch bucket. Prefills choose the token after each lane's
/// last prompt row only; the all-row forward ([`GraphRole::Logits`]) is planned where
/// `extras` asks for it. `random` synthesises every weight (`model` must have been opened
/// with the same). Every
/// graph chooses tokens by one acceptance: `extras.acceptance`, else the spec's (also for
/// `method = "none"`), else greedy.
pub fn engine_input(
    model: &Model,
    cfg: Option<&SpecConfig>,
    max_context: u64,
    random: Option<RandomWeights>,
    extras: &EngineExtras,
    dir_ref: DirRef,
) -> Result<(BuildInput, Option<SpecBundle>), ModelError> {
    let spec = model.spec();
    let acceptance = extras
        .acceptance
        .clone()
        .or_else(|| cfg.map(|c| c.acceptance.clone()))
        .unwrap_or_default();
    let overridden = cfg.map(|c| SpecConfig {
        acceptance: acceptance.clone(),
        ..c.clone()
    });
    let cfg = overridden.as_ref();
    let lower_at = |a: &Acceptance| {
        lower_plain(spec, DECODE_RING, a).map_err(|source| ModelError::Lower {
            model: spec.arch.hf_name().into(),
            source,
        })
    };
    let (prefill, decode) = lower_at(&acceptance)?;
    // A sampling engine's decode step has a greedy twin (`StepContract::greedy`).
    let greedy_decode = match acceptance {
        Acceptance::Greedy => None,
        Acceptance::Sample { .. } => Some(lower_at(&Acceptance::Greedy)?.1),
    };
    let bundle = match cfg {
        Some(c) if c.method != Method::None => Some(SpecBundle::open_with(model, c, random)?),
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
    let mut logits_ts = extras.verify_tokens.clone();
    if extras.all_logits {
        logits_ts.extend(&chunk_ts);
    }
    logits_ts.sort_unstable();
    logits_ts.dedup();
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
            buckets: at(&chunk_ts),
        },
        RoleGraph {
            role: GraphRole::Decode,
            graph: decode,
            buckets: at(&[1]),
        },
    ];
    let mut plain = StepContract::plain(DECODE_RING as usize);
    if let Some(g) = greedy_decode {
        graphs.push(RoleGraph {
            role: GraphRole::GreedyDecode,
            graph: g,
            buckets: at(&[1]),
        });
        plain.greedy = vec![StepVariant {
            k: 0,
            role: GraphRole::GreedyDecode,
        }];
    }
    if !logits_ts.is_empty() {
        graphs.push(RoleGraph {
            role: GraphRole::Logits,
            graph: model.graph().clone(),
            buckets: at(&logits_ts),
        });
    }
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
        let other_steps = bu.contract.variants.iter().zip(&bu.variants);
        for (v, (_, g)) in other_steps.chain(bu.contract.greedy.iter().zip(&bu.greedy)) {
            graphs.push(RoleGraph {
                role: v.role,
                graph: g.clone(),
                buckets: at(&[1]),
            });
        }
        if let (Some(c), Some(g)) = (bu.contract.catch_up, &bu.catch_up) {
            graphs.push(RoleGraph {
                role: c.role,
                graph: g.clone(),
                buckets: at(&[1]),
            });
        }
        graphs.push(RoleGraph {
            role: GraphRole::SpecTargetPrefill,
            graph: bu.target_prefill.clone(),
            buckets: at(&chunk_ts),
        });
        graphs.push(RoleGraph {
            role: GraphRole::DraftPrefill,
            graph: bu.draft_prefill.clone(),
            buckets: at(&chunk_ts),
        });
    }
    if random.is_some() {
        target_ref.config = Some(dir_ref(model.config_file()));
    }
    checkpoints.push(target_ref);
    if let (Some(bu), Some(c)) = (&bundle, cfg) {
        let dir = c.draft.clone().unwrap_or_default();
        let mut r = bu
            .draft_checkpoint
            .reference(bu.prefix, &dir, dir_ref(&dir));
        if random.is_some() {
            r.config = Some(dir_ref(&dir));
        }
        checkpoints.push(r);
    }
    let input = BuildInput {
        architecture: spec.arch.hf_name().to_string(),
        max_context,
        graphs,
        plain,
        spec: contract,
        spec_toml: cfg
            .filter(|c| c.method != Method::None)
            .map(|c| c.text.clone()),
        acceptance,
        checkpoints,
        random_seed: random.map(|r| r.seed),
        synthetic_acceptance: random.and_then(|r| r.synthetic_acceptance),
    };
    Ok((input, bundle))
}
