//! What a build starts from: the method's lowered graphs with the buckets to plan each at,
//! its contracts, and the checkpoints the weights come from. `specc_models` produces it from a
//! model directory and a spec; `specc_codegen::build` turns it into an [`super::Engine`].

use super::{Acceptance, CheckpointRef, GraphRole, StepContract};
use crate::{Bindings, Graph};

pub struct RoleGraph {
    pub role: GraphRole,
    pub graph: Graph,
    /// One plan per binding (batch bucket × token count).
    pub buckets: Vec<Bindings>,
}

pub struct BuildInput {
    pub architecture: String,
    pub max_context: u64,
    pub graphs: Vec<RoleGraph>,
    pub plain: StepContract,
    pub spec: Option<StepContract>,
    pub spec_toml: Option<String>,
    /// How every step graph chooses tokens (already lowered into the graphs).
    pub acceptance: Acceptance,
    pub checkpoints: Vec<CheckpointRef>,
    pub random_seed: Option<u64>,
    /// With `random_seed`: the planted acceptance P of the synthesised pair.
    pub synthetic_acceptance: Option<f64>,
}
