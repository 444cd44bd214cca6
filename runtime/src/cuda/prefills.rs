//! A session's prefill graphs: each (role, prompt bucket) plan is loaded and captured as one
//! CUDA graph on its first use and replayed from then on, so a prefill costs one
//! `cuGraphLaunch` instead of one launch per kernel.
//!
//! Every prefill is captured: its launches are plain kernel launches over fixed arena
//! offsets, and the host moves its inputs and outputs with copies outside the graph (inputs
//! written into the arena's input slots before the replay, outputs read after it), so
//! nothing in a prefill depends on a host value at capture time.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use specc_ir::engine::{BucketPlan, GraphRole};

use super::{CudaEngine, LoadedGraph, StepGraph};
use crate::RuntimeError;

/// One prefill plan, loaded and captured.
pub struct PrefillGraph {
    pub loaded: LoadedGraph,
    captured: StepGraph,
}

impl PrefillGraph {
    /// Writes `inputs` into the graph's input slots, replays it and returns the bytes of
    /// `outputs` (blocking until the replay has run).
    pub fn run(
        &self,
        engine: &CudaEngine,
        inputs: &[(&str, &[u8])],
        outputs: &[&str],
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        for (name, bytes) in inputs {
            self.loaded.write(name, bytes)?;
        }
        self.captured.replay()?;
        engine.synchronize()?;
        outputs.iter().map(|o| self.loaded.read(o)).collect()
    }

    /// Replays so far (the capture itself runs nothing).
    pub fn replays(&self) -> u64 {
        self.captured.replays()
    }
}

/// The prefill graphs captured so far, by role and prompt bucket.
#[derive(Default)]
pub struct PrefillGraphs {
    graphs: HashMap<(GraphRole, usize), PrefillGraph>,
}

impl PrefillGraphs {
    /// The graph of `plan` (role `role`, bucket `t`), loaded and captured on first use.
    pub fn get_or_capture(
        &mut self,
        engine: &mut CudaEngine,
        role: GraphRole,
        t: usize,
        plan: &BucketPlan,
    ) -> Result<&PrefillGraph, RuntimeError> {
        Ok(match self.graphs.entry((role, t)) {
            Entry::Occupied(g) => g.into_mut(),
            Entry::Vacant(slot) => {
                let loaded = engine.load(plan)?;
                let captured = engine.capture(&loaded)?;
                slot.insert(PrefillGraph { loaded, captured })
            }
        })
    }

    /// The graph of `(role, t)` if it was captured.
    pub fn get(&self, role: GraphRole, t: usize) -> Option<&PrefillGraph> {
        self.graphs.get(&(role, t))
    }

    /// How many prefill graphs were captured.
    pub fn captured(&self) -> usize {
        self.graphs.len()
    }

    /// Replays of every prefill graph so far.
    pub fn replays(&self) -> u64 {
        self.graphs.values().map(PrefillGraph::replays).sum()
    }
}
