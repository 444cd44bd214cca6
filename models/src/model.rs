//! The [`Model`] façade: config + lowered graph + validated checkpoint, and CPU execution of
//! that graph through the IR interpreter.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use specc_ir::interp::{self, Data, Env, Tensor, WeightSource};
use specc_ir::{Bindings, DType, Graph};

use crate::checkpoint::{Checkpoint, Plant, PlantRole};
use crate::config::ModelSpec;
use crate::coverage;
use crate::error::ModelError;
use crate::lower::{self, LOGITS, NEXT_TOKEN, POSITIONS, TOKENS};

pub const CONFIG_FILE: &str = "config.json";

/// How `--random-weights` synthesises a model's (and its draft's) checkpoints.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RandomWeights {
    pub seed: u64,
    /// `--synthetic-acceptance P`: a target whose greedy next token is a fixed permutation
    /// of the current one, and a draft model that agrees with it on a fraction P of the
    /// tokens ([`crate::checkpoint::planted`]).
    pub synthetic_acceptance: Option<f64>,
}

impl RandomWeights {
    /// Plain random weights (acceptance ≈ 0 for any draft).
    pub fn seeded(seed: u64) -> Self {
        RandomWeights {
            seed,
            synthetic_acceptance: None,
        }
    }

    /// The plant of `role` in a pair whose target is `target` (its end-of-sequence ids are
    /// the tokens π fixes); `None` without a synthetic acceptance.
    pub fn plant(&self, target: &ModelSpec, role: PlantRole) -> Option<Plant> {
        self.synthetic_acceptance.map(|acceptance| Plant {
            seed: self.seed,
            acceptance,
            fixed: target.eos_token_ids.clone(),
            role,
        })
    }
}

/// An opened dense model.
///
/// Invariants (checked by [`Model::open`]): every `weight` of `graph` exists in
/// `checkpoint` with the graph's shape and a bf16/f16/f32 dtype; the checkpoint holds
/// exactly the config's layers and no tensor outside the graph but known-unused ones
/// ([`crate::coverage`]).
pub struct Model {
    dir: PathBuf,
    /// The config.json the spec was resolved from.
    config: PathBuf,
    spec: ModelSpec,
    graph: Graph,
    checkpoint: Checkpoint,
}

impl Model {
    /// Reads and resolves `dir/config.json`, opens the checkpoint and checks its layers
    /// against the config (headers only: nothing is lowered for a config the checkpoint
    /// contradicts), lowers the model, and validates the graph's weights and the
    /// checkpoint's other tensors against the safetensors headers.
    pub fn open(dir: impl AsRef<Path>) -> Result<Model, ModelError> {
        let dir = dir.as_ref().to_path_buf();
        let config = dir.join(CONFIG_FILE);
        let mut spec = ModelSpec::from_file(&config)?;
        let mut checkpoint = Checkpoint::open(&dir)?;
        coverage::check_layers(&checkpoint, &spec, &config)?;
        checkpoint.adapt_router_dtypes(&mut spec);
        checkpoint.adapt_quant(&mut spec, &config)?;
        let graph = lower::lower_dense(&spec)?;
        checkpoint.validate(&graph)?;
        let reader = coverage::Reader::model(&spec, &config);
        coverage::check_unused(&mut checkpoint, &coverage::reads(&[&graph], ""), &reader)?;
        Ok(Model {
            config: dir.join(CONFIG_FILE),
            dir,
            spec,
            graph,
            checkpoint,
        })
    }

    /// A model from its config alone (`path` is a model directory or a `config.json`), with
    /// deterministic random weights: full-size shapes without a download.
    pub fn open_random(path: impl AsRef<Path>, seed: u64) -> Result<Model, ModelError> {
        Self::open_random_layers(path, seed, None)
    }

    /// [`Model::open_random`] with the first `layers` decoder layers only (a full-size
    /// model's shapes on a device that holds a few of its layers): the config's other
    /// fields are kept, so dense and MoE layers keep their places.
    pub fn open_random_layers(
        path: impl AsRef<Path>,
        seed: u64,
        layers: Option<usize>,
    ) -> Result<Model, ModelError> {
        Self::open_synthetic(path, RandomWeights::seeded(seed), layers)
    }

