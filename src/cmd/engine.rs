//! How the CLI obtains an engine and the checkpoints its weights come from: an engine
//! directory (`specc compile`'s output), the engine baked into this binary (the embedded
//! default), or one built in memory by the same build for the device (or the CPU) that
//! runs it. Everything downstream executes the engine; nothing re-lowers or re-plans.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use specc_codegen::{build, BuildOptions, Built, Cubins};
use specc_ir::engine::{CheckpointRef, Engine, GraphRole, Target, ENGINE_FILE};
use specc_ir::interp::Tensor;
use specc_models::context::ContextFrom;
use specc_models::spec_bundle::{engine_input, synthetic_draft, EngineExtras};
use specc_models::{Checkpoint, Model, ModelSpec, RandomWeights, SpecConfig};
use specc_runtime::EngineGraphs;

use super::fit::{self, open_model, Fit};
use crate::{embedded, progress};

/// Seed of `--random-weights`.
pub const RANDOM_SEED: u64 = 0x5eed;

/// The name an engine gives the embedded default model's directory.
const EMBEDDED: &str = "embedded";

/// What the user named on the command line: a model or engine directory (or the embedded
/// default when absent), and whether to synthesise its weights.
#[derive(Clone, Debug)]
pub struct Source {
    pub path: Option<PathBuf>,
    pub random_weights: bool,
    /// With random weights: the first this many decoder layers only (`--layers`).
    pub layers: Option<usize>,
    /// With random weights: the planted acceptance (`--synthetic-acceptance`).
    pub synthetic_acceptance: Option<f64>,
}

impl Source {
    pub fn new(path: Option<PathBuf>, random_weights: bool) -> Self {
        Source {
            path,
            random_weights,
            layers: None,
            synthetic_acceptance: None,
        }
    }

    /// The same source with a planted acceptance (random weights only: clap enforces it).
    pub fn with_synthetic_acceptance(mut self, p: Option<f64>) -> Self {
        self.synthetic_acceptance = p;
        self
    }

    /// How its weights are synthesised; `None`: read from the checkpoint.
    pub fn random(&self) -> Option<RandomWeights> {
        self.random_weights.then_some(RandomWeights {
            seed: RANDOM_SEED,
            synthetic_acceptance: self.synthetic_acceptance,
        })
    }

    /// The same source cut to `layers` decoder layers (random weights only: clap enforces it).
    pub fn with_layers(mut self, layers: Option<u32>) -> Self {
        self.layers = layers.map(|n| n as usize);
        self
    }

    /// Whether the path is an engine directory.
    pub fn is_engine(&self) -> bool {
        self.path
            .as_ref()
            .is_some_and(|p| p.join(ENGINE_FILE).is_file())
    }
}

/// What an in-memory build is asked for.
pub struct Want<'a> {
    pub spec: Option<&'a SpecConfig>,
    pub max_context: Option<u64>,
    pub target: Target,
    pub extras: EngineExtras,
    /// The memory the run will have (`None`: not checked before the build).
    pub fit: Option<Fit>,
}

/// An engine ready to run, and the checkpoints its weights come from.
pub struct Ready {
    pub engine: Engine,
    /// The target's directory (config.json, tokenizer).
    pub model_dir: PathBuf,
    /// The target's resolved config (BOS/EOS, vocabulary).
    pub spec: ModelSpec,
    /// Checkpoints by graph-name prefix (`""` for the target).
    pub checkpoints: Vec<(String, Checkpoint)>,
    /// Where the engine's `max_context` came from, for errors about it.
    pub context_from: ContextFrom,
    /// Where the engine came from, for the run's first line.
    pub origin: String,
}

