//! The engine: the artifact one build writes and the runtime only loads and replays.
//!
//! An [`Engine`] holds, for every graph of a method and every bucket it was built for, the
//! launches that run (kernel, geometry, operand table, bucket constants), the buffers they
//! reach ([`Slot`]s), the arena size and the host's I/O ranges; the states the graphs keep
//! between steps; the method's step contract ([`StepContract`]: which graphs, how lanes are
//! primed at admission) as data; the IR text of each graph (what the CPU backend executes);
//! the cubins of every kernel for every arch of its [`Target`]; and the checkpoints it was
//! built from (paths, every tensor's name, dtype and shape, a hash of each safetensors
//! header), so a changed checkpoint is an error at load and not a wrong answer.
//!
//! On disk an engine is a directory: `engine.json` (this struct, serde) and
//! `kernels/{module}.{arch}.cubin` (each listed with its SHA-256 in `engine.json`), plus
//! the reports `plan.txt` and `kernels/*.cu` that nothing reads back ([`format`]).

pub mod abi;
mod acceptance;
pub mod choice;
mod contract;
mod format;
mod input;
mod target;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use abi::{Bucket, Loc};

pub use acceptance::Acceptance;
pub use contract::{CatchUp, DraftKind, GraphRole, Priming, StepContract, StepVariant};
pub use format::{sha256_hex, EngineError, ENGINE_FILE, PLAN_FILE};
pub use input::{BuildInput, RoleGraph};
pub use target::{Arch, Target, UnknownArch};

/// Bumped whenever a field changes meaning; an engine of another version is refused.
pub const FORMAT_VERSION: u32 = 6;

/// The specc version that writes engines (an engine from another one is refused: kernel
/// text, ABI and graph lowering may differ between versions).
pub const SPECC_VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Engine {
    pub format_version: u32,
    pub specc_version: String,
    /// The model architecture (`LlamaForCausalLM`, ...), for reports.
    pub architecture: String,
    pub target: Target,
    /// KV capacity per sequence every graph was built for.
    pub max_context: u64,
    /// Plain decoding (k = 0): always present.
    pub plain: StepContract,
    /// The speculative method of the spec the engine was built from.
    pub spec: Option<StepContract>,
    /// The spec.toml text the engine was built from.
    pub spec_toml: Option<String>,
    /// How its step graphs choose tokens (the spec's `[acceptance]`, or what `--temperature`
    /// and friends made of it): compiled in, so a run cannot change it.
    pub acceptance: Acceptance,
    pub checkpoints: Vec<CheckpointRef>,
    /// Deterministic random weights (benchmarks of full-size shapes): the seed the loader
    /// synthesises every checkpoint from.
    pub random_seed: Option<u64>,
    /// With `random_seed`: the draft agrees with the target's greedy token on this fraction
    /// of the tokens (`--synthetic-acceptance`; the target and draft_model checkpoints are
    /// planted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic_acceptance: Option<f64>,
    /// IR text of each graph, by role.
    pub graphs: Vec<GraphText>,
    /// Every built (graph, bucket), in build order.
    pub plans: Vec<BucketPlan>,
    /// Buffers kept across steps (KV caches, token rings, lane states), sized for the
    /// largest bucket that uses them.
    pub states: Vec<StateBuffer>,
    pub kernels: Vec<KernelInfo>,
    pub modules: Vec<ModuleInfo>,
    /// Why the engine holds no cubins although its target names archs (NVRTC was not
    /// available when it was built): it then runs on the CPU backend only.
    #[serde(default)]
    pub uncompiled: Option<String>,
    /// Plans of further ranks (tensor / expert parallelism); empty: one GPU.
    #[serde(default)]
    pub ranks: Vec<RankPlans>,
    /// Cubin bytes, by module and arch; on disk they are files beside `engine.json`.
    #[serde(skip)]
    pub cubins: Vec<Cubin>,
}

/// The plans of one rank beyond rank 0 (reserved for sharded engines).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankPlans {
    pub rank: u32,
    pub plans: Vec<BucketPlan>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GraphText {
    pub role: GraphRole,
    pub ir: String,
}

/// Where a checkpoint the engine reads lives, and what it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRef {
    /// Name prefix of its tensors inside the graphs (`""` for the target, `draft/`, ...).
    pub prefix: String,
    /// The model directory (relative to the engine directory where it lies below it;
    /// `embedded` for the binary's own default model).
    pub dir: PathBuf,
    /// The config the weights are synthesised from, with `random_seed`.
    pub config: Option<PathBuf>,
    pub files: Vec<FileRef>,
    pub tensors: Vec<TensorRef>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// Relative to the checkpoint directory.
    pub name: String,
    /// SHA-256 of the safetensors header (length prefix + JSON).
    pub header_sha256: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorRef {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
}

