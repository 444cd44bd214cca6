//! The launch plan: what runs, in order, and where each argument lives.

use std::fmt::Write;

use specc_ir::engine::Target;
use specc_ir::{Bindings, Graph, ValueId};

use crate::cost::{group_cost, Cost};
use crate::group::{Group, GroupId};
use crate::memory::{Home, MemoryPlan};

/// One argument of a launch: an IR value and its home.
#[derive(Clone, Debug, PartialEq)]
pub struct ArgSlot {
    pub value: ValueId,
    pub home: Home,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub group: GroupId,
    pub family: &'static str,
    /// Values read, then values written, each with its home.
    pub reads: Vec<ArgSlot>,
    pub writes: Vec<ArgSlot>,
    pub cost: Cost,
}

/// Launches of one bucket in execution order, and the memory plan they index.
#[derive(Clone, Debug)]
pub struct LaunchPlan {
    pub bind: Bindings,
    pub memory: MemoryPlan,
    pub launches: Vec<Launch>,
}

fn slot(memory: &MemoryPlan, v: ValueId) -> ArgSlot {
    ArgSlot {
        value: v,
        home: memory
            .homes
            .get(&v)
            .cloned()
            .expect("memory plan gives every group input and output a home"),
    }
}

pub fn build(g: &Graph, groups: &[Group], bind: Bindings, memory: MemoryPlan) -> LaunchPlan {
    let launches = groups
        .iter()
        .enumerate()
        .map(|(i, gr)| Launch {
            group: GroupId(i as u32),
            family: gr.family(g),
            reads: gr.inputs.iter().map(|&v| slot(&memory, v)).collect(),
            writes: gr.outputs.iter().map(|&v| slot(&memory, v)).collect(),
            cost: group_cost(g, gr, &bind),
        })
        .collect();
    LaunchPlan {
        bind,
        memory,
        launches,
    }
}

impl LaunchPlan {
    pub fn total_cost(&self) -> Cost {
        self.launches.iter().fold(Cost::default(), |a, l| Cost {
            weight_bytes: a.weight_bytes + l.cost.weight_bytes,
            act_bytes: a.act_bytes + l.cost.act_bytes,
            flops: a.flops + l.cost.flops,
        })
    }

    pub fn report(&self, _g: &Graph, target: &Target) -> String {
        let mut s = String::new();
        let (bw, fl) = (target.bytes_per_s as f64, target.flops_per_s as f64);
        let b = |d| self.bind.get(d).unwrap_or(0);
        let _ = writeln!(
            s,
            "bucket B={} T={} Ctx={}: {} launches, arena {} bytes ({} without reuse)",
            b(specc_ir::BucketDim::B),
            b(specc_ir::BucketDim::T),
            b(specc_ir::BucketDim::Ctx),
            self.launches.len(),
            self.memory.arena_bytes,
            self.memory.unshared_bytes
        );
        let _ = writeln!(
            s,
            "  {:<5} {:<16} {:>14} {:>14} {:>14} {:>12}",
            "group", "family", "weight bytes", "act bytes", "flops", "roofline us"
        );
        for l in &self.launches {
            let _ = writeln!(
                s,
                "  g{:<4} {:<16} {:>14} {:>14} {:>14} {:>12.3}",
                l.group.0,
                l.family,
                l.cost.weight_bytes,
                l.cost.act_bytes,
                l.cost.flops,
                l.cost.roofline_us(bw, fl)
            );
        }
        let t = self.total_cost();
        let _ = writeln!(
            s,
            "  total: {} bytes, {} flops, roofline {:.3} us on {} ({:.2} TB/s)",
            t.bytes(),
            t.flops,
            t.roofline_us(bw, fl),
            target.device,
            bw / 1e12
        );
        s
    }
}
