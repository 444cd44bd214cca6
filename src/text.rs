//! Tokenizer loading and streaming detokenisation.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use specc_models::files::is_regular;
use specc_models::tokenizer;
use specc_models::ModelSpec;
use tokenizers::Tokenizer;

pub struct TextCodec {
    tok: Tokenizer,
}

impl TextCodec {
    /// Loads `model_dir/tokenizer.json` (a regular file) and checks that every id it can
    /// produce lies inside the vocabulary of `spec` (resolved from `config`): an id past it
    /// would be clamped by the embedding into a wrong token, silently.
    pub fn open(model_dir: &Path, spec: &ModelSpec, config: &Path) -> Result<Self> {
        let path = model_dir.join("tokenizer.json");
        if !is_regular(&path)? {
            bail!(
                "{}: tokenizer.json not found (a Hugging Face tokenizer file is required to run text)",
                model_dir.display()
            );
        }
        let tok = tokenizer::load(&path)?;
        let vocab = tok.get_vocab(true);
        if let Some((token, &id)) = vocab.iter().max_by_key(|(_, &id)| id) {
            if id as usize >= spec.vocab {
                bail!(
                    "{}: expected token ids below vocab_size ({}, {}), found id {id} (token {}; {} ids in all)",
                    path.display(),
                    spec.vocab,
                    config.display(),
                    serde_json::to_string(token).unwrap_or_default(),
                    vocab.len()
                );
            }
        }
        Ok(TextCodec { tok })
    }

    /// Token ids of `text`, without special tokens (the caller adds BOS).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        tokenizer::encode(&self.tok, text)
            .map_err(|e| anyhow!("tokenizer.json: cannot encode prompt: {e}"))
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        tokenizer::decode(&self.tok, ids, true)
            .map_err(|e| anyhow!("tokenizer.json: cannot decode ids: {e}"))
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
