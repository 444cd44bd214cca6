//! `specc run`: generate text from a prompt, plain or speculative, on either backend. Both
//! backends execute the same engine: its prefill, then one step graph per step (k draft
//! tokens + verify + accept + commit + emit; k = 0 without a spec or with `--no-spec`).
//! Sampling happens inside those graphs; the host only prints, and ends generation at EOS,
//! `--max-tokens`, a `--stop` string or the end of the context.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Result};
use specc_ir::Bindings;
use specc_models::spec_bundle::EngineExtras;
use specc_models::SpecConfig;
use specc_models::CONFIG_FILE;
use specc_runtime::memory::{Budget, Footprint, Storage};
use specc_runtime::{admission, EngineGraphs, SpecCpuSession, SpecGraphs, Speculator};

use super::engine::{ready, target_for, Ready, Source, Want};
use super::fit::Fit;
use super::sampling;
use crate::cli::{Backend, SamplingArgs, SpecPolicyArg};
use crate::text::{StopScan, Streamer, TextCodec};

pub struct RunArgs<'a> {
    pub model: Source,
    pub spec_file: Option<&'a Path>,
    /// Decode plainly even when the engine has a speculative method.
    pub no_spec: bool,
    pub spec_policy: Option<SpecPolicyArg>,
    pub prompt: &'a str,
    pub max_tokens: usize,
    pub stop: &'a [String],
    pub sampling: SamplingArgs,
    pub backend: Backend,
    pub max_context: Option<u64>,
    /// Prompt rows per prefill (`None`: the default chunk; 0: whole prompts).
    pub prefill_chunk: Option<usize>,
    pub ids_out: Option<&'a Path>,
}