impl Ready {
    /// Every weight of `roles`' graphs as interpreter tensors.
    pub fn cpu_weights(
        &self,
        graphs: &EngineGraphs,
        roles: &[GraphRole],
    ) -> Result<HashMap<String, Tensor>> {
        let mut names: Vec<&str> = Vec::new();
        for &r in roles {
            for (_, name, _) in graphs.get(r)?.weights() {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        // Per checkpoint, shard by shard (each shard's pages released after it), with one
        // bar over the stored bytes of all of them.
        let mut by_source: Vec<(&str, &Checkpoint, Vec<&str>)> = Vec::new();
        for name in names {
            let (prefix, ck) = self.source_of(name)?;
            let inner = &name[prefix.len()..];
            match by_source.iter_mut().find(|(p, _, _)| *p == prefix) {
                Some((_, _, v)) => v.push(inner),
                None => by_source.push((prefix, ck, vec![inner])),
            }
        }
        let total: u64 = by_source
            .iter()
            .flat_map(|(_, ck, v)| v.iter().filter_map(|n| ck.tensor(n)))
            .map(|e| e.range.len() as u64)
            .sum();
        let pb = progress::bytes_bar(total, "loading weights");
        let mut out = HashMap::new();
        let mut base = 0u64;
        for (prefix, ck, inner) in &by_source {
            let mut last = 0u64;
            ck.stream::<anyhow::Error>(
                inner,
                |n, _, _| {
                    out.insert(format!("{prefix}{n}"), ck.load_f32(n)?);
                    Ok(())
                },
                |done, _| {
                    last = done;
                    pb.set_position(base + done);
                },
            )?;
            base += last;
        }
        pb.finish_and_clear();
        Ok(out)
    }

    fn source_of(&self, name: &str) -> Result<(&str, &Checkpoint)> {
        self.checkpoints
            .iter()
            .filter(|(p, _)| name.starts_with(p.as_str()))
            .max_by_key(|(p, _)| p.len())
            .map(|(p, c)| (p.as_str(), c))
            .ok_or_else(|| anyhow!("weight `{name}` is in no checkpoint of the engine"))
    }

    #[cfg(feature = "cuda")]
    pub fn weight_sources(&self) -> specc_runtime::cuda::WeightSources<'_> {
        specc_runtime::cuda::WeightSources {
            sources: self
                .checkpoints
                .iter()
                .map(|(p, c)| (p.as_str(), c))
                .collect(),
        }
    }
}

/// The target of the device that will run the engine (GPU 0), or the CPU.
pub fn target_for(cuda: bool) -> Result<Target> {
    if !cuda {
        return Ok(Target::cpu());
    }
    #[cfg(feature = "cuda")]
    {
        let dev = specc_runtime::cuda::CudaDevice::open(0)?;
        let info = dev.info();
        let (major, minor) = info.compute_capability;
        let arch = specc_ir::engine::Arch::of_capability(major, minor).ok_or_else(|| {
            anyhow!(
                "{} (compute capability {major}.{minor}) is not a GPU specc compiles for (sm_90a, sm_100a, sm_120)",
                info.name
            )
        })?;
        Ok(Target::for_device(
            arch,
            info.sm_count,
            info.max_smem_per_block_optin,
            &info.name,
        ))
    }
    #[cfg(not(feature = "cuda"))]
    Err(super::gpu::unavailable())
}

/// The engine named by `src`, or built for `want`.
pub fn ready(src: Source, want: Want) -> Result<Ready> {
    if src.is_engine() {
        let dir = src.path.clone().expect("an engine source has a path");
        if let Some(c) = want.spec {
            bail!(
                "--spec {}: an engine carries the spec it was built from; pass a model directory to speculate otherwise",
                c.file.display()
            );
        }
        let engine = Engine::read_dir(&dir)?;
        if let Some(m) = want.max_context.filter(|&m| m != engine.max_context) {
            bail!(
                "--max-context {m}: {} was built for a context of {} tokens (rebuild it with --max-context {m})",
                dir.display(),
                engine.max_context
            );
        }
        let from = ContextFrom::Engine(dir.join(ENGINE_FILE));
        return open_engine(engine, &dir, format!("engine {}", dir.display()), from);
    }
    if src.path.is_none() && !src.random_weights {
        if let Some(e) = baked_fits(&want)? {
            let what = crate::baked::SUMMARY.lines().next().unwrap_or_default();
            let origin = format!("baked into this binary: {what}");
            return open_engine(e, Path::new("."), origin, ContextFrom::Builtin);
        }
    }
    build_for(src, want)
}

/// The baked engine, when it is what `want` asks for.
fn baked_fits(want: &Want) -> Result<Option<Engine>> {
    let Some(engine) = crate::baked::engine()? else {
        return Ok(None);
    };
    let default_spec =
        std::fs::read_to_string(embedded::default_model_dir()?.join(embedded::SPEC_FILE)).ok();
    let spec_ok = match want.spec {
        None => true,
        Some(c) => Some(&c.text) == default_spec.as_ref() && engine.spec_toml == default_spec,
    };
    let ctx_ok = want.max_context.is_none_or(|m| m == engine.max_context);
    let acceptance_ok = want
        .extras
        .acceptance
        .as_ref()
        .is_none_or(|a| *a == engine.acceptance);
    let target_ok = !want.target.has_kernels()
        || want.target.archs.iter().all(|a| {
            engine.target.archs.contains(a)
                && engine.uncompiled.is_none()
                && engine.target.sms == want.target.sms
                && engine.target.smem_per_block <= want.target.smem_per_block
        });
    let extras_ok =
        acceptance_ok && want.extras.verify_tokens.is_empty() && !want.extras.all_logits;
    Ok((spec_ok && ctx_ok && target_ok && extras_ok).then_some(engine))
}

/// A model directory (or config, with random weights) built in memory for `want`.
pub fn build_for(src: Source, want: Want) -> Result<Ready> {
    let random = src.random();
    let path = match src.path {
        Some(p) => p,
        None => embedded::default_model_dir()?,
    };
    let fit = want.fit.as_ref();
    let model = open_model(&path, random, src.layers, fit)?;
    let context = fit::context(&model, want.max_context, want.spec, fit)?;
    let t = Instant::now();
    let (input, bundle) = engine_input(
        &model,
        want.spec,
        context.tokens,
        random,
        &want.extras,
        &|p: &Path| p.to_path_buf(),
    )?;
    if let Some(b) = &bundle {
        fit::note_skipped(&b.draft_checkpoint);
    }
    let pb = progress::bar(0, "building the engine");
    let report = progress::build_reporter(&pb);
    let opts = BuildOptions {
        cubins: Cubins::Require,
        progress: Some(&report),
        ..BuildOptions::default()
    };
    let built = build(input, &want.target, &opts);
    pb.finish_and_clear();
    let Built { engine, .. } = built?;
    let origin = if want.target.has_kernels() {
        format!(
            "built in memory for {} in {:.2} s",
            want.target.device,
            t.elapsed().as_secs_f64()
        )
    } else {
        "built in memory".to_string()
    };
    let model_dir = model.dir().to_path_buf();
    let spec = model.spec().clone();
    let mut checkpoints = vec![(String::new(), model.into_checkpoint())];
    if let Some(b) = bundle {
        checkpoints.push((b.prefix.to_string(), b.draft_checkpoint));
    }
    Ok(Ready {
        engine,
        model_dir,
        spec,
        checkpoints,
        origin,
        context_from: context.from,
    })
}

/// Where a recorded checkpoint directory is now: relative to the engine directory, or the
/// embedded default's materialised copy.
fn locate(r: &Path, engine_dir: &Path) -> Result<PathBuf> {
    if let Ok(rest) = r.strip_prefix(EMBEDDED) {
        return Ok(embedded::default_model_dir()?.join(rest));
    }
    Ok(if r.is_absolute() {
        r.to_path_buf()
    } else {
        engine_dir.join(r)
    })
}

/// The name an engine in `engine_dir` records for `dir`: relative where it lies below the
/// engine directory, absolute otherwise.
pub fn dir_ref(engine_dir: &Path) -> impl Fn(&Path) -> PathBuf + '_ {
    move |dir: &Path| {
        let abs = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        let base = engine_dir
            .canonicalize()
            .unwrap_or_else(|_| engine_dir.to_path_buf());
        match abs.strip_prefix(&base) {
            Ok(rel) => rel.to_path_buf(),
            Err(_) => abs,
        }
    }
}

