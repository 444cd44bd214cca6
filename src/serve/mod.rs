//! `specc serve`: an OpenAI-compatible HTTP server in one process. The engine is built or
//! loaded as for `run`; a session of `--lanes` lanes is owned by the engine loop on this
//! thread ([`batcher`]), and the HTTP side runs on tokio + axum in another ([`api`]),
//! handing checked requests to the loop through a bounded queue and reading their tokens
//! back as a stream of text deltas.

mod api;
mod batcher;
mod chat;
#[cfg(test)]
mod chunked_tests;
mod errors;
mod metrics;
mod request;

use axum::serve::ListenerExt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use specc_models::spec_bundle::EngineExtras;
use specc_models::{SpecConfig, CONFIG_FILE};
use specc_runtime::{admission, EngineGraphs, SpecCpuSession, SpecGraphs};

use crate::cli::{Backend, ServeArgs, SpecPolicyArg};
use crate::cmd::engine::{ready, target_for, Source, Want};
use crate::cmd::fit::Fit;
use crate::cmd::sampling;
use crate::embedded;
use crate::text::TextCodec;

/// Lanes of a CPU session unless `--lanes` says otherwise.
const CPU_LANES: usize = 4;

pub fn serve(a: ServeArgs) -> Result<()> {
    if a.max_queue == 0 {
        bail!("--max-queue 0: expected at least 1");
    }
    let embedded_default = a.model.is_none() && !a.random_weights;
    let spec_file = match (&a.spec, embedded_default && !a.no_spec) {
        (Some(s), _) => Some(s.clone()),
        (None, true) => Some(embedded::default_model_dir()?.join(embedded::SPEC_FILE)),
        (None, false) => None,
    };
    let cfg = spec_file
        .as_deref()
        .map(SpecConfig::from_file)
        .transpose()?;
    let src = Source::new(a.model.clone(), a.random_weights)
        .with_synthetic_acceptance(a.synthetic_acceptance);
    let engine_dir = src.is_engine().then(|| src.path.clone()).flatten();
    let base = cfg
        .as_ref()
        .map(|c| c.acceptance.clone())
        .unwrap_or_default();
    let acceptance = sampling::per_lane(sampling::acceptance(&a.sampling, &base)?);
    let cuda = a.backend == Backend::Cuda;
    let want_lanes = match (a.lanes, cuda) {
        (Some(0), _) => bail!("--lanes 0: expected at least 1"),
        (Some(n), _) => n,
        (None, false) => CPU_LANES,
        (None, true) => cfg
            .as_ref()
            .and_then(|c| c.batch_buckets.iter().max())
            .map_or(1, |&b| b as usize),
    };
    let r = ready(
        src,
        Want {
            spec: cfg.as_ref(),
            max_context: a.max_context,
            target: target_for(cuda)?,
            extras: EngineExtras {
                acceptance: Some(acceptance),
                ..EngineExtras::default()
            },
            fit: Fit::of_backend(cuda, want_lanes as u64)?,
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
    let codec = Arc::new(codec_of(&r.model_dir, &r.spec, &config, a.random_weights)?);
    let name_of = |id: Option<u32>| id.and_then(|i| codec.token_text(i)).unwrap_or_default();
    let template = chat::ChatTemplate::load(
        &r.model_dir,
        name_of(r.spec.bos_token_id),
        name_of(r.spec.eos_token_ids.first().copied()),
    )?;
    let served_name = a.served_model_name.clone().unwrap_or_else(|| {
        match a.model.as_deref().and_then(Path::file_name) {
            Some(n) => n.to_string_lossy().into_owned(),
            None => "specc-default".to_string(),
        }
    });
    let k = contract.num_steps;
    let policy = SpecPolicyArg::resolve_serving(a.spec_policy);
    let metrics = Arc::new(metrics::Metrics::new(
        &served_name,
        want_lanes,
        if speculative {
            contract.max_accept()
        } else {
            0
        },
    ));
    let (queue, rx, waiting) = batcher::Queue::new(a.max_queue);
    let label = format!(
        "{}, {}, {}, {want_lanes} lanes",
        match a.backend {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        },
        match contract.variants.is_empty() {
            true => contract.label.clone(),
            false => format!("{} ({policy} speculation)", contract.label),
        },
        r.engine.acceptance
    );
    let app = Arc::new(api::App {
        queue,
        codec: codec.clone(),
        template,
        served_name: served_name.clone(),
        api_key: a.api_key.clone(),
        vocab: r.spec.vocab,
        bos: r.spec.bos_token_id,
        k,
        max_context: r.engine.max_context,
        acceptance: r.engine.acceptance.clone(),
        metrics: metrics.clone(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    let chat_from = app
        .template
        .as_ref()
        .map_or("none (chat completions answer 400)".to_string(), |t| {
            t.origin.clone()
        });
    let chunk = admission::prefill_chunk_or_default(a.prefill_chunk, r.engine.max_context)
        .map_err(|e| anyhow::anyhow!("--prefill-chunk: {e}"))?;
    // The GPU session's own budget: its widest prefill fits one launch.
    let shown_chunk = match a.backend {
        Backend::Cuda => admission::chunk_within_launch(chunk, want_lanes, r.engine.max_context),
        Backend::Cpu => chunk,
    };
    let ctx = batcher::LoopCtx {
        codec: &codec,
        eos: &r.spec.eos_token_ids,
        max_context: r.engine.max_context,
        metrics: &metrics,
        waiting: &waiting,
        chunked: chunk > 0,
    };
    let announce = |addr: SocketAddr| {
        eprintln!("[{label}] engine: {}", r.origin);
        eprintln!("[{label}] chat template: {chat_from}");
        eprintln!(
            "[{label}] serving `{served_name}` on http://{addr} (max context {}, queue {}, prefill chunk {})",
            r.engine.max_context,
            a.max_queue,
            match shown_chunk {
                0 => "off".to_string(),
                c if c != chunk => format!(
                    "{c} rows per prefill across the lanes admitted together ({} exceed one launch's rows)",
                    match chunk {
                        0 => format!("{want_lanes} lanes × whole prompts"),
                        c => format!("{c} rows"),
                    }
                ),
                c => format!("{c} rows per prefill across the lanes admitted together"),
            }
        );
    };
    match a.backend {
        Backend::Cpu => {
            let graphs = EngineGraphs::parse(&r.engine)?;
            let sg = SpecGraphs::from_engine(&contract, &graphs)?;
            let weights = r.cpu_weights(&graphs, &contract.roles())?;
            let mut s = SpecCpuSession::new(sg, &weights, want_lanes, r.engine.max_context);
            s.set_policy(policy)?;
            s.set_prefill_chunk(chunk)?;
            let addr = listen(&a.host, a.port, app)?;
            announce(addr);
            batcher::run(&mut s, rx, &ctx);
        }
        Backend::Cuda => {
            #[cfg(feature = "cuda")]
            {
                let buckets = r.engine.batch_buckets();
                if !buckets.contains(&(want_lanes as u32)) {
                    bail!(
                        "--lanes {want_lanes}: the engine has step graphs for batch buckets {buckets:?} (set batch_buckets in the spec)"
                    );
                }
                let sources = r.weight_sources();
                let mut s = specc_runtime::cuda::CudaSpecSession::with_prefill_chunk(
                    &r.engine,
                    speculative,
                    &sources,
                    want_lanes,
                    a.shrink_buckets,
                    chunk,
                )?;
                s.set_policy(policy)?;
                let addr = listen(&a.host, a.port, app)?;
                announce(addr);
                batcher::run(&mut s, rx, &ctx);
            }
            #[cfg(not(feature = "cuda"))]
            {
                drop((app, rx, ctx, announce));
                return Err(crate::cmd::gpu::unavailable());
            }
        }
    }
    Ok(())
}

/// Binds `host:port` and serves the API on a tokio runtime of its own thread; the bound
/// address (the port chosen when `port` is 0).
fn listen(host: &str, port: u16, app: Arc<api::App>) -> Result<SocketAddr> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the HTTP runtime")?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind((host, port)))
        .with_context(|| format!("--host {host} --port {port}: cannot listen"))?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            // Each streamed event is a small write: without TCP_NODELAY, Nagle's algorithm
            // holds it until the client's delayed ACK (≈ 40 ms on Linux), which every time
            // to first token would pay.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let res = rt.block_on(async move { axum::serve(listener, api::router(app)).await });
            if let Err(e) = res {
                eprintln!("error: the HTTP server stopped: {e}");
                std::process::exit(1);
            }
        })
        .map_err(|e| anyhow!("cannot start the HTTP thread: {e}"))?;
    Ok(addr)
}

/// The model's tokenizer; a random-weights model from a bare config (no tokenizer file
/// beside it) is served on token ids alone.
fn codec_of(
    dir: &Path,
    spec: &specc_models::ModelSpec,
    config: &Path,
    random_weights: bool,
) -> Result<TextCodec> {
    if random_weights && specc_models::tokenizer::Tokenizer::from_dir(dir)?.is_none() {
        eprintln!(
            "{}: no tokenizer beside the config: serving token ids only (prompts as id arrays, completions as their ids)",
            dir.display()
        );
        return Ok(TextCodec::ids_only());
    }
    TextCodec::open(dir, spec, config)
}
