//! Where the prompt comes from: `--prompt TEXT`, `--prompt -` (standard input) or
//! `--prompt-file PATH` (prompts longer than the command line allows).

use std::io::Read;
use std::path::Path;

use anyhow::{anyhow, Result};

/// The prompt text; invalid UTF-8 or an unreadable source is a one-line error naming it.
pub fn read(prompt: Option<&str>, file: Option<&Path>) -> Result<String> {
    let (bytes, source) = match (prompt, file) {
        (Some("-"), _) => {
            let mut b = Vec::new();
            std::io::stdin()
                .read_to_end(&mut b)
                .map_err(|e| anyhow!("--prompt -: cannot read standard input: {e}"))?;
            (b, "--prompt -: standard input".to_string())
        }
        (Some(text), _) => return Ok(text.to_string()),
        (None, Some(p)) => {
            let b = std::fs::read(p)
                .map_err(|e| anyhow!("--prompt-file {}: cannot read: {e}", p.display()))?;
            (b, format!("--prompt-file {}", p.display()))
        }
        (None, None) => return Err(anyhow!("--prompt: expected a prompt (or --prompt-file)")),
    };
    String::from_utf8(bytes).map_err(|e| {
        anyhow!(
            "{source}: not valid UTF-8 (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}