/// One graph planned for one bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketPlan {
    pub role: GraphRole,
    pub bucket: Bucket,
    pub launches: Vec<Launch>,
    /// Table slot `i` of the ABI is `slots[i]`.
    pub slots: Vec<Slot>,
    /// Bytes of the activation arena (planned values, group scratch, split-K counters).
    pub arena_bytes: u64,
    /// How the arena divides: the memory plan's values, then the split-K counters, then
    /// the scratch region every group reuses (sized for the largest request).
    pub arena: ArenaLayout,
    /// Arena ranges of the graph's inputs and outputs (host copies).
    pub io: Vec<IoRange>,
    /// Cost of each fused group (indexed by [`Launch::group`]).
    pub groups: Vec<GroupCost>,
    /// The passes that made the plan, with their times.
    pub passes: Vec<PassTime>,
    /// The bytes any implementation of this graph must move at a full context (the
    /// physical roofline; `groups` hold what this plan moves).
    #[serde(default)]
    pub physical: PhysicalBytes,
}

/// The physical floor of a step: weights at their stored bytes (each read once per compute
/// node that needs it; the routed experts as the union the tokens select), the caches up to
/// the live context, the cache rows written, and the step's inputs and outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhysicalBytes {
    pub weights: u64,
    pub kv_read: u64,
    pub kv_written: u64,
    pub io: u64,
}

impl PhysicalBytes {
    pub fn total(&self) -> u64 {
        self.weights
            .saturating_add(self.kv_read)
            .saturating_add(self.kv_written)
            .saturating_add(self.io)
    }
}

/// The regions of one plan's arena, in address order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaLayout {
    /// `[0, values_bytes)`: the values the memory plan placed (live ranges).
    pub values_bytes: u64,
    /// `[counters_offset, +counters_bytes)`: zeroed split-K tile counters, left zero by
    /// every kernel that uses them.
    pub counters_offset: u64,
    pub counters_bytes: u64,
    /// `[moe_stats_offset, +4·moe_stats_count)`: per MoE layer in schedule order, the
    /// number of distinct experts the last step's tokens selected (i32, written by the
    /// grouped dispatch; 0 for a layer on the per-token kernel). Read by `specc bench`.
    #[serde(default)]
    pub moe_stats_offset: u64,
    #[serde(default)]
    pub moe_stats_count: u64,
    /// `[scratch_offset, +scratch_bytes)`: group-local scratch (matmul partials, argmax
    /// partials, a separate norm's output, attention split partials), reused by every
    /// group since groups run one after another.
    pub scratch_offset: u64,
    pub scratch_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoRange {
    pub name: String,
    pub offset: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassTime {
    pub pass: String,
    pub micros: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCost {
    /// The fused group's family (`matmul+norm`, `attention`, ...).
    pub family: String,
    /// The kernels chosen for it.
    pub choice: choice::KernelChoice,
    /// Bytes of the arena's scratch region its launches use.
    pub scratch_bytes: u64,
    pub weight_bytes: u64,
    pub act_bytes: u64,
    pub flops: u64,
}

/// One kernel launch, as the runtime issues it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// Index into [`Engine::kernels`].
    pub kernel: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory.
    pub smem_bytes: u32,
    /// `ops[i]` of the kernel points at `operands[i]`.
    pub operands: Vec<Loc>,
    /// The bucket constants passed (inside a step graph an op's token count is its own).
    pub bucket: Bucket,
    /// The fused group it computes, in schedule order.
    pub group: u32,
    pub phase: Phase,
}

/// A buffer outside the arena that kernels reach through the operand table.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Slot {
    Weight(String),
    State(String),
    /// `[Σ rows, K]`: the named `[rows_i, K]` weights stacked in order at upload.
    ConcatRows(Vec<String>),
    /// A folded constant: these bytes, uploaded once at load and never written.
    Const(Vec<u8>),
    /// Blocks of one weight gathered at upload (a per-head slice: MLA's W_UK and W_UV of
    /// `kv_b_proj`), so no kernel copies them on every step.
    WeightBlocks(WeightBlocks),
}

/// `[outer · len]` elements of weight `name` viewed as `outer` blocks of `period` elements:
/// elements `[start, start + len)` of each block, in block order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightBlocks {
    pub name: String,
    pub outer: u64,
    pub period: u64,
    pub start: u64,
    pub len: u64,
    /// The weight is stored quantised (fp8 blocks, int4 groups): the blocks are gathered
    /// from its `dequantize` with this scale, to this dtype (the op's own definition), once
    /// at upload rather than by a kernel on every step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dequant: Option<BlockDequant>,
}

/// The `dequantize` a [`WeightBlocks`] gathers from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockDequant {
    /// The scale weight (`weight_scale_inv` of fp8 blocks, `weight_scale` of int4 groups).
    pub scale: String,
    #[serde(with = "dtype_text")]
    pub to: crate::DType,
}

