//! Command-line syntax.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

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

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The IR interpreter: exact, slow, needs no GPU.
    Cpu,
    /// Generated kernels on GPU 0, one captured CUDA graph per step (needs a build with
    /// `--features cuda` and an NVIDIA driver).
    Cuda,
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
        /// Compile the speculative engine this spec.toml describes (its step, prefills and
        /// batch buckets) rather than plain decoding alone.
        #[arg(long)]
        spec: Option<PathBuf>,
    },
    /// Print an engine's IR, per-op shapes and byte counts.
    Inspect {
        /// Engine directory written by `specc compile`.
        engine: PathBuf,
    },
    /// Generate text greedily from a prompt.
    Run {
        /// Model or engine directory; the embedded default if omitted.
        model: Option<PathBuf>,
        #[arg(long)]
        prompt: String,
        /// Tokens to generate at most (clamped, with a note, to what fits in the context).
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
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
        /// Also write the prompt ids and generated ids as JSON here (for parity checks).
        #[arg(long)]
        ids_out: Option<PathBuf>,
        /// Use deterministic random weights: only config.json is read (MODEL may be the
        /// config file itself).
        #[arg(long)]
        random_weights: bool,
    },
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
}
