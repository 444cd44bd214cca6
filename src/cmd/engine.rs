//! The engine directory: what `specc compile` writes and `run`/`inspect` read.
//!
//! Layout: `engine.json` (format version, model directory, max context), `graph.ir` (the IR
//! text after lowering) and `plan.txt` (a human-readable summary).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use specc_models::Model;

use crate::embedded;

pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, Deserialize, Debug)]
pub struct EngineManifest {
    pub format_version: u32,
    /// Absolute path of the model directory the engine was compiled from (weights and
    /// tokenizer are read from there).
    pub model_dir: PathBuf,
    pub max_context: u64,
    pub architecture: String,
    /// Compiled with `--random-weights`: running it synthesises the same weights.
    #[serde(default)]
    pub random_weights: bool,
    /// The config the engine was compiled from (a directory's config.json, or a file).
    #[serde(default)]
    pub config: Option<PathBuf>,
}

impl EngineManifest {
    pub fn read(engine: &Path) -> Result<Self> {
        let path = engine.join("engine.json");
        let text = fs::read_to_string(&path)
            .with_context(|| format!("{}: not an engine directory", path.display()))?;
        let m: EngineManifest = serde_json::from_str(&text)
            .map_err(|e| anyhow!("{}: malformed engine manifest: {e}", path.display()))?;
        if m.format_version != FORMAT_VERSION {
            bail!(
                "{}: field \"format_version\": expected {FORMAT_VERSION}, found {} (recompile the engine)",
                path.display(),
                m.format_version
            );
        }
        Ok(m)
    }
}

/// What the user named on the command line: a model or engine directory (or the embedded
/// default when absent), and whether to synthesise its weights.
#[derive(Clone, Debug)]
pub struct Source {
    pub path: Option<PathBuf>,
    pub random_weights: bool,
}

impl Source {
    pub fn new(path: Option<PathBuf>, random_weights: bool) -> Self {
        Source {
            path,
            random_weights,
        }
    }
}

/// Seed of `--random-weights`.
pub const RANDOM_SEED: u64 = 0x5eed;

/// A model resolved from a CLI argument: a model dir, an engine dir, or the embedded default.
pub struct Resolved {
    pub model: Model,
    /// The path the model was read from (a directory, or a config file with
    /// `--random-weights`).
    pub source_path: Option<PathBuf>,
    pub model_dir: PathBuf,
    pub max_context: u64,
}

/// Opens what the user named. An engine's IR is checked against a fresh lowering of its
/// model so a stale engine is an error rather than silently different.
pub fn resolve(src: Source, max_context: Option<u64>) -> Result<Resolved> {
    if src.random_weights {
        let path = match src.path {
            Some(p) => p,
            None => embedded::default_model_dir()?,
        };
        let model = Model::open_random(&path, RANDOM_SEED)?;
        let model_dir = model.dir().to_path_buf();
        let mut r = finish(model, model_dir, max_context, None)?;
        r.source_path = Some(path);
        return Ok(r);
    }
    let (model_dir, engine_ctx, engine_ir) = match src.path {
        None => (embedded::default_model_dir()?, None, None),
        Some(p) if p.join("engine.json").is_file() => {
            let m = EngineManifest::read(&p)?;
            if m.random_weights {
                let cfg = m.config.clone().unwrap_or_else(|| m.model_dir.clone());
                let model = Model::open_random(&cfg, RANDOM_SEED)?;
                let ir = fs::read_to_string(p.join("graph.ir"))
                    .with_context(|| format!("{}: cannot read", p.join("graph.ir").display()))?;
                return finish(
                    model,
                    m.model_dir,
                    max_context.or(Some(m.max_context)),
                    Some(ir),
                );
            }
            let ir_path = p.join("graph.ir");
            let ir = fs::read_to_string(&ir_path)
                .with_context(|| format!("{}: cannot read", ir_path.display()))?;
            (m.model_dir, Some(m.max_context), Some(ir))
        }
        Some(p) => {
            if !p.is_dir() {
                bail!("{}: no such model or engine directory", p.display());
            }
            (p, None, None)
        }
    };
    let model = Model::open(&model_dir)?;
    finish(model, model_dir, max_context.or(engine_ctx), engine_ir)
}

fn finish(
    model: Model,
    model_dir: PathBuf,
    max_context: Option<u64>,
    engine_ir: Option<String>,
) -> Result<Resolved> {
    if let Some(ir) = engine_ir {
        if specc_ir::text::print(model.graph()) != ir {
            bail!(
                "engine graph.ir differs from a fresh lowering of {} (recompile the engine)",
                model_dir.display()
            );
        }
    }
    let limit = model.spec().max_position as u64;
    let max_context = max_context.unwrap_or(limit);
    if max_context == 0 || max_context > limit {
        bail!(
            "--max-context {max_context}: expected 1..={limit} (the model's max_position_embeddings)"
        );
    }
    Ok(Resolved {
        source_path: None,
        model,
        model_dir,
        max_context,
    })
}
