//! specc model front-ends: Hugging Face configs resolved into a validated [`ModelSpec`],
//! safetensors checkpoints, and the lowering of dense decoder-only models to IR.
//!
//! [`Model`] ties them together: open a model directory, and every problem with its files
//! (config fields, missing, unused or non-finite tensors, layer counts, shapes, dtypes,
//! overlapping or truncated files) surfaces as a one-line [`ModelError`] before anything
//! runs.

#[macro_use]
mod raw;

pub mod checkpoint;
pub mod config;
pub mod context;
pub mod coverage;
pub mod dflash;
mod draft_config;
pub mod eagle3;
pub mod error;
pub mod files;
pub mod lower;
mod model;
pub mod spec_bundle;
pub mod spec_config;
pub mod spec_step;

pub use checkpoint::{Checkpoint, TensorEntry};
pub use config::{Arch, ModelSpec, RawConfig};
pub use error::ModelError;
pub use lower::{decoder_layer, lower_dense, lower_dense_prefixed, LayerNames};
pub use model::{Model, CONFIG_FILE};
pub use spec_bundle::{DraftSide, SpecBundle};
pub use spec_config::{Acceptance, Method, SpecConfig, TreeKnobs};
