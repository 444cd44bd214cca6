//! Hugging Face `tokenizer.json` through the `tokenizers` library, with that library's
//! panics on malformed files (found by `tests/fuzz.rs`) turned into errors naming the file.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Once;

use tokenizers::Tokenizer;

use crate::error::ModelError;

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
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Tokenizer, ModelError> {
    let err = |msg: String| ModelError::Tokenizer {
        file: path.to_path_buf(),
        msg,
    };
    guarded(|| Tokenizer::from_bytes(bytes))
        .map_err(err)?
        .map_err(|e| err(e.to_string()))
}

/// Reads and parses the tokenizer file `path`.
pub fn load(path: &Path) -> Result<Tokenizer, ModelError> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        file: path.to_path_buf(),
        source,
    })?;
    parse(path, &bytes)
}

/// The ids of `text` (no special tokens added).
pub fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
    match guarded(|| tok.encode(text, false)) {
        Ok(Ok(enc)) => Ok(enc.get_ids().to_vec()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(msg) => Err(msg),
    }
}

/// The text of `ids`, special tokens skipped when `skip_special`.
pub fn decode(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> Result<String, String> {
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