    /// [`Model::open_random_layers`] for any [`RandomWeights`]: with a synthetic acceptance,
    /// the target of a planted pair ([`crate::checkpoint::planted`]).
    pub fn open_synthetic(
        path: impl AsRef<Path>,
        random: RandomWeights,
        layers: Option<usize>,
    ) -> Result<Model, ModelError> {
        let seed = random.seed;
        let (dir, config) = Self::random_paths(path.as_ref());
        let mut spec = ModelSpec::from_file(&config)?;
        if let Some(n) = layers {
            if n == 0 || n > spec.layers {
                return Err(ModelError::Field {
                    file: config.clone(),
                    field: "num_hidden_layers".into(),
                    expected: format!("at least the {n} layers --layers asks for"),
                    found: spec.layers.to_string(),
                });
            }
            spec.layers = n;
        }
        spec.quant.formats = crate::quant::published_formats(&spec)?;
        let graph = lower::lower_dense(&spec)?;
        let checkpoint = match random.plant(&spec, PlantRole::Target) {
            Some(p) => Checkpoint::random_planted(&dir, &config, &graph, seed, p)?,
            None => Checkpoint::random(&dir, &graph, seed),
        };
        Ok(Model {
            config,
            dir,
            spec,
            graph,
            checkpoint,
        })
    }

    /// `(model directory, config.json)` of [`Model::open_random`]'s `path`: a model
    /// directory or a config file.
    pub fn random_paths(path: &Path) -> (PathBuf, PathBuf) {
        if path.is_dir() {
            (path.to_path_buf(), path.join(CONFIG_FILE))
        } else {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (dir, path.to_path_buf())
        }
    }

    /// The checkpoint, given up by the model (an engine keeps its weights' sources).
    pub fn into_checkpoint(self) -> Checkpoint {
        self.checkpoint
    }

