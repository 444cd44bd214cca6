//! `specc run --spec spec.toml`: speculative decoding of one prompt.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};
use specc_models::{Method, SpecBundle, SpecConfig};
use specc_runtime::{DraftKind, SpecCpuSession, SpecGraphs};

use super::engine::{resolve, Source};
use super::run;
use crate::cli::Backend;
use crate::text::{Streamer, TextCodec};

pub fn run(
    model: Source,
    spec_file: &Path,
    prompt: &str,
    max_tokens: usize,
    backend: Backend,
    max_context: Option<u64>,
) -> Result<()> {
    let cfg = SpecConfig::from_file(spec_file)?;
    if cfg.method == Method::None {
        return run::run(
            model,
            prompt,
            max_tokens,
            backend,
            max_context.or(cfg.max_context),
        );
    }
    let r = resolve(model, max_context.or(cfg.max_context))?;
    let bundle = SpecBundle::open(&r.model, &cfg)?;
    let codec = TextCodec::open(&r.model_dir)?;
    let spec = r.model.spec();
    let mut ids = Vec::new();
    if let Some(bos) = spec.bos_token_id {
        ids.push(bos);
    }
    ids.extend(codec.encode(prompt)?);
    let k = bundle.num_steps();
    let room = r.max_context as usize;
    if ids.len() + k + 3 > room {
        bail!(
            "--prompt: {} tokens plus {} draft tokens exceed the maximum context of {room} tokens",
            ids.len(),
            k + 3
        );
    }
    let weights = match backend {
        Backend::Cpu => bundle.load_weights_f32(&r.model)?,
    };
    let graphs = SpecGraphs {
        kind: match bundle.taps_width() {
            Some(taps_width) => DraftKind::Eagle3 { taps_width },
            None => DraftKind::Model,
        },
        target_prefill: &bundle.target_prefill,
        draft_prefill: &bundle.draft_prefill,
        step: &bundle.step,
        num_steps: k,
        ring: bundle.shape.ring as usize,
    };
    let mut session = SpecCpuSession::new(graphs, &weights, 1, r.max_context);
    let mut streamer = Streamer::new(&codec);
    let mut out = std::io::stdout().lock();
    write!(out, "{prompt}")?;
    out.flush()?;

    let t0 = Instant::now();
    let first = session.admit(std::slice::from_ref(&ids), max_tokens)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut generated = 0usize;
    let mut pending = first;
    'outer: loop {
        for tok in pending.drain(..) {
            if spec.eos_token_ids.contains(&tok) || generated == max_tokens {
                session.finish(0);
                break 'outer;
            }
            generated += 1;
            write!(out, "{}", streamer.push(tok)?)?;
        }
        out.flush()?;
        if !session.live()[0] {
            break;
        }
        session.step()?;
        pending = session.drain()?.remove(0);
    }
    let decode_s = t1.elapsed().as_secs_f64();
    writeln!(out)?;
    let stats = &session.stats;
    eprintln!(
        "[{:?}, {:?} k={k}] prompt {} tokens in {:.3} s; generated {generated} tokens in {:.3} s ({:.1} tok/s) over {} steps",
        backend,
        cfg.method,
        ids.len(),
        prefill_s,
        decode_s,
        generated as f64 / decode_s.max(1e-9),
        stats.steps,
    );
    eprintln!(
        "mean acceptance length {:.2} tokens/step; histogram of accepted draft tokens (0..={k}): {:?}",
        stats.mean_accept_len(),
        stats.histogram
    );
    Ok(())
}
