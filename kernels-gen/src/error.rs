//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can fail in kernel generation or compilation.
///
/// Generation errors are raised before any text is printed: a generator validates its
/// parameters first, so printing itself cannot fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A generator parameter breaks a rule of its family.
    #[error("{family}: parameter `{field}` {reason}")]
    Param {
        family: &'static str,
        field: &'static str,
        reason: String,
    },
    /// An op, or an operand type, that no generator handles (e.g. `moe_experts` in the
    /// generic family, which only covers ops the fused families leave over).
    #[error("{family}: `{op}` is not supported: {reason}")]
    Unsupported {
        family: &'static str,
        op: &'static str,
        reason: String,
    },
    /// `libnvrtc` could not be loaded (cudarc would panic; this is checked first).
    #[error("NVRTC is not available: {reason}")]
    NvrtcUnavailable { reason: String },
    /// No directory with `cuda_bf16.h` was found for `--include-path`.
    #[error("CUDA headers (cuda_bf16.h) not found; searched {searched:?}; set SPECC_CUDA_INCLUDE (scripts/nvrtc-env.sh)")]
    HeadersNotFound { searched: Vec<PathBuf> },
    /// An NVRTC API call other than the compilation itself failed.
    #[error("NVRTC {call} failed: {status}")]
    Nvrtc { call: &'static str, status: String },
    /// The compilation failed; carries the program log and the numbered source (boxed: the
    /// texts would make every `Result` of this crate, and of those that wrap it, large).
    #[error("{0}")]
    Compile(Box<CompileFailure>),
    /// Reading or writing the on-disk kernel cache.
    #[error("kernel cache at {path}: {source}")]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What NVRTC said about a program it could not compile.
#[derive(Debug, thiserror::Error)]
#[error("NVRTC could not compile `{name}` for {arch} ({status}):\n{log}\n--- source ---\n{numbered_source}")]
pub struct CompileFailure {
    pub name: String,
    pub arch: String,
    pub status: String,
    pub log: String,
    pub numbered_source: String,
}

impl Error {
    pub(crate) fn param(
        family: &'static str,
        field: &'static str,
        reason: impl Into<String>,
    ) -> Self {
        Error::Param {
            family,
            field,
            reason: reason.into(),
        }
    }
}

/// `source` with 1-based line numbers, as compiler logs count them.
pub fn number_lines(source: &str) -> String {
    let width = source.lines().count().max(1).to_string().len();
    let mut out = String::with_capacity(source.len() + source.len() / 8);
    for (i, line) in source.lines().enumerate() {
        out.push_str(&format!("{:>width$} | {line}\n", i + 1));
    }
    out
}
