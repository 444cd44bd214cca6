//! The memory a run needs, estimated from its engine (or, before an engine exists, from its
//! graphs) before anything is allocated, against the memory available to it: the host's
//! `MemAvailable` (/proc/meminfo) for the CPU backend, `cuMemGetInfo`'s free bytes for the
//! GPU ([`crate::cuda::CudaDevice::mem_info`]).
//!
//! Invariant: every size is computed with saturating arithmetic, so an absurd config
//! (`hidden_size` 10^9, `vocab_size` 10^12) estimates to at most `u64::MAX` bytes — which
//! no budget holds — and fails here with one line, never in an allocator.

use std::collections::BTreeMap;
use std::fmt;

use specc_ir::engine::{BucketPlan, Engine, GraphRole, Priming, Slot, StepContract};
use specc_ir::{Bindings, DType, Graph, Op, TensorType};
use specc_models::methods::EAGLE_HIDDEN;

use crate::admission::lane_chunk;
use crate::RuntimeError;

/// How a backend holds tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// As stored (bf16 is 2 bytes): the GPU.
    Device,
    /// As the interpreter holds them: every float as f32, every integer as i64.
    Interpreter,
}

impl Storage {
    /// Bytes of a tensor of type `ty` under `bind` (saturating).
    pub fn bytes(self, ty: &TensorType, bind: &Bindings) -> u64 {
        let numel = ty.shape.dims().iter().fold(1u64, |n, d| {
            n.saturating_mul(d.resolve(bind).unwrap_or(u64::MAX))
        });
        let per = match (self, ty.dtype) {
            (Storage::Interpreter, DType::I32 | DType::I64 | DType::Bool) => 8,
            (Storage::Interpreter, _) => 4,
            // Packed formats: one byte per element bounds them.
            (Storage::Device, d) => d.size_bytes().unwrap_or(1) as u64,
        };
        numel.saturating_mul(per)
    }
}

/// Estimated bytes of one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub weights: u64,
    /// KV caches, rings and lane states: they grow with the context and the batch.
    pub states: u64,
    /// Activations: the arenas of the plans a run loads, or the interpreter's peak of live
    /// values.
    pub activations: u64,
}

/// Memory a run may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    /// Where the figure comes from, for the error.
    pub what: &'static str,
}

impl Budget {
    /// The host's `MemAvailable`, where /proc/meminfo has it.
    pub fn host() -> Option<Budget> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        Some(Budget {
            bytes: mem_available(&text)?,
            what: "available host memory (MemAvailable)",
        })
    }

    /// Free GPU memory as `cuMemGetInfo` reports it.
    pub fn gpu(free: u64) -> Budget {
        Budget {
            bytes: free,
            what: "free GPU memory (cuMemGetInfo)",
        }
    }
}

/// `MemAvailable` of /proc/meminfo text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut it = line["MemAvailable:".len()..].split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") => Some(n.saturating_mul(1024)),
        None => Some(n),
        Some(_) => None,
    }
}

/// A byte count for people: `21.9 GiB`, `512 B`; `u64::MAX` (a saturated sum) is "more
/// than 16 EiB".
pub struct Human(pub u64);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == u64::MAX {
            return f.write_str("more than 16 EiB");
        }
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut v = self.0 as f64 / 1024.0;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        write!(f, "{v:.1} {}", UNITS[u])
    }
}

impl Footprint {
    pub fn total(&self) -> u64 {
        self.weights
            .saturating_add(self.states)
            .saturating_add(self.activations)
    }

