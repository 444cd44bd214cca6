//! `specc bench`: specc's step graphs timed on the GPU against the HBM roofline, and with
//! `--compare` against a PyTorch model of the same shapes run in the same call.
//!
//! - [`figures`]: which graphs are timed (one; decode + verify + spec step; or the suite) and
//!   how they share sessions;
//! - `measure` (feature `cuda`): the timings on the device;
//! - [`reference`]: `bench/torch_reference.py` as a subprocess;
//! - [`table`]: the printed tables.

// Without CUDA only the argument checks run; the rest is used by the CUDA build and tests.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod figures;
#[cfg(feature = "cuda")]
mod measure;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod reference;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod table;

use std::path::PathBuf;

use anyhow::{bail, Result};
use specc_models::{Method, SpecConfig};

use super::engine::Source;
use figures::{Figure, Request};

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
    pub compare: bool,
    pub suite: bool,
    pub torch_modes: Option<String>,
}

/// What was checked before anything touches a device.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct Checked {
    spec: Option<SpecConfig>,
    plan: Vec<Figure>,
    /// Reference modes (empty without `--compare`).
    modes: Vec<String>,
}

fn check(a: &BenchArgs) -> Result<Checked> {
    if a.iters < 10 {
        bail!("--iters: expected at least 10, found {}", a.iters);
    }
    if a.batch == 0 {
        bail!("--batch: expected at least 1, found 0");
    }
    if a.tokens == Some(0) {
        bail!("--tokens: expected at least 1, found 0");
    }
    let modes = match (a.compare, &a.torch_modes) {
        (true, m) => reference::parse_modes(m.as_deref().unwrap_or(reference::DEFAULT_MODES))?,
        (false, _) => Vec::new(),
    };
    let spec = a.spec.as_deref().map(SpecConfig::from_file).transpose()?;
    let spec = spec.filter(|c| c.method != Method::None);
    let plan = figures::plan(&Request {
        batch: a.batch,
        context: a.context,
        tokens: a.tokens,
        spec: spec.is_some(),
        compare: a.compare,
        suite: a.suite,
    });
    Ok(Checked { spec, plan, modes })
}

#[cfg(not(feature = "cuda"))]
pub fn bench(a: BenchArgs) -> Result<()> {
    check(&a)?;
    let why = if a.compare {
        "; --compare measures specc's own figures on the GPU before running the PyTorch reference"
    } else {
        ""
    };
    bail!(
        "specc bench: this specc was built without CUDA support (rebuild with `cargo build --release --features cuda`){why}"
    )
}

