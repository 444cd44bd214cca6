//! What the CLI checks before it builds or runs anything: the model opens and validates
//! (with a note for the tensors it skipped), the context is chosen and said where it came
//! from, and the memory estimate fits the backend that will run it.
//!
//! Two estimates, both with saturating arithmetic ([`specc_runtime::memory`]): before the
//! build, from the model's config and graph (rejects absurd configs and caps the default
//! context); before the run allocates, from the engine (the CPU backend here, the GPU's in
//! the runtime's CUDA device code).

use std::path::Path;

use anyhow::{bail, Result};
use specc_ir::{Bindings, Graph};
use specc_models::context::Context;
use specc_models::{Checkpoint, Model, ModelSpec, RandomWeights, SpecConfig};
use specc_runtime::memory::{Budget, Footprint, Human, Storage};

/// The memory a build must fit: its budget, how the backend stores tensors, and the
/// sequences whose states it sizes.
#[derive(Clone, Copy, Debug)]
pub struct Fit {
    pub budget: Budget,
    pub storage: Storage,
    pub lanes: u64,
}

/// A quarter of the budget is left for what the pre-build estimate does not see
/// (activations of long prompts, the draft, allocator slack) when the default context is
/// capped to what fits.
const RESERVE_DIV: u64 = 4;

/// Default contexts are lowered to a multiple of this (the smallest prompt chunk).
const CONTEXT_STEP: u64 = specc_models::spec_bundle::MIN_PREFILL_T as u64;

impl Fit {
    /// The memory of the backend that runs (`cuda`: GPU 0's free memory), when it can be
    /// measured.
    pub fn of_backend(cuda: bool, lanes: u64) -> Result<Option<Fit>> {
        let budget = if cuda { gpu_budget()? } else { Budget::host() };
        let storage = if cuda {
            Storage::Device
        } else {
            Storage::Interpreter
        };
        Ok(budget.map(|budget| Fit {
            budget,
            storage,
            lanes,
        }))
    }
}

#[cfg(feature = "cuda")]
fn gpu_budget() -> Result<Option<Budget>> {
    let (free, _) = specc_runtime::cuda::CudaDevice::open(0)?.mem_info()?;
    Ok(Some(Budget::gpu(free)))
}

#[cfg(not(feature = "cuda"))]
fn gpu_budget() -> Result<Option<Budget>> {
    Err(super::gpu::unavailable())
}

/// Opens the model at `path` (with `random`, synthesised from its config: the weights'
/// estimate must fit `fit` first, since lowering and synthesising cost what the config
/// says), printing the note of tensors its checkpoint holds that nothing reads.
pub fn open_model(
    path: &Path,
    random: Option<RandomWeights>,
    layers: Option<usize>,
    fit: Option<&Fit>,
) -> Result<Model> {
    if let Some(random) = random {
        let (_, config) = Model::random_paths(path);
        let mut spec = ModelSpec::from_file(&config)?;
        if let Some(n) = layers {
            spec.layers = spec.layers.min(n);
        }
        if let Some(f) = fit {
            let per = match f.storage {
                Storage::Device => spec.dtype.size_bytes().unwrap_or(1) as u64,
                Storage::Interpreter => 4,
            };
            let weights = Footprint {
                weights: spec.param_count().unwrap_or(u64::MAX).saturating_mul(per),
                ..Footprint::default()
            };
            weights.check(
                &f.budget,
                &format!(
                    "the weights grow with hidden_size, intermediate_size, num_hidden_layers and vocab_size of {}",
                    config.display()
                ),
            )?;
        }
        return Ok(Model::open_synthetic(path, random, layers)?);
    }
    if !path.is_dir() {
        bail!("{}: no such model directory", path.display());
    }
    let model = Model::open(path)?;
    note_skipped(model.checkpoint());
    Ok(model)
}

/// Prints which known-unused tensors of `ck` were skipped (one line, if any).
pub fn note_skipped(ck: &Checkpoint) {
    if let Some(n) = ck.note() {
        eprintln!("note: {n}");
    }
}

/// The context for `model` (rule: [`Context::choose`]); with `fit`, a default context is
/// lowered to what fits, and any context whose estimate does not fit is an error naming
/// where it came from. A lowered default is noted.
pub fn context(
    model: &Model,
    flag: Option<u64>,
    cfg: Option<&SpecConfig>,
    fit: Option<&Fit>,
) -> Result<Context> {
    let mut ctx = Context::choose(model.spec(), model.config_file(), flag, cfg)?;
    if let Some(f) = fit {
        let at = |tokens: u64| estimate(model.graph(), f, 1, tokens);
        let (fixed, per_token) = (at(0), at(1).states);
        let usable = f.budget.bytes - f.budget.bytes / RESERVE_DIV;
        if let Some(room) = usable.checked_sub(fixed.total()) {
            let fits = room / per_token.max(1) / CONTEXT_STEP * CONTEXT_STEP;
            if fits >= CONTEXT_STEP {
                let why = format!("in {} of {}", Human(f.budget.bytes), f.budget.what);
                ctx.cap(fits, &why);
            }
        }
        at(ctx.tokens).check(
            &f.budget,
            &format!(
                "it grows with the max context ({}, from {}) and the batch ({})",
                ctx.tokens, ctx.from, f.lanes
            ),
        )?;
    }
    if let Some(n) = ctx.note() {
        eprintln!("note: {n}");
    }
    Ok(ctx)
}

/// The estimate of running `g` over `t` tokens at `ctx` KV slots per sequence.
pub fn estimate(g: &Graph, f: &Fit, t: u64, ctx: u64) -> Footprint {
    Footprint::of_graphs(&[(g, Bindings::new(f.lanes, t, ctx))], f.storage)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use specc_models::context::ContextFrom;

    use super::*;

    fn default_model() -> Model {
        Model::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("models/default")).unwrap()
    }

    fn fit(bytes: u64) -> Fit {
        Fit {
            budget: Budget {
                bytes,
                what: "the test's budget",
            },
            storage: Storage::Interpreter,
            lanes: 1,
        }
    }

    #[test]
    fn default_context_is_capped_to_what_fits() {
        let m = default_model();
        let f = fit(u64::MAX);
        let (fixed, per_token) = (estimate(m.graph(), &f, 1, 0), estimate(m.graph(), &f, 1, 1));
        // Room for 500 tokens in three quarters of the budget: 496, a multiple of 16.
        let usable = fixed.total() + 500 * per_token.states;
        let f = fit(usable + usable / 3);
        let ctx = context(&m, None, None, Some(&f)).unwrap();
        assert_eq!(ctx.tokens, 496);
        assert!(matches!(ctx.from, ContextFrom::Default(_)));
        assert_eq!(
            ctx.note().unwrap(),
            format!(
                "max context 496 tokens (496 tokens fit in {} of the test's budget; --max-context sets it)",
                Human(f.budget.bytes)
            )
        );
        // A given context is never lowered: it fails the estimate, naming its flag.
        let f = fit(fixed.total() + 100 * per_token.states);
        let e = context(&m, Some(1024), None, Some(&f))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("of the test's budget; it grows with the max context (1024, from --max-context) and the batch (1)"),
            "{e}"
        );
        // Without a budget the default is max_position_embeddings (1024 ≤ 4096).
        assert_eq!(context(&m, None, None, None).unwrap().tokens, 1024);
    }
}