    /// `Ok` when the estimate fits `budget`; else one line giving the estimate, its
    /// non-zero parts, the budget and `drivers` (the flags and fields it grows with).
    pub fn check(&self, budget: &Budget, drivers: &str) -> Result<(), RuntimeError> {
        if self.total() <= budget.bytes {
            return Ok(());
        }
        let parts: Vec<String> = [
            ("weights", self.weights),
            ("KV cache and states", self.states),
            ("activations", self.activations),
        ]
        .iter()
        .filter(|(_, b)| *b > 0)
        .map(|(what, b)| format!("{what} {}", Human(*b)))
        .collect();
        Err(RuntimeError::OutOfMemory(format!(
            "estimated memory {} ({}) exceeds the {} of {}; {drivers}",
            Human(self.total()),
            parts.join(", "),
            Human(budget.bytes),
            budget.what,
        )))
    }

    /// The estimate of interpreter `runs` (a graph and the bucket it runs at): every weight
    /// and state once (a state at its largest bucket), and the largest peak of live values.
    pub fn of_graphs(runs: &[(&Graph, Bindings)], storage: Storage) -> Footprint {
        let mut weights: BTreeMap<&str, u64> = BTreeMap::new();
        let mut states: BTreeMap<&str, u64> = BTreeMap::new();
        let mut activations = 0;
        for (g, bind) in runs {
            for (_, name, ty) in g.weights() {
                weights.insert(name, storage.bytes(ty, bind));
            }
            for (_, name, ty) in g.states() {
                let b = storage.bytes(ty, bind);
                let e = states.entry(name).or_default();
                *e = (*e).max(b);
            }
            activations = peak_live(g, bind, storage).max(activations);
        }
        let sum = |m: BTreeMap<&str, u64>| m.values().fold(0u64, |a, &b| a.saturating_add(b));
        Footprint {
            weights: sum(weights),
            states: sum(states),
            activations,
        }
    }

    /// The CUDA backend's allocations for `contract` at batch `lanes` (what
    /// `CudaSpecSession::new` and its first admission make): the weights and constants the
    /// method's plans name, each once (`weight_bytes` gives a checkpoint tensor's size),
    /// every state of the engine (and EAGLE-3's staged `eagle.hidden` lanes, at most that
    /// state's bytes), the step plan's arena and the arena of every prefill plan
    /// the session may run (each prompt bucket at `lanes` and, for admissions, at the
    /// smaller batch buckets: a session keeps each one it has run). With a prefill chunk
    /// (`prefill_chunk` > 0, a budget of rows per prefill across a window's lanes) a window
    /// of `b` lanes never prefills above [`crate::admission::lane_chunk`]`(prefill_chunk,
    /// b)` rows per lane, so the target and draft prefills of larger prompt buckets at that
    /// batch bucket are never loaded.
    pub fn of_cuda_engine(
        engine: &Engine,
        contract: &StepContract,
        lanes: u32,
        prefill_chunk: usize,
        weight_bytes: &dyn Fn(&str) -> u64,
    ) -> Footprint {
        // A session loads its method's graphs and, where the engine plans it, the all-row
        // forward (`prefill_logits`, verify timings).
        let mut roles = contract.roles();
        roles.push(GraphRole::Logits);
        // Admissions prefill at the smallest bucket that holds the lanes they admit.
        let admits =
            |r: GraphRole| r == contract.target_prefill || Some(r) == contract.draft_prefill;
        let within_chunk = |p: &BucketPlan| {
            !admits(p.role)
                || prefill_chunk == 0
                || p.bucket.t as usize <= lane_chunk(prefill_chunk, p.bucket.b as usize)
        };
        let plans: Vec<_> = engine
            .plans
            .iter()
            .filter(|p| {
                roles.contains(&p.role)
                    && (p.bucket.b == lanes || (admits(p.role) && p.bucket.b < lanes))
                    && within_chunk(p)
            })
            .collect();
        let mut slots: BTreeMap<String, u64> = BTreeMap::new();
        for s in plans.iter().flat_map(|p| &p.slots) {
            let (key, bytes) = match s {
                Slot::State(_) => continue,
                Slot::Weight(n) => (n.clone(), weight_bytes(n)),
                Slot::ConcatRows(names) => (
                    names.join("+"),
                    names
                        .iter()
                        .fold(0u64, |a, n| a.saturating_add(weight_bytes(n))),
                ),
                // Per-head blocks of a weight: at most the weight's bytes.
                Slot::WeightBlocks(b) => (
                    format!("{}[{}+{}]", b.name, b.start, b.len),
                    weight_bytes(&b.name).saturating_mul(b.len) / b.period.max(1),
                ),
                Slot::Const(b) => (format!("const{}", slots.len()), b.len() as u64),
            };
            slots.insert(key, bytes);
        }
        let step_arena = plans
            .iter()
            .filter(|p| p.role == contract.step)
            .map(|p| p.arena_bytes)
            .max()
            .unwrap_or(0);
        let mut prefill_roles = vec![contract.target_prefill, GraphRole::Logits];
        prefill_roles.extend(
            contract
                .draft_prefill
                .filter(|r| *r != contract.target_prefill),
        );
        // A prefill plan keeps its arena once it has run (its graphs are captured over
        // it), so a long-lived session may hold every one of them.
        // The draft's catch-up ([`specc_ir::engine::CatchUp`]) holds an arena of its own.
        let catch_up = plans
            .iter()
            .filter(|p| contract.catch_up.is_some_and(|c| c.role == p.role))
            .map(|p| p.arena_bytes)
            .max()
            .unwrap_or(0);
        let activations = plans
            .iter()
            .filter(|p| prefill_roles.contains(&p.role))
            .fold(step_arena.saturating_add(catch_up), |a, p| {
                a.saturating_add(p.arena_bytes)
            });
        // EAGLE-3 admissions stage each lane's `eagle.hidden` bytes until they arm the lane
        // (at most the state's bytes).
        let staged = match contract.priming() {
            Priming::Pairs { .. } => engine
                .states
                .iter()
                .filter(|s| s.name == EAGLE_HIDDEN)
                .map(|s| s.bytes)
                .sum(),
            _ => 0,
        };
        Footprint {
            weights: slots.values().fold(0u64, |a, &b| a.saturating_add(b)),
            states: engine
                .states
                .iter()
                .fold(staged, |a, s| a.saturating_add(s.bytes)),
            activations,
        }
    }
}

