//! `specc run`: generate text from a prompt, plain or speculative, on either backend. Both
//! backends run the same graphs: a prefill, then one step graph per step (k draft tokens
//! + verify + accept + commit + emit; k = 0 without `--spec`).

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};
use specc_models::spec_step::lower_plain_greedy;
use specc_models::{Method, SpecBundle, SpecConfig};
use specc_runtime::{SpecCpuSession, SpecGraphs, Speculator};

use super::engine::{resolve, Resolved, Source};
use crate::cli::Backend;
use crate::text::{Streamer, TextCodec};

use specc_models::spec_bundle::DECODE_RING;

pub fn run(
    model: Source,
    spec_file: Option<&Path>,
    prompt: &str,
    max_tokens: usize,
    backend: Backend,
    max_context: Option<u64>,
    ids_out: Option<&Path>,
) -> Result<()> {
    let cfg = spec_file.map(SpecConfig::from_file).transpose()?;
    let cfg = cfg.filter(|c| c.method != Method::None);
    let r = resolve(
        model,
        max_context.or(cfg.as_ref().and_then(|c| c.max_context)),
    )?;
    let codec = TextCodec::open(&r.model_dir)?;
    let spec = r.model.spec();
    let mut ids = Vec::new();
    if let Some(bos) = spec.bos_token_id {
        ids.push(bos);
    }
    ids.extend(codec.encode(prompt)?);
    // Cache slots one verify writes past the sequence, minus one.
    let k = cfg.as_ref().map_or(0, SpecConfig::verify_margin);
    if ids.len() + k + 3 > r.max_context as usize {
        bail!(
            "--prompt: {} tokens (+{} for drafting) exceed the maximum context of {} tokens",
            ids.len(),
            k + 3,
            r.max_context
        );
    }
    let label = match &cfg {
        Some(c) => match c.tree {
            Some(t) if c.method == Method::Eagle3 => format!(
                "{backend:?}, {:?} tree depth={} num_draft_tokens={} topk={}",
                c.method, c.num_steps, t.budget, t.topk
            ),
            Some(t) => format!(
                "{backend:?}, {:?} depth={} budget={} topk={}",
                c.method, c.num_steps, t.budget, t.topk
            ),
            None => format!("{backend:?}, {:?} k={k}", c.method),
        },
        None => format!("{backend:?}"),
    };
    let bundle = cfg
        .as_ref()
        .map(|c| SpecBundle::open(&r.model, c))
        .transpose()?;
    let plain = match &bundle {
        None => Some(lower_plain_greedy(spec, DECODE_RING)?),
        Some(_) => None,
    };
    match backend {
        Backend::Cpu => {
            let weights = match &bundle {
                Some(b) => b.load_weights_f32(&r.model)?,
                None => r.model.load_weights_f32(),
            };
            let graphs = match (&bundle, &plain) {
                (Some(b), _) => SpecGraphs::of(b),
                (None, Some((pre, step))) => SpecGraphs::plain(pre, step, DECODE_RING as usize),
                (None, None) => unreachable!("plain graphs exist without a bundle"),
            };
            let mut s = SpecCpuSession::new(graphs, &weights, 1, r.max_context);
            generate(
                &mut s, &r, &codec, &ids, prompt, max_tokens, &label, ids_out,
            )
        }
        Backend::Cuda => {
            #[cfg(feature = "cuda")]
            {
                use super::gpu;
                let mut s = match (&bundle, &plain) {
                    (Some(b), _) => gpu::spec_session(&r.model, b, 1, r.max_context)?,
                    (None, Some((prefill, step))) => gpu::decode_session(
                        &r.model,
                        prefill,
                        step,
                        1,
                        r.max_context,
                        DECODE_RING as usize,
                    )?,
                    (None, None) => unreachable!("plain graphs exist without a bundle"),
                };
                eprintln!(
                    "[cuda] {} cubins baked into this binary; step graph: {} kernels in one captured graph (codegen {:.2} s, nvrtc/cache {:.2} s)",
                    crate::baked::PREBUILT.len(),
                    s.step_plan().launches.len(),
                    s.step_compile_s.0,
                    s.step_compile_s.1
                );
                let res = generate(
                    &mut s, &r, &codec, &ids, prompt, max_tokens, &label, ids_out,
                );
                eprintln!(
                    "[cuda] graph launches: {} for {} steps",
                    s.engine.dev.counters().graph_launches(),
                    s.stats.steps
                );
                res
            }
            #[cfg(not(feature = "cuda"))]
            {
                Err(super::gpu::unavailable())
            }
        }
    }
}

/// The host loop: admit, then step / drain / print until EOS, the budget or the context ends.
#[allow(clippy::too_many_arguments)]
fn generate(
    s: &mut dyn Speculator,
    r: &Resolved,
    codec: &TextCodec,
    ids: &[u32],
    prompt: &str,
    max_tokens: usize,
    label: &str,
    ids_out: Option<&Path>,
) -> Result<()> {
    let mut all = Vec::new();
    let eos = &r.model.spec().eos_token_ids;
    let mut streamer = Streamer::new(codec);
    let mut out = std::io::stdout().lock();
    write!(out, "{prompt}")?;
    out.flush()?;
    let t0 = Instant::now();
    let first = s.admit(std::slice::from_ref(&ids.to_vec()), max_tokens)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut generated = 0usize;
    let mut pending = first;
    'outer: loop {
        for tok in pending.drain(..) {
            if eos.contains(&tok) || generated == max_tokens {
                s.finish(0)?;
                break 'outer;
            }
            generated += 1;
            all.push(tok);
            write!(out, "{}", streamer.push(tok)?)?;
        }
        out.flush()?;
        if !s.live()?[0] {
            break;
        }
        s.step()?;
        pending = s.drain()?.remove(0);
    }
    let decode_s = t1.elapsed().as_secs_f64();
    writeln!(out)?;
    let stats = s.stats();
    eprintln!(
        "[{label}] prompt {} tokens in {:.3} s; generated {generated} tokens in {:.3} s ({:.1} tok/s) over {} steps",
        ids.len(),
        prefill_s,
        decode_s,
        generated as f64 / decode_s.max(1e-9),
        stats.steps,
    );
    if let Some(p) = ids_out {
        let j = serde_json::json!({ "prompt_ids": ids, "generated_ids": all });
        std::fs::write(p, j.to_string())?;
    }
    if stats.histogram.len() > 1 {
        eprintln!(
            "mean acceptance length {:.2} tokens/step; histogram of accepted draft tokens (0..={}; for trees: path depth): {:?}",
            stats.mean_accept_len(),
            stats.histogram.len() - 1,
            stats.histogram
        );
    }
    Ok(())
}