pub fn run(a: RunArgs) -> Result<()> {
    let cfg = a.spec_file.map(SpecConfig::from_file).transpose()?;
    let engine_dir = a.model.is_engine().then(|| a.model.path.clone()).flatten();
    // A model directory is built with the flags' acceptance; an engine keeps its own.
    let base = cfg
        .as_ref()
        .map(|c| c.acceptance.clone())
        .unwrap_or_default();
    let acceptance = sampling::acceptance(&a.sampling, &base)?;
    let cuda = a.backend == Backend::Cuda;
    // The GPU's states are sized for every batch bucket of the spec.
    let lanes = cfg
        .as_ref()
        .filter(|_| cuda)
        .and_then(|c| c.batch_buckets.iter().max())
        .map_or(1, |&b| b as u64);
    let r = ready(
        a.model,
        Want {
            spec: cfg.as_ref(),
            max_context: a.max_context,
            target: target_for(cuda)?,
            extras: EngineExtras {
                acceptance: Some(acceptance),
                ..EngineExtras::default()
            },
            fit: Fit::of_backend(cuda, lanes)?,
        },
    )?;
    let mut r = r;
    if let Some(dir) = &engine_dir {
        // The lanes' knobs are the engine's defaults, which the flags replace.
        r.engine.acceptance = sampling::for_engine(&a.sampling, &r.engine.acceptance, dir)?;
    }
    let speculative = r.engine.spec.is_some() && !a.no_spec;
    let contract = r.engine.contract(speculative).clone();
    let config = r.model_dir.join(CONFIG_FILE);
    let codec = TextCodec::open(&r.model_dir, &r.spec, &config)?;
    let mut ids = Vec::new();
    if let Some(bos) = r.spec.bos_token_id {
        ids.push(bos);
    }
    ids.extend(codec.encode(a.prompt)?);
    r.spec
        .check_token_ids(&config, "the tokenized --prompt", &ids)?;
    let k = contract.num_steps;
    let max_context = r.engine.max_context;
    if ids.len() + k + 3 > max_context as usize {
        bail!(
            "--prompt: {} tokens (+{} for drafting) exceed the max context of {max_context} tokens (from {})",
            ids.len(),
            k + 3,
            r.context_from
        );
    }
    let fits = admission::max_new_tokens(ids.len(), k, max_context);
    let max_tokens = a.max_tokens.min(fits);
    if max_tokens < a.max_tokens {
        eprintln!(
            "note: --max-tokens {} clamped to {fits}: what fits after the {}-token prompt in the max context of {max_context} (from {})",
            a.max_tokens,
            ids.len(),
            r.context_from
        );
    }
    let backend = match a.backend {
        Backend::Cpu => "cpu",
        Backend::Cuda => "cuda",
    };
    let policy = SpecPolicyArg::resolve(a.spec_policy, &r.engine.acceptance);
    let label = match contract.variants.is_empty() {
        true => format!("{backend}, {}, {}", contract.label, r.engine.acceptance),
        false => format!(
            "{backend}, {} ({policy} speculation), {}",
            contract.label, r.engine.acceptance
        ),
    };
    // Said once the weights are read: a weight that fails to load is then the only line.
    let announce = || eprintln!("[{label}] engine: {}", r.origin);
    let out = Out {
        r: &r,
        codec: &codec,
        ids: &ids,
        prompt: a.prompt,
        max_tokens,
        context_bound: max_tokens < a.max_tokens,
        stop: a.stop,
        label: &label,
        ids_out: a.ids_out,
        context_flag: match &engine_dir {
            Some(_) => "recompile the engine with a larger --max-context",
            None => "pass a larger --max-context",
        },
    };
    let chunk = admission::prefill_chunk_or_default(a.prefill_chunk, max_context)
        .map_err(|e| anyhow::anyhow!("--prefill-chunk: {e}"))?;
    match a.backend {
        Backend::Cpu => {
            let graphs = EngineGraphs::parse(&r.engine)?;
            let sg = SpecGraphs::from_engine(&contract, &graphs)?;
            // A prefill runs over one chunk of the prompt at most.
            let rows = match chunk {
                0 => ids.len(),
                c => ids.len().min(c),
            };
            check_cpu_memory(&r, &sg, rows as u64)?;
            let weights = r.cpu_weights(&graphs, &contract.roles())?;
            announce();
            let mut s = SpecCpuSession::new(sg, &weights, 1, max_context);
            s.set_policy(policy)?;
            s.set_prefill_chunk(chunk)?;
            generate(&mut s, &out)
        }
        Backend::Cuda => {
            #[cfg(feature = "cuda")]
            {
                let sources = r.weight_sources();
                let pb = crate::progress::spinner("uploading weights, capturing the step graph");
                let s = specc_runtime::cuda::CudaSpecSession::with_prefill_chunk(
                    &r.engine,
                    speculative,
                    &sources,
                    1,
                    false,
                    chunk,
                );
                pb.finish_and_clear();
                let mut s = s?;
                s.set_policy(policy)?;
                announce();
                eprintln!(
                    "[cuda] step graph: {} kernels in one captured graph",
                    s.step_plan().launches.len(),
                );
                let res = generate(&mut s, &out);
                let prefills = s.prefill_replays();
                eprintln!(
                    "[cuda] graph launches: {} for {} steps and {prefills} prefills",
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

/// The interpreter's estimate for a `prompt`-token prefill and the steps after it must fit
/// the host's available memory (where it can be measured).
/// The interpreter's memory for prefills of `prompt` rows (a chunk) and the step.
fn check_cpu_memory(r: &Ready, sg: &SpecGraphs, prompt: u64) -> Result<()> {
    let Some(budget) = Budget::host() else {
        return Ok(());
    };
    let ctx = r.engine.max_context;
    let runs = [
        (sg.target_prefill, Bindings::new(1, prompt, ctx)),
        (sg.draft_prefill, Bindings::new(1, prompt, ctx)),
        (sg.step, Bindings::new(1, 1, ctx)),
    ];
    Footprint::of_graphs(&runs, Storage::Interpreter).check(
        &budget,
        &format!(
            "it grows with the max context ({ctx}, from {}) and the prompt rows per prefill ({prompt})",
            r.context_from
        ),
    )?;
    Ok(())
}

/// What the host loop prints and where.
struct Out<'a> {
    r: &'a Ready,
    codec: &'a TextCodec,
    ids: &'a [u32],
    prompt: &'a str,
    max_tokens: usize,
    /// `max_tokens` is what the context holds (the request was clamped to it): reaching it
    /// is reaching the end of the context.
    context_bound: bool,
    stop: &'a [String],
    label: &'a str,
    ids_out: Option<&'a Path>,
    /// How to get a longer context, for the message when generation reaches its end.
    context_flag: &'a str,
}

/// Why generation ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    /// An end-of-sequence token, `--max-tokens` or a `--stop` string.
    Asked,
    /// The lane's budget ran out before `--max-tokens`: the KV cache is full.
    Context,
}

/// The host loop: admit, then step / drain / print until EOS, the budget, a stop string or
/// the context ends.
fn generate(s: &mut dyn Speculator, o: &Out) -> Result<()> {
    let (codec, ids, max_tokens) = (o.codec, o.ids, o.max_tokens);
    let mut all = Vec::new();
    let eos = &o.r.spec.eos_token_ids;
    let mut streamer = Streamer::new(codec);
    let mut stops = StopScan::new(o.stop);
    let mut out = std::io::stdout().lock();
    write!(out, "{}", o.prompt)?;
    out.flush()?;
    let t0 = Instant::now();
    let first = s.admit(std::slice::from_ref(&ids.to_vec()), max_tokens)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut generated = 0usize;
    let mut pending = first;
    let end = 'outer: loop {
        for tok in pending.drain(..) {
            if eos.contains(&tok) {
                break 'outer End::Asked;
            }
            if generated == max_tokens {
                break 'outer if o.context_bound {
                    End::Context
                } else {
                    End::Asked
                };
            }
            generated += 1;
            all.push(tok);
            let (text, stopped) = stops.push(&streamer.push(tok)?);
            write!(out, "{text}")?;
            if stopped {
                break 'outer End::Asked;
            }
        }
        out.flush()?;
        if !s.live()?[0] {
            break if generated < max_tokens || o.context_bound {
                End::Context
            } else {
                End::Asked
            };
        }
        s.step()?;
        pending = s.drain()?.remove(0);
    };
    s.finish(0)?;
    write!(out, "{}", stops.flush())?;
    let decode_s = t1.elapsed().as_secs_f64();
    writeln!(out)?;
    out.flush()?;
    let stats = s.stats();
    let label = o.label;
    if end == End::Context {
        let max_context = o.r.engine.max_context;
        eprintln!(
            "[{label}] stopped at the end of the context: the KV cache holds {max_context} tokens per sequence (prompt {} + {generated} generated + room for one step); {} for more",
            ids.len(),
            o.context_flag
        );
    }
    eprintln!(
        "[{label}] prompt {} tokens in {:.3} s; generated {generated} tokens in {:.3} s ({:.1} tok/s) over {} steps",
        ids.len(),
        prefill_s,
        decode_s,
        generated as f64 / decode_s.max(1e-9),
        stats.steps,
    );
    if let Some(table) = specc_ir::interp::profile::report() {
        eprint!("[{label}] {table}");
    }
    if let Some(p) = o.ids_out {
        let j = serde_json::json!({ "prompt_ids": ids, "generated_ids": all });
        std::fs::write(p, j.to_string())?;
    }
    let p = s.policy();
    if p.ks().len() > 1 {
        let per: Vec<String> = p
            .ks()
            .iter()
            .zip(p.steps())
            .map(|(k, n)| format!("k={k} {n}"))
            .collect();
        eprintln!(
            "[{label}] steps per variant ({} policy): {}",
            p.mode(),
            per.join(", ")
        );
    }
    if stats.histogram.len() > 1 {
        let counts: Vec<String> = stats.histogram.iter().map(|c| c.to_string()).collect();
        eprintln!(
            "mean acceptance length {:.2} tokens/step; histogram of accepted draft tokens (0..={}; for trees: path depth): [{}]",
            stats.mean_accept_len(),
            stats.histogram.len() - 1,
            counts.join(", ")
        );
    }
    Ok(())
}
