//! Safetensors checkpoints: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`.
//!
//! Opening reads every header and builds an index name → (file, dtype, shape, byte range).
//! Rules checked at open, so that nothing later can read out of bounds:
//! 1. the 8-byte header length and the header itself lie inside the file;
//! 2. each tensor's byte range is exactly `numel × dtype size` bytes;
//! 3. every byte range lies inside the file's data section (else: "truncated");
//! 4. no two tensors' byte ranges overlap (one write would change the other);
//! 5. every shard the index names is a plain relative path inside the model directory (no
//!    `..`, no absolute path; symlinks are followed as for any file), exists as a regular
//!    file and holds the tensors mapped to it.
//!
//! Reading a float tensor ([`Checkpoint::checked_bytes`], [`Checkpoint::load_f32`]) checks
//! that it holds no NaN or infinity, naming the tensor: a non-finite weight would otherwise
//! turn every logit into NaN and the argmax into token 0 without a word.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::Dtype;
use specc_ir::engine::{CheckpointRef, FileRef, TensorRef};
use specc_ir::interp::Tensor;
use specc_ir::{DType, Graph, TensorType};

use crate::coverage::Ignored;
use crate::error::ModelError;
use crate::files::{is_regular, read_text};

mod part;
pub mod planted;
mod quantised;
pub use part::scale_part;
pub use planted::{Plant, PlantRole};
pub use quantised::fp8e4m3_to_f32;

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Where one tensor's bytes are.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    /// Index into [`Checkpoint::files`].
    pub file: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub range: Range<usize>,
}

struct SafetensorsFile {
    path: PathBuf,
    mmap: Backing,
    /// SHA-256 of the header (length prefix + JSON); empty for synthesised files.
    header_sha256: String,
}

/// The bytes of a file: mapped from disk, or synthesised in memory on first read
/// (`--random-weights`: compiling a full-size engine reads no weight, so it makes none).
enum Backing {
    Mapped(Mmap),
    Random(Box<RandomFile>),
}

/// A synthesised file: its layout now, its bytes on first use.
struct RandomFile {
    seed: u64,
    /// Controlled acceptance: the embedding, head and final norm it overrides.
    plant: Option<Plant>,
    len: usize,
    jobs: Vec<RandomJob>,
    bytes: std::sync::OnceLock<Vec<u8>>,
}

/// One tensor of a [`RandomFile`].
struct RandomJob {
    name: String,
    dtype: DType,
    stored: Dtype,
    bytes: Range<usize>,
    shape: Vec<usize>,
}

impl std::ops::Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Random(f) => f.bytes.get_or_init(|| f.fill()),
        }
    }
}

impl RandomFile {
    /// Every tensor's values, filled in parallel: each job owns a disjoint byte range.
    fn fill(&self) -> Vec<u8> {
        let mut data = vec![0u8; self.len];
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(32);
        let mut rest: &mut [u8] = &mut data;
        let mut slices = Vec::new();
        let mut at = 0;
        for j in &self.jobs {
            let (_, tail) = rest.split_at_mut(j.bytes.start - at);
            let (mine, tail) = tail.split_at_mut(j.bytes.len());
            rest = tail;
            at = j.bytes.end;
            match self.plant.as_ref().zip(planted::Planted::of(&j.name)) {
                // Planted tensors are few and large: each fills its rows in parallel.
                Some((p, which)) => p.fill(which, j.stored, &j.shape, mine),
                None => slices.push((j.name.as_str(), j.dtype, j.shape.clone(), mine)),
            }
        }
        let per = slices.len().div_ceil(threads).max(1);
        let seed = self.seed;
        std::thread::scope(|sc| {
            let mut chunks = Vec::new();
            while !slices.is_empty() {
                let n = per.min(slices.len());
                chunks.push(slices.drain(..n).collect::<Vec<_>>());
            }
            for chunk in chunks {
                sc.spawn(move || {
                    for (name, dt, shape, bytes) in chunk {
                        fill_random(name, dt, &shape, bytes, seed);
                    }
                });
            }
        });
        data
    }
}

