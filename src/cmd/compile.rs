//! `specc compile`: a model (and optionally a spec.toml) → an engine directory: every graph
//! the engine runs through the pass pipeline and kernel generation, the distinct kernels'
//! sources, and their cubins for the requested archs (NVRTC modules of several kernels on all
//! cores, disk cache): `kernels/{module}.{arch}.cubin`, the kernel → module map in plan.txt.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use specc_codegen::{describe_groups, H200};
use specc_kernels_gen::plan::{plan_kernels_for, DeviceLimits};
use specc_kernels_gen::{Arch, KernelSource, Nvrtc, PtxasStats};
use specc_models::spec_bundle::engine_graphs;
use specc_models::{Method, SpecConfig};

use super::engine::{resolve, EngineManifest, Source, FORMAT_VERSION, RANDOM_SEED};
use super::inspect::summary;

pub struct CompileArgs<'a> {
    pub model: Option<PathBuf>,
    pub out: &'a Path,
    pub max_context: Option<u64>,
    pub archs: &'a [String],
    pub random_weights: bool,
    pub spec: Option<&'a Path>,
}

pub fn compile(a: CompileArgs) -> Result<()> {
    let t_all = Instant::now();
    let archs: Vec<Arch> = a
        .archs
        .iter()
        .map(|a| a.parse::<Arch>())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("--arch: {e}"))?;
    let cfg = a.spec.map(SpecConfig::from_file).transpose()?;
    let max_context = a.max_context.or(cfg.as_ref().and_then(|c| c.max_context));
    let r = resolve(Source::new(a.model, a.random_weights), max_context)?;
    let out = a.out;
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let model_dir = r
        .model_dir
        .canonicalize()
        .with_context(|| format!("{}", r.model_dir.display()))?;
    let manifest = EngineManifest {
        format_version: FORMAT_VERSION,
        model_dir,
        max_context: r.max_context,
        architecture: r.model.spec().arch.hf_name().to_string(),
        random_weights: a.random_weights,
        config: r.source_path.as_ref().and_then(|p| p.canonicalize().ok()),
    };
    let write = |name: &str, text: String| -> Result<()> {
        let p = out.join(name);
        fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    write("engine.json", serde_json::to_string_pretty(&manifest)?)?;
    write("graph.ir", specc_ir::text::print(r.model.graph()))?;

    // Every graph of the engine through codegen and kernel generation.
    let t_plan = Instant::now();
    let seed = a.random_weights.then_some(RANDOM_SEED);
    let graphs = engine_graphs(&r.model, cfg.as_ref(), r.max_context, seed)?;
    let mut plan = summary(r.model.graph(), r.max_context);
    let mut kernels: Vec<KernelSource> = Vec::new();
    let mut launches = 0;
    let mut per_graph = String::new();
    let mut reported = false;
    for eg in graphs {
        let name = eg.name;
        let c = specc_codegen::compile(eg.graph, &[eg.bind]).with_context(|| name.clone())?;
        // Work splits every target arch can run (e.g. shared memory per block).
        let limits = DeviceLimits::of_archs(&archs);
        let kplan = plan_kernels_for(&c.graph, &c.groups, &c.plans[0], limits)
            .with_context(|| name.clone())?;
        let _ = writeln!(
            per_graph,
            "{name}: {} launches, arena {} bytes",
            kplan.launches.len(),
            kplan.arena_bytes
        );
        if !reported && name.starts_with("decode step") {
            // The first plain decode step: the report a reader of plan.txt looks for first.
            reported = true;
            plan.push_str(&c.report(&H200));
            plan.push_str(&format!("groups ({name}):\n"));
            plan.push_str(&describe_groups(&c.graph, &c.groups));
        }
        launches += kplan.launches.len();
        for l in kplan.launches {
            if !kernels.iter().any(|k| k.name == l.kernel.name) {
                kernels.push(l.kernel);
            }
        }
    }
    let plan_s = t_plan.elapsed().as_secs_f64();
    plan.push_str(&per_graph);
    let kdir = out.join("kernels");
    fs::create_dir_all(&kdir).with_context(|| format!("creating {}", kdir.display()))?;
    for k in &kernels {
        write(&format!("kernels/{}.cu", k.name), k.source.clone())?;
    }
    let _ = writeln!(
        plan,
        "engine: {launches} launches over all graphs, {} distinct kernels in kernels/*.cu",
        kernels.len()
    );
    let method = cfg.as_ref().map_or(Method::None, |c| c.method);
    println!(
        "{method:?} engine: {launches} launches, {} distinct kernels; IR → kernels {plan_s:.2} s",
        kernels.len()
    );
    match Nvrtc::new() {
        Ok(nvrtc) => {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let t = Instant::now();
            let refs: Vec<&KernelSource> = kernels.iter().collect();
            let compiled = nvrtc.compile_many(&refs, &archs, threads)?;
            let nvrtc_s = t.elapsed().as_secs_f64();
            let _ = writeln!(
                plan,
                "| kernel | module | arch | registers | spill stores | spill loads | stack | smem |"
            );
            let _ = writeln!(plan, "|---|---|---|---|---|---|---|---|");
            for m in &compiled {
                for e in &m.entries {
                    let st = PtxasStats::parse_entry(&m.compiled.log, e);
                    let _ = writeln!(
                        plan,
                        "| {e} | {} | {} | {} | {} | {} | {} | {} |",
                        m.name,
                        m.compiled.arch.name(),
                        st.registers,
                        st.spill_stores,
                        st.spill_loads,
                        st.stack_bytes,
                        st.smem_bytes,
                    );
                }
            }
            let _ = writeln!(plan, "| module | arch | kernels | compile ms |");
            let _ = writeln!(plan, "|---|---|---|---|");
            let mut cached = 0;
            for m in &compiled {
                let c = &m.compiled;
                fs::write(
                    kdir.join(format!("{}.{}.cubin", m.name, c.arch.name())),
                    &c.cubin,
                )?;
                cached += c.cached as usize;
                let _ = writeln!(
                    plan,
                    "| {} | {} | {} | {:.0}{} |",
                    m.name,
                    c.arch.name(),
                    m.entries.len(),
                    c.elapsed.as_secs_f64() * 1e3,
                    if c.cached { " (cache)" } else { "" }
                );
            }
            println!(
                "compiled {} kernels as {} modules for {:?} in {nvrtc_s:.1} s on {threads} threads ({cached} from the cache; NVRTC {}.{})",
                kernels.len(),
                compiled.len(),
                archs.iter().map(|a| a.name()).collect::<Vec<_>>(),
                nvrtc.version().0,
                nvrtc.version().1
            );
        }
        Err(e) => {
            let _ = writeln!(plan, "cubins not compiled: {e}");
            println!("kernel sources written; cubins not compiled ({e})");
        }
    }
    write("plan.txt", plan)?;
    print!("{}", summary(r.model.graph(), r.max_context));
    println!(
        "engine compiled in {:.1} s (IR → cubins); wrote {}",
        t_all.elapsed().as_secs_f64(),
        out.display()
    );
    print!(
        "engine baked into this binary at build time:\n{}",
        crate::baked::SUMMARY
    );
    Ok(())
}
