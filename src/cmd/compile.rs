//! `specc compile`: a model (and optionally a spec.toml) → an engine directory, through the
//! one build (`specc_models::spec_bundle::engine_input` + `specc_codegen::build`):
//! `engine.json` (every plan, launch, slot, state, contract and checkpoint reference),
//! `kernels/{module}.{arch}.cubin` for every requested arch (when NVRTC is available),
//! `plan.txt` (the plan report) and `kernels/{kernel}.cu` (the generated sources).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use specc_codegen::{build, plan_report, BuildOptions, Built, CodegenError, Cubins};
use specc_ir::engine::{Arch, Engine, GraphRole, Target, ENGINE_FILE, PLAN_FILE};
use specc_models::spec_bundle::{engine_input, EngineExtras};
use specc_models::{RandomWeights, SpecConfig};

use super::engine::{dir_ref, RANDOM_SEED};
use super::fit::{self, open_model};
use super::sampling;
use crate::cli::SamplingArgs;
use crate::{embedded, progress};

pub struct CompileArgs<'a> {
    pub model: Option<PathBuf>,
    pub out: &'a Path,
    pub max_context: Option<u64>,
    pub archs: &'a [String],
    pub random_weights: bool,
    /// `--synthetic-acceptance` (random weights).
    pub synthetic_acceptance: Option<f64>,
    /// `--layers`: the first this many decoder layers (random weights).
    pub layers: Option<usize>,
    pub spec: Option<&'a Path>,
    pub sampling: SamplingArgs,
}

/// `--arch` names → archs, in order, each once.
fn parse_archs(names: &[String]) -> Result<Vec<Arch>> {
    let mut archs = Vec::new();
    for n in names {
        let a: Arch = n.trim().parse().map_err(|e| anyhow!("--arch: {e}"))?;
        if !archs.contains(&a) {
            archs.push(a);
        }
    }
    if archs.is_empty() {
        bail!("--arch: expected at least one of sm_90a, sm_100a, sm_120");
    }
    Ok(archs)
}

