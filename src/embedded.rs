//! The embedded default model: a tiny trained Llama shipped in `models/default/` with its
//! standalone draft and spec.toml, compiled into the binary, so `specc run --prompt ...`
//! speculates with no model directory at all.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};

const FILES: [(&str, &[u8]); 6] = [
    (
        "config.json",
        include_bytes!("../models/default/config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../models/default/model.safetensors"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../models/default/tokenizer.json"),
    ),
    (
        "draft/config.json",
        include_bytes!("../models/default/draft/config.json"),
    ),
    (
        "draft/model.safetensors",
        include_bytes!("../models/default/draft/model.safetensors"),
    ),
    ("spec.toml", include_bytes!("../models/default/spec.toml")),
];

/// The embedded default's spec.toml (a standalone draft), inside the materialised folder.
pub const SPEC_FILE: &str = "spec.toml";

/// FNV-1a over every embedded byte: names the cache folder, so a binary with other
/// embedded weights never reuses a stale copy.
fn fingerprint() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, bytes) in FILES {
        for &b in name.as_bytes().iter().chain(bytes) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn cache_root() -> PathBuf {
    if let Some(d) = std::env::var_os("SPECC_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("specc");
    }
    if let Some(d) = std::env::var_os("HOME") {
        return PathBuf::from(d).join(".cache").join("specc");
    }
    std::env::temp_dir().join("specc")
}

/// Materialises the embedded model as an ordinary model directory (once per fingerprint)
/// and returns its path.
pub fn default_model_dir() -> Result<PathBuf> {
    let dir = cache_root().join(format!("default-{:016x}", fingerprint()));
    if FILES.iter().all(|(n, b)| {
        fs::metadata(dir.join(n))
            .map(|m| m.len() == b.len() as u64)
            .unwrap_or(false)
    }) {
        return Ok(dir);
    }
    fs::create_dir_all(dir.join("draft")).with_context(|| format!("creating {}", dir.display()))?;
    for (name, bytes) in FILES {
        // Write then rename, so a concurrent reader never sees a half-written file.
        let tmp = dir.join(format!("{name}.tmp{}", std::process::id()));
        fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, dir.join(name)).with_context(|| format!("writing {name}"))?;
    }
    Ok(dir)
}
