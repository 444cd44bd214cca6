//! The embedded default model: a tiny trained Llama shipped in `models/default/` with its
//! standalone draft and spec.toml, compiled into the binary, so `specc run --prompt ...`
//! speculates with no model directory at all.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

const FILES: [(&str, &[u8]); 7] = [
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
    (
        "chat_template.jinja",
        include_bytes!("../models/default/chat_template.jinja"),
    ),
];

/// The embedded default's spec.toml (a standalone draft), inside the materialised folder.
pub const SPEC_FILE: &str = "spec.toml";

/// Written last into a materialised copy: `{sha256}  {name}` of every file, one a line.
/// A copy is reused only when it holds this marker for exactly the embedded files and every
/// file's content hashes as the marker says.
const MARKER: &str = ".complete";

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The marker's text for the embedded files (hashed once per process).
fn manifest() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        FILES
            .iter()
            .map(|(name, bytes)| format!("{}  {name}\n", sha256_hex(bytes)))
            .collect()
    })
}

/// Names the cache folder, so a binary with other embedded files never reuses a stale copy.
fn fingerprint() -> String {
    sha256_hex(manifest().as_bytes())[..16].to_string()
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

/// Whether `dir` holds the marker of exactly the embedded files and every file's content
/// has the hash it records.
fn is_complete(dir: &Path) -> bool {
    let want = manifest();
    if fs::read_to_string(dir.join(MARKER)).ok().as_deref() != Some(want) {
        return false;
    }
    want.lines().all(|line| {
        let Some((hash, name)) = line.split_once("  ") else {
            return false;
        };
        fs::read(dir.join(name)).is_ok_and(|bytes| sha256_hex(&bytes) == hash)
    })
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a concurrent reader
/// never sees a half-written file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

fn materialise(dir: &Path) -> Result<()> {
    if is_complete(dir) {
        return Ok(());
    }
    // Anything missing or different: drop the marker first, rewrite every file, and mark
    // the copy complete only once all of them are in place.
    match fs::remove_file(dir.join(MARKER)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("removing {}", dir.join(MARKER).display()))
        }
    }
    fs::create_dir_all(dir.join("draft")).with_context(|| format!("creating {}", dir.display()))?;
    for (name, bytes) in FILES {
        write_atomic(&dir.join(name), bytes)?;
    }
    write_atomic(&dir.join(MARKER), manifest().as_bytes())?;
    if !is_complete(dir) {
        anyhow::bail!(
            "{}: the materialised embedded model does not read back as written",
            dir.display()
        );
    }
    Ok(())
}

/// Materialises the embedded model as an ordinary model directory (once per fingerprint;
/// re-written when any file's content differs from the embedded bytes) and returns its path.
pub fn default_model_dir() -> Result<PathBuf> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Some(d) = DIR.get() {
        return Ok(d.clone());
    }
    let dir = cache_root().join(format!("default-{}", fingerprint()));
    materialise(&dir)?;
    Ok(DIR.get_or_init(|| dir).clone())
}