/// The most bytes of values alive at once while the interpreter runs `g` at `bind`: each
/// node's value lives from its node to its last use (outputs to the end). Leaves and the
/// in-place state updates, which alias their state, hold nothing of their own.
fn peak_live(g: &Graph, bind: &Bindings, storage: Storage) -> u64 {
    let n = g.len();
    let mut last = vec![0usize; n];
    for (id, node) in g.nodes() {
        last[id.index()] = id.index();
        for a in &node.args {
            last[a.index()] = id.index();
        }
    }
    for (_, v) in g.outputs() {
        last[v.index()] = n;
    }
    let mut frees: Vec<u64> = vec![0; n + 1];
    let (mut live, mut peak) = (0u64, 0u64);
    for (id, node) in g.nodes() {
        let owns = !matches!(
            node.op,
            Op::Input { .. }
                | Op::Weight { .. }
                | Op::State { .. }
                | Op::KvWrite
                | Op::KvMove
                | Op::Assign
        );
        if owns {
            let b = storage.bytes(&node.ty, bind);
            live = live.saturating_add(b);
            peak = peak.max(live);
            let end = last[id.index()];
            frees[end] = frees[end].saturating_add(b);
        }
        live = live.saturating_sub(frees[id.index()]);
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   22000000 kB\n";
        assert_eq!(mem_available(text), Some(22_000_000 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(Human(512).to_string(), "512 B");
        assert_eq!(Human(3 << 30).to_string(), "3.0 GiB");
        assert_eq!(Human(u64::MAX).to_string(), "more than 16 EiB");
    }

    #[test]
    fn over_budget_is_one_line_naming_the_drivers() {
        let f = Footprint {
            weights: 1 << 30,
            states: u64::MAX,
            activations: 0,
        };
        assert_eq!(f.total(), u64::MAX, "saturates, never wraps");
        let e = f
            .check(&Budget::gpu(2 << 30), "it grows with --max-context (4096)")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "estimated memory more than 16 EiB (weights 1.0 GiB, KV cache and states more than 16 EiB) exceeds the 2.0 GiB of free GPU memory (cuMemGetInfo); it grows with --max-context (4096)"
        );
        assert!(Footprint::default().check(&Budget::gpu(0), "").is_ok());
    }

    #[test]
    fn cuda_footprint_counts_what_a_session_allocates() {
        use specc_ir::engine::abi::Bucket;
        use specc_ir::engine::{BucketPlan, StateBuffer, Target};
        let plan = |role, b, t, arena_bytes, slots: Vec<Slot>| BucketPlan {
            role,
            bucket: Bucket { b, t, ctx: 64 },
            launches: vec![],
            slots,
            arena_bytes,
            arena: Default::default(),
            io: vec![],
            groups: vec![],
            passes: vec![],
            physical: Default::default(),
        };
        let w = |n: &str| Slot::Weight(n.into());
        let plain = StepContract::plain(64);
        let engine = Engine {
            format_version: 0,
            specc_version: String::new(),
            architecture: String::new(),
            target: Target::cpu(),
            max_context: 64,
            plain: plain.clone(),
            spec: None,
            spec_toml: None,
            acceptance: Default::default(),
            checkpoints: vec![],
            random_seed: None,
            synthetic_acceptance: None,
            graphs: vec![],
            plans: vec![
                plan(GraphRole::Decode, 1, 1, 100, vec![w("a"), w("b")]),
                plan(
                    GraphRole::Prefill,
                    1,
                    16,
                    1000,
                    vec![w("a"), Slot::Const(vec![0; 8])],
                ),
                plan(
                    GraphRole::Prefill,
                    1,
                    32,
                    2000,
                    vec![Slot::ConcatRows(vec!["a".into(), "b".into()])],
                ),
                // Another batch bucket: not loaded by a session of batch 1.
                plan(GraphRole::Decode, 4, 1, 1 << 20, vec![w("c")]),
            ],
            states: vec![
                StateBuffer {
                    name: "k".into(),
                    bytes: 300,
                },
                StateBuffer {
                    name: "v".into(),
                    bytes: 300,
                },
            ],
            kernels: vec![],
            modules: vec![],
            uncompiled: None,
            ranks: vec![],
            cubins: vec![],
        };
        let sizes = |n: &str| match n {
            "a" => 10,
            "b" => 20,
            _ => 1 << 30,
        };
        let f = Footprint::of_cuda_engine(&engine, &plain, 1, 0, &sizes);
        // a + b, the stacked a|b, the constant; every state; decode arena + every prefill's
        // (a session keeps each prefill plan's arena once it has run).
        assert_eq!(
            f,
            Footprint {
                weights: 10 + 20 + 30 + 8,
                states: 600,
                activations: 100 + 1000 + 2000
            }
        );
    }

    #[test]
    fn peak_of_live_values() {
        use specc_ir::{BinaryOp, Dim};
        let mut g = Graph::new("g");
        let ty = TensorType::new(DType::F32, [Dim::Static(256)]);
        let x = g.input("x", ty.clone()).unwrap();
        let a = g.add(Op::Binary(BinaryOp::Add), &[x, x]).unwrap();
        let b = g.add(Op::Binary(BinaryOp::Mul), &[a, a]).unwrap();
        let c = g.add(Op::Binary(BinaryOp::Add), &[b, b]).unwrap();
        g.set_output("c", c);
        // a and b live together (b reads a), then a is freed before c: 2 × 1 KiB.
        let bind = Bindings::new(1, 1, 1);
        assert_eq!(peak_live(&g, &bind, Storage::Interpreter), 2048);
        let f = Footprint::of_graphs(&[(&g, bind)], Storage::Interpreter);
        assert_eq!((f.weights, f.states, f.activations), (0, 0, 2048));
    }
}