/// An opened checkpoint: memory-mapped files and the tensor index.
pub struct Checkpoint {
    /// `model.safetensors` or `model.safetensors.index.json`: the file errors about the
    /// checkpoint as a whole (missing tensors) name.
    root: PathBuf,
    files: Vec<SafetensorsFile>,
    tensors: BTreeMap<String, TensorEntry>,
    /// Tensors no graph reads, of a family known to be unused (set by the coverage check).
    pub(crate) ignored: Vec<Ignored>,
}

raw_struct! {
    /// `model.safetensors.index.json` as written (its `metadata` is ignored).
    pub struct RawIndex {
        weight_map: Option<BTreeMap<String, String>>,
    }
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`, preferring a single `model.safetensors`.
    pub fn open(dir: &Path) -> Result<Checkpoint, ModelError> {
        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        if is_regular(&single)? {
            let f = read_file(&single)?;
            let mut tensors = BTreeMap::new();
            for (name, mut e) in f.1 {
                e.file = 0;
                tensors.insert(name, e);
            }
            Ok(Checkpoint {
                root: single,
                files: vec![f.0],
                tensors,
                ignored: Vec::new(),
            })
        } else if is_regular(&index)? {
            Self::open_sharded(dir, &index)
        } else {
            Err(ModelError::NoCheckpoint {
                dir: dir.to_path_buf(),
            })
        }
    }

    fn open_sharded(dir: &Path, index: &Path) -> Result<Checkpoint, ModelError> {
        let text = read_text(index)?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::json(index, &e))?;
        let raw: RawIndex = crate::raw::from_value(index, v)?;
        let weight_map = raw.weight_map.ok_or_else(|| {
            ModelError::missing(
                index,
                "weight_map",
                "an object mapping tensor names to shard files",
            )
        })?;
        let shards: BTreeSet<&str> = weight_map.values().map(String::as_str).collect();
        let mut files = Vec::new();
        let mut by_shard = BTreeMap::new();
        for shard in shards {
            let first_tensor = || {
                weight_map
                    .iter()
                    .find(|(_, s)| s.as_str() == shard)
                    .map(|(t, _)| t.clone())
                    .unwrap_or_default()
            };
            let inside = !shard.is_empty()
                && Path::new(shard)
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)));
            if !inside {
                return Err(ModelError::field(
                    index,
                    "weight_map",
                    "shard file names inside the model directory",
                    format!("\"{shard}\" for tensor \"{}\"", first_tensor()),
                ));
            }
            let path = dir.join(shard);
            if !is_regular(&path)? {
                return Err(ModelError::MissingShard {
                    file: index.to_path_buf(),
                    tensor: first_tensor(),
                    shard: shard.to_string(),
                });
            }
            let (f, entries) = read_file(&path)?;
            by_shard.insert(shard, (files.len(), entries));
            files.push(f);
        }
        let mut tensors = BTreeMap::new();
        for (name, shard) in &weight_map {
            let (fi, entries) = &by_shard[shard.as_str()];
            let mut e = entries
                .get(name)
                .cloned()
                .ok_or_else(|| ModelError::Tensor {
                    file: files[*fi].path.clone(),
                    tensor: name.clone(),
                    expected: format!("to be in this shard (as {INDEX_FILE} says)"),
                    found: "no such tensor".into(),
                })?;
            e.file = *fi;
            tensors.insert(name.clone(), e);
        }
        Ok(Checkpoint {
            root: index.to_path_buf(),
            files,
            tensors,
            ignored: Vec::new(),
        })
    }

    /// A checkpoint with deterministic random values for every weight of `graph` (for
    /// benchmarking full-size shapes without downloads). Linear weights are uniform with
    /// the variance of N(0, 1/in); norm weights are 1 ± 0.1; integer tables are zero.
    /// Values depend only on (`seed`, tensor name, index) and are made on first read.
    pub fn random(dir: &Path, graph: &Graph, seed: u64) -> Checkpoint {
        Self::random_with(dir, graph, seed, None)
    }

    /// [`Checkpoint::random`] with `plant`'s embedding, lm_head and final norm (controlled
    /// acceptance, [`planted`]). `config` is the file errors name: a tied or quantised head
    /// (or a graph without one of the three tensors) cannot carry the plant.
    pub fn random_planted(
        dir: &Path,
        config: &Path,
        graph: &Graph,
        seed: u64,
        plant: Plant,
    ) -> Result<Checkpoint, ModelError> {
        let refuse = |why: String| ModelError::SyntheticAcceptance {
            file: config.to_path_buf(),
            why,
        };
        let ck = Self::random_with(dir, graph, seed, Some(plant));
        let embedding = ck.tensors.get(planted::EMBEDDING);
        let head = ck.tensors.get(planted::HEAD);
        if head.is_none() && embedding.is_some() {
            return Err(refuse(
                "needs a separate lm_head, and this config ties it to the embedding (tie_word_embeddings: set it to false for a benchmark shape)".into(),
            ));
        }
        for name in [planted::EMBEDDING, planted::HEAD, planted::FINAL_NORM] {
            let Some(e) = ck.tensors.get(name) else {
                return Err(refuse(format!("the model has no tensor `{name}` to plant")));
            };
            if !planted::plantable(e.dtype) {
                return Err(refuse(format!(
                    "`{name}` is stored as {}, and only a float tensor can be planted",
                    dtype_name(e.dtype)
                )));
            }
        }
        if embedding.map(|e| &e.shape) != head.map(|e| &e.shape) {
            return Err(refuse(
                "the embedding and lm_head shapes differ (a vocabulary-mapped head)".into(),
            ));
        }
        Ok(ck)
    }

    fn random_with(dir: &Path, graph: &Graph, seed: u64, plant: Option<Plant>) -> Checkpoint {
        let mut tensors = BTreeMap::new();
        let mut len = 0usize;
        let mut jobs = Vec::new();
        for (_, name, ty) in graph.weights() {
            let mut shape: Vec<usize> = ty
                .shape
                .dims()
                .iter()
                .map(|d| d.as_static().unwrap_or(1) as usize)
                .collect();
            if let (DType::Int4Group { .. }, Some(l)) = (ty.dtype, shape.last_mut()) {
                // Stored as i32 words of 8 nibbles.
                *l /= 8;
            }
            let numel: usize = shape.iter().product();
            let (dtype, size) = match ty.dtype {
                DType::Int4Group { .. } => (Dtype::I32, 4),
                DType::Fp8E4M3 => (Dtype::F8_E4M3, 1),
                DType::F32 => (Dtype::F32, 4),
                DType::F16 => (Dtype::F16, 2),
                DType::I64 => (Dtype::I64, 8),
                DType::I32 => (Dtype::I32, 4),
                _ => (Dtype::BF16, 2),
            };
            let start = len.next_multiple_of(16);
            let end = start + numel * size;
            jobs.push(RandomJob {
                name: name.to_string(),
                dtype: ty.dtype,
                stored: dtype,
                bytes: start..end,
                shape: shape.clone(),
            });
            tensors.insert(
                name.to_string(),
                TensorEntry {
                    file: 0,
                    dtype,
                    shape,
                    range: start..end,
                },
            );
            len = end;
        }
        Checkpoint {
            root: dir.join("(random weights)"),
            files: vec![SafetensorsFile {
                path: dir.join("(random weights)"),
                header_sha256: String::new(),
                mmap: Backing::Random(Box::new(RandomFile {
                    seed,
                    plant,
                    len,
                    jobs,
                    bytes: std::sync::OnceLock::new(),
                })),
            }],
            tensors,
            ignored: Vec::new(),
        }
    }

    /// What an engine records of this checkpoint: its files (relative to `dir`, the model
    /// directory, as `dir_ref` names it) with header hashes, and every tensor's name, dtype
    /// and shape.
    pub fn reference(&self, prefix: &str, dir: &Path, dir_ref: PathBuf) -> CheckpointRef {
        CheckpointRef {
            prefix: prefix.to_string(),
            dir: dir_ref,
            config: None,
            files: self
                .files
                .iter()
                .filter(|f| !f.header_sha256.is_empty())
                .map(|f| FileRef {
                    name: f
                        .path
                        .strip_prefix(dir)
                        .unwrap_or(&f.path)
                        .display()
                        .to_string(),
                    header_sha256: f.header_sha256.clone(),
                })
                .collect(),
            tensors: self
                .tensors
                .iter()
                .map(|(n, e)| TensorRef {
                    name: n.clone(),
                    dtype: dtype_name(e.dtype),
                    shape: e.shape.iter().map(|&d| d as u64).collect(),
                })
                .collect(),
        }
    }

    /// Checks this checkpoint is the one `r` was recorded from: the same files with the same
    /// headers, or else the same tensors (names, dtypes, shapes) — the first difference is
    /// the error, naming the file and the tensor.
    pub fn matches(&self, r: &CheckpointRef) -> Result<(), ModelError> {
        let changed = |file: PathBuf, what: String| ModelError::Changed { file, what };
        for f in &r.files {
            let Some(have) = self.files.iter().find(|x| x.path.ends_with(&f.name)) else {
                return Err(changed(
                    self.root.clone(),
                    format!(
                        "the engine was built from `{}`, which this checkpoint lacks",
                        f.name
                    ),
                ));
            };
            if have.header_sha256 != f.header_sha256 {
                // Name the first tensor that differs when there is one.
                for t in &r.tensors {
                    let now = self.tensors.get(&t.name).map(|e| {
                        (
                            dtype_name(e.dtype),
                            e.shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
                        )
                    });
                    match now {
                        None => {
                            return Err(changed(
                                have.path.clone(),
                                format!("tensor `{}` is gone", t.name),
                            ))
                        }
                        Some((d, s)) if d != t.dtype || s != t.shape => {
                            return Err(changed(
                                have.path.clone(),
                                format!(
                                "tensor `{}` is now {d} {s:?}, the engine was built for {} {:?}",
                                t.name, t.dtype, t.shape
                            ),
                            ))
                        }
                        _ => {}
                    }
                }
                return Err(changed(
                    have.path.clone(),
                    "the safetensors header differs from the one the engine was built from".into(),
                ));
            }
        }
        Ok(())
    }

    /// `model.safetensors` or the index file.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// All tensors, by name.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &TensorEntry)> {
        self.tensors.iter().map(|(n, e)| (n.as_str(), e))
    }

    /// The file holding `entry`.
    pub fn file_of(&self, entry: &TensorEntry) -> &Path {
        &self.files[entry.file].path
    }

    /// The stored bytes of a tensor (little-endian, as in the file).
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        let e = self.tensors.get(name)?;
        Some(&self.files[e.file].mmap[e.range.clone()])
    }

    /// The stored bytes of a tensor, checked to hold no NaN or infinity (synthesised random
    /// weights are finite by construction and not scanned).
    pub fn checked_bytes(&self, name: &str) -> Result<&[u8], ModelError> {
        let e = self.tensors.get(name).ok_or_else(|| ModelError::Tensor {
            file: self.root.clone(),
            tensor: name.into(),
            expected: "a tensor".into(),
            found: "no such tensor".into(),
        })?;
        let f = &self.files[e.file];
        let bytes = &f.mmap[e.range.clone()];
        if let Backing::Mapped(_) = f.mmap {
            if let Some((i, v)) = first_non_finite(e.dtype, bytes) {
                return Err(ModelError::Tensor {
                    file: f.path.clone(),
                    tensor: name.into(),
                    expected: "finite values".into(),
                    found: format!("{v} at element {i}"),
                });
            }
        }
        Ok(bytes)
    }

    /// Drops the resident pages of file `file` (its mapping stays valid: a later read pages
    /// them in again). A streaming upload calls it once the file's last tensor is staged,
    /// so host memory holds at most the shards in flight, not the whole checkpoint.
    /// Synthesised files keep their bytes.
    pub fn release_file(&self, file: usize) {
        if let Some(Backing::Mapped(m)) = self.files.get(file).map(|f| &f.mmap) {
            // SAFETY: the map is a read-only file mapping; `DontNeed` only drops its
            // resident pages, which are read back from the file on the next access, so no
            // slice borrowed from it changes.
            let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }

    /// Tensors the coverage check skipped as known-unused families.
    pub fn ignored(&self) -> &[Ignored] {
        &self.ignored
    }

    /// Checks the weights of `g` named `prefix` + a tensor of this checkpoint (a draft's
    /// weights inside a step graph), with the prefix stripped.
    pub fn validate_prefixed(&self, g: &Graph, prefix: &str) -> Result<(), ModelError> {
        for (_, name, ty) in g.weights() {
            if let Some(stripped) = name.strip_prefix(prefix) {
                self.check(stripped, ty)?;
            }
        }
        Ok(())
    }

    /// Checks the weights of `g` that carry none of `foreign` prefixes (the target's
    /// weights inside a step graph that also holds a draft's).
    pub fn validate_unprefixed(&self, g: &Graph, foreign: &[&str]) -> Result<(), ModelError> {
        for (_, name, ty) in g.weights() {
            if !foreign.iter().any(|p| name.starts_with(p)) {
                self.check(name, ty)?;
            }
        }
        Ok(())
    }

    /// A DeepSeek-V3 router's stored dtypes, from the first MoE layer's headers (transformers
    /// keeps `mlp.gate.weight` in f32, real checkpoints in bf16); the router computes in f32
    /// either way. Unchanged when the tensors are absent or not float (validation names them).
    pub fn adapt_router_dtypes(&self, spec: &mut crate::config::ModelSpec) {
        let prefix = spec.weight_prefix.clone();
        let layers = spec.layers;
        let Some(moe) = spec.moe.as_mut() else {
            return;
        };
        if moe.first_dense >= layers {
            return;
        }
        let stem = format!("{prefix}model.layers.{}.mlp.gate.", moe.first_dense);
        let stored = |name: &str| {
            self.tensors
                .get(&format!("{stem}{name}"))
                .filter(|e| is_float_weight(e.dtype))
                .and_then(|e| ir_dtype(e.dtype))
        };
        if let Some(d) = stored("weight") {
            moe.router_dtype = d;
        }
        if let Some(d) = stored("e_score_correction_bias") {
            moe.bias_dtype = d;
        }
    }

    /// Checks that every `weight` of `g` exists with the graph's shape and dtype.
    pub fn validate(&self, g: &Graph) -> Result<(), ModelError> {
        for (_, name, ty) in g.weights() {
            self.check(name, ty)?;
        }
        Ok(())
    }

    fn check(&self, name: &str, ty: &TensorType) -> Result<(), ModelError> {
        let want_dims: Option<Vec<usize>> = ty
            .shape
            .dims()
            .iter()
            .map(|d| d.as_static().map(|n| n as usize))
            .collect();
        let expected = match ty.dtype {
            DType::Int4Group { .. } => format!(
                "shape {} {} (i32 words of 8 nibbles)",
                fmt_shape_ir(ty),
                ty.dtype
            ),
            _ => format!("shape {} {}", fmt_shape_ir(ty), ty.dtype),
        };
        let Some(e) = self.tensors.get(name) else {
            return Err(ModelError::Tensor {
                file: self.root.clone(),
                tensor: name.into(),
                expected,
                found: "no such tensor".into(),
            });
        };
        // Float weights must be bf16/f16/f32; integer tables (EAGLE-3 `d2t`) match exactly;
        // fp8 weights are stored as fp8; int4 [out, in] weights as i32 words [out, in/8].
        let (stored_dims, dtype_ok) = match ty.dtype {
            DType::Int4Group { .. } => (
                want_dims.as_ref().map(|d| {
                    let mut d = d.clone();
                    if let Some(l) = d.last_mut() {
                        *l /= 8;
                    }
                    d
                }),
                e.dtype == Dtype::I32,
            ),
            DType::Fp8E4M3 => (want_dims.clone(), e.dtype == Dtype::F8_E4M3),
            _ => (
                want_dims.clone(),
                ir_dtype(e.dtype) == Some(ty.dtype)
                    && (is_float_weight(e.dtype) || ty.dtype.is_int()),
            ),
        };
        if stored_dims.as_ref() != Some(&e.shape) || !dtype_ok {
            return Err(ModelError::Tensor {
                file: self.file_of(e).to_path_buf(),
                tensor: name.into(),
                expected,
                found: format!("{:?} {}", e.shape, dtype_name(e.dtype)),
            });
        }
        Ok(())
    }

    /// Loads a bf16/f16/f32 tensor as f32 values; the tensor's dtype records the stored
    /// dtype (the interpreter rounds to it where the GPU would).
    pub fn load_f32(&self, name: &str) -> Result<Tensor, ModelError> {
        let bytes = self.checked_bytes(name)?;
        let e = &self.tensors[name];
        self.decode(name, e, e.shape.clone(), bytes)
    }
}

/// Maps and indexes one safetensors file (entries' `file` is left 0 for the caller).
fn read_file(path: &Path) -> Result<(SafetensorsFile, BTreeMap<String, TensorEntry>), ModelError> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the map is read-only and private to this process. Another process truncating
    // or rewriting the file while it is mapped would be undefined behaviour; every
    // safetensors loader accepts that risk, and checkpoints are not written while served.
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
    let header_err = |msg: String| ModelError::Header {
        file: path.to_path_buf(),
        msg,
    };
    let len = mmap.len() as u64;
    if len < 8 {
        return Err(header_err(format!(
            "expected at least the 8-byte header length, found a {len}-byte file"
        )));
    }
    let n = u64::from_le_bytes(mmap[..8].try_into().expect("8 bytes"));
    if n > len - 8 {
        return Err(header_err(format!(
            "header length says {n} bytes, file has {} after the length",
            len - 8
        )));
    }
    let header_end = 8 + n as usize;
    let meta: Metadata =
        serde_json::from_slice(&mmap[8..header_end]).map_err(|e| header_err(e.to_string()))?;
    let available = len - header_end as u64;
    let mut entries = BTreeMap::new();
    let mut data_end = 0u64;
    for (name, info) in meta.tensors() {
        let (s, e) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
        let numel = info
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64));
        let need = numel.and_then(|n| n.checked_mul(info.dtype.size() as u64));
        if e < s || need != Some(e - s) {
            return Err(ModelError::Tensor {
                file: path.to_path_buf(),
                tensor: name,
                expected: format!(
                    "data_offsets spanning {} bytes for {:?} {}",
                    need.map_or("too many".to_string(), |n| n.to_string()),
                    info.shape,
                    dtype_name(info.dtype)
                ),
                found: format!("[{s}, {e}]"),
            });
        }
        data_end = data_end.max(e);
        entries.insert(
            name,
            TensorEntry {
                file: 0,
                dtype: info.dtype,
                shape: info.shape.clone(),
                range: header_end + s as usize..header_end + e as usize,
            },
        );
    }
    check_disjoint(path, &entries, header_end)?;
    if data_end > available {
        return Err(ModelError::Truncated {
            file: path.to_path_buf(),
            header_bytes: data_end,
            file_bytes: available,
        });
    }
    Ok((
        SafetensorsFile {
            path: path.to_path_buf(),
            header_sha256: specc_ir::engine::sha256_hex(&mmap[..header_end]),
            mmap: Backing::Mapped(mmap),
        },
        entries,
    ))
}

/// Rule 4: no two non-empty byte ranges overlap. The error names the later tensor (by
/// start offset) and the one it overlaps, with their `data_offsets` as the header gives them
/// (relative to `data_start`, where the absolute ranges begin).
fn check_disjoint(
    path: &Path,
    entries: &BTreeMap<String, TensorEntry>,
    data_start: usize,
) -> Result<(), ModelError> {
    let mut ranges: Vec<(&Range<usize>, &str)> = entries
        .iter()
        .filter(|(_, e)| !e.range.is_empty())
        .map(|(n, e)| (&e.range, n.as_str()))
        .collect();
    ranges.sort_by_key(|(r, _)| (r.start, r.end));
    let Some(&(first, first_name)) = ranges.first() else {
        return Ok(());
    };
    // The range reaching furthest so far: any later start below its end overlaps it.
    let mut reach = (first, first_name);
    for &(r, name) in &ranges[1..] {
        if r.start < reach.0.end {
            let base = data_start;
            return Err(ModelError::Tensor {
                file: path.to_path_buf(),
                tensor: name.to_string(),
                expected: format!(
                    "data_offsets that do not overlap tensor \"{}\" ([{}, {}])",
                    reach.1,
                    reach.0.start - base,
                    reach.0.end - base
                ),
                found: format!("[{}, {}]", r.start - base, r.end - base),
            });
        }
        if r.end > reach.0.end {
            reach = (r, name);
        }
    }
    Ok(())
}

/// The first NaN or infinity of a float tensor stored as `dtype`: its element index and
/// value. Integer and other dtypes hold none.
pub fn first_non_finite(dtype: Dtype, bytes: &[u8]) -> Option<(usize, f32)> {
    // A float is NaN or infinite exactly when its exponent bits are all ones.
    let half = |exp: u16, to_f32: fn(u16) -> f32| {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .position(|b| b & exp == exp)
            .map(|i| {
                (
                    i,
                    to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])),
                )
            })
    };
    match dtype {
        Dtype::BF16 => half(0x7f80, |b| half::bf16::from_bits(b).to_f32()),
        Dtype::F16 => half(0x7c00, |b| half::f16::from_bits(b).to_f32()),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .enumerate()
            .find(|(_, v)| !v.is_finite()),
        // e4m3fn has no infinities; NaN is S.1111.111.
        Dtype::F8_E4M3 => bytes
            .iter()
            .position(|&b| b & 0x7f == 0x7f)
            .map(|i| (i, f32::NAN)),
        _ => None,
    }
}

/// The IR dtype of a stored dtype, where the IR has one.
pub fn ir_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::F32 => DType::F32,
        Dtype::F8_E4M3 => DType::Fp8E4M3,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fill_random(name: &str, dt: DType, shape: &[usize], out: &mut [u8], seed: u64) {
    let mut h = seed ^ 0x5bd1_e995;
    for b in name.bytes() {
        h = splitmix64(h ^ b as u64);
    }
    let fan_in = *shape.last().unwrap_or(&1) as f32;
    let is_norm = shape.len() == 1 && name.contains("norm");
    // Uniform on [-a, a] has variance a²/3: a = sqrt(3 / fan_in) matches N(0, 1/fan_in).
    let amp = (3.0 / fan_in).sqrt();
    let value = |i: usize| -> f32 {
        let u = (splitmix64(h ^ i as u64) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        if is_norm {
            1.0 + 0.1 * u
        } else {
            amp * u
        }
    };
    // Quantised weights: uniform codes, and one small positive scale for all (a scale's
    // shape does not tell its weight's fan-in): finite values of a plausible size.
    let is_scale = name.ends_with(crate::quant::SCALE) || name.ends_with(crate::quant::SCALE_INV);
    match dt {
        DType::Int4Group { .. } => {
            for (i, b) in out.iter_mut().enumerate() {
                *b = splitmix64(h ^ i as u64) as u8;
            }
        }
        DType::Fp8E4M3 => {
            // Sign, exponent 6..=8 (0.5 ..= 3.75 in magnitude), any mantissa.
            for (i, b) in out.iter_mut().enumerate() {
                let r = splitmix64(h ^ i as u64);
                *b = (r as u8 & 0x87) | ((6 + (r >> 8) % 3) as u8) << 3;
            }
        }
        DType::F32 | DType::BF16 | DType::F16 if is_scale => {
            let v = 0.01f32;
            match dt {
                DType::F32 => out
                    .chunks_exact_mut(4)
                    .for_each(|c| c.copy_from_slice(&v.to_le_bytes())),
                DType::F16 => out
                    .chunks_exact_mut(2)
                    .for_each(|c| c.copy_from_slice(&half::f16::from_f32(v).to_le_bytes())),
                _ => out
                    .chunks_exact_mut(2)
                    .for_each(|c| c.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes())),
            }
        }
        DType::F32 => {
            for (i, c) in out.chunks_exact_mut(4).enumerate() {
                c.copy_from_slice(&value(i).to_le_bytes());
            }
        }
        DType::F16 => {
            for (i, c) in out.chunks_exact_mut(2).enumerate() {
                c.copy_from_slice(&half::f16::from_f32(value(i)).to_le_bytes());
            }
        }
        DType::I64 | DType::I32 => out.fill(0),
        _ => {
            for (i, c) in out.chunks_exact_mut(2).enumerate() {
                c.copy_from_slice(&half::bf16::from_f32(value(i)).to_le_bytes());
            }
        }
    }
}

fn is_float_weight(d: Dtype) -> bool {
    matches!(d, Dtype::BF16 | Dtype::F16 | Dtype::F32)
}

/// A stored dtype in the IR's spelling (`bf16`), or the safetensors one lower-cased.
pub fn dtype_name(d: Dtype) -> String {
    match ir_dtype(d) {
        Some(t) => t.to_string(),
        None => format!("{d:?}").to_lowercase(),
    }
}

/// `[64, 64]`, with bucket dims by name.
fn fmt_shape_ir(ty: &TensorType) -> String {
    let dims: Vec<String> = ty.shape.dims().iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}
