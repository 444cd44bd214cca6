//! Command-line syntax.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "specc",
    version,
    about = "Ahead-of-time compiler and runtime for speculative decoding"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// `--spec-policy`: which step graph each step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpecPolicyArg {
    /// Per step, the variant (plain decoding, smaller k, the configured k) with the most
    /// expected tokens per second, from step times measured at load and each lane's
    /// running acceptance.
    Adaptive,
    /// Always the spec's configured k.
    Fixed,
}

impl SpecPolicyArg {
    /// The server's policy of `arg`, by default adaptive: the server pins each sampled lane
    /// to the configured k while it is live (`AdaptivePolicy::pin`), so only greedy lanes'
    /// steps follow the policy and a seeded request's tokens do not depend on the load.
    pub fn resolve_serving(arg: Option<SpecPolicyArg>) -> specc_runtime::SpecPolicy {
        match arg {
            Some(SpecPolicyArg::Fixed) => specc_runtime::SpecPolicy::Fixed,
            Some(SpecPolicyArg::Adaptive) | None => specc_runtime::SpecPolicy::Adaptive,
        }
    }

    /// The policy of `arg`, by default adaptive under greedy acceptance and fixed under
    /// sampling (where each variant draws differently, so a seed's tokens would depend on
    /// the load).
    pub fn resolve(
        arg: Option<SpecPolicyArg>,
        acceptance: &specc_ir::engine::Acceptance,
    ) -> specc_runtime::SpecPolicy {
        use specc_runtime::SpecPolicy;
        match arg {
            Some(SpecPolicyArg::Adaptive) => SpecPolicy::Adaptive,
            Some(SpecPolicyArg::Fixed) => SpecPolicy::Fixed,
            None if matches!(acceptance, specc_ir::engine::Acceptance::Greedy) => {
                SpecPolicy::Adaptive
            }
            None => SpecPolicy::Fixed,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The IR interpreter: exact, slow, needs no GPU.
    Cpu,
    /// Generated kernels on GPU 0, one captured CUDA graph per step (needs a build with
    /// `--features cuda` and an NVIDIA driver).
    Cuda,
}

/// Sampling flags. They are compiled into the step graphs (as the spec's `[acceptance]`
/// is), so they override a spec's acceptance and an engine directory must have been
/// compiled with the same values.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct SamplingArgs {
    /// Sample at temperature T instead of decoding greedily (0: greedy). Overrides the
    /// spec's acceptance.temperature.
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub temperature: Option<f64>,
    /// Sample from the K most likely tokens only (implies sampling, at temperature 1 unless
    /// --temperature says otherwise).
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    pub top_k: Option<i64>,
    /// Sample from the smallest set of most likely tokens whose probability reaches P
    /// (nucleus sampling, 0 < P <= 1; implies sampling).
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub top_p: Option<f64>,
    /// Seed of the device's random numbers (implies sampling): the same seed, prompt and
    /// engine give the same text again.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Compile a Hugging Face model directory into an engine directory.
    Compile {
        /// Model directory (config.json, *.safetensors); the embedded default if omitted.
        model: Option<PathBuf>,
        /// Engine directory to write.
        #[arg(short, long)]
        out: PathBuf,
        /// KV-cache capacity per sequence (default: the spec's max_context, else the
        /// model's max_position_embeddings capped at 4096).
        #[arg(long)]
        max_context: Option<u64>,
        /// GPU architectures to compile the kernels for with NVRTC (when it is available).
        #[arg(long, value_delimiter = ',', default_value = "sm_90a")]
        arch: Vec<String>,
        /// Use deterministic random weights: only config.json is read (MODEL may be the
        /// config file itself).
        #[arg(long)]
        random_weights: bool,
        /// With --random-weights: only the first N decoder layers (a full-size model's shapes
        /// on a device that holds a few of its layers; dense and MoE layers keep their places).
        #[arg(long, requires = "random_weights", value_parser = clap::value_parser!(u32).range(1..))]
        layers: Option<u32>,
        /// With --random-weights: plant a controlled acceptance P (0..=1, a benchmarking aid):
        /// the target's greedy next token is a fixed permutation of the current token, and a
        /// `draft_model` draft agrees with it on a fraction P of the tokens, so each drafted
        /// token is accepted with probability ≈ P. Needs untied lm_heads.
        #[arg(long, value_name = "P", requires = "random_weights", value_parser = parse_fraction)]
        synthetic_acceptance: Option<f64>,
        /// Compile the speculative engine this spec.toml describes (its step, prefills and
        /// batch buckets) rather than plain decoding alone.
        #[arg(long)]
        spec: Option<PathBuf>,
        #[command(flatten)]
        sampling: SamplingArgs,
    },
    /// Print an engine's IR, per-op shapes and byte counts.
    Inspect {
        /// Engine directory written by `specc compile`.
        engine: PathBuf,
    },
    /// Generate text from a prompt (greedy unless sampling flags or the spec say otherwise).
    Run {
        /// Model or engine directory; the embedded default if omitted.
        model: Option<PathBuf>,
        /// The prompt text; `-` reads it from standard input.
        #[arg(
            long,
            value_name = "TEXT",
            required_unless_present = "prompt_file",
            conflicts_with = "prompt_file"
        )]
        prompt: Option<String>,
        /// Read the prompt from this UTF-8 file (for prompts too long for the command line).
        #[arg(long, value_name = "PATH")]
        prompt_file: Option<PathBuf>,
        /// Generate at most N tokens (clamped, with a note, to what fits in the context; generation
        /// also ends at an end-of-sequence token, a --stop string or the end of the context).
        #[arg(long, value_name = "N", default_value_t = 64)]
        max_tokens: usize,
        /// End generation at the first occurrence of this text, which is not printed
        /// (repeatable: the earliest occurrence of any of them).
        #[arg(long, value_name = "STRING")]
        stop: Vec<String>,
        #[command(flatten)]
        sampling: SamplingArgs,
        /// Where the engine runs.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// KV-cache capacity per sequence (default: the spec's max_context, else the model's
        /// max_position_embeddings capped at 4096 and at what fits in memory).
        #[arg(long)]
        max_context: Option<u64>,
        /// Speculative decoding as described by this spec.toml (method, draft, k, acceptance).
        #[arg(long)]
        spec: Option<PathBuf>,
        /// Decode without speculation even for the embedded default (which otherwise uses its
        /// own spec.toml: the trained draft, k = 5).
        #[arg(long, conflicts_with = "spec")]
        no_spec: bool,
        /// Which step graph each step runs: `adaptive` (the default under greedy acceptance)
        /// switches between plain decoding, smaller k and the configured k by expected
        /// goodput; `fixed` always runs the configured k.
        #[arg(long, value_enum, conflicts_with = "no_spec")]
        spec_policy: Option<SpecPolicyArg>,
        /// Prefill a prompt in chunks of at most N tokens (a power of two from 16; 0: whole
        /// prompts in one prefill). Default: 512, or the largest such chunk within the
        /// context. Each chunk attends to the cache rows of the ones before it: the tokens
        /// are those of a whole prefill, and no prefill graph or arena is larger than a chunk.
        #[arg(long, value_name = "N")]
        prefill_chunk: Option<usize>,
        /// Also write the prompt ids and generated ids as JSON here (for parity checks).
        #[arg(long)]
        ids_out: Option<PathBuf>,
        /// Use deterministic random weights: only config.json is read (MODEL may be the
        /// config file itself).
        #[arg(long)]
        random_weights: bool,
        /// With --random-weights: only the first N decoder layers (a full-size model's shapes
        /// on a device that holds a few of its layers; dense and MoE layers keep their places).
        #[arg(long, requires = "random_weights", value_parser = clap::value_parser!(u32).range(1..))]
        layers: Option<u32>,
        /// With --random-weights: plant a controlled acceptance P (0..=1, a benchmarking aid):
        /// the target's greedy next token is a fixed permutation of the current token, and a
        /// `draft_model` draft agrees with it on a fraction P of the tokens, so each drafted
        /// token is accepted with probability ≈ P. Needs untied lm_heads.
        #[arg(long, value_name = "P", requires = "random_weights", value_parser = parse_fraction)]
        synthetic_acceptance: Option<f64>,
    },
    /// Serve an OpenAI-compatible HTTP API (completions, chat, models, health, metrics)
    /// with continuous batching over the engine's lanes.
    Serve(ServeArgs),
    /// Time the step graph on the GPU: CUDA events over graph replays, vs the HBM roofline.
    Bench {
        /// Model directory, engine, or (with --random-weights) a config.json; the embedded
        /// default if omitted.
        model: Option<PathBuf>,
        /// Speculative method to time (default: plain decoding).
        #[arg(long)]
        spec: Option<PathBuf>,
        /// Sequences per step (the batch bucket).
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Tokens already in each sequence's KV cache.
        #[arg(long, default_value_t = 1024)]
        context: usize,
        /// Timed replays (the median is reported).
        #[arg(long, default_value_t = 100)]
        iters: usize,
        /// Also time every kernel of the step alone (per-kernel table).
        #[arg(long)]
        per_kernel: bool,
        /// Time one target forward over this many tokens per sequence (a verify of
        /// `--tokens` tokens) instead of the step graph.
        #[arg(long)]
        tokens: Option<usize>,
        /// Write the figures as JSON here too.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Acceptance length to convert step time into tokens/s (default: 1 for plain
        /// decoding, else measured elsewhere and passed here).
        #[arg(long)]
        accept_len: Option<f64>,
        /// Use deterministic random weights: only config.json is read.
        #[arg(long)]
        random_weights: bool,
        /// With --random-weights: only the first N decoder layers (a full-size model's shapes
        /// on a device that holds a few of its layers; dense and MoE layers keep their places).
        #[arg(long, requires = "random_weights", value_parser = clap::value_parser!(u32).range(1..))]
        layers: Option<u32>,
        /// With --random-weights: plant a controlled acceptance P (0..=1, a benchmarking aid):
        /// the target's greedy next token is a fixed permutation of the current token, and a
        /// `draft_model` draft agrees with it on a fraction P of the tokens, so each drafted
        /// token is accepted with probability ≈ P. Needs untied lm_heads.
        #[arg(long, value_name = "P", requires = "random_weights", value_parser = parse_fraction)]
        synthetic_acceptance: Option<f64>,
        /// Also time a PyTorch model of the same shapes (`bench/torch_reference.py`, run with
        /// $SPECC_PYTHON or python3) and print one table: decode, the `--tokens` verify and
        /// the `--spec` step, each against torch eager, eager under a CUDA graph and
        /// torch.compile.
        #[arg(long)]
        compare: bool,
        /// Measure the standard set in one go: decode B=1 ctx 1024, verify T=8, decode B=8,
        /// decode ctx 8192 (and the `--spec` step at B=1 ctx 1024).
        #[arg(long, conflicts_with_all = ["batch", "context", "tokens", "accept_len"])]
        suite: bool,
        /// Reference modes for --compare, comma-separated: eager, graph, compile (whole-model
        /// torch.compile, reduce-overhead; minutes per shape at 8B), compile-layers (one
        /// Inductor-compiled layer reused by all, under one CUDA graph; seconds).
        #[arg(long, requires = "compare")]
        torch_modes: Option<String>,
    },
    /// Write f32 logits for every position of a token sequence (for parity checks).
    Logits {
        /// Model or engine directory; the embedded default if omitted.
        model: Option<PathBuf>,
        /// Comma-separated token ids.
        #[arg(long, value_delimiter = ',', required = true)]
        ids: Vec<u32>,
        /// Where the forward pass runs.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// Output safetensors file: tensor `logits`, f32 [n, vocab].
        #[arg(long)]
        out: PathBuf,
        /// Use deterministic random weights: only config.json is read (MODEL may be the
        /// config file itself).
        #[arg(long)]
        random_weights: bool,
    },
    /// Load-test an OpenAI-compatible server (specc, vLLM, SGLang): output tokens/s, time to
    /// first token and inter-token latency at each concurrency.
    BenchServe(crate::cmd::bench_serve::BenchServeArgs),
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every flag and argument of every subcommand says what it is for.
    #[test]
    fn every_argument_has_help() {
        let cli = Cli::command();
        for sub in cli.get_subcommands() {
            assert!(
                sub.get_about().is_some(),
                "`{}` has no about",
                sub.get_name()
            );
            for arg in sub.get_arguments() {
                assert!(
                    arg.get_help().is_some(),
                    "`specc {} {}` has no help text",
                    sub.get_name(),
                    arg.get_id()
                );
            }
        }
        cli.debug_assert();
    }
}

