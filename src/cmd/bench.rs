//! `specc bench`: the step graph's time on the GPU against the HBM roofline.
//!
//! Method: the step is compiled and captured exactly as `run --backend cuda` does; every lane
//! is put at `--context` tokens (synthetic steady state: the KV cache is not prefilled, which
//! does not change the bytes a step reads); then `--iters` replays are timed one by one with
//! CUDA events after a warm-up, and the median is reported. Roofline = bytes the step must
//! move (the codegen cost model: every weight once, KV up to the context, activations) /
//! the device-to-device copy bandwidth measured in the same run.
//!
//! Kernels are launched with programmatic dependent launch when the device supports it;
//! `SPECC_PDL=0` turns it off for an A/B comparison (the report says which).

use std::path::PathBuf;

use anyhow::Result;

use super::engine::Source;

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub struct BenchArgs {
    pub tokens: Option<usize>,
    pub src: Source,
    pub spec: Option<PathBuf>,
    pub batch: usize,
    pub context: usize,
    pub iters: usize,
    pub per_kernel: bool,
    pub json: Option<PathBuf>,
    pub accept_len: Option<f64>,
}

#[cfg(not(feature = "cuda"))]
pub fn bench(_: BenchArgs) -> Result<()> {
    Err(super::gpu::unavailable())
}

