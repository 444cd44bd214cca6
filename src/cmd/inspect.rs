use std::collections::BTreeMap;
use std::fmt::Write;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use specc_ir::{Bindings, Graph, Op};

use super::engine::EngineManifest;

/// Op counts, parameter bytes and KV bytes of a graph, for one sequence of `max_context`.
pub fn summary(g: &Graph, max_context: u64) -> String {
    let mut s = String::new();
    let one = Bindings::new(1, 1, max_context);
    let per_token = Bindings::new(1, 1, 1);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, n) in g.nodes() {
        *counts.entry(n.op.info().name).or_default() += 1;
    }
    let params: u64 = g.weights().filter_map(|(_, _, t)| t.bytes(&one)).sum();
    let n_params = g.weights().count();
    let kv: u64 = g.states().filter_map(|(_, _, t)| t.bytes(&one)).sum();
    let kv_tok: u64 = g.states().filter_map(|(_, _, t)| t.bytes(&per_token)).sum();
    let _ = writeln!(s, "graph {}: {} nodes", g.name, g.len());
    let _ = writeln!(s, "parameters: {n_params} tensors, {params} bytes");
    let _ = writeln!(
        s,
        "kv cache: {kv_tok} bytes per token per sequence, {kv} bytes at context {max_context}"
    );
    let _ = writeln!(s, "ops:");
    for (name, c) in counts {
        let _ = writeln!(s, "  {name:<16} {c}");
    }
    s
}

pub fn inspect(engine: &Path) -> Result<()> {
    let m = EngineManifest::read(engine)?;
    let ir_path = engine.join("graph.ir");
    let ir = fs::read_to_string(&ir_path)
        .with_context(|| format!("{}: cannot read", ir_path.display()))?;
    let g = specc_ir::text::parse(&ir).with_context(|| format!("{}", ir_path.display()))?;
    specc_ir::verify(&g).with_context(|| format!("{}", ir_path.display()))?;
    println!("engine {} ({})", engine.display(), m.architecture);
    println!("model: {}", m.model_dir.display());
    println!("max context: {}", m.max_context);
    print!("{}", summary(&g, m.max_context));
    println!(
        "per-op shapes and bytes at B=1, T=1, Ctx={}:",
        m.max_context
    );
    let bind = Bindings::new(1, 1, m.max_context);
    for (id, n) in g.nodes() {
        let what = match &n.op {
            Op::Input { name, .. } | Op::Weight { name, .. } | Op::State { name, .. } => {
                format!("{} \"{name}\"", n.op.info().name)
            }
            op => op.info().name.to_string(),
        };
        let bytes = n.ty.bytes(&bind).unwrap_or(0);
        println!(
            "  {id:<6} {what:<58} {:<24} {bytes:>12} B",
            n.ty.to_string()
        );
    }
    println!("IR:");
    print!("{ir}");
    Ok(())
}
