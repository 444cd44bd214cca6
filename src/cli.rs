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
        /// KV-cache capacity per sequence (default: the model's max_position_embeddings).
        #[arg(long)]
        max_context: Option<u64>,
        /// Use deterministic random weights: only config.json is read (MODEL may be the
        /// config file itself).
        #[arg(long)]
        random_weights: bool,
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
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// KV-cache capacity per sequence (default: the spec's max_context, else the model's
        /// max_position_embeddings).
        #[arg(long)]
        max_context: Option<u64>,
        /// Speculative decoding as described by this spec.toml (method, draft, k, acceptance).
        #[arg(long)]
        spec: Option<PathBuf>,
        /// Use deterministic random weights: only config.json is read (MODEL may be the
        /// config file itself).
        #[arg(long)]
        random_weights: bool,
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