/// A [`crate::DType`] as its IR text (`bf16`, ...).
mod dtype_text {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &crate::DType, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(d)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<crate::DType, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|_| D::Error::custom(format!("unknown dtype `{text}`")))
    }
}

impl WeightBlocks {
    /// The gathered bytes of `src` (the whole weight, `elem` bytes per element), or `None`
    /// when `src` does not hold `outer · period` elements or a block overruns its period.
    pub fn gather(&self, src: &[u8], elem: usize) -> Option<Vec<u8>> {
        let whole = self
            .outer
            .checked_mul(self.period)?
            .checked_mul(elem as u64)?;
        if whole != src.len() as u64 || self.start.checked_add(self.len)? > self.period {
            return None;
        }
        let (period, start, len) = (
            self.period as usize * elem,
            self.start as usize * elem,
            self.len as usize * elem,
        );
        let mut out = Vec::with_capacity(self.outer as usize * len);
        for block in src.chunks_exact(period) {
            out.extend_from_slice(&block[start..start + len]);
        }
        Some(out)
    }

    /// Bytes of the gathered blocks at `elem` bytes per element.
    pub fn bytes(&self, elem: u64) -> u64 {
        self.outer.saturating_mul(self.len).saturating_mul(elem)
    }
}

/// The parts of a step: kernels reading a draft's weights (with the draft's attention),
/// kernels reading the target's, and the weightless rest (positions, acceptance, commit,
/// emit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    Draft,
    Target,
    Bookkeeping,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Draft => "draft",
            Phase::Target => "verify (target)",
            Phase::Bookkeeping => "accept + commit + emit",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateBuffer {
    pub name: String,
    pub bytes: u64,
}

/// A generated kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    /// `{family}_{dtype}_{hash8}`, also the entry symbol.
    pub name: String,
    /// Index into [`Engine::modules`].
    pub module: u32,
    /// ptxas figures per compiled arch.
    pub stats: Vec<KernelStats>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelStats {
    pub arch: Arch,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
    pub smem_bytes: u32,
}

/// An NVRTC program holding several kernels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleInfo {
    pub name: String,
    pub cubins: Vec<CubinRef>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CubinRef {
    pub arch: Arch,
    /// Path relative to the engine directory.
    pub file: String,
    pub sha256: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cubin {
    pub module: u32,
    pub arch: Arch,
    pub bytes: Vec<u8>,
}

impl Engine {
    pub fn graph_ir(&self, role: GraphRole) -> Option<&str> {
        self.graphs
            .iter()
            .find(|g| g.role == role)
            .map(|g| g.ir.as_str())
    }

    /// The plan of `role` at batch `b` and token count `t` (any `t` when `None`).
    pub fn plan(&self, role: GraphRole, b: u32, t: Option<u32>) -> Option<&BucketPlan> {
        self.plans
            .iter()
            .find(|p| p.role == role && p.bucket.b == b && t.is_none_or(|t| p.bucket.t == t))
    }

    /// Token counts `role` was built for at batch `b`, ascending.
    pub fn token_buckets(&self, role: GraphRole, b: u32) -> Vec<u32> {
        let mut ts: Vec<u32> = self
            .plans
            .iter()
            .filter(|p| p.role == role && p.bucket.b == b)
            .map(|p| p.bucket.t)
            .collect();
        ts.sort_unstable();
        ts.dedup();
        ts
    }

    /// Batch buckets of the step graphs, ascending.
    pub fn batch_buckets(&self) -> Vec<u32> {
        let mut bs: Vec<u32> = self.plans.iter().map(|p| p.bucket.b).collect();
        bs.sort_unstable();
        bs.dedup();
        bs
    }

    /// The cubin of `module` for `arch`.
    pub fn cubin(&self, module: u32, arch: Arch) -> Option<&[u8]> {
        self.cubins
            .iter()
            .find(|c| c.module == module && c.arch == arch)
            .map(|c| c.bytes.as_slice())
    }

    /// The contract of the speculative method, or plain decoding.
    pub fn contract(&self, speculative: bool) -> &StepContract {
        match (&self.spec, speculative) {
            (Some(s), true) => s,
            _ => &self.plain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WeightBlocks;

    #[test]
    fn weight_blocks_gather_each_blocks_range_in_order() {
        // Two heads of 3 rows (2-byte elements, one per row): rows 1..3 of each head.
        let src: Vec<u8> = (0..12).collect();
        let b = WeightBlocks {
            name: "w".into(),
            outer: 2,
            period: 3,
            start: 1,
            len: 2,
            dequant: None,
        };
        assert_eq!(b.gather(&src, 2), Some(vec![2, 3, 4, 5, 8, 9, 10, 11]));
        assert_eq!(b.bytes(2), 8);
        assert_eq!(b.gather(&src[..10], 2), None, "a short weight");
        let over = WeightBlocks { start: 2, ..b };
        assert_eq!(over.gather(&src, 2), None, "a block past its period");
    }
}
