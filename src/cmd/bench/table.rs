//! Tables of `specc bench`: pure formatting of measured numbers (no device), so the layout is
//! tested with made-up figures.

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub use specc_ir::engine::PhysicalBytes;

/// specc's measurement of one timed graph.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeccTiming {
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    /// Launches in the captured graph.
    pub kernels: usize,
    /// Bytes the plan moves (codegen cost model), split into weights and the rest.
    pub weight_bytes: u64,
    pub act_bytes: u64,
    /// Bytes any implementation of the step must move at the live context (the physical
    /// floor: weights at their stored bytes, the live KV once, the KV rows written, the
    /// step's inputs and outputs).
    pub floor: PhysicalBytes,
    /// Device-to-device copy bandwidth measured in the same session, bytes/s.
    pub copy_bw: f64,
}

impl SpeccTiming {
    /// Bytes the plan moves.
    pub fn bytes(&self) -> u64 {
        self.weight_bytes + self.act_bytes
    }

    /// The physical roofline: the floor's bytes at the copy bandwidth.
    pub fn roofline_ms(&self) -> f64 {
        self.floor.total() as f64 / self.copy_bw * 1e3
    }

    /// The plan's bytes over the floor's (1: the plan moves nothing it need not).
    pub fn plan_over_floor(&self) -> f64 {
        self.bytes() as f64 / self.floor.total().max(1) as f64
    }

    pub fn pct_roofline(&self) -> f64 {
        100.0 * self.roofline_ms() / self.median_ms
    }
}

/// One reference mode of one figure: its median milliseconds, or why it did not run.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeTiming {
    pub mode: String,
    pub result: Result<f64, String>,
}

/// One figure of a multi-figure table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub label: String,
    pub specc: SpeccTiming,
    /// `None` without `--compare`; `Some(Err(why))` when this figure has no reference figures.
    pub reference: Option<Result<Vec<ModeTiming>, String>>,
}

