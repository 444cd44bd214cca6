use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Result};
use specc_runtime::CpuSession;

use super::engine::{resolve, Source};
use crate::cli::Backend;
use crate::text::{Streamer, TextCodec};

pub fn run(
    model: Source,
    prompt: &str,
    max_tokens: usize,
    backend: Backend,
    max_context: Option<u64>,
) -> Result<()> {
    let r = resolve(model, max_context)?;
    let codec = TextCodec::open(&r.model_dir)?;
    let spec = r.model.spec();
    let mut ids = Vec::new();
    if let Some(bos) = spec.bos_token_id {
        ids.push(bos);
    }
    ids.extend(codec.encode(prompt)?);
    if ids.is_empty() {
        bail!("--prompt: expected text that tokenizes to at least one token");
    }
    if ids.len() as u64 > r.max_context {
        bail!(
            "--prompt: {} tokens exceed the maximum context of {} tokens",
            ids.len(),
            r.max_context
        );
    }
    let weights = match backend {
        Backend::Cpu => r.model.load_weights_f32(),
    };
    let mut session = CpuSession::new(r.model.graph(), &weights, r.max_context);
    let mut streamer = Streamer::new(&codec);
    let mut out = std::io::stdout().lock();
    write!(out, "{prompt}")?;
    out.flush()?;

    let t0 = Instant::now();
    let first = session.step(&ids)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut next = *first.next.last().expect("step returns one token per input");
    let t1 = Instant::now();
    let mut generated = 0usize;
    while generated < max_tokens {
        if spec.eos_token_ids.contains(&next) {
            break;
        }
        generated += 1;
        write!(out, "{}", streamer.push(next)?)?;
        out.flush()?;
        if generated == max_tokens || session.len() as u64 >= r.max_context {
            break;
        }
        next = session.step(&[next])?.next[0];
    }
    let decode_s = t1.elapsed().as_secs_f64();
    writeln!(out)?;
    eprintln!(
        "[{:?}] prompt {} tokens in {:.3} s ({:.1} tok/s); generated {} tokens in {:.3} s ({:.1} tok/s)",
        backend,
        ids.len(),
        prefill_s,
        ids.len() as f64 / prefill_s.max(1e-9),
        generated,
        decode_s,
        generated as f64 / decode_s.max(1e-9),
    );
    Ok(())
}
