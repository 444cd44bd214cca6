use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use std::fmt::Write as _;

use specc_codegen::{describe_groups, H200};
use specc_ir::Bindings;
use specc_kernels_gen::plan::plan_kernels;
use specc_kernels_gen::{Arch, Nvrtc};

use super::engine::{resolve, EngineManifest, Source, FORMAT_VERSION};
use super::inspect::summary;

pub fn compile(
    model: Option<PathBuf>,
    out: &Path,
    max_context: Option<u64>,
    archs: &[String],
    random_weights: bool,
) -> Result<()> {
    let archs: Vec<Arch> = archs
        .iter()
        .map(|a| a.parse::<Arch>())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("--arch: {e}"))?;
    let r = resolve(Source::new(model, random_weights), max_context)?;
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
        random_weights,
        config: r.source_path.as_ref().and_then(|p| p.canonicalize().ok()),
    };
    let write = |name: &str, text: String| -> Result<()> {
        let p = out.join(name);
        fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    write("engine.json", serde_json::to_string_pretty(&manifest)?)?;
    write("graph.ir", specc_ir::text::print(r.model.graph()))?;
    // The pass pipeline for the decode bucket and a prefill-chunk bucket.
    let buckets = [
        Bindings::new(1, 1, r.max_context),
        Bindings::new(1, 8.min(r.max_context), r.max_context),
    ];
    let compiled = specc_codegen::compile(r.model.graph().clone(), &buckets)?;
    let mut plan = summary(r.model.graph(), r.max_context);
    plan.push_str(&compiled.report(&H200));
    plan.push_str("groups:\n");
    plan.push_str(&describe_groups(&compiled.graph, &compiled.groups));
    // Kernels of the decode bucket and of the T = 8 bucket (verify: the tensor-core GEMVs):
    // sources always, cubins and ptxas figures when NVRTC is here.
    let kplans = compiled
        .plans
        .iter()
        .map(|p| plan_kernels(&compiled.graph, &compiled.groups, p))
        .collect::<Result<Vec<_>, _>>()?;
    let kdir = out.join("kernels");
    fs::create_dir_all(&kdir).with_context(|| format!("creating {}", kdir.display()))?;
    let mut distinct: Vec<&specc_kernels_gen::KernelSource> = Vec::new();
    for l in kplans.iter().flat_map(|kp| &kp.launches) {
        if !distinct.iter().any(|k| k.name == l.kernel.name) {
            distinct.push(&l.kernel);
        }
    }
    for k in &distinct {
        write(&format!("kernels/{}.cu", k.name), k.source.clone())?;
    }
    for (kp, b) in kplans.iter().zip(&buckets) {
        let _ = writeln!(
            plan,
            "kernels (bucket B={} T={}): {} launches",
            b.get(specc_ir::BucketDim::B).unwrap_or(1),
            b.get(specc_ir::BucketDim::T).unwrap_or(1),
            kp.launches.len()
        );
    }
    let _ = writeln!(plan, "{} distinct kernels in kernels/*.cu", distinct.len());
    match Nvrtc::new() {
        Ok(nvrtc) => {
            let _ = writeln!(plan, "| kernel | arch | registers | spill stores | spill loads | stack | smem | compile ms |");
            let _ = writeln!(plan, "|---|---|---|---|---|---|---|---|");
            let t = std::time::Instant::now();
            for k in &distinct {
                for &arch in &archs {
                    let c = nvrtc.compile(k, arch)?;
                    fs::write(
                        kdir.join(format!("{}.{}.cubin", k.name, arch.name())),
                        &c.cubin,
                    )?;
                    let st = &c.stats;
                    let _ = writeln!(
                        plan,
                        "| {} | {} | {} | {} | {} | {} | {} | {:.0}{} |",
                        k.name,
                        arch.name(),
                        st.registers,
                        st.spill_stores,
                        st.spill_loads,
                        st.stack_bytes,
                        st.smem_bytes,
                        c.elapsed.as_secs_f64() * 1e3,
                        if c.cached { " (cache)" } else { "" }
                    );
                }
            }
            println!(
                "compiled {} kernels for {:?} in {:.1} s (NVRTC {}.{})",
                distinct.len(),
                archs.iter().map(|a| a.name()).collect::<Vec<_>>(),
                t.elapsed().as_secs_f64(),
                nvrtc.version().0,
                nvrtc.version().1
            );
        }
        Err(e) => {
            let _ = writeln!(plan, "cubins not compiled: {e}");
            println!("kernel sources written; cubins not compiled ({e})");
        }
    }
    write("plan.txt", plan.clone())?;
    print!("{}", summary(r.model.graph(), r.max_context));
    println!(
        "{} kernels per step after fusion (plan.txt has the per-kernel table)",
        compiled.groups.len()
    );
    println!("wrote {}", out.display());
    print!(
        "engine baked into this binary at build time:\n{}",
        crate::baked::SUMMARY
    );
    Ok(())
}
