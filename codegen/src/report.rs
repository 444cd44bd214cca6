//! The plan report of an engine: what `plan.txt` holds and `specc inspect` prints. Every
//! figure comes from the [`Engine`] itself (and the roofline ceilings of its [`Target`]),
//! so a report of an engine read back from disk equals the one written beside it.
//!
//! [`Target`]: specc_ir::engine::Target

use std::fmt::Write;

use specc_ir::engine::{BucketPlan, Engine, Phase, StepContract};
use specc_kernels_gen::KernelSource;

use crate::cost::Cost;

/// A text table: `|`-separated, every column padded to its widest cell; numeric columns
/// (`right[i]`) right-aligned.
struct Table {
    head: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(cols: &[(&'static str, bool)]) -> Table {
        Table {
            head: cols.iter().map(|c| c.0).collect(),
            right: cols.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.head.len());
        self.rows.push(cells);
    }

    fn render(&self, s: &mut String) {
        let mut w: Vec<usize> = self.head.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |s: &mut String, cells: &[String]| {
            s.push('|');
            for (i, c) in cells.iter().enumerate() {
                let pad = w[i] - c.chars().count();
                let (l, r) = if self.right[i] { (pad, 0) } else { (0, pad) };
                let _ = write!(s, " {}{c}{} |", " ".repeat(l), " ".repeat(r));
            }
            s.push('\n');
        };
        let head: Vec<String> = self.head.iter().map(|h| h.to_string()).collect();
        line(s, &head);
        s.push('|');
        for (i, &n) in w.iter().enumerate() {
            let dashes = "-".repeat(n);
            if self.right[i] {
                let _ = write!(s, "-{dashes}:|");
            } else {
                let _ = write!(s, "-{dashes}-|");
            }
        }
        s.push('\n');
        for r in &self.rows {
            line(s, r);
        }
    }
}

/// The phase in a word (`Phase::name` speaks of a speculative step's parts).
fn phase(p: Phase) -> &'static str {
    match p {
        Phase::Draft => "draft",
        Phase::Target => "target",
        Phase::Bookkeeping => "bookkeeping",
    }
}

fn dims(d: [u32; 3]) -> String {
    format!("{}x{}x{}", d[0], d[1], d[2])
}

fn method_line(s: &mut String, kind: &str, c: &StepContract) {
    let roles: Vec<String> = c.roles().iter().map(|r| r.to_string()).collect();
    let _ = writeln!(
        s,
        "  {kind:<12} {} (method {}, {} cache slots past a lane per step, ring {}): {}",
        c.label,
        c.method,
        c.num_steps,
        c.ring,
        roles.join(", ")
    );
}

/// The header (what the engine is for), every bucket plan with exactly the launches that run,
/// the kernels with their ptxas figures, and the modules with their cubins. With `sources`
/// (a fresh build's, in [`Engine::kernels`] order) each kernel also names its `.cu` file.
pub fn plan_report(engine: &Engine, sources: Option<&[KernelSource]>) -> String {
    let mut s = String::new();
    let t = &engine.target;
    let (bw, fl) = (t.bytes_per_s as f64, t.flops_per_s as f64);
    let _ = writeln!(s, "specc {} engine", engine.specc_version);
    let _ = writeln!(s, "architecture: {}", engine.architecture);
    let archs: Vec<&str> = t.archs.iter().map(|a| a.name()).collect();
    let _ = writeln!(
        s,
        "target: {} ({}): {} SMs, {} bytes shared memory per block, roofline {:.2} TB/s, {:.0} TFLOP/s",
        if archs.is_empty() {
            "no GPU archs (graphs only)".to_string()
        } else {
            archs.join(", ")
        },
        t.device,
        t.sms,
        t.smem_per_block,
        bw / 1e12,
        fl / 1e12
    );
    let _ = writeln!(s, "max context: {}", engine.max_context);
    let _ = writeln!(s, "methods:");
    method_line(&mut s, "plain", &engine.plain);
    if let Some(c) = &engine.spec {
        method_line(&mut s, "speculative", c);
    }
    let _ = writeln!(s, "checkpoints:");
    for c in &engine.checkpoints {
        let prefix = if c.prefix.is_empty() {
            "target".to_string()
        } else {
            format!("`{}`", c.prefix)
        };
        let _ = write!(
            s,
            "  {prefix:<12} {}: {} files, {} tensors",
            c.dir.display(),
            c.files.len(),
            c.tensors.len()
        );
        if let Some(cfg) = &c.config {
            let _ = write!(s, " (random weights from {})", cfg.display());
        }
        s.push('\n');
    }
    if let Some(seed) = engine.random_seed {
        let _ = writeln!(s, "random weights: seed {seed:#x}");
        if let Some(p) = engine.synthetic_acceptance {
            let _ = writeln!(s, "synthetic acceptance: {p}");
        }
    }
    if !engine.states.is_empty() {
        let total: u64 = engine.states.iter().map(|st| st.bytes).sum();
        let _ = writeln!(s, "states: {} buffers, {total} bytes", engine.states.len());
    }
    let launches: usize = engine.plans.iter().map(|p| p.launches.len()).sum();
    let _ = writeln!(
        s,
        "{} graphs, {} bucket plans, {launches} launches, {} kernels, {} modules, {} cubins",
        engine.graphs.len(),
        engine.plans.len(),
        engine.kernels.len(),
        engine.modules.len(),
        engine.modules.iter().map(|m| m.cubins.len()).sum::<usize>()
    );
    if let Some(why) = &engine.uncompiled {
        let _ = writeln!(s, "no cubins: {why} (runs on the CPU backend only)");
    }
    for p in &engine.plans {
        s.push('\n');
        plan_section(&mut s, engine, p, bw, fl);
    }
    s.push('\n');
    kernel_section(&mut s, engine, sources);
    s.push('\n');
    let _ = writeln!(s, "modules ({}):", engine.modules.len());
    for (i, m) in engine.modules.iter().enumerate() {
        let n = engine
            .kernels
            .iter()
            .filter(|k| k.module as usize == i)
            .count();
        let _ = writeln!(s, "  {}: {n} kernels", m.name);
        for c in &m.cubins {
            let _ = writeln!(
                s,
                "    {} {} ({} bytes, sha256 {})",
                c.arch, c.file, c.bytes, c.sha256
            );
        }
        if m.cubins.is_empty() {
            let _ = writeln!(s, "    no cubins");
        }
    }
    s
}

/// One bucket plan: its header lines and one row per launch.
fn plan_section(s: &mut String, engine: &Engine, p: &BucketPlan, bw: f64, fl: f64) {
    let bk = &p.bucket;
    let _ = writeln!(s, "== {} B={} T={} Ctx={} ==", p.role, bk.b, bk.t, bk.ctx);
    let _ = writeln!(
        s,
        "arena {} bytes (values {}, split-K counters {}, group scratch {}), {} launches of {} groups, {} table slots",
        p.arena_bytes,
        p.arena.values_bytes,
        p.arena.counters_bytes,
        p.arena.scratch_bytes,
        p.launches.len(),
        p.groups.len(),
        p.slots.len()
    );
    if !p.passes.is_empty() {
        let passes: Vec<String> = p
            .passes
            .iter()
            .map(|t| format!("{} {} us", t.pass, t.micros))
            .collect();
        let _ = writeln!(s, "passes: {}", passes.join(", "));
    }
    let mut table = Table::new(&[
        ("#", true),
        ("group", false),
        ("kernel", false),
        ("grid", false),
        ("block", false),
        ("smem", true),
        ("phase", false),
        ("family", false),
        ("choice", false),
        ("weight bytes", true),
        ("act bytes", true),
        ("flops", true),
        ("roofline us", true),
    ]);
    let mut seen = vec![false; p.groups.len()];
    let mut total = Cost::default();
    for (i, l) in p.launches.iter().enumerate() {
        let kernel = engine
            .kernels
            .get(l.kernel as usize)
            .map_or_else(|| format!("#{}", l.kernel), |k| k.name.clone());
        let mut row = vec![
            i.to_string(),
            format!("g{}", l.group),
            kernel,
            dims(l.grid),
            dims(l.block),
            l.smem_bytes.to_string(),
            phase(l.phase).to_string(),
        ];
        let g = l.group as usize;
        match p.groups.get(g) {
            Some(gc) if !seen[g] => {
                seen[g] = true;
                let c = Cost {
                    weight_bytes: gc.weight_bytes,
                    act_bytes: gc.act_bytes,
                    flops: gc.flops,
                };
                row.extend([
                    gc.family.clone(),
                    gc.choice.to_string(),
                    c.weight_bytes.to_string(),
                    c.act_bytes.to_string(),
                    c.flops.to_string(),
                    format!("{:.3}", c.roofline_us(bw, fl)),
                ]);
            }
            _ => row.extend(std::iter::repeat_n(String::new(), 6)),
        }
        table.row(row);
    }
    table.render(s);
    // Over every group: a chain's launch row shows its first group only.
    for gc in &p.groups {
        total.weight_bytes += gc.weight_bytes;
        total.act_bytes += gc.act_bytes;
        total.flops += gc.flops;
    }
    let _ = writeln!(
        s,
        "total: {} weight + {} act bytes, {} flops, roofline {:.3} us",
        total.weight_bytes,
        total.act_bytes,
        total.flops,
        total.roofline_us(bw, fl)
    );
    let f = &p.physical;
    if f.total() > 0 {
        let _ = writeln!(
            s,
            "physical floor at a full context: {} bytes ({} weights, {} KV read, {} KV written, {} in/out), roofline {:.3} us (with the flops); this plan moves {:.2}x the floor",
            f.total(),
            f.weights,
            f.kv_read,
            f.kv_written,
            f.io,
            (f.total() as f64 / bw).max(total.flops as f64 / fl) * 1e6,
            total.bytes() as f64 / f.total() as f64
        );
    }
}

/// One row per kernel and compiled arch: registers, spills, stack, shared memory.
fn kernel_section(s: &mut String, engine: &Engine, sources: Option<&[KernelSource]>) {
    let _ = writeln!(s, "kernels ({}):", engine.kernels.len());
    let mut cols = vec![
        ("kernel", false),
        ("module", false),
        ("arch", false),
        ("registers", true),
        ("spill stores", true),
        ("spill loads", true),
        ("stack", true),
        ("smem", true),
    ];
    if sources.is_some() {
        cols.push(("source", false));
    }
    let mut table = Table::new(&cols);
    for (i, k) in engine.kernels.iter().enumerate() {
        let module = engine
            .modules
            .get(k.module as usize)
            .map_or_else(|| "-".to_string(), |m| m.name.clone());
        let source = sources.map(|srcs| match srcs.get(i) {
            Some(src) => format!(
                "kernels/{}.cu ({} lines)",
                src.name,
                src.source.lines().count()
            ),
            None => "-".to_string(),
        });
        let mut rows: Vec<Vec<String>> = k
            .stats
            .iter()
            .map(|st| {
                vec![
                    k.name.clone(),
                    module.clone(),
                    st.arch.to_string(),
                    st.registers.to_string(),
                    st.spill_stores.to_string(),
                    st.spill_loads.to_string(),
                    st.stack_bytes.to_string(),
                    st.smem_bytes.to_string(),
                ]
            })
            .collect();
        if rows.is_empty() {
            let mut r = vec![k.name.clone(), module.clone(), "-".into()];
            r.extend(std::iter::repeat_n("-".to_string(), 5));
            rows.push(r);
        }
        for mut r in rows {
            if let Some(src) = &source {
                r.push(src.clone());
            }
            table.row(r);
        }
    }
    table.render(s);
}
