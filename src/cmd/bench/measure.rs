//! specc's measurements on the GPU: one session per (kind, batch, context), every figure of
//! that session timed on it, the model (and its random weights) built once for all.
//!
//! Method per figure: the graph is captured as `run --backend cuda` does; every lane is put
//! at the figure's context (synthetic steady state: the KV cache is not prefilled, which does
//! not change the bytes a step reads); then `iters` replays are timed one by one with CUDA
//! events after 10 warm-ups, and the median is reported. Roofline = bytes the graph must move
//! (the codegen cost model: every weight once, KV up to the context, activations) / the
//! device-to-device copy bandwidth measured in the same session.

use std::path::PathBuf;

use anyhow::Result;
use specc_ir::engine::GraphRole;
use specc_ir::{Bindings, Graph};
use specc_models::spec_bundle::EngineExtras;
use specc_models::SpecConfig;
use specc_runtime::cuda::bench::{copy_bandwidth, median, time_launches, time_replays};
use specc_runtime::cuda::{CudaSpecSession, LoadedGraph};
use specc_runtime::EngineGraphs;

use super::figures::{sessions, Figure, Kind, SessionKind};
use super::table::{KernelRow, SpeccTiming};
use crate::cmd::engine::{build_for, target_for, Source, Want};

/// Single-launch timings per kernel are medians of this many launches.
const LAUNCH_REPS: usize = 20;
const WARMUP: usize = 10;

pub struct Measured {
    pub timing: SpeccTiming,
    /// Programmatic (PDL) edges in the timed graph, where the driver reports them.
    pub pdl_edges: Option<usize>,
    pub per_kernel: Option<Vec<KernelRow>>,
    /// Distinct experts each MoE layer's tokens selected in the last replay (empty without
    /// MoE layers; 0 for a layer on the per-token kernel).
    pub moe_experts: Vec<i64>,
}

pub struct Measurement {
    pub device: String,
    /// Whether launches used programmatic dependent launch (off unless `SPECC_PDL=1`).
    pub pdl: bool,
    /// The target's config.json (what the PyTorch reference reads).
    pub config: PathBuf,
    /// The draft's directory of a draft_model spec.
    pub draft: Option<PathBuf>,
    /// One per figure of the plan, in plan order.
    pub figures: Vec<Measured>,
}

/// Measures every figure of `plan`.
pub fn measure(
    src: Source,
    spec: Option<&SpecConfig>,
    plan: &[Figure],
    iters: usize,
    per_kernel: bool,
) -> Result<Measurement> {
    // Fail on a missing driver or GPU before synthesising gigabytes of random weights.
    let target = target_for(true)?;
    // Slots one step writes past the context: k for chains and blocks, the tree budget for trees.
    let k = spec.map_or(0, |c| c.verify_margin());
    let groups = sessions(plan);
    let config = match &src.path {
        Some(p) if p.is_file() => p.clone(),
        Some(p) => p.join("config.json"),
        None => crate::embedded::default_model_dir()?.join("config.json"),
    };
    let mut out: Vec<Option<Measured>> = plan.iter().map(|_| None).collect();
    let mut device = String::new();
    let mut pdl = false;
    for group in &groups {
        let ctx = group.max_context(plan, k);
        let speculative = group.kind == SessionKind::Spec && spec.is_some();
        let verify_tokens = group
            .figures
            .iter()
            .filter_map(|&i| match plan[i].kind {
                Kind::Verify(t) => Some(t as u32),
                _ => None,
            })
            .collect();
        // One engine per session: its batch, its context, its verify widths.
        let r = build_for(
            src.clone(),
            Want {
                spec: spec.filter(|_| speculative),
                max_context: Some(ctx),
                target: target.clone(),
                extras: EngineExtras {
                    batch_buckets: Some(vec![group.batch as u32]),
                    verify_tokens,
                    smallest_chunk_only: true,
                    ..EngineExtras::default()
                },
                // The device's own check runs when the session allocates.
                fit: None,
            },
        )?;
        let graphs = EngineGraphs::parse(&r.engine)?;
        let contract = r.engine.contract(speculative).clone();
        let sources = r.weight_sources();
        let mut s = CudaSpecSession::new(&r.engine, speculative, &sources, group.batch)?;
        let bw = copy_bandwidth(&s.engine.dev, 1 << 30)?;
        device = s.engine.dev.info().name.clone();
        pdl = s.engine.dev.pdl_enabled();
        let session_k = if speculative { k } else { 0 };
        for &i in &group.figures {
            let f = plan[i];
            let graph = match f.kind {
                // A verify computes every row's logits: the all-row forward.
                Kind::Verify(_) => graphs.get(GraphRole::Logits)?,
                Kind::Decode | Kind::Spec => graphs.get(contract.step)?,
            };
            let one = Figure1 {
                f,
                graph,
                held: f.context + session_k.max(f.tokens()),
                bw,
                iters,
                per_kernel,
            };
            out[i] = Some(one.measure(&mut s)?);
        }
    }
    Ok(Measurement {
        device,
        pdl,
        config,
        draft: spec.and_then(|c| c.draft.clone()),
        figures: out.into_iter().flatten().collect(),
    })
}