impl Row {
    /// The fastest reference mode that ran, `(mode, ms)`.
    pub fn best_reference(&self) -> Option<(&str, f64)> {
        let modes = self.reference.as_ref()?.as_ref().ok()?;
        modes
            .iter()
            .filter_map(|m| m.result.as_ref().ok().map(|&ms| (m.mode.as_str(), ms)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// Column title of a reference mode of `bench/torch_reference.py`.
pub fn mode_title(mode: &str) -> &str {
    match mode {
        "eager" => "torch eager",
        "graph" => "eager+graph",
        "compile" => "torch.compile",
        "compile-layers" => "compile (layers)+graph",
        other => other,
    }
}

/// Footnotes numbered in order of first use; the same text gets the same number.
#[derive(Default)]
struct Notes(Vec<String>);

impl Notes {
    fn mark(&mut self, text: &str) -> usize {
        match self.0.iter().position(|n| n == text) {
            Some(i) => i + 1,
            None => {
                self.0.push(text.to_string());
                self.0.len()
            }
        }
    }
}

/// The table of several figures: specc, then one column per reference mode (none without
/// `--compare`), the physical roofline, specc's % of it, the plan's bytes over the floor's,
/// and specc's time over the best reference's (below 1: specc is faster).
pub fn compare_table(rows: &[Row], modes: &[String]) -> String {
    let mut t = String::new();
    let mut notes = Notes::default();
    let mut head = vec!["figure".to_string(), "specc ms".into()];
    head.extend(modes.iter().map(|m| format!("{} ms", mode_title(m))));
    head.extend([
        "roofline ms".into(),
        "% of roofline".into(),
        "plan bytes / floor".into(),
    ]);
    if !modes.is_empty() {
        head.push("specc / best reference".into());
    }
    let _ = writeln!(t, "| {} |", head.join(" | "));
    let _ = writeln!(t, "|{}", "---|".repeat(head.len()));
    for r in rows {
        let s = &r.specc;
        let mut cells = vec![r.label.clone(), format!("{:.3}", s.median_ms)];
        match &r.reference {
            None => {}
            Some(Ok(got)) => {
                for m in modes {
                    cells.push(match got.iter().find(|g| g.mode == *m).map(|g| &g.result) {
                        Some(Ok(ms)) => format!("{ms:.3}"),
                        Some(Err(why)) => format!("skipped [{}]", notes.mark(why)),
                        None => "—".into(),
                    });
                }
            }
            Some(Err(why)) => {
                let n = notes.mark(why);
                cells.extend(modes.iter().map(|_| format!("n/a [{n}]")));
            }
        }
        cells.push(format!("{:.3}", s.roofline_ms()));
        cells.push(format!("{:.1}", s.pct_roofline()));
        cells.push(format!("{:.2}", s.plan_over_floor()));
        if !modes.is_empty() {
            cells.push(match r.best_reference() {
                Some((_, best)) => format!("{:.2}", s.median_ms / best),
                None => "—".into(),
            });
        }
        let _ = writeln!(t, "| {} |", cells.join(" | "));
    }
    for (i, n) in notes.0.iter().enumerate() {
        let _ = writeln!(t, "[{}] {n}", i + 1);
    }
    t
}

/// The one-figure table `specc bench` prints without `--compare` / `--suite`.
pub fn single_table(
    step: &str,
    batch: usize,
    context: usize,
    s: &SpeccTiming,
    accept: f64,
) -> String {
    let mut t = String::new();
    let tok_s = accept * batch as f64 / (s.median_ms * 1e-3);
    let _ = writeln!(
        t,
        "| step | batch | context | kernels | median ms | p10 | p90 | roofline ms | % of roofline | plan bytes / floor | tok/s @ accept {accept:.2} |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|---|");
    let _ = writeln!(
        t,
        "| {step} | {batch} | {context} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} | {:.2} | {tok_s:.1} |",
        s.kernels,
        s.median_ms,
        s.p10_ms,
        s.p90_ms,
        s.roofline_ms(),
        s.pct_roofline(),
        s.plan_over_floor()
    );
    let f = &s.floor;
    let _ = writeln!(
        t,
        "physical floor per step {} (weights {}, KV read {}, KV written {}, in/out {}); the plan moves {} (weights {}, activations + KV {}); one cuGraphLaunch per step",
        f.total(),
        f.weights,
        f.kv_read,
        f.kv_written,
        f.io,
        s.bytes(),
        s.weight_bytes,
        s.act_bytes
    );
    t
}

/// One fused group of the step (one or more launches) timed launch by launch.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelRow {
    /// Group index in schedule order.
    pub group: usize,
    pub family: String,
    pub phase: &'static str,
    /// Names of its launches, in order.
    pub kernels: Vec<String>,
    /// Bytes the cost model gives the group (`None` when the plans disagree on groups).
    pub bytes: Option<u64>,
    /// Sum of the median single-launch times of its launches.
    pub ms: f64,
}

/// `12.34 MB` style, decimal units.
pub fn human_bytes(b: u64) -> String {
    let b = b as f64;
    for (unit, scale) in [("GB", 1e9), ("MB", 1e6), ("kB", 1e3)] {
        if b >= scale {
            return format!("{:.2} {unit}", b / scale);
        }
    }
    format!("{b} B")
}

fn gbps(bytes: Option<u64>, ms: f64) -> String {
    match bytes {
        Some(b) if ms > 0.0 => format!("{:.0}", b as f64 / (ms * 1e-3) / 1e9),
        _ => "—".into(),
    }
}

#[derive(Default)]
struct Sum {
    groups: usize,
    launches: usize,
    bytes: Option<u64>,
    ms: f64,
}

fn add(s: &mut Sum, r: &KernelRow) {
    s.groups += 1;
    s.launches += r.kernels.len();
    s.bytes = match (s.groups, s.bytes, r.bytes) {
        (1, _, b) => b,
        (_, Some(a), Some(b)) => Some(a + b),
        _ => None,
    };
    s.ms += r.ms;
}

fn summary(t: &mut String, title: &str, sums: &[(String, Sum)], total_ms: f64) {
    let _ = writeln!(
        t,
        "| {title} | groups | launches | bytes | ms | % of time | GB/s |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---|");
    for (name, s) in sums {
        let _ = writeln!(
            t,
            "| {name} | {} | {} | {} | {:.3} | {:.1} | {} |",
            s.groups,
            s.launches,
            s.bytes.map_or("—".into(), human_bytes),
            s.ms,
            100.0 * s.ms / total_ms.max(1e-12),
            gbps(s.bytes, s.ms)
        );
    }
}

/// Per-kernel report: totals, the breakdown by phase (draft / target / bookkeeping) and by
/// kernel family, then the `top` slowest groups with bytes, time and achieved bandwidth.
pub fn per_kernel_table(rows: &[KernelRow], top: usize, copy_bw: f64) -> String {
    let mut t = String::new();
    let mut total = Sum::default();
    let mut phases: Vec<(String, Sum)> = Vec::new();
    let mut families: BTreeMap<String, Sum> = BTreeMap::new();
    for r in rows {
        add(&mut total, r);
        match phases.iter_mut().find(|p| p.0 == r.phase) {
            Some(p) => add(&mut p.1, r),
            None => {
                let mut s = Sum::default();
                add(&mut s, r);
                phases.push((r.phase.to_string(), s));
            }
        }
        add(families.entry(r.family.clone()).or_default(), r);
    }
    let _ = writeln!(
        t,
        "per kernel: each launch timed alone (median of 20), so each includes its launch latency \
         (~3-5 us); the graph overlaps those gaps. {} launches in {} groups, sum {:.3} ms, {} \
         ({} GB/s; copy bandwidth {:.0} GB/s)",
        total.launches,
        total.groups,
        total.ms,
        total.bytes.map_or("—".into(), human_bytes),
        gbps(total.bytes, total.ms),
        copy_bw / 1e9
    );
    summary(&mut t, "phase", &phases, total.ms);
    let mut fams: Vec<(String, Sum)> = families.into_iter().collect();
    fams.sort_by(|a, b| b.1.ms.total_cmp(&a.1.ms));
    summary(&mut t, "family", &fams, total.ms);
    let _ = writeln!(
        t,
        "| group | family | phase | kernel | launches | bytes | ms | GB/s | % of copy bw |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|");
    let mut order: Vec<&KernelRow> = rows.iter().collect();
    order.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    for r in order.iter().take(top) {
        let pct = match r.bytes {
            Some(b) if r.ms > 0.0 => {
                format!("{:.0}", 100.0 * b as f64 / (r.ms * 1e-3) / copy_bw)
            }
            _ => "—".into(),
        };
        let name = match r.kernels.len() {
            0 => String::new(),
            1 => r.kernels[0].clone(),
            n => format!("{} (+{})", r.kernels[0], n - 1),
        };
        let _ = writeln!(
            t,
            "| g{} | {} | {} | {name} | {} | {} | {:.4} | {} | {pct} |",
            r.group,
            r.family,
            r.phase,
            r.kernels.len(),
            r.bytes.map_or("—".into(), human_bytes),
            r.ms,
            gbps(r.bytes, r.ms)
        );
    }
    if order.len() > top {
        let rest: f64 = order[top..].iter().map(|r| r.ms).sum();
        let _ = writeln!(
            t,
            "({} more groups, {rest:.3} ms together)",
            order.len() - top
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(median_ms: f64, bytes: u64) -> SpeccTiming {
        SpeccTiming {
            median_ms,
            p10_ms: median_ms * 0.99,
            p90_ms: median_ms * 1.01,
            kernels: 275,
            weight_bytes: bytes - 420_000_000,
            act_bytes: 420_000_000,
            floor: PhysicalBytes {
                weights: bytes - 420_000_000,
                kv_read: 134_217_728,
                kv_written: 131_072,
                io: 1_000_000,
            },
            copy_bw: 4.2e12,
        }
    }

    fn modes(v: &[(&str, Result<f64, &str>)]) -> Vec<ModeTiming> {
        v.iter()
            .map(|(m, r)| ModeTiming {
                mode: m.to_string(),
                result: r.map_err(str::to_string),
            })
            .collect()
    }

    #[test]
    fn compare_table_layout() {
        let all: Vec<String> = ["eager", "graph", "compile"].map(String::from).to_vec();
        let rows = vec![
            Row {
                label: "decode B=1 ctx=1024".into(),
                specc: timing(5.482, 15_420_000_000),
                reference: Some(Ok(modes(&[
                    ("eager", Ok(31.2)),
                    ("graph", Ok(8.43)),
                    ("compile", Ok(5.30)),
                ]))),
            },
            Row {
                label: "verify T=8 B=1 ctx=1024".into(),
                specc: timing(10.335, 15_470_000_000),
                reference: Some(Ok(modes(&[
                    ("eager", Ok(35.0)),
                    ("graph", Ok(9.56)),
                    ("compile", Err("BackendCompilerFailed: inductor")),
                ]))),
            },
            Row {
                label: "Eagle3 k=7 B=1 ctx=1024".into(),
                specc: timing(9.1, 16_100_000_000),
                reference: Some(Err("no PyTorch reference for method Eagle3".into())),
            },
        ];
        insta::assert_snapshot!(compare_table(&rows, &all), @r"
        | figure | specc ms | torch eager ms | eager+graph ms | torch.compile ms | roofline ms | % of roofline | plan bytes / floor | specc / best reference |
        |---|---|---|---|---|---|---|---|---|
        | decode B=1 ctx=1024 | 5.482 | 31.200 | 8.430 | 5.300 | 3.604 | 65.7 | 1.02 | 1.03 |
        | verify T=8 B=1 ctx=1024 | 10.335 | 35.000 | 9.560 | skipped [1] | 3.616 | 35.0 | 1.02 | 1.08 |
        | Eagle3 k=7 B=1 ctx=1024 | 9.100 | n/a [2] | n/a [2] | n/a [2] | 3.766 | 41.4 | 1.02 | — |
        [1] BackendCompilerFailed: inductor
        [2] no PyTorch reference for method Eagle3
        ");
        assert_eq!(rows[0].best_reference(), Some(("compile", 5.30)));
    }

    #[test]
    fn table_without_reference_has_no_reference_columns() {
        let rows = vec![Row {
            label: "decode B=8 ctx=1024".into(),
            specc: timing(6.0, 15_500_000_000),
            reference: None,
        }];
        insta::assert_snapshot!(compare_table(&rows, &[]), @r"
        | figure | specc ms | roofline ms | % of roofline | plan bytes / floor |
        |---|---|---|---|---|
        | decode B=8 ctx=1024 | 6.000 | 3.623 | 60.4 | 1.02 |
        ");
    }

    #[test]
    fn single_table_layout() {
        insta::assert_snapshot!(single_table("decode", 1, 1024, &timing(5.482, 15_420_000_000), 1.0), @r"
        | step | batch | context | kernels | median ms | p10 | p90 | roofline ms | % of roofline | plan bytes / floor | tok/s @ accept 1.00 |
        |---|---|---|---|---|---|---|---|---|---|---|
        | decode | 1 | 1024 | 275 | 5.482 | 5.427 | 5.537 | 3.604 | 65.7 | 1.02 | 182.4 |
        physical floor per step 15135348800 (weights 15000000000, KV read 134217728, KV written 131072, in/out 1000000); the plan moves 15420000000 (weights 15000000000, activations + KV 420000000); one cuGraphLaunch per step
        ");
    }

    #[test]
    fn per_kernel_groups_by_phase_and_family() {
        let row = |group, family: &str, phase, n: usize, bytes, ms| KernelRow {
            group,
            family: family.into(),
            phase,
            kernels: (0..n).map(|i| format!("{family}_bf16_{i:08x}")).collect(),
            bytes,
            ms,
        };
        let rows = vec![
            row(
                0,
                "embedding",
                "accept + commit + emit",
                1,
                Some(16_384),
                0.003,
            ),
            row(
                1,
                "gemv_silu_mul",
                "verify (target)",
                1,
                Some(235_000_000),
                0.087,
            ),
            row(2, "attention", "verify (target)", 2, Some(4_200_000), 0.010),
            row(3, "gemv_silu_mul", "draft", 1, Some(33_000_000), 0.015),
            row(
                4,
                "gemv_lm_head",
                "verify (target)",
                2,
                Some(1_050_000_000),
                0.251,
            ),
        ];
        insta::assert_snapshot!(per_kernel_table(&rows, 3, 4.2e12), @r"
        per kernel: each launch timed alone (median of 20), so each includes its launch latency (~3-5 us); the graph overlaps those gaps. 7 launches in 5 groups, sum 0.366 ms, 1.32 GB (3613 GB/s; copy bandwidth 4200 GB/s)
        | phase | groups | launches | bytes | ms | % of time | GB/s |
        |---|---|---|---|---|---|---|
        | accept + commit + emit | 1 | 1 | 16.38 kB | 0.003 | 0.8 | 5 |
        | verify (target) | 3 | 5 | 1.29 GB | 0.348 | 95.1 | 3705 |
        | draft | 1 | 1 | 33.00 MB | 0.015 | 4.1 | 2200 |
        | family | groups | launches | bytes | ms | % of time | GB/s |
        |---|---|---|---|---|---|---|
        | gemv_lm_head | 1 | 2 | 1.05 GB | 0.251 | 68.6 | 4183 |
        | gemv_silu_mul | 2 | 2 | 268.00 MB | 0.102 | 27.9 | 2627 |
        | attention | 1 | 2 | 4.20 MB | 0.010 | 2.7 | 420 |
        | embedding | 1 | 1 | 16.38 kB | 0.003 | 0.8 | 5 |
        | group | family | phase | kernel | launches | bytes | ms | GB/s | % of copy bw |
        |---|---|---|---|---|---|---|---|---|
        | g4 | gemv_lm_head | verify (target) | gemv_lm_head_bf16_00000000 (+1) | 2 | 1.05 GB | 0.2510 | 4183 | 100 |
        | g1 | gemv_silu_mul | verify (target) | gemv_silu_mul_bf16_00000000 | 1 | 235.00 MB | 0.0870 | 2701 | 64 |
        | g3 | gemv_silu_mul | draft | gemv_silu_mul_bf16_00000000 | 1 | 33.00 MB | 0.0150 | 2200 | 52 |
        (2 more groups, 0.013 ms together)
        ");
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(15_009_849_344), "15.01 GB");
    }
}
