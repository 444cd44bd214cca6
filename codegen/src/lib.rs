//! specc's pass pipeline: IR graph → fused, scheduled groups → static memory plan →
//! launch plan. [`compile`] lists every pass in order.

mod build;
pub mod choose;
mod consts;
mod cost;
mod dce;
mod error;
mod fuse;
mod fuse_mla;
mod group;
pub mod kernels;
mod launch;
mod memory;
mod physical;
mod report;
mod schedule;
mod stacks;
mod uses;

use std::fmt::Write;
use std::time::Instant;

use specc_ir::{Bindings, Graph};

pub use build::{build, BuildOptions, BuildProgress, Built, Cubins};
pub use consts::{constant_nodes, tensor_bytes, MAX_STATIC_ELEMS};
pub use cost::{group_cost, Cost};
pub use error::CodegenError;
pub use fuse::is_view;
pub use group::{
    Epilogue, Group, GroupId, GroupKind, HeadNorm, MatOut, MlaKv, MlaQ, NormPrologue, RopeKvWrite,
};
pub use launch::{ArgSlot, Launch, LaunchPlan};
pub use memory::{check as check_memory, root, Home, MemoryPlan, ALIGN};
pub use physical::physical_bytes;
pub use report::plan_report;

/// Environment variable naming a pass after which the IR (the groups, or the kernel
/// choices for `kernels`) is printed to stderr, e.g. `SPECC_DUMP_IR=dce`; `all` dumps after
/// every pass.
pub const DUMP_ENV: &str = "SPECC_DUMP_IR";

#[derive(Clone, Debug)]
pub struct PassTime {
    pub pass: &'static str,
    pub micros: u128,
}

/// Everything the pipeline produced for one graph and its buckets.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub graph: Graph,
    /// Groups in schedule order.
    pub groups: Vec<Group>,
    /// One launch plan per bucket, in the order the buckets were given.
    pub plans: Vec<LaunchPlan>,
    pub timings: Vec<PassTime>,
    pub removed_nodes: usize,
    /// `constants[v]`: node `v` was folded (no group computes it; see [`constant_nodes`]).
    pub constants: Vec<bool>,
}

pub(crate) fn dump_requested(pass: &str) -> bool {
    std::env::var(DUMP_ENV)
        .map(|v| v == "all" || v.split(',').any(|p| p == pass))
        .unwrap_or(false)
}

fn verify(g: &Graph, pass: &'static str) -> Result<(), CodegenError> {
    specc_ir::verify(g).map_err(|source| CodegenError::Verify { pass, source })
}

/// Runs the pipeline. Each pass is timed; the IR is verified after every pass that changes it.
pub fn compile(mut graph: Graph, buckets: &[Bindings]) -> Result<Compiled, CodegenError> {
    let mut timings = Vec::new();
    let mut timed = |pass: &'static str, t: Instant| {
        timings.push(PassTime {
            pass,
            micros: t.elapsed().as_micros(),
        })
    };

    // 1. verify: the input graph obeys every IR rule.
    let t = Instant::now();
    verify(&graph, "input")?;
    timed("verify", t);

    // 2. dce: drop pure nodes nothing observable depends on.
    let t = Instant::now();
    let removed_nodes = dce::run(&mut graph);
    verify(&graph, "dce")?;
    timed("dce", t);
    if dump_requested("dce") {
        eprintln!("--- IR after dce ---\n{}", specc_ir::text::print(&graph));
    }

    // 3. fold: values that depend only on the bucket (fills, iotas and pure functions of
    // them) become constants, computed here and uploaded once, never launched.
    let t = Instant::now();
    let constants = consts::constant_nodes(&graph);
    timed("fold", t);

    // 4. fuse: partition the non-constant compute nodes into kernel groups (prologues,
    // epilogues).
    let t = Instant::now();
    let groups = fuse::run(&graph, &constants);
    timed("fuse", t);

    // 5. schedule: topological order of groups, program order on ties.
    let t = Instant::now();
    let groups = schedule::run(&graph, groups)?;
    timed("schedule", t);
    if dump_requested("fuse") || dump_requested("schedule") {
        eprintln!(
            "--- groups after schedule ---\n{}",
            describe_groups(&graph, &groups)
        );
    }

    // 6. memory: per bucket, live ranges → arena offsets, constants → their bytes; checked
    // for overlap.
    let t = Instant::now();
    let mut memories = Vec::with_capacity(buckets.len());
    for b in buckets {
        let m = memory::plan(&graph, &groups, b, &constants)?;
        memory::check(&m)?;
        memories.push(m);
    }
    timed("memory", t);

    // 7. launch: ordered launches with argument homes and costs, per bucket.
    let t = Instant::now();
    let plans = buckets
        .iter()
        .zip(memories)
        .map(|(b, m)| launch::build(&graph, &groups, b.clone(), m))
        .collect();
    timed("launch", t);

    Ok(Compiled {
        graph,
        groups,
        plans,
        timings,
        removed_nodes,
        constants,
    })
}

/// One line per group: id, family, nodes covered, inputs and outputs.
pub fn describe_groups(g: &Graph, groups: &[Group]) -> String {
    let mut s = String::new();
    for (i, gr) in groups.iter().enumerate() {
        let list = |v: &[specc_ir::ValueId]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let _ = writeln!(
            s,
            "g{i:<4} {:<16} nodes [{}] in [{}] out [{}]",
            gr.family(g),
            list(&gr.nodes),
            list(&gr.inputs),
            list(&gr.outputs)
        );
    }
    s
}

impl Compiled {
    /// The plan report: pass timings, memory, and the per-kernel bytes/FLOPs/roofline table
    /// for each bucket, with the roofline ceilings of `target`.
    pub fn report(&self, target: &specc_ir::engine::Target) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "graph {}: {} nodes ({} removed as dead), {} groups",
            self.graph.name,
            self.graph.len(),
            self.removed_nodes,
            self.groups.len()
        );
        let _ = writeln!(s, "passes:");
        for p in &self.timings {
            let _ = writeln!(s, "  {:<10} {:>8} us", p.pass, p.micros);
        }
        for plan in &self.plans {
            s.push_str(&plan.report(&self.graph, target));
        }
        s
    }
}