/// One figure on its session.
struct Figure1<'g> {
    f: Figure,
    /// The graph timed (for the byte counts).
    graph: &'g Graph,
    /// Tokens in each sequence's KV cache when the graph has run.
    held: usize,
    bw: f64,
    iters: usize,
    per_kernel: bool,
}

impl Figure1<'_> {
    fn measure(&self, s: &mut CudaSpecSession) -> Result<Measured> {
        let f = self.f;
        let t = f.tokens();
        let bind = Bindings::new(f.batch as u64, t as u64, self.held as u64);
        let compiled = specc_codegen::compile(self.graph.clone(), std::slice::from_ref(&bind))?;
        let plan = &compiled.plans[0];
        let cost = plan.total_cost();
        let verify = match f.kind {
            Kind::Verify(t) => Some(s.verify_graph(t, f.context)?),
            Kind::Decode | Kind::Spec => {
                s.arm_synthetic(f.context)?;
                None
            }
        };
        let (loaded, timed) = match &verify {
            Some((l, g)) => (l, g),
            None => (s.step_plan(), &s.step_graph),
        };
        let mut times = time_replays(&s.engine.dev, timed, WARMUP, self.iters)?;
        let med = median(&mut times) as f64;
        let timing = SpeccTiming {
            median_ms: med,
            p10_ms: times[times.len() / 10] as f64,
            p90_ms: times[times.len() * 9 / 10] as f64,
            kernels: loaded.launches.len(),
            weight_bytes: cost.weight_bytes,
            act_bytes: cost.act_bytes,
            floor: specc_codegen::physical_bytes(&compiled.graph, &bind, f.context as u64),
            copy_bw: self.bw,
        };
        let per_kernel = if self.per_kernel {
            let per = time_launches(&s.engine.dev, loaded, LAUNCH_REPS)?;
            Some(kernel_rows(loaded, &per, plan))
        } else {
            None
        };
        let a = &loaded.plan.arena;
        let moe_experts = loaded
            .arena
            .read(a.moe_stats_offset, 4 * a.moe_stats_count)?
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect();
        Ok(Measured {
            timing,
            pdl_edges: timed.programmatic_edges(),
            per_kernel,
            moe_experts,
        })
    }
}

/// Single-launch times grouped by fused group, with the group's family and bytes from the
/// cost model (compiled at the held context, so KV bytes are the live ones). The loaded plan
/// and `cost_plan` come from the same graph, so group `g` is `cost_plan.launches[g]`; if the
/// counts disagree the bytes are left out rather than misattributed.
fn kernel_rows(
    loaded: &LoadedGraph,
    per: &[f32],
    cost_plan: &specc_codegen::LaunchPlan,
) -> Vec<KernelRow> {
    let groups = loaded.plan.groups.len();
    let costs = (groups == cost_plan.launches.len()).then_some(&cost_plan.launches);
    let mut rows: Vec<KernelRow> = Vec::new();
    for ((pl, l), ms) in loaded.plan.launches.iter().zip(&loaded.launches).zip(per) {
        let group = pl.group as usize;
        if let Some(r) = rows.iter_mut().find(|r| r.group == group) {
            r.kernels.push(l.name().to_string());
            r.ms += *ms as f64;
            continue;
        }
        let cost = costs.map(|c| &c[group]);
        rows.push(KernelRow {
            group,
            family: cost.map_or_else(|| l.name().to_string(), |c| c.family.to_string()),
            phase: pl.phase.name(),
            kernels: vec![l.name().to_string()],
            bytes: cost.map(|c| c.cost.bytes()),
            ms: *ms as f64,
        });
    }
    rows
}