/// Removes what an earlier compile into `out` left in `out/kernels` (cubins and sources of
/// kernels this engine may no longer have).
fn clear_previous(out: &Path) -> Result<()> {
    let kdir = out.join("kernels");
    if !out.join(ENGINE_FILE).is_file() || !kdir.is_dir() {
        return Ok(());
    }
    for entry in fs::read_dir(&kdir).with_context(|| format!("{}: cannot read", kdir.display()))? {
        let p = entry
            .with_context(|| format!("{}: cannot read", kdir.display()))?
            .path();
        let ours = p.extension().is_some_and(|e| e == "cubin" || e == "cu");
        if ours && p.is_file() {
            fs::remove_file(&p).with_context(|| format!("{}: cannot remove", p.display()))?;
        }
    }
    Ok(())
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// Sorted, distinct token counts of `role` over every batch bucket.
fn token_buckets(e: &Engine, role: GraphRole) -> Vec<u32> {
    let mut ts: Vec<u32> = e
        .plans
        .iter()
        .filter(|p| p.role == role)
        .map(|p| p.bucket.t)
        .collect();
    ts.sort_unstable();
    ts.dedup();
    ts
}

fn list(xs: &[u32]) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn compile(a: CompileArgs) -> Result<()> {
    let archs = parse_archs(a.archs)?;
    let embedded_default = a.model.is_none();
    let path = match a.model {
        Some(p) => p,
        None => embedded::default_model_dir()?,
    };
    // The embedded default compiles with its own spec (as `specc run` runs it) unless a
    // spec is named; random weights build plain decoding, as `specc run` does.
    let spec_file = match a.spec {
        Some(s) => Some(s.to_path_buf()),
        None if embedded_default && !a.random_weights => Some(path.join(embedded::SPEC_FILE)),
        None => None,
    };
    if !a.random_weights && path.join(ENGINE_FILE).is_file() {
        bail!(
            "{}: an engine directory, not a model (compile a model directory)",
            path.display()
        );
    }
    // The engine runs elsewhere: no memory here to fit it to.
    let random = a.random_weights.then_some(RandomWeights {
        seed: RANDOM_SEED,
        synthetic_acceptance: a.synthetic_acceptance,
    });
    let model = open_model(&path, random, a.layers, None)?;
    let cfg = spec_file
        .as_deref()
        .map(SpecConfig::from_file)
        .transpose()?;
    let max_context = fit::context(&model, a.max_context, cfg.as_ref(), None)?.tokens;
    let base = cfg
        .as_ref()
        .map(|c| c.acceptance.clone())
        .unwrap_or_default();
    let extras = EngineExtras {
        acceptance: Some(sampling::acceptance(&a.sampling, &base)?),
        ..EngineExtras::default()
    };

    let out = a.out;
    if out.exists() && !out.is_dir() {
        bail!("{}: exists and is not a directory", out.display());
    }
    fs::create_dir_all(out).with_context(|| format!("{}: cannot create", out.display()))?;
    // Checkpoint directories as the engine names them: the embedded default's materialised
    // copy as `embedded/...`, others relative to the engine where they lie below it.
    let default_dir = embedded_default.then(|| canonical(&path));
    let relative = dir_ref(out);
    let name_dir = |dir: &Path| -> PathBuf {
        if let Some(d) = &default_dir {
            if let Ok(rest) = canonical(dir).strip_prefix(d) {
                return match rest.as_os_str().is_empty() {
                    true => PathBuf::from("embedded"),
                    false => Path::new("embedded").join(rest),
                };
            }
        }
        relative(dir)
    };
    let (input, bundle) = engine_input(
        &model,
        cfg.as_ref(),
        max_context,
        random,
        &extras,
        &name_dir,
    )?;
    if let Some(b) = &bundle {
        fit::note_skipped(&b.draft_checkpoint);
    }
    let target = Target::for_archs(&archs);
    let require = std::env::var("SPECC_REQUIRE_NVRTC").as_deref() == Ok("1");
    let pb = progress::bar(0, "compiling the engine");
    let report = progress::build_reporter(&pb);
    let opts = BuildOptions {
        cubins: if require {
            Cubins::Require
        } else {
            Cubins::IfAvailable
        },
        progress: Some(&report),
        ..BuildOptions::default()
    };
    let built = build(input, &target, &opts);
    pb.finish_and_clear();
    let Built {
        engine,
        sources,
        plan_s,
        nvrtc_s,
        cached_modules,
        nvrtc_version,
    } = match built {
        Err(CodegenError::Nvrtc(e)) if require => bail!("SPECC_REQUIRE_NVRTC=1: {e}"),
        r => r?,
    };

    clear_previous(out)?;
    engine.write_dir(out)?;
    let plan = out.join(PLAN_FILE);
    fs::write(&plan, plan_report(&engine, Some(&sources)))
        .with_context(|| format!("{}: cannot write", plan.display()))?;
    for k in &sources {
        let p = out.join("kernels").join(format!("{}.cu", k.name));
        fs::write(&p, &k.source).with_context(|| format!("{}: cannot write", p.display()))?;
    }

    let mut methods = vec![engine.plain.label.clone()];
    methods.extend(engine.spec.as_ref().map(|c| c.label.clone()));
    let what = match embedded_default {
        true => "the embedded default model".to_string(),
        false => path.display().to_string(),
    };
    println!(
        "compiled {what} ({}) for {}: {}",
        engine.architecture,
        archs
            .iter()
            .map(|a| a.name())
            .collect::<Vec<_>>()
            .join(", "),
        methods.join(" + ")
    );
    println!("max context: {}", engine.max_context);
    println!("acceptance: {}", engine.acceptance);
    println!("batch buckets: {}", list(&engine.batch_buckets()));
    let mut roles: Vec<GraphRole> = Vec::new();
    for c in [Some(&engine.plain), engine.spec.as_ref()]
        .into_iter()
        .flatten()
    {
        for r in [c.target_prefill, c.step]
            .into_iter()
            .chain(c.draft_prefill)
        {
            if !roles.contains(&r) {
                roles.push(r);
            }
        }
    }
    let per_role: Vec<String> = roles
        .iter()
        .map(|&r| format!("{r} [{}]", list(&token_buckets(&engine, r))))
        .collect();
    println!("token buckets: {}", per_role.join("; "));
    let launches: usize = engine.plans.iter().map(|p| p.launches.len()).sum();
    let cubins: usize = engine.modules.iter().map(|m| m.cubins.len()).sum();
    println!(
        "{} bucket plans, {launches} launches; {} kernels, {} modules, {cubins} cubins",
        engine.plans.len(),
        engine.kernels.len(),
        engine.modules.len()
    );
    let nvrtc = match nvrtc_version {
        Some((major, minor)) => format!(
            "NVRTC {nvrtc_s:.2} s ({cached_modules} of {} modules from its cache; NVRTC {major}.{minor})",
            engine.modules.len()
        ),
        None => "NVRTC not run".to_string(),
    };
    println!("timings: IR → kernels {plan_s:.2} s, {nvrtc}");
    println!("wrote {}", out.display());
    if cubins == 0 {
        let why = engine
            .uncompiled
            .as_deref()
            .unwrap_or("no kernels were compiled");
        eprintln!("warning: the engine has no cubins ({why}): it will run on the CPU backend only");
    }
    Ok(())
}
