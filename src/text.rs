//! Tokenizer loading and streaming detokenisation.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use specc_models::tokenizer::Tokenizer;
use specc_models::ModelSpec;

pub struct TextCodec {
    /// `None`: a model without a tokenizer (random weights from a bare config), served on
    /// token ids alone ([`TextCodec::ids_only`]).
    tok: Option<Tokenizer>,
}

impl TextCodec {
    /// The codec of a model with no tokenizer (`--random-weights` from a bare config, as
    /// vLLM's `--skip-tokenizer-init`): prompts must be token ids; generated ids come back
    /// as their decimal numbers, each after a space (one text chunk per token).
    pub fn ids_only() -> Self {
        TextCodec { tok: None }
    }

    /// Loads the tokenizer of `model_dir` (`tokenizer.json`, else Kimi's `tiktoken.model`)
    /// and checks that every id it can produce lies inside the vocabulary of `spec`
    /// (resolved from `config`): an id past it would be clamped by the embedding into a
    /// wrong token, silently.
    pub fn open(model_dir: &Path, spec: &ModelSpec, config: &Path) -> Result<Self> {
        let Some(tok) = Tokenizer::from_dir(model_dir)? else {
            bail!(
                "{}: tokenizer.json not found (a Hugging Face tokenizer file, or Kimi's tiktoken.model, is required to run text)",
                model_dir.display()
            );
        };
        if let Some((id, token, count)) = tok.max_id() {
            if id as usize >= spec.vocab {
                bail!(
                    "{}: expected token ids below vocab_size ({}, {}), found id {id} (token {}; {count} ids in all)",
                    tok.file().display(),
                    spec.vocab,
                    config.display(),
                    serde_json::to_string(&token).unwrap_or_default(),
                );
            }
        }
        Ok(TextCodec { tok: Some(tok) })
    }

    /// Token ids of `text`, without special tokens (the caller adds BOS).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let tok = self.tok.as_ref().ok_or_else(|| {
            anyhow!("this model has no tokenizer (random weights from a config): send token ids")
        })?;
        tok.encode(text)
            .map_err(|e| anyhow!("{}: cannot encode prompt: {e}", self.file_name()))
    }

    /// The vocabulary's text of token `id` (BOS / EOS names for chat templates).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.tok.as_ref()?.id_to_token(id)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.tok {
            Some(tok) => tok
                .decode(ids, true)
                .map_err(|e| anyhow!("{}: cannot decode ids: {e}", self.file_name())),
            None => Ok(ids.iter().map(|i| format!(" {i}")).collect()),
        }
    }

    fn file_name(&self) -> String {
        self.tok
            .as_ref()
            .and_then(|t| t.file().file_name())
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    }
}

/// Turns a growing id sequence into text deltas. Decoding the whole tail each time keeps
/// multi-token characters intact; a delta is held back while it ends in U+FFFD (an
/// incomplete UTF-8 sequence).
pub struct Streamer<'a> {
    codec: &'a TextCodec,
    ids: Vec<u32>,
    printed: usize,
}

impl<'a> Streamer<'a> {
    pub fn new(codec: &'a TextCodec) -> Self {
        Streamer {
            codec,
            ids: Vec::new(),
            printed: 0,
        }
    }

    /// Adds a token and returns the newly completed text, if any.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.codec.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        // Decoding more tokens can rewrite earlier text (rare); print only a clean suffix.
        let delta = text.get(self.printed..).unwrap_or("").to_string();
        self.printed = self.printed.max(text.len());
        Ok(delta)
    }
}

/// Ends generation at the first occurrence of any stop string in the streamed text. Text is
/// printed as soon as it cannot be the start of an occurrence: [`StopScan::push`] holds back
/// the longest tail that is a prefix of some stop string, so every occurrence lies in the
/// text not yet printed, and the text before it is printed exactly once.
pub struct StopScan {
    stops: Vec<String>,
    held: String,
}

impl StopScan {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> Self {
        StopScan {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds streamed text; returns what may be printed now and whether a stop string was
    /// reached (then the returned text is everything before it, and nothing follows).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        self.held.push_str(delta);
        let first = self.stops.iter().filter_map(|s| self.held.find(s)).min();
        if let Some(at) = first {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        let keep = self.held_back();
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }

    /// What is still held back (printed when generation ends without a stop string).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Bytes of the longest tail of `held` that is a proper prefix of a stop string.
    fn held_back(&self) -> usize {
        let h = &self.held;
        (1..=h.len())
            .rev()
            .filter(|&n| h.is_char_boundary(h.len() - n))
            .find(|&n| {
                let tail = &h[h.len() - n..];
                self.stops
                    .iter()
                    .any(|s| s.len() > n && s.starts_with(tail))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::StopScan;

    /// Streams `deltas`; returns the printed text and whether a stop string ended it.
    fn scan(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopScan::new(&stops);
        let mut printed = String::new();
        for d in deltas {
            let (out, stop) = s.push(d);
            printed.push_str(&out);
            if stop {
                return (printed, true);
            }
        }
        printed.push_str(&s.flush());
        (printed, false)
    }

    #[test]
    fn stops_at_the_first_occurrence() {
        assert_eq!(
            scan(&["END"], &["ab", "cE", "N", "Dxy"]),
            ("abc".into(), true)
        );
        assert_eq!(scan(&["\n\n", "b"], &["a\n", "\nb"]), ("a".into(), true));
        // The earliest occurrence of any stop string, not the first string's.
        assert_eq!(scan(&["cd", "bcde"], &["abcdef"]), ("a".into(), true));
        assert_eq!(scan(&["x"], &["x"]), (String::new(), true));
    }

    #[test]
    fn holds_back_only_possible_starts() {
        let stops = vec!["END".to_string()];
        let mut s = StopScan::new(&stops);
        assert_eq!(s.push("aEN"), ("a".into(), false));
        assert_eq!(s.push("x"), ("ENx".into(), false), "not a stop after all");
        assert_eq!(scan(&["END"], &["aE", "N"]), ("aEN".into(), false));
        assert_eq!(scan(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(
            scan(&[""], &["a"]),
            ("a".into(), false),
            "empty stops ignored"
        );
        // Multi-byte text is split at character boundaries only.
        assert_eq!(scan(&["é!"], &["aé", "é", "!"]), ("aé".into(), true));
    }
}
