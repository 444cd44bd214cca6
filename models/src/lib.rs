//! specc model front-ends: Hugging Face configs resolved into a validated [`ModelSpec`],
//! safetensors checkpoints, the lowering of dense decoder-only models to IR, and one module
//! per speculative method ([`methods`]).
//!
//! [`Model`] ties them together: open a model directory, and every problem with its files
//! (config fields, missing, unused or non-finite tensors, layer counts, shapes, dtypes,
//! overlapping or truncated files) surfaces as a one-line [`ModelError`] before anything
//! runs.

#[macro_use]
mod raw;

pub mod checkpoint;
pub mod config;
pub mod config_mla;
pub mod context;
pub mod coverage;
mod draft_config;
pub mod error;
pub mod files;
pub mod lower;
pub mod lower_mla;
pub mod methods;
mod model;
pub mod quant;
pub mod spec_bundle;
pub mod spec_config;
pub mod tiktoken;
pub mod tokenizer;

pub use checkpoint::{Checkpoint, TensorEntry};
pub use config::{Arch, ModelSpec, RawConfig};
pub use error::ModelError;
pub use lower::{decoder_layer, lower_dense, lower_dense_prefixed, LayerNames};
pub use methods::{Method, TreeKnobs};
pub use model::{Model, RandomWeights, CONFIG_FILE};
pub use spec_bundle::{DraftSide, SpecBundle};
pub use spec_config::{Acceptance, SamplingKnobs, SpecConfig};
