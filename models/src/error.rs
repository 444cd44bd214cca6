//! The crate's one error type.
//!
//! Invariant: every variant displays as ONE line that names the file (as the path the user
//! gave joined with the file name), the field or tensor at fault, and what was expected
//! versus what was found. Values quoted from user files are shortened by [`short`] so a
//! huge JSON value cannot break that rule.

use std::fmt;
use std::path::{Path, PathBuf};

use specc_ir::IrError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    /// A checkpoint differs from the one an engine was built from.
    #[error("{}: {what} (rebuild the engine)", file.display())]
    Changed { file: PathBuf, what: String },
    /// The file cannot be opened or read.
    #[error("{}: cannot read: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    /// The path exists but is not a regular file (a FIFO, a device, a directory).
    #[error("{}: expected a regular file, found {found}", file.display())]
    NotRegular { file: PathBuf, found: &'static str },
    /// The file is not JSON at all.
    #[error("{}: malformed JSON at line {line} column {column}: {msg}", file.display())]
    Json {
        file: PathBuf,
        line: usize,
        column: usize,
        msg: String,
    },
    /// The TOML file (spec.toml) cannot be parsed or has an unknown key.
    #[error("{}: line {line} column {column}: {msg}", file.display())]
    Toml {
        file: PathBuf,
        line: usize,
        column: usize,
        msg: String,
    },
    /// A JSON field is missing, has the wrong type, or holds a value we cannot use.
    /// `field` is a dotted path (`rope_scaling.factor`).
    #[error("{}: field \"{field}\": expected {expected}, found {found}", file.display())]
    Field {
        file: PathBuf,
        field: String,
        expected: String,
        found: String,
    },
    /// A checkpoint tensor is missing or its shape / dtype differ from what the lowered
    /// graph needs. `found` is `no such tensor` when it is missing.
    #[error("{}: tensor \"{tensor}\": expected {expected}, found {found}", file.display())]
    Tensor {
        file: PathBuf,
        tensor: String,
        expected: String,
        found: String,
    },
    /// A safetensors file whose header promises more data than the file holds.
    #[error(
        "{}: truncated: header says {header_bytes} bytes of data, file has {file_bytes}",
        file.display()
    )]
    Truncated {
        file: PathBuf,
        header_bytes: u64,
        file_bytes: u64,
    },
    /// A safetensors header that cannot be parsed or is inconsistent.
    #[error("{}: invalid safetensors header: {msg}", file.display())]
    Header { file: PathBuf, msg: String },

    #[error("{}: cannot load tokenizer: {msg}", file.display())]
    Tokenizer { file: PathBuf, msg: String },
    /// A shard named by `model.safetensors.index.json` does not exist.
    #[error(
        "{}: weight_map: tensor \"{tensor}\": expected shard file \"{shard}\" to exist, found no such file",
        file.display()
    )]
    MissingShard {
        file: PathBuf,
        tensor: String,
        shard: String,
    },
    /// A model directory without any checkpoint.
    #[error(
        "{}: expected model.safetensors or model.safetensors.index.json, found neither",
        dir.display()
    )]
    NoCheckpoint { dir: PathBuf },
    /// A request that the model cannot serve (prompt too long, token id out of range...).
    #[error("{what}: expected {expected}, found {found}")]
    Request {
        what: String,
        expected: String,
        found: String,
    },
    /// `--synthetic-acceptance` asked of a model or method that cannot carry it.
    #[error("{}: --synthetic-acceptance {why}", file.display())]
    SyntheticAcceptance { file: PathBuf, why: String },
    /// Building the graph failed: a bug in the lowering, not in the user's files.
    #[error("lowering {model}: {source}")]
    Lower { model: String, source: IrError },
    /// The interpreter rejected a run.
    #[error("running {graph}: {source}")]
    Run { graph: String, source: IrError },
}

impl ModelError {
    pub(crate) fn io(file: &Path, source: std::io::Error) -> Self {
        ModelError::Io {
            file: file.to_path_buf(),
            source,
        }
    }

    pub(crate) fn json(file: &Path, e: &serde_json::Error) -> Self {
        // serde_json appends " at line L column C" to its message; we print those ourselves.
        let msg = e.to_string();
        let msg = match msg.rfind(" at line ") {
            Some(i) => msg[..i].to_string(),
            None => msg,
        };
        ModelError::Json {
            file: file.to_path_buf(),
            line: e.line(),
            column: e.column(),
            msg,
        }
    }

    pub(crate) fn field(
        file: &Path,
        field: impl Into<String>,
        expected: impl Into<String>,
        found: impl fmt::Display,
    ) -> Self {
        ModelError::Field {
            file: file.to_path_buf(),
            field: field.into(),
            expected: expected.into(),
            found: short(&found.to_string()),
        }
    }

    pub(crate) fn missing(file: &Path, field: impl Into<String>, expected: &str) -> Self {
        Self::field(file, field, expected, "nothing (field absent)")
    }

    pub(crate) fn request(
        what: impl Into<String>,
        expected: impl Into<String>,
        found: impl fmt::Display,
    ) -> Self {
        ModelError::Request {
            what: what.into(),
            expected: expected.into(),
            found: found.to_string(),
        }
    }
}

/// One-line, bounded rendering of a value quoted from a user file.
pub(crate) fn short(s: &str) -> String {
    const MAX: usize = 80;
    let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= MAX {
        one_line
    } else {
        let cut: String = one_line.chars().take(MAX).collect();
        format!("{cut}...")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_is_one_bounded_line() {
        let long = "x\n".repeat(200);
        let s = short(&long);
        assert!(!s.contains('\n'));
        assert!(s.len() <= 83);
        assert_eq!(short("[1,\n 2]"), "[1, 2]");
    }
}
