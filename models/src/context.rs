//! The KV capacity per sequence an engine is built for (`max_context`), and where it came
//! from, so that errors and notes name the flag, file or default that set it.
//!
//! Rule: `--max-context` if given, else the spec's `max_context`, else the default:
//! `max_position_embeddings` capped at [`DEFAULT_CONTEXT_CAP`] (a Llama-3.1 config says
//! 131072 positions, whose KV cache alone would take 16 GiB at 8B). Given values must lie in
//! `1..=max_position_embeddings`. A backend may lower the default further to what fits its
//! memory ([`Context::cap`]); a given value is never changed.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::spec_config::SpecConfig;

/// The largest default context: more must be asked for.
pub const DEFAULT_CONTEXT_CAP: u64 = 4096;

/// Where a context came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContextFrom {
    /// `--max-context`.
    Flag,
    /// `max_context` of this spec.toml.
    Spec(PathBuf),
    /// The `max_context` an engine was built for (its engine.json).
    Engine(PathBuf),
    /// The `max_context` of the engine this binary carries.
    Builtin,
    /// The default, from the `max_position_embeddings` of this config.
    Default(PathBuf),
}

impl fmt::Display for ContextFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContextFrom::Flag => f.write_str("--max-context"),
            ContextFrom::Spec(p) => write!(f, "field \"max_context\" of {}", p.display()),
            ContextFrom::Engine(p) => write!(f, "\"max_context\" of {}", p.display()),
            ContextFrom::Builtin => f.write_str("the engine built into this binary"),
            ContextFrom::Default(p) => write!(
                f,
                "the default: max_position_embeddings of {}, at most {DEFAULT_CONTEXT_CAP}",
                p.display()
            ),
        }
    }
}

/// A chosen context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pub tokens: u64,
    pub from: ContextFrom,
    /// Why a default was lowered, for a note (`None`: not lowered).
    pub capped: Option<String>,
}

impl Context {
    /// The context of `spec` (resolved from `config`) given `flag` and the spec file `cfg`.
    pub fn choose(
        spec: &ModelSpec,
        config: &Path,
        flag: Option<u64>,
        cfg: Option<&SpecConfig>,
    ) -> Result<Context, ModelError> {
        let limit = spec.max_position as u64;
        let expected = format!(
            "1..={limit} (max_position_embeddings of {})",
            config.display()
        );
        if let Some(m) = flag {
            if m == 0 || m > limit {
                return Err(ModelError::request("--max-context", expected, m));
            }
            return Ok(Context::given(m, ContextFrom::Flag));
        }
        if let Some((c, m)) = cfg.and_then(|c| c.max_context.map(|m| (c, m))) {
            if m == 0 || m > limit {
                return Err(ModelError::field(&c.file, "max_context", expected, m));
            }
            return Ok(Context::given(m, ContextFrom::Spec(c.file.clone())));
        }
        let capped = (limit > DEFAULT_CONTEXT_CAP).then(|| {
            format!(
                "max_position_embeddings {limit} of {} is capped at {DEFAULT_CONTEXT_CAP} by default",
                config.display()
            )
        });
        Ok(Context {
            tokens: limit.min(DEFAULT_CONTEXT_CAP),
            from: ContextFrom::Default(config.to_path_buf()),
            capped,
        })
    }

    fn given(tokens: u64, from: ContextFrom) -> Context {
        Context {
            tokens,
            from,
            capped: None,
        }
    }

    /// Lowers a default context to `fits` tokens (`why` says what limits it); a given
    /// context is left alone, to fail the memory check with its own origin named.
    pub fn cap(&mut self, fits: u64, why: &str) {
        if matches!(self.from, ContextFrom::Default(_)) && fits < self.tokens {
            self.capped = Some(format!("{} tokens fit {why}", fits));
            self.tokens = fits;
        }
    }

    /// The note to print when a default was lowered.
    pub fn note(&self) -> Option<String> {
        self.capped.as_ref().map(|why| {
            format!(
                "max context {} tokens ({why}; --max-context sets it)",
                self.tokens
            )
        })
    }
}