/// Opens the checkpoints an engine records and checks they are the ones it was built from.
fn open_engine(
    engine: Engine,
    engine_dir: &Path,
    origin: String,
    context_from: ContextFrom,
) -> Result<Ready> {
    let target_ref = engine
        .checkpoints
        .iter()
        .find(|c| c.prefix.is_empty())
        .ok_or_else(|| {
            anyhow!(
                "{}: the engine names no target checkpoint",
                engine_dir.join(ENGINE_FILE).display()
            )
        })?;
    let model_dir = locate(&target_ref.dir, engine_dir)?;
    let mut checkpoints = Vec::new();
    let spec = match engine.random_seed {
        Some(seed) => {
            let config = target_ref
                .config
                .as_ref()
                .map(|c| locate(c, engine_dir))
                .transpose()?
                .unwrap_or_else(|| model_dir.join("config.json"));
            let random = RandomWeights {
                seed,
                synthetic_acceptance: engine.synthetic_acceptance,
            };
            let model = Model::open_synthetic(&config, random, None)?;
            let spec = model.spec().clone();
            checkpoints.push((String::new(), model.into_checkpoint()));
            for r in engine.checkpoints.iter().filter(|c| !c.prefix.is_empty()) {
                let ck = random_for(&engine, r, engine_dir, random, &spec)?;
                checkpoints.push((r.prefix.clone(), ck));
            }
            spec
        }
        None => {
            let spec = ModelSpec::from_file(&model_dir.join("config.json"))?;
            for r in &engine.checkpoints {
                let dir = locate(&r.dir, engine_dir)?;
                let ck = Checkpoint::open(&dir)
                    .with_context(|| format!("checkpoint of {}", engine_dir.display()))?;
                ck.matches(r)?;
                checkpoints.push((r.prefix.clone(), ck));
            }
            spec
        }
    };
    Ok(Ready {
        engine,
        model_dir,
        spec,
        checkpoints,
        origin,
        context_from,
    })
}

/// A draft's random checkpoint, synthesised as the build did (from the graphs' weights).
fn random_for(
    engine: &Engine,
    r: &CheckpointRef,
    engine_dir: &Path,
    random: RandomWeights,
    target: &ModelSpec,
) -> Result<Checkpoint> {
    let dir = locate(&r.dir, engine_dir)?;
    let step = engine
        .graph_ir(GraphRole::SpecStep)
        .ok_or_else(|| anyhow!("the engine has a draft but no spec step"))?;
    let g = specc_ir::text::parse(step)?;
    Ok(synthetic_draft(&dir, &g, &r.prefix, random, target)?)
}
