use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use specc_codegen::{describe_groups, H200};
use specc_ir::Bindings;

use super::engine::{resolve, EngineManifest, Source, FORMAT_VERSION};
use super::inspect::summary;

pub fn compile(
    model: Option<PathBuf>,
    out: &Path,
    max_context: Option<u64>,
    random_weights: bool,
) -> Result<()> {
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
