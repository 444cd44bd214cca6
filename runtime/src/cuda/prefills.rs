//! A session's prefill graphs: each (role, prompt bucket) plan is loaded and captured as one
//! CUDA graph on its first use and replayed from then on, so a prefill costs one
//! `cuGraphLaunch` instead of one launch per kernel.
//!
//! A graph is captured per (role, batch bucket, prompt bucket, first lane): an admission
//! prefills the smallest bucket holding the lanes it admits, its state slots moved to them.
//!
//! Every prefill is captured: its launches are plain kernel launches over fixed arena
//! offsets, and the host moves its inputs and outputs with copies outside the graph (inputs
//! written into the arena's input slots before the replay, outputs read after it), so
//! nothing in a prefill depends on a host value at capture time.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use specc_ir::engine::{BucketPlan, GraphRole};

use super::{CudaEngine, DeviceArena, LoadedGraph, StepGraph};
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
        self.loaded.shadow_in()?;
        self.captured.replay()?;
        self.loaded.shadow_out()?;
        engine.synchronize()?;
        outputs.iter().map(|o| self.loaded.read(o)).collect()
    }

    /// Replays so far (the capture itself runs nothing).
    pub fn replays(&self) -> u64 {
        self.captured.replays()
    }
}

/// Where a prefill runs: batch bucket `b`, prompt bucket `t`, first lane `lane` (a
/// bucket-`b` plan over lanes `lane..lane + b` of the states).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefillAt {
    pub b: usize,
    pub t: usize,
    pub lane: usize,
}

/// The prefill graphs captured so far, by role and place, and one activation arena per
/// plan (role, batch bucket, prompt bucket) that its graphs at every lane share: they run
/// one at a time on the session's stream, and one plan's kernels leave its arena as they
/// expect it (split-K counters back at zero, its own values elsewhere), which another
/// plan's layout would not.
#[derive(Default)]
pub struct PrefillGraphs {
    graphs: HashMap<(GraphRole, PrefillAt), PrefillGraph>,
    arenas: HashMap<(GraphRole, usize, usize), DeviceArena>,
}

impl PrefillGraphs {
    /// The graph of `plan` (role `role`) at `at`, loaded and captured on first use, in
    /// the plan's arena (allocated by its first graph).
    pub fn get_or_capture(
        &mut self,
        engine: &mut CudaEngine,
        role: GraphRole,
        at: PrefillAt,
        plan: &BucketPlan,
    ) -> Result<&PrefillGraph, RuntimeError> {
        Ok(match self.graphs.entry((role, at)) {
            Entry::Occupied(g) => g.into_mut(),
            Entry::Vacant(slot) => {
                let arena = match self.arenas.entry((role, at.b, at.t)) {
                    Entry::Occupied(a) => a.into_mut(),
                    Entry::Vacant(a) => {
                        a.insert(DeviceArena::new(&engine.dev, plan.arena_bytes.max(256))?)
                    }
                };
                let loaded = engine.load_at(plan, at.lane as u64, Some(arena))?;
                let captured = engine.capture(&loaded)?;
                slot.insert(PrefillGraph { loaded, captured })
            }
        })
    }

    /// The graph of `role` at `at` if it was captured.
    pub fn get(&self, role: GraphRole, at: PrefillAt) -> Option<&PrefillGraph> {
        self.graphs.get(&(role, at))
    }

    /// The role and place of every captured graph.
    pub fn places(&self) -> Vec<(GraphRole, PrefillAt)> {
        self.graphs.keys().copied().collect()
    }

    /// How many prefill graphs were captured.
    pub fn captured(&self) -> usize {
        self.graphs.len()
    }

    /// Replays of every prefill graph so far.
    pub fn replays(&self) -> u64 {
        self.graphs.values().map(PrefillGraph::replays).sum()
    }

    /// Replays of the `role` graphs at prompt bucket `t` so far, at any batch bucket and
    /// lane.
    pub fn replays_of(&self, role: GraphRole, t: usize) -> u64 {
        self.graphs
            .iter()
            .filter(|((r, at), _)| *r == role && at.t == t)
            .map(|(_, g)| g.replays())
            .sum()
    }
}
