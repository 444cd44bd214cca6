//! An engine on disk (or embedded in a binary): `engine.json` and the cubins it lists.
//! Reading checks everything the runtime will rely on, so a damaged, stale or foreign
//! engine is a one-line error naming the file and what differs, never a panic later.

use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::abi::Loc;
use super::{Cubin, Engine, FORMAT_VERSION, SPECC_VERSION};

/// The manifest's file name inside an engine directory.
pub const ENGINE_FILE: &str = "engine.json";
/// The human-readable report beside it (never read back).
pub const PLAN_FILE: &str = "plan.txt";

/// Why an engine cannot be read or used: the file and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {what}", path.display())]
pub struct EngineError {
    pub path: PathBuf,
    pub what: String,
}

fn err(path: impl Into<PathBuf>, what: impl Into<String>) -> EngineError {
    EngineError {
        path: path.into(),
        what: what.into(),
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Engine {
    /// Writes `engine.json` and every cubin into `dir` (created if needed).
    pub fn write_dir(&self, dir: &Path) -> Result<(), EngineError> {
        let kdir = dir.join("kernels");
        fs::create_dir_all(&kdir).map_err(|e| err(&kdir, format!("cannot create: {e}")))?;
        for c in &self.cubins {
            let file = self
                .cubin_file(c.module, c.arch)
                .ok_or_else(|| err(dir.join(ENGINE_FILE), "a cubin the manifest does not list"))?;
            let p = dir.join(file);
            fs::write(&p, &c.bytes).map_err(|e| err(&p, format!("cannot write: {e}")))?;
        }
        let p = dir.join(ENGINE_FILE);
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| err(&p, format!("cannot serialise: {e}")))?;
        fs::write(&p, json).map_err(|e| err(&p, format!("cannot write: {e}")))
    }

    /// Reads and checks the engine in `dir`.
    pub fn read_dir(dir: &Path) -> Result<Engine, EngineError> {
        let p = dir.join(ENGINE_FILE);
        if !p.is_file() {
            return Err(err(dir, "not an engine directory (no engine.json)"));
        }
        let json = fs::read_to_string(&p).map_err(|e| err(&p, format!("cannot read: {e}")))?;
        Engine::from_json(&json, &p, |file| {
            let c = dir.join(file);
            fs::read(&c).map_err(|e| err(&c, format!("missing or unreadable cubin: {e}")))
        })
    }

    /// Parses a manifest (named `path` in errors) and attaches the cubins `read` returns
    /// for each listed file, checking each against its recorded hash.
    pub fn from_json(
        json: &str,
        path: &Path,
        mut read: impl FnMut(&str) -> Result<Vec<u8>, EngineError>,
    ) -> Result<Engine, EngineError> {
        let head: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| err(path, format!("malformed engine manifest: {e}")))?;
        let version = head.get("format_version").and_then(|v| v.as_u64());
        if version != Some(FORMAT_VERSION as u64) {
            return Err(err(
                path,
                format!(
                    "field \"format_version\": expected {FORMAT_VERSION}, found {} (rebuild the engine with this specc)",
                    version.map_or("nothing".to_string(), |v| v.to_string())
                ),
            ));
        }
        let by = head.get("specc_version").and_then(|v| v.as_str());
        if by != Some(SPECC_VERSION) {
            return Err(err(
                path,
                format!(
                    "field \"specc_version\": built by specc {}, this is specc {SPECC_VERSION} (rebuild the engine)",
                    by.unwrap_or("?")
                ),
            ));
        }
        let mut e: Engine = serde_json::from_value(head)
            .map_err(|e| err(path, format!("malformed engine manifest: {e}")))?;
        e.check(path)?;
        for (m, module) in e.modules.iter().enumerate() {
            for c in &module.cubins {
                let bytes = read(&c.file)?;
                let got = sha256_hex(&bytes);
                if got != c.sha256 || bytes.len() as u64 != c.bytes {
                    return Err(err(
                        path.with_file_name(&c.file),
                        format!(
                            "content differs from the manifest (sha256 {got}, expected {})",
                            c.sha256
                        ),
                    ));
                }
                e.cubins.push(Cubin {
                    module: m as u32,
                    arch: c.arch,
                    bytes,
                });
            }
        }
        Ok(e)
    }

    /// File of the cubin of `module` for `arch`, as the manifest lists it.
    pub fn cubin_file(&self, module: u32, arch: super::Arch) -> Option<&str> {
        self.modules
            .get(module as usize)?
            .cubins
            .iter()
            .find(|c| c.arch == arch)
            .map(|c| c.file.as_str())
    }

    /// Every index and range the runtime follows: kernels, modules, slots, arena offsets,
    /// I/O ranges, graph texts.
    pub fn check(&self, path: &Path) -> Result<(), EngineError> {
        let bad = |what: String| Err(err(path, what));
        for k in &self.kernels {
            if k.module as usize >= self.modules.len() {
                return bad(format!(
                    "kernel {}: module {} does not exist",
                    k.name, k.module
                ));
            }
        }
        for p in &self.plans {
            let name = format!("{} B={} T={}", p.role, p.bucket.b, p.bucket.t);
            for (i, l) in p.launches.iter().enumerate() {
                if l.kernel as usize >= self.kernels.len() {
                    return bad(format!(
                        "{name}: launch {i} names kernel {}, which does not exist",
                        l.kernel
                    ));
                }
                for loc in &l.operands {
                    let (slot, offset) = match loc {
                        Loc::Arena { offset } => (None, *offset),
                        Loc::Table { slot, offset } => (Some(*slot), *offset),
                        Loc::TensorMap(m) => (m.slot, m.offset),
                    };
                    match slot {
                        Some(s) if s as usize >= p.slots.len() => {
                            return bad(format!(
                                "{name}: launch {i} reads slot {s} of {}",
                                p.slots.len()
                            ));
                        }
                        None if offset >= p.arena_bytes.max(1) => {
                            return bad(format!(
                                "{name}: launch {i} reads arena offset {offset} past its {} bytes",
                                p.arena_bytes
                            ));
                        }
                        _ => {}
                    }
                }
            }
            let a = &p.arena;
            let ends = [
                a.values_bytes,
                a.counters_offset.saturating_add(a.counters_bytes),
                a.scratch_offset.saturating_add(a.scratch_bytes),
            ];
            if ends.iter().any(|&e| e > p.arena_bytes)
                || a.counters_offset < a.values_bytes
                || a.scratch_offset < a.counters_offset.saturating_add(a.counters_bytes)
            {
                return bad(format!(
                    "{name}: arena regions {a:?} overlap or pass its {} bytes",
                    p.arena_bytes
                ));
            }
            for io in &p.io {
                if io.offset.saturating_add(io.bytes) > p.arena_bytes {
                    return bad(format!("{name}: `{}` lies past the arena", io.name));
                }
            }
            for s in &p.slots {
                if let super::Slot::State(n) = s {
                    if !self.states.iter().any(|st| st.name == *n) {
                        return bad(format!(
                            "{name}: state `{n}` is not among the engine's states"
                        ));
                    }
                }
            }
            if self.graph_ir(p.role).is_none() {
                return bad(format!("{name}: no graph text for its role"));
            }
        }
        for g in &self.graphs {
            let parsed = crate::text::parse(&g.ir)
                .map_err(|e| err(path, format!("graph `{}`: {e}", g.role)))?;
            crate::verify(&parsed).map_err(|e| err(path, format!("graph `{}`: {e}", g.role)))?;
        }
        for c in [Some(&self.plain), self.spec.as_ref()]
            .into_iter()
            .flatten()
        {
            for r in c.roles() {
                if self.graph_ir(r).is_none() {
                    return bad(format!("method {}: graph `{r}` is missing", c.method));
                }
            }
        }
        Ok(())
    }
}