#[cfg(feature = "cuda")]
pub fn bench(a: BenchArgs) -> Result<()> {
    use anyhow::bail;
    use specc_ir::Bindings;
    use specc_models::spec_step::{lower_decode_step, lower_target_prefill, StepShape};
    use specc_models::{Acceptance, Method, SpecBundle, SpecConfig};
    use specc_runtime::cuda::bench::{copy_bandwidth, median, time_launches, time_replays};
    use std::fmt::Write as _;

    use super::engine::resolve;
    use super::gpu;

    let cfg = a.spec.as_deref().map(SpecConfig::from_file).transpose()?;
    let cfg = cfg.filter(|c| c.method != Method::None);
    let k = cfg.as_ref().map_or(0, |c| c.num_steps as usize);
    let ctx = (a.context + k.max(a.tokens.unwrap_or(0)) + 16) as u64;
    let random = a.src.random_weights;
    let r = resolve(a.src, Some(ctx))?;
    if a.iters < 10 {
        bail!("--iters: expected at least 10, found {}", a.iters);
    }
    let shape = StepShape {
        num_steps: 0,
        ring: 64,
        acceptance: Acceptance::Greedy,
    };
    let seed = random.then_some(super::engine::RANDOM_SEED);
    let bundle = cfg
        .as_ref()
        .map(|c| SpecBundle::open_with(&r.model, c, seed))
        .transpose()?;
    let plain = (
        lower_target_prefill(r.model.spec(), &[])?,
        lower_decode_step(r.model.spec(), &shape)?,
    );
    let mut s = match &bundle {
        Some(b) => gpu::spec_session(&r.model, b, a.batch, ctx)?,
        None => gpu::decode_session(&r.model, &plain.0, &plain.1, a.batch, ctx, 64)?,
    };
    let (step_graph, t) = match (&bundle, a.tokens) {
        (_, Some(t)) => (plain.0.clone(), t),
        (Some(b), None) => (b.step.clone(), 1),
        (None, None) => (plain.1.clone(), 1),
    };
    // Bytes the step must move, from the same plan the kernels were generated from, with the
    // KV cache counted up to the context actually held.
    let held = a.context as u64 + k.max(t) as u64;
    let compiled =
        specc_codegen::compile(step_graph, &[Bindings::new(a.batch as u64, t as u64, held)])?;
    let cost = compiled.plans[0].total_cost();
    let bw = copy_bandwidth(&s.engine.dev, 1 << 30)?;
    let roofline_ms = cost.bytes() as f64 / bw * 1e3;
    let verify = match a.tokens {
        Some(t) => Some(s.verify_graph(t, a.context)?),
        None => {
            s.arm_synthetic(a.context)?;
            None
        }
    };
    let timed = match &verify {
        Some((_, g)) => g,
        None => &s.step_graph,
    };
    let mut times = time_replays(&s.engine.dev, timed, 10, a.iters)?;
    let med = median(&mut times) as f64;
    let (p10, p90) = (
        times[times.len() / 10] as f64,
        times[times.len() * 9 / 10] as f64,
    );
    // Without a measured acceptance length, report tokens per step = 1 (a lower bound).
    let accept = a.accept_len.unwrap_or(1.0);
    let tok_s = accept * a.batch as f64 / (med * 1e-3);
    let launches = match &verify {
        Some((l, _)) => l.launches.len(),
        None => s.step_plan().launches.len(),
    };
    let name = match (&cfg, a.tokens) {
        (_, Some(t)) => format!("target forward T={t}"),
        (Some(c), None) => format!("{:?} k={k}", c.method),
        (None, None) => "decode".into(),
    };
    let dev = s.engine.dev.info().name.clone();
    let pdl = s.engine.dev.pdl_enabled();
    let pdl_edges = timed.programmatic_edges();
    let mut t = String::new();
    let _ = writeln!(
        t,
        "device: {dev}; copy bandwidth {:.2} TB/s (read + write)",
        bw / 1e12
    );
    let _ = writeln!(
        t,
        "PDL (programmatic dependent launch): {}; {} programmatic edges in the step graph",
        if pdl {
            "on (SPECC_PDL=0 turns it off)"
        } else {
            "off"
        },
        pdl_edges.map_or("unknown".into(), |n| n.to_string())
    );
    let _ = writeln!(
        t,
        "| step | batch | context | kernels | median ms | p10 | p90 | roofline ms | % of roofline | tok/s @ accept {accept:.2} |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|");
    let _ = writeln!(
        t,
        "| {name} | {} | {} | {launches} | {med:.3} | {p10:.3} | {p90:.3} | {roofline_ms:.3} | {:.1} | {tok_s:.1} |",
        a.batch,
        a.context,
        100.0 * roofline_ms / med
    );
    let _ = writeln!(
        t,
        "bytes per step {} (weights {}, activations + KV {}); one cuGraphLaunch per step",
        cost.bytes(),
        cost.weight_bytes,
        cost.act_bytes
    );
    if a.per_kernel {
        let loaded = match &verify {
            Some((l, _)) => l,
            None => s.step_plan(),
        };
        let per = time_launches(&s.engine.dev, loaded, 20)?;
        let total: f32 = per.iter().sum();
        // Breakdown by part of the step, from the same single-launch timings.
        let mut parts: Vec<(&str, f32, usize)> = Vec::new();
        for (l, ms) in loaded.plan.launches.iter().zip(&per) {
            let name = l.phase.name();
            match parts.iter_mut().find(|p| p.0 == name) {
                Some(p) => {
                    p.1 += ms;
                    p.2 += 1;
                }
                None => parts.push((name, *ms, 1)),
            }
        }
        let _ = writeln!(
            t,
            "breakdown (sum of single-launch times; the graph overlaps launch gaps):"
        );
        for (name, ms, n) in &parts {
            let _ = writeln!(
                t,
                "  {name:<24} {n:>5} kernels {ms:>9.3} ms ({:.1} %)",
                100.0 * ms / total.max(1e-9)
            );
        }
        let _ = writeln!(
            t,
            "per kernel (each launched alone; includes launch latency): sum {total:.3} ms"
        );
        let _ = writeln!(t, "| # | kernel | grid | block | ms |");
        let _ = writeln!(t, "|---|---|---|---|---|");
        let mut rows: Vec<(usize, f32)> = per.iter().copied().enumerate().collect();
        rows.sort_by(|x, y| y.1.total_cmp(&x.1));
        for (i, ms) in rows.into_iter().take(25) {
            let l = &loaded.launches[i];
            let _ = writeln!(
                t,
                "| {i} | {} | {:?} | {:?} | {ms:.4} |",
                l.name(),
                l.grid(),
                l.block()
            );
        }
    }
    print!("{t}");
    if let Some(path) = a.json {
        let j = serde_json::json!({
            "device": dev, "step": name, "batch": a.batch, "context": a.context,
            "kernels": launches, "pdl": pdl, "pdl_edges": pdl_edges, "median_ms": med, "p10_ms": p10, "p90_ms": p90,
            "roofline_ms": roofline_ms, "pct_roofline": 100.0 * roofline_ms / med,
            "bytes": cost.bytes(), "copy_bw_bytes_per_s": bw, "tok_s": tok_s, "accept_len": accept,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(())
}