#[cfg(feature = "cuda")]
pub fn bench(a: BenchArgs) -> Result<()> {
    let c = check(&a)?;
    let m = measure::measure(
        a.src.clone(),
        c.spec.as_ref(),
        &c.plan,
        a.iters,
        a.per_kernel,
    )?;
    let bw = m.figures.first().map_or(0.0, |f| f.timing.copy_bw);
    println!(
        "device: {}; copy bandwidth {:.2} TB/s (read + write)",
        m.device,
        bw / 1e12
    );
    let edges: Vec<String> = m
        .figures
        .iter()
        .map(|f| f.pdl_edges.map_or("?".into(), |n| n.to_string()))
        .collect();
    println!(
        "PDL (programmatic dependent launch): {}; programmatic edges per timed graph: {}",
        if m.pdl {
            "on (SPECC_PDL=1)"
        } else {
            "off (SPECC_PDL=1 turns it on)"
        },
        edges.join(", ")
    );
    let method = c
        .spec
        .as_ref()
        .map(|s| (s.method.name().to_string(), s.num_steps as usize));
    let method = method.as_ref().map(|(m, k)| (m.as_str(), *k));
    if !a.compare && !a.suite {
        return single(&a, &c.plan[0], &m, method);
    }
    let mut rows: Vec<table::Row> = c
        .plan
        .iter()
        .zip(&m.figures)
        .map(|(f, got)| table::Row {
            label: f.label(method),
            specc: got.timing.clone(),
            reference: None,
        })
        .collect();
    // specc's figures first, table and JSON, so they survive a reference that never ends.
    print!("{}", table::compare_table(&rows, &[]));
    print_per_kernel(&c.plan, &m, method);
    print_moe(&c.plan, &m, method);
    let write =
        |rows: &[table::Row], r: Option<&reference::Output>, e: Option<&anyhow::Error>| match &a
            .json
        {
            Some(path) => {
                let j = json_multi(&c.plan, rows, &m, method, r, e);
                std::fs::write(path, serde_json::to_string_pretty(&j)?).map_err(anyhow::Error::from)
            }
            None => Ok(()),
        };
    write(&rows, None, None)?;
    if !a.compare {
        return Ok(());
    }
    let (reference, err) = compare(&a, &c, &m, method, &mut rows);
    println!(
        "
specc vs the PyTorch reference (same shapes, same device):"
    );
    print!("{}", table::compare_table(&rows, &c.modes));
    if let Some(r) = &reference {
        println!(
            "reference: bench/torch_reference.py, torch {} on {}, random bf16 weights of the same config; median of {} CUDA-event-timed calls",
            r.torch, r.device, a.iters
        );
    }
    write(&rows, reference.as_ref(), err.as_ref())?;
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The one-figure report (and JSON record) `specc bench` prints without `--compare`/`--suite`.
#[cfg(feature = "cuda")]
fn single(
    a: &BenchArgs,
    f: &Figure,
    m: &measure::Measurement,
    method: Option<(&str, usize)>,
) -> Result<()> {
    let s = &m.figures[0].timing;
    let name = f.step_name(method);
    // A planted acceptance P knows its own mean: 1 + Σ_{i=1..k} P^i tokens per step.
    let planted = a.src.synthetic_acceptance.zip(method);
    let accept = a.accept_len.unwrap_or_else(|| {
        planted.map_or(1.0, |(p, (_, k))| {
            1.0 + specc_models::checkpoint::planted::expected_accepted(p, k)
        })
    });
    print!(
        "{}",
        table::single_table(&name, f.batch, f.context, s, accept)
    );
    print_per_kernel(std::slice::from_ref(f), m, method);
    print_moe(std::slice::from_ref(f), m, method);
    if let Some(path) = &a.json {
        let j = serde_json::json!({
            "device": m.device, "step": name, "batch": f.batch, "context": f.context,
            "pdl": m.pdl, "pdl_edges": m.figures[0].pdl_edges,
            "kernels": s.kernels, "median_ms": s.median_ms, "p10_ms": s.p10_ms,
            "p90_ms": s.p90_ms, "roofline_ms": s.roofline_ms(), "pct_roofline": s.pct_roofline(),
            "bytes": s.bytes(), "floor_bytes": s.floor.total(), "floor": floor_json(&s.floor),
            "plan_over_floor": s.plan_over_floor(), "copy_bw_bytes_per_s": s.copy_bw,
            "tok_s": accept * f.batch as f64 / (s.median_ms * 1e-3), "accept_len": accept,
            "moe_experts_per_layer": m.figures[0].moe_experts,
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(())
}

/// Per figure with MoE layers: the distinct experts each layer read in the last replay (the
/// grouped dispatch's count), beside the uniform-routing floor the roofline assumes.
#[cfg(feature = "cuda")]
fn print_moe(plan: &[Figure], m: &measure::Measurement, method: Option<(&str, usize)>) {
    for (f, got) in plan.iter().zip(&m.figures) {
        let e = &got.moe_experts;
        if e.is_empty() {
            continue;
        }
        let mean = e.iter().sum::<i64>() as f64 / e.len() as f64;
        let list: Vec<String> = e.iter().map(|n| n.to_string()).collect();
        println!(
            "{}: experts read per MoE layer (last replay): {} (mean {mean:.1}); the roofline counts the uniform-routing union",
            f.label(method),
            list.join(", ")
        );
    }
}

#[cfg(feature = "cuda")]
fn print_per_kernel(plan: &[Figure], m: &measure::Measurement, method: Option<(&str, usize)>) {
    for (f, got) in plan.iter().zip(&m.figures) {
        if let Some(rows) = &got.per_kernel {
            println!("\n## {}", f.label(method));
            print!("{}", table::per_kernel_table(rows, 25, got.timing.copy_bw));
        }
    }
}

/// Runs the reference and fills the rows' reference figures; on failure every row carries the
/// error (specc's figures are still reported) and it is returned too.
#[cfg(feature = "cuda")]
fn compare(
    a: &BenchArgs,
    c: &Checked,
    m: &measure::Measurement,
    method: Option<(&str, usize)>,
    rows: &mut [table::Row],
) -> (Option<reference::Output>, Option<anyhow::Error>) {
    let spec_method = c.spec.as_ref().map(|s| s.method);
    let args: Vec<Result<String, String>> = c
        .plan
        .iter()
        .map(|f| reference::figure_arg(f, spec_method))
        .collect();
    let needs_draft = c
        .plan
        .iter()
        .zip(&args)
        .any(|(f, r)| f.kind == figures::Kind::Spec && r.is_ok());
    let modes = c.modes.clone();
    let req = reference::Request {
        config: m.config.clone(),
        draft: if needs_draft { m.draft.clone() } else { None },
        k: method.map_or(0, |(_, k)| k),
        figures: args.iter().filter_map(|r| r.clone().ok()).collect(),
        modes: &modes,
        iters: a.iters,
    };
    let result = reference::script().and_then(|script| {
        let py = reference::python();
        let argv = reference::args(&req);
        eprintln!(
            "specc figures done; PyTorch reference: {py} {} {}",
            script.display(),
            argv.join(" ")
        );
        reference::run(&py, &script, &argv)
    });
    match result {
        Ok(out) => {
            let mut got = out.figures.iter();
            for (row, arg) in rows.iter_mut().zip(&args) {
                row.reference = Some(match arg {
                    Ok(_) => Ok(got.next().cloned().unwrap_or_default()),
                    Err(why) => Err(why.clone()),
                });
            }
            (Some(out), None)
        }
        Err(e) => {
            let why = format!("{e:#}");
            for row in rows.iter_mut() {
                row.reference = Some(Err(why.clone()));
            }
            (None, Some(e))
        }
    }
}

#[cfg(feature = "cuda")]
fn json_multi(
    plan: &[Figure],
    rows: &[table::Row],
    m: &measure::Measurement,
    method: Option<(&str, usize)>,
    reference: Option<&reference::Output>,
    err: Option<&anyhow::Error>,
) -> serde_json::Value {
    use serde_json::{json, Value};
    let figures: Vec<Value> = plan
        .iter()
        .zip(rows)
        .map(|(f, r)| {
            let s = &r.specc;
            let (refs, missing) = match &r.reference {
                Some(Ok(modes)) => {
                    let obj: serde_json::Map<String, Value> = modes
                        .iter()
                        .map(|mt| {
                            let v = match &mt.result {
                                Ok(ms) => json!({ "median_ms": ms }),
                                Err(why) => json!({ "skipped": why }),
                            };
                            (mt.mode.clone(), v)
                        })
                        .collect();
                    (Value::Object(obj), Value::Null)
                }
                Some(Err(why)) => (Value::Null, json!(why)),
                None => (Value::Null, Value::Null),
            };
            let best = r.best_reference();
            json!({
                "figure": f.label(method), "step": f.step_name(method), "batch": f.batch,
                "context": f.context, "tokens": f.tokens(),
                "specc": {
                    "median_ms": s.median_ms, "p10_ms": s.p10_ms, "p90_ms": s.p90_ms,
                    "kernels": s.kernels, "bytes": s.bytes(), "weight_bytes": s.weight_bytes,
                    "act_bytes": s.act_bytes, "floor_bytes": s.floor.total(),
                    "floor": floor_json(&s.floor), "plan_over_floor": s.plan_over_floor(),
                    "roofline_ms": s.roofline_ms(),
                    "pct_roofline": s.pct_roofline(), "copy_bw_bytes_per_s": s.copy_bw,
                },
                "reference": refs, "reference_missing": missing,
                "best_reference": best.map(|(mode, ms)| json!({ "mode": mode, "median_ms": ms })),
                "specc_over_best_reference": best.map(|(_, ms)| s.median_ms / ms),
            })
        })
        .collect();
    json!({
        "device": m.device,
        "figures": figures,
        "reference": reference.map(|r| r.json.clone()),
        "reference_error": err.map(|e| format!("{e:#}")),
    })
}

/// The physical floor's parts, for `--json`.
#[cfg(feature = "cuda")]
fn floor_json(f: &table::PhysicalBytes) -> serde_json::Value {
    serde_json::json!({
        "weights": f.weights, "kv_read": f.kv_read, "kv_written": f.kv_written, "io": f.io,
    })
}
