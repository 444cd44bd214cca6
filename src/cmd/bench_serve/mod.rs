//! `specc bench-serve`: a closed-loop load generator for any OpenAI-compatible server
//! (specc, vLLM, SGLang). At each concurrency C, C workers send streamed
//! `POST /v1/completions` requests back to back until `--requests` have been sent; the
//! level reports output tokens/s over its wall time and TTFT / inter-token latency
//! percentiles. The first failed request ends the run with its error: a measurement with
//! failures in it would not mean what it says.

mod client;
mod prompts;
mod sse;
mod stats;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use tokio::task::JoinSet;

use client::Endpoint;
use stats::{LevelSummary, RequestRecord};

#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Base URL of the server (http://host:port, with or without a trailing /v1).
    #[arg(long)]
    pub url: String,
    /// Concurrency levels to measure, comma-separated: that many requests in flight.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub concurrency: Vec<usize>,
    /// Requests sent at each concurrency level.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub requests: usize,
    /// max_tokens of each request.
    #[arg(long, value_name = "M", default_value_t = 128)]
    pub max_tokens: usize,
    /// Prompts, cycled through: one per line, or JSON Lines with a `prompt` field, a string or
    /// an array of token ids (for a server without a tokenizer) (default:
    /// a built-in set of 16 short instructions).
    #[arg(long, value_name = "FILE")]
    pub prompts: Option<PathBuf>,
    /// Model name to request (default: the first id `GET /v1/models` lists).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Sampling temperature of each request.
    #[arg(long, value_name = "T", default_value_t = 0.0)]
    pub temperature: f64,
    /// Ask the server to ignore end-of-sequence tokens (`ignore_eos: true`, a vLLM / SGLang
    /// extension), so that every request produces max_tokens tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Give up on a request (and the run) after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    pub timeout: f64,
    /// Also write the figures here: a JSON list, one object per concurrency level.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

pub fn bench_serve(args: &BenchServeArgs) -> Result<()> {
    validate(args)?;
    let prompts = prompts::load(args.prompts.as_deref())?;
    let endpoint = Endpoint::parse(&args.url, args.api_key.clone())?;
    let timeout = Duration::from_secs_f64(args.timeout);
    // A few threads so that one busy stream does not delay the timestamps of the others.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let model = match &args.model {
            Some(m) => m.clone(),
            None => tokio::time::timeout(timeout, endpoint.first_model())
                .await
                .map_err(|_| anyhow!("GET /v1/models at {}: no answer within --timeout {}s", endpoint.url, args.timeout))??,
        };
        println!(
            "bench-serve {}: model {model}, {} requests per level, max_tokens {}, {} prompts",
            endpoint.url,
            args.requests,
            args.max_tokens,
            prompts.len()
        );
        let bodies: Arc<Vec<Bytes>> = Arc::new(
            prompts
                .iter()
                .map(|p| request_body(args, &model, p))
                .collect(),
        );
        let mut summaries = Vec::new();
        // Written before the first level (a path that cannot be written fails now, not after
        // the measurement) and again after each level (a later failure keeps the earlier rows).
        write_json(args.json.as_deref(), &summaries)?;
        print_header();
        for &c in &args.concurrency {
            if c > args.requests {
                eprintln!(
                    "note: concurrency {c} exceeds --requests {}: at most {} requests are in flight",
                    args.requests, args.requests
                );
            }
            let summary = run_level(&endpoint, &bodies, c, args.requests, timeout)
                .await
                .with_context(|| format!("concurrency {c}"))?;
            print_row(&summary);
            summaries.push(summary);
            write_json(args.json.as_deref(), &summaries)?;
        }
        Ok(())
    })
}

fn write_json(path: Option<&Path>, summaries: &[LevelSummary]) -> Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(summaries)?;
    std::fs::write(path, text + "\n")
        .with_context(|| format!("cannot write --json {}", path.display()))
}

fn validate(args: &BenchServeArgs) -> Result<()> {
    if args.concurrency.contains(&0) {
        bail!("--concurrency: every level must be at least 1");
    }
    if args.requests == 0 {
        bail!("--requests must be at least 1");
    }
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        bail!("--temperature must be a number >= 0");
    }
    Ok(())
}

fn request_body(args: &BenchServeArgs, model: &str, prompt: &serde_json::Value) -> Bytes {
    let mut body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if args.ignore_eos {
        body["ignore_eos"] = serde_json::Value::Bool(true);
    }
    Bytes::from(body.to_string())
}

/// Sends `requests` requests with `concurrency` workers (request i uses prompt i mod the
/// number of prompts); stops at the first error.
async fn run_level(
    endpoint: &Endpoint,
    bodies: &Arc<Vec<Bytes>>,
    concurrency: usize,
    requests: usize,
    timeout: Duration,
) -> Result<LevelSummary> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..concurrency.min(requests) {
        let (endpoint, bodies, next) = (endpoint.clone(), bodies.clone(), next.clone());
        tasks.spawn(async move { worker(&endpoint, &bodies, &next, requests, timeout).await });
    }
    let mut records = Vec::with_capacity(requests);
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(mut r)) => records.append(&mut r),
            Ok(Err(e)) => {
                tasks.abort_all();
                return Err(e);
            }
            Err(e) => {
                tasks.abort_all();
                bail!("a request task failed: {e}");
            }
        }
    }
    Ok(LevelSummary::new(concurrency, &records, start.elapsed()))
}

/// One worker: takes request indices until none are left, on one kept-alive connection
/// (reopened when the server closed it).
async fn worker(
    endpoint: &Endpoint,
    bodies: &[Bytes],
    next: &AtomicUsize,
    requests: usize,
    timeout: Duration,
) -> Result<Vec<RequestRecord>> {
    let mut records = Vec::new();
    let mut conn: Option<client::Sender> = None;
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= requests {
            return Ok(records);
        }
        let body = bodies[i % bodies.len()].clone();
        let start = Instant::now();
        let one = async {
            let mut sender = match conn.take() {
                Some(mut s) if !s.is_closed() => match s.ready().await {
                    Ok(()) => s,
                    Err(_) => endpoint.connect().await?,
                },
                _ => endpoint.connect().await?,
            };
            let record = endpoint.stream_completion(&mut sender, body, start).await?;
            Ok::<_, anyhow::Error>((record, sender))
        };
        let (record, sender) = tokio::time::timeout(timeout, one)
            .await
            .map_err(|_| {
                anyhow!(
                    "request {i} to {} timed out after {}s (--timeout)",
                    endpoint.url,
                    timeout.as_secs_f64()
                )
            })?
            .with_context(|| format!("request {i}"))?;
        records.push(record);
        conn = Some(sender);
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.1}"))
}

fn print_header() {
    println!(
        "{:>11} {:>8} {:>13} {:>11} {:>11} {:>10} {:>10} {:>11}",
        "concurrency",
        "requests",
        "output tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "TPOT p50 ms"
    );
}

fn print_row(s: &LevelSummary) {
    println!(
        "{:>11} {:>8} {:>13.1} {:>11} {:>11} {:>10} {:>10} {:>11}",
        s.concurrency,
        s.requests,
        s.output_tok_s,
        fmt_ms(s.ttft_ms_p50),
        fmt_ms(s.ttft_ms_p99),
        fmt_ms(s.itl_ms_p50),
        fmt_ms(s.itl_ms_p99),
        fmt_ms(s.tpot_ms_p50)
    );
}
