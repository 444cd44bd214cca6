//! `specc inspect`: an engine directory's plan report (what `plan.txt` holds), then every
//! graph's op counts, parameter and KV bytes, and IR text.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use anyhow::{anyhow, Result};
use specc_codegen::plan_report;
use specc_ir::engine::{Engine, ENGINE_FILE};
use specc_ir::{Bindings, Graph};

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

/// Prints the engine's plan report, then each graph's summary and IR text.
pub fn inspect(engine: &Path) -> Result<()> {
    let e = Engine::read_dir(engine)?;
    println!("engine {}", engine.display());
    print!("{}", plan_report(&e, None));
    for g in &e.graphs {
        let parsed = specc_ir::text::parse(&g.ir).map_err(|err| {
            anyhow!(
                "{}: graph `{}`: {err}",
                engine.join(ENGINE_FILE).display(),
                g.role
            )
        })?;
        println!();
        println!("== graph {} ==", g.role);
        print!("{}", summary(&parsed, e.max_context));
        println!("IR:");
        print!("{}", g.ir);
        if !g.ir.ends_with('\n') {
            println!();
        }
    }
    Ok(())
}
