//! A model directory's tokenizer: Hugging Face `tokenizer.json` through the `tokenizers`
//! library (its panics on malformed files, found by `tests/fuzz.rs`, turned into errors
//! naming the file), or Kimi's `tiktoken.model` ([`crate::tiktoken`]) when a directory has
//! that and no `tokenizer.json`.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;

use tokenizers::Tokenizer as HfTokenizer;

use crate::error::ModelError;
use crate::files::is_regular;
use crate::tiktoken::Tiktoken;

/// The tokenizer file names a model directory is searched for, in order of preference.
pub const HF_FILE: &str = "tokenizer.json";
pub const TIKTOKEN_FILE: &str = "tiktoken.model";

/// Either backend, behind one encode / decode.
pub enum Tokenizer {
    Hf {
        tok: Box<HfTokenizer>,
        file: PathBuf,
    },
    Tiktoken(Box<Tiktoken>),
}

impl Tokenizer {
    /// `dir/tokenizer.json` when it exists, else `dir/tiktoken.model` (with
    /// `tokenizer_config.json`); `Ok(None)` when there is neither.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, ModelError> {
        let hf = dir.join(HF_FILE);
        if is_regular(&hf)? {
            let tok = load(&hf)?;
            return Ok(Some(Tokenizer::Hf {
                tok: Box::new(tok),
                file: hf,
            }));
        }
        if is_regular(&dir.join(TIKTOKEN_FILE))? {
            return Ok(Some(Tokenizer::Tiktoken(Box::new(Tiktoken::load(dir)?))));
        }
        Ok(None)
    }

    /// The file it was read from (for messages).
    pub fn file(&self) -> &Path {
        match self {
            Tokenizer::Hf { file, .. } => file,
            Tokenizer::Tiktoken(t) => t.ranks_file(),
        }
    }

    /// The highest id it can produce, that token's text and the number of ids (for the
    /// vocabulary check).
    pub fn max_id(&self) -> Option<(u32, String, usize)> {
        match self {
            Tokenizer::Hf { tok, .. } => {
                let vocab = tok.get_vocab(true);
                let count = vocab.len();
                vocab
                    .into_iter()
                    .max_by_key(|(_, id)| *id)
                    .map(|(token, id)| (id, token, count))
            }
            Tokenizer::Tiktoken(t) => {
                let id = t.num_ids().checked_sub(1)?;
                let token = t.decode(&[id], false).unwrap_or_default();
                Some((id, token, t.num_ids() as usize))
            }
        }
    }

    /// The ids of `text` (no BOS added; special-token text maps to its id in both backends).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Tokenizer::Hf { tok, .. } => encode(tok, text),
            Tokenizer::Tiktoken(t) => t.encode(text),
        }
    }

    /// The vocabulary's text of token `id` (a special token's name, e.g. BOS / EOS for chat
    /// templates); `None` past the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        match self {
            Tokenizer::Hf { tok, .. } => tok.id_to_token(id),
            Tokenizer::Tiktoken(t) => (id < t.num_ids())
                .then(|| t.decode(&[id], false).ok())
                .flatten(),
        }
    }

    /// The text of `ids`, special tokens skipped when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, String> {
        match self {
            Tokenizer::Hf { tok, .. } => decode(tok, ids, skip_special),
            Tokenizer::Tiktoken(t) => t.decode(ids, skip_special),
        }
    }
}

thread_local! {
    /// Whether this thread is inside [`guarded`] (its panics are reported as errors).
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, returning a panic inside it as `Err(message)`. The panic hook stays quiet for
/// guarded panics, so a user sees one error line, not a backtrace note first.
pub fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let was = GUARDED.with(|g| g.replace(true));
    let out = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(was));
    out.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the tokenizers library panicked".to_string())
    })
}

/// Parses the tokenizer file `path` (contents `bytes`).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<HfTokenizer, ModelError> {
    let err = |msg: String| ModelError::Tokenizer {
        file: path.to_path_buf(),
        msg,
    };
    guarded(|| HfTokenizer::from_bytes(bytes))
        .map_err(err)?
        .map_err(|e| err(e.to_string()))
}

/// Reads and parses the tokenizer file `path`.
pub fn load(path: &Path) -> Result<HfTokenizer, ModelError> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        file: path.to_path_buf(),
        source,
    })?;
    parse(path, &bytes)
}

/// The ids of `text` (no special tokens added).
pub fn encode(tok: &HfTokenizer, text: &str) -> Result<Vec<u32>, String> {
    match guarded(|| tok.encode(text, false)) {
        Ok(Ok(enc)) => Ok(enc.get_ids().to_vec()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(msg) => Err(msg),
    }
}

/// The text of `ids`, special tokens skipped when `skip_special`.
pub fn decode(tok: &HfTokenizer, ids: &[u32], skip_special: bool) -> Result<String, String> {
    match guarded(|| tok.decode(ids, skip_special)) {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(e)) => Err(e.to_string()),
        Err(msg) => Err(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default tokenizer cut inside its pre-tokenizer section: `tokenizers` 0.21 panics
    /// deserialising it (the first input `tests/fuzz.rs` found); here it is an error naming
    /// the file.
    #[test]
    fn a_truncated_tokenizer_is_an_error_not_a_panic() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("default/tokenizer.json");
        let full = std::fs::read(&file).unwrap();
        let err = parse(&file, &full[..704]).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: cannot load tokenizer: ", file.display())));
        assert!(!err.contains('\n'), "{err}");
        assert!(parse(&file, &full).is_ok());
    }
}