/// `specc serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Model or engine directory; the embedded default if omitted.
    pub model: Option<PathBuf>,
    /// Speculative decoding as described by this spec.toml (the embedded default uses its
    /// own unless --no-spec).
    #[arg(long)]
    pub spec: Option<PathBuf>,
    /// Decode without speculation.
    #[arg(long, conflicts_with = "spec")]
    pub no_spec: bool,
    /// Which step graph each step runs: `adaptive` (the default under greedy acceptance)
    /// switches between plain decoding, smaller k and the configured k by expected goodput;
    /// `fixed` always runs the configured k.
    #[arg(long, value_enum, conflicts_with = "no_spec")]
    pub spec_policy: Option<SpecPolicyArg>,
    /// Where the engine runs.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Requests that may wait for a free lane; past it a request gets 503 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_queue: usize,
    /// The model id clients send and /v1/models lists (default: the model directory's
    /// name, `specc-default` for the embedded default).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Sequences decoded together (default: 4 on the CPU; on the GPU the largest batch
    /// bucket of the engine, which must hold this many).
    #[arg(long, value_name = "N")]
    pub lanes: Option<usize>,
    /// GPU: each step replays the smallest captured batch bucket that holds the lanes in
    /// use (faster at low load; a request's tokens may then vary with the load at
    /// near-ties, since kernels tile by bucket). Off: every step replays the `--lanes`
    /// bucket, and a request's tokens never depend on the others.
    #[arg(long)]
    pub shrink_buckets: bool,
    /// KV-cache capacity per sequence (as for `run`).
    #[arg(long)]
    pub max_context: Option<u64>,
    /// Prefill joining requests' prompts in chunks of at most N rows per prefill across the
    /// requests admitted together (a power of two from 16; 0: whole prompts; each of `b`
    /// lanes of a window takes N / b rows, rounded down to a power of two, at least 16),
    /// one chunk between two steps of the running requests, so their next tokens wait one
    /// step and one chunk, not a whole long prompt. Default: 512, or the largest such chunk
    /// within the context.
    #[arg(long, value_name = "N")]
    pub prefill_chunk: Option<usize>,
    /// The default sampling knobs of requests (each request may send its own temperature,
    /// top_k and top_p: they are per-lane device state; the seed is compiled in, and a
    /// request's seed picks its RNG stream).
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Use deterministic random weights: only config.json is read.
    #[arg(long)]
    pub random_weights: bool,
    /// With --random-weights: plant a controlled acceptance P (0..=1, a benchmarking aid):
    /// the target's greedy next token is a fixed permutation of the current token, and a
    /// `draft_model` draft agrees with it on a fraction P of the tokens, so each drafted
    /// token is accepted with probability ≈ P. Needs untied lm_heads.
    #[arg(long, value_name = "P", requires = "random_weights", value_parser = parse_fraction)]
    pub synthetic_acceptance: Option<f64>,
}

/// A fraction in [0, 1].
fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("expected a number from 0 to 1, found `{s}`")),
    }
}