    pub fn config_file(&self) -> &Path {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// Every weight the graph reads, as f32 values tagged with the stored dtype; an error
    /// names the first tensor holding a NaN or an infinity.
    pub fn weights_f32(&self) -> Result<HashMap<String, Tensor>, ModelError> {
        self.graph
            .weights()
            .map(|(_, name, _)| Ok((name.to_string(), self.checkpoint.load_f32(name)?)))
            .collect()
    }

    /// [`Model::weights_f32`] for weights known to be finite (tests, synthesised weights).
    ///
    /// # Panics
    /// On a non-finite weight (every graph weight exists: [`Model::open`] checked).
    pub fn load_weights_f32(&self) -> HashMap<String, Tensor> {
        self.weights_f32().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Greedy decoding of one sequence on the CPU interpreter: one prefill step over the
    /// whole prompt, then `max_new - 1` decode steps of one token, with a KV cache of `ctx`
    /// slots. Returns exactly `max_new` new tokens (it does not stop at EOS; callers cut at
    /// `spec().eos_token_ids`).
    pub fn greedy_generate(
        &self,
        weights: &dyn WeightSource,
        prompt_ids: &[u32],
        max_new: usize,
        ctx: usize,
    ) -> Result<Vec<u32>, ModelError> {
        self.check_ids(prompt_ids)?;
        self.check_length(prompt_ids.len(), max_new, Some(ctx))?;
        let mut states = self.empty_states(ctx);
        let mut out = Vec::with_capacity(max_new);
        let mut step_ids = prompt_ids.to_vec();
        let mut start = 0;
        while out.len() < max_new {
            let res = self.step(weights, &mut states, &step_ids, start, ctx)?;
            let next = int_values(&res[NEXT_TOKEN]);
            let tok = *next.last().expect("next_token has T >= 1 entries");
            let tok = u32::try_from(tok)
                .map_err(|_| ModelError::request("next_token", "a token id", format!("{tok}")))?;
            out.push(tok);
            start += step_ids.len();
            step_ids = vec![tok];
        }
        Ok(out)
    }

    /// Logits at every position of `ids` from one forward pass: `([n, vocab], values)`.
    pub fn logits(
        &self,
        weights: &dyn WeightSource,
        ids: &[u32],
    ) -> Result<(Vec<usize>, Vec<f32>), ModelError> {
        self.check_ids(ids)?;
        self.check_length(ids.len(), 0, None)?;
        let ctx = ids.len();
        let mut states = self.empty_states(ctx);
        let mut res = self.step(weights, &mut states, ids, 0, ctx)?;
        let logits = res.remove(LOGITS).expect("the graph outputs logits");
        let values = match logits.data {
            Data::F32(v) => v,
            Data::I64(_) => unreachable!("logits are f32 by construction"),
        };
        Ok((vec![ids.len(), self.spec.vocab], values))
    }

    /// Runs the graph once for batch 1: `ids` at positions `start..start + ids.len()`.
    fn step(
        &self,
        weights: &dyn WeightSource,
        states: &mut HashMap<String, Tensor>,
        ids: &[u32],
        start: usize,
        ctx: usize,
    ) -> Result<HashMap<String, Tensor>, ModelError> {
        let t = ids.len();
        let ids_tensor = |v: Vec<i64>| Tensor::from_i64(DType::I32, vec![1, t], v);
        let inputs = HashMap::from([
            (
                TOKENS.to_string(),
                ids_tensor(ids.iter().map(|&i| i as i64).collect()),
            ),
            (
                POSITIONS.to_string(),
                ids_tensor((start..start + t).map(|p| p as i64).collect()),
            ),
        ]);
        let mut env = Env {
            bind: Bindings::new(1, t as u64, ctx as u64),
            inputs,
            weights,
            states,
        };
        interp::run(&self.graph, &mut env).map_err(|source| ModelError::Run {
            graph: self.graph.name.clone(),
            source,
        })
    }

    /// Zeroed KV caches (every state of the graph) for batch 1 and `ctx` slots.
    fn empty_states(&self, ctx: usize) -> HashMap<String, Tensor> {
        let bind = Bindings::new(1, 1, ctx as u64);
        self.graph
            .states()
            .map(|(_, name, ty)| {
                let shape = ty
                    .shape
                    .dims()
                    .iter()
                    .map(|d| d.resolve(&bind).expect("state dims are static or B/Ctx") as usize)
                    .collect();
                (name.to_string(), Tensor::zeros(ty.dtype, shape))
            })
            .collect()
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), ModelError> {
        if ids.is_empty() {
            return Err(ModelError::request(
                "prompt",
                "at least one token id",
                "0 tokens",
            ));
        }
        self.spec.check_token_ids(&self.config, "prompt", ids)
    }

    /// `prompt + max_new` tokens must fit `max_position_embeddings` and the cache.
    fn check_length(
        &self,
        prompt: usize,
        max_new: usize,
        ctx: Option<usize>,
    ) -> Result<(), ModelError> {
        let total = prompt + max_new;
        let found = format!("{prompt} prompt + {max_new} new = {total} tokens");
        let max_pos = self.spec.max_position;
        if total > max_pos {
            return Err(ModelError::request(
                "prompt",
                format!(
                    "at most {max_pos} tokens in all (max_position_embeddings of {})",
                    self.dir.join(CONFIG_FILE).display()
                ),
                found,
            ));
        }
        if let Some(ctx) = ctx {
            if total > ctx {
                return Err(ModelError::request(
                    "prompt",
                    format!("at most {ctx} tokens in all (the KV cache's ctx)"),
                    found,
                ));
            }
        }
        Ok(())
    }
}

/// Integer values of an i32/i64 tensor (the interpreter holds them as i64).
fn int_values(t: &Tensor) -> Vec<i64> {
    match &t.data {
        Data::I64(v) => v.clone(),
        Data::F32(v) => v.iter().map(|&x| x as i64).collect(),
    }
}
