//! Graphs of a method compiled to kernels and run on one GPU: the target prefill and the
//! draft prefill launched directly (once per admission), the step captured as ONE CUDA graph
//! per bucket and replayed with no host value inside it.
//!
//! Pipeline per graph and bucket: `specc_codegen::compile` (fuse, schedule, memory plan) →
//! `specc_kernels_gen::plan_kernels` (sources, grids, operands) → NVRTC cubins (on-disk cache)
//! → modules → launches whose parameters are the launch's operand table (arena offsets and
//! weight/state slots resolved to addresses) and its bucket constants.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use specc_ir::{Bindings, DType, Graph};
use specc_kernels_gen::abi::Loc;
use specc_kernels_gen::plan::{plan_kernels_for, DeviceLimits, KernelPlan, Slot};
use specc_kernels_gen::tensor_map::DESCRIPTOR_BYTES as TENSOR_MAP_BYTES;
use specc_kernels_gen::{Arch, Nvrtc};
use specc_models::Checkpoint;

use super::{
    operand_table, pointer_table, BufRef, CudaDevice, DeviceArena, DeviceBuffer, DeviceWeights,
    HostTensor, KernelImage, KernelModule, KernelParam, PreparedLaunch, StateBuffers, StepGraph,
};
use crate::RuntimeError;

/// Where the weights named by the graphs come from: checkpoints, each under a name prefix
/// (`""` for the target, `draft/` or `eagle/` for a draft).
pub struct WeightSources<'a> {
    pub sources: Vec<(&'a str, &'a Checkpoint)>,
}

impl WeightSources<'_> {
    /// Stored dtype, shape and bytes of graph weight `name`.
    pub fn get(&self, name: &str) -> Option<(DType, Vec<usize>, &[u8])> {
        // Longest prefix first so `draft/x` never resolves in the target.
        let mut best: Option<(&str, &Checkpoint)> = None;
        for (p, ck) in &self.sources {
            if name.starts_with(p) && best.is_none_or(|(bp, _)| p.len() > bp.len()) {
                best = Some((p, ck));
            }
        }
        let (p, ck) = best?;
        let inner = &name[p.len()..];
        let e = ck.tensor(inner)?;
        let dt = specc_models::checkpoint::ir_dtype(e.dtype)?;
        Some((dt, e.shape.clone(), ck.bytes(inner)?))
    }
}

/// Cubins baked into the binary at build time: `(kernel name, arch, cubin)`. Kernel names
/// hash their source, so a name match means the same kernel. The kernels of one baked
/// module list the same cubin (one static, so equal pointers): it is loaded once.
pub type Prebuilt = &'static [(&'static str, &'static str, &'static [u8])];

static PREBUILT: std::sync::OnceLock<Prebuilt> = std::sync::OnceLock::new();

/// Registers the binary's baked cubins (the generated runtime binary does this at start);
/// kernels found there skip NVRTC.
pub fn set_prebuilt(table: Prebuilt) {
    let _ = PREBUILT.set(table);
}

fn prebuilt(name: &str, arch: &str) -> Option<&'static [u8]> {
    PREBUILT
        .get()?
        .iter()
        .find(|(n, a, _)| *n == name && *a == arch)
        .map(|(_, _, c)| *c)
}

/// A cubin and the kernels (entry names) it holds.
type ModuleImage = (Vec<String>, Vec<u8>);

fn slot_key(s: &Slot) -> String {
    match s {
        Slot::Weight(n) | Slot::State(n) => n.clone(),
        Slot::ConcatRows(names) => format!("concat[{}]", names.join("+")),
        // Constants are small (codegen caps them): their bytes are their key.
        Slot::Const(bytes) => format!(
            "const[{}]",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}

fn kerr(e: specc_kernels_gen::Error) -> RuntimeError {
    RuntimeError::Kernel(e.to_string())
}

/// One graph compiled for one bucket and loaded: launches ready to issue or capture.
pub struct LoadedGraph {
    pub plan: KernelPlan,
    pub arena: DeviceArena,
    pub launches: Vec<PreparedLaunch>,
    pub table: Arc<DeviceBuffer>,
    /// Seconds spent in codegen + kernel generation, and in NVRTC (or its cache).
    pub compile_s: (f64, f64),
}

impl LoadedGraph {
    /// Arena offset and bytes of graph input or output `name`.
    pub fn io(&self, name: &str) -> Result<(u64, u64), RuntimeError> {
        self.plan
            .io
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, o, b)| (*o, *b))
            .ok_or_else(|| RuntimeError::MissingOutput(leak(name)))
    }

    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), RuntimeError> {
        let (off, len) = self.io(name)?;
        if bytes.len() as u64 != len {
            return Err(RuntimeError::Kernel(format!(
                "input `{name}`: {} bytes given, the plan holds {len}",
                bytes.len()
            )));
        }
        self.arena.write_input(off, bytes)
    }

    pub fn read(&self, name: &str) -> Result<Vec<u8>, RuntimeError> {
        let (off, len) = self.io(name)?;
        self.arena.read(off, len)
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// The device side of an engine: weights and states shared by every graph.
pub struct CudaEngine {
    pub dev: CudaDevice,
    pub arch: Arch,
    nvrtc: Nvrtc,
    weights: Option<DeviceWeights>,
    pub states: StateBuffers,
    /// Concatenated weights and folded constants built at upload, by slot key.
    derived: HashMap<String, BufRef>,
}

impl CudaEngine {
    /// Opens GPU 0 and NVRTC, and allocates every state the graphs use at their bindings
    /// (weights come with [`CudaEngine::upload`]).
    pub fn new(graphs: &[(&Graph, Bindings)]) -> Result<CudaEngine, RuntimeError> {
        let dev = CudaDevice::open(0)?;
        let arch: Arch = dev
            .info()
            .arch
            .parse()
            .map_err(|e: specc_kernels_gen::Error| RuntimeError::Kernel(e.to_string()))?;
        let nvrtc = Nvrtc::new().map_err(kerr)?;
        let mut sizes: Vec<(String, u64)> = Vec::new();
        for (g, bind) in graphs {
            for s in super::state_sizes(g, bind)? {
                if !sizes.iter().any(|(n, _)| *n == s.0) {
                    sizes.push(s);
                }
            }
        }
        let states = StateBuffers::new(&dev, sizes.iter().map(|(n, b)| (n.as_str(), *b)))?;
        Ok(CudaEngine {
            dev,
            arch,
            nvrtc,
            weights: None,
            states,
            derived: HashMap::new(),
        })
    }

    /// Uploads the weights every plan's slots name (each once, concatenations built on the
    /// host), in one slab.
    pub fn upload(
        &mut self,
        plans: &[&KernelPlan],
        sources: &WeightSources,
    ) -> Result<(), RuntimeError> {
        let mut owned: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut borrowed: Vec<(String, DType, Vec<usize>, &[u8])> = Vec::new();
        for plan in plans {
            for s in &plan.slots {
                let key = slot_key(s);
                if owned.iter().any(|o| o.0 == key) || borrowed.iter().any(|b| b.0 == key) {
                    continue;
                }
                match s {
                    Slot::State(_) => {}
                    Slot::Weight(n) => {
                        let (dt, shape, bytes) = sources.get(n).ok_or_else(|| {
                            RuntimeError::Kernel(format!("weight `{n}` not in any checkpoint"))
                        })?;
                        borrowed.push((key, dt, shape, bytes));
                    }
                    Slot::ConcatRows(names) => {
                        let mut data = Vec::new();
                        let mut rows = 0;
                        let mut cols = 0;
                        let mut dtype = DType::BF16;
                        for n in names {
                            let (dt, shape, bytes) = sources.get(n).ok_or_else(|| {
                                RuntimeError::Kernel(format!("weight `{n}` not in any checkpoint"))
                            })?;
                            rows += shape[0];
                            cols = shape[1];
                            dtype = dt;
                            data.extend_from_slice(bytes);
                        }
                        owned.push((key, dtype, vec![rows, cols], data));
                    }
                    // Raw bytes, uploaded as a byte tensor (bool is 1 byte per element).
                    Slot::Const(bytes) => {
                        owned.push((key, DType::Bool, vec![bytes.len()], bytes.clone()));
                    }
                }
            }
        }
        let tensors: Vec<HostTensor> = borrowed
            .iter()
            .map(|(n, d, s, b)| HostTensor {
                name: n,
                dtype: *d,
                shape: s,
                data: b,
            })
            .chain(owned.iter().map(|(n, d, s, b)| HostTensor {
                name: n,
                dtype: *d,
                shape: s,
                data: b,
            }))
            .collect();
        let w = DeviceWeights::upload(&self.dev, tensors, true)?;
        for (n, ..) in &owned {
            self.derived.insert(n.clone(), w.buf_ref(n)?);
        }
        self.weights = Some(w);
        Ok(())
    }

    /// Codegen + kernel generation for `graph` at `bind` within this device's limits (no
    /// device work).
    pub fn plan(&self, graph: &Graph, bind: Bindings) -> Result<(KernelPlan, f64), RuntimeError> {
        let t = Instant::now();
        let c = specc_codegen::compile(graph.clone(), &[bind])
            .map_err(|e| RuntimeError::Kernel(e.to_string()))?;
        let limits = DeviceLimits {
            smem_per_block: self.dev.info().max_smem_per_block_optin,
        };
        let plan = plan_kernels_for(&c.graph, &c.groups, &c.plans[0], limits).map_err(kerr)?;
        Ok((plan, t.elapsed().as_secs_f64()))
    }

    /// Compiles the plan's kernels, loads them and prepares the launches (weights must be
    /// uploaded already).
    pub fn load(&self, plan: KernelPlan, plan_s: f64) -> Result<LoadedGraph, RuntimeError> {
        let weights = self
            .weights
            .as_ref()
            .ok_or_else(|| RuntimeError::Kernel("weights are not uploaded".into()))?;
        // Constants of a plan `upload` did not see (a bucket planned later): uploaded here,
        // kept alive by the operand table that points into them.
        let late: Vec<(String, Vec<usize>, &[u8])> = plan
            .slots
            .iter()
            .filter_map(|s| match s {
                Slot::Const(bytes) if !self.derived.contains_key(&slot_key(s)) => {
                    Some((slot_key(s), vec![bytes.len()], bytes.as_slice()))
                }
                _ => None,
            })
            .collect();
        let late_consts = if late.is_empty() {
            None
        } else {
            Some(DeviceWeights::upload(
                &self.dev,
                late.iter().map(|(n, shape, b)| HostTensor {
                    name: n,
                    dtype: DType::Bool,
                    shape,
                    data: b,
                }),
                false,
            )?)
        };
        let mut slots = Vec::with_capacity(plan.slots.len());
        for s in &plan.slots {
            slots.push(match s {
                Slot::State(n) => self.states.buf_ref(n)?,
                Slot::Weight(n) => weights.buf_ref(n)?,
                Slot::Const(_) if !self.derived.contains_key(&slot_key(s)) => late_consts
                    .as_ref()
                    .expect("late constants were uploaded")
                    .buf_ref(&slot_key(s))?,
                Slot::ConcatRows(_) | Slot::Const(_) => self.derived[&slot_key(s)].clone(),
            });
        }
        // Slot bases must be 16-byte aligned: kernels chose vector widths from offsets alone.
        pointer_table(&self.dev, "slot bases", &slots)?;
        let arena = DeviceArena::new(&self.dev, plan.arena_bytes.max(256))?;
        // Every launch's operand table, concatenated into one device array: launch `i` reads
        // entries `starts[i]..`. The table holds every buffer it points into.
        let resolve = |loc: Loc| match loc {
            Loc::Table { slot, offset } => {
                let base = &slots[slot as usize];
                BufRef {
                    buf: base.buf.clone(),
                    offset: base.offset + offset,
                }
            }
            Loc::Arena { offset } => BufRef {
                buf: arena.buffer().clone(),
                offset,
            },
            Loc::TensorMap(m) => unreachable!("tensor map {m:?} resolved as a tensor"),
        };
        // Tensor-map operands point into one buffer of descriptors, each encoded for its
        // launch's bucket after checking that every row it may read lies in the tensor's buffer.
        let mut descriptors: Vec<u8> = Vec::new();
        let mut described: Vec<BufRef> = Vec::new();
        for l in &plan.launches {
            for loc in &l.kernel.operands {
                if let Loc::TensorMap(m) = *loc {
                    let at = resolve(m.tensor());
                    let addr = at.buf.addr(at.offset, m.span_bytes(&l.bucket))?;
                    let d = m
                        .encode(addr, &l.bucket)
                        .map_err(|e| RuntimeError::Kernel(format!("{}: {e}", l.kernel.name)))?;
                    descriptors.extend_from_slice(&d);
                    described.push(at);
                }
            }
        }
        let descriptor_buf = if descriptors.is_empty() {
            None
        } else {
            let deps = described.into_iter().map(|r| r.buf).collect();
            let buf = DeviceBuffer::alloc_uninit(
                self.dev.stream(),
                "tensor-map descriptors",
                descriptors.len() as u64,
            )?
            .with_deps(deps);
            buf.write(0, &descriptors)?;
            Some(Arc::new(buf))
        };
        let mut entries = Vec::new();
        let mut starts = Vec::with_capacity(plan.launches.len());
        let mut next_descriptor = 0u64;
        for l in &plan.launches {
            starts.push(entries.len() as u64);
            for loc in &l.kernel.operands {
                entries.push(match *loc {
                    Loc::TensorMap(_) => {
                        let buf = descriptor_buf.clone().expect("descriptors were encoded");
                        let offset = next_descriptor;
                        next_descriptor += TENSOR_MAP_BYTES;
                        BufRef { buf, offset }
                    }
                    other => resolve(other),
                });
            }
        }
        if entries.is_empty() {
            // The table pointer must be valid even when no kernel reads it.
            entries.push(BufRef {
                buf: arena.buffer().clone(),
                offset: 0,
            });
        }
        let table = operand_table(&self.dev, "operands", &entries)?;
        let t = Instant::now();
        let cubins = self.compile_all(&plan)?;
        // One loaded module per cubin; every kernel it holds maps to it.
        let mut modules: HashMap<String, Arc<KernelModule>> = HashMap::new();
        for (entries, cubin) in cubins {
            let m = Arc::new(KernelModule::load(
                &self.dev,
                &entries.join(","),
                KernelImage::Binary(cubin),
            )?);
            for e in entries {
                modules.insert(e, m.clone());
            }
        }
        let mut launches = Vec::with_capacity(plan.launches.len());
        for (l, &start) in plan.launches.iter().zip(&starts) {
            let k = &l.kernel;
            let geo = k.launch.resolve(&l.bucket);
            let f = modules[&k.name].function(&k.entry, geo.smem_bytes)?;
            let c = l.bucket.consts();
            launches.push(
                PreparedLaunch::new(
                    &k.name,
                    f,
                    (geo.grid[0], geo.grid[1], geo.grid[2]),
                    (geo.block[0], geo.block[1], geo.block[2]),
                    geo.smem_bytes,
                    vec![
                        KernelParam::buf(&table, 8 * start)?,
                        KernelParam::i32s(&[c.b, c.t, c.ctx, c.m]),
                    ],
                )?
                // Every generated kernel runs `pdl_enter()` before touching activations.
                .with_pdl(),
            );
        }
        Ok(LoadedGraph {
            plan,
            arena,
            launches,
            table,
            compile_s: (plan_s, t.elapsed().as_secs_f64()),
        })
    }

    /// Cubins holding every distinct kernel of `plan`, each with the kernels (entry names)
    /// it holds: baked cubins first (kernels baked into one module share its bytes, so they
    /// load once), the rest compiled as NVRTC modules on all cores (the on-disk cache makes
    /// repeats cheap).
    fn compile_all(&self, plan: &KernelPlan) -> Result<Vec<ModuleImage>, RuntimeError> {
        let mut missing: Vec<&specc_kernels_gen::KernelSource> = Vec::new();
        let mut baked: Vec<(Vec<String>, &'static [u8])> = Vec::new();
        for l in &plan.launches {
            let name = &l.kernel.name;
            if missing.iter().any(|k| k.name == *name)
                || baked.iter().any(|(names, _)| names.contains(name))
            {
                continue;
            }
            match prebuilt(name, self.arch.name()) {
                Some(cubin) => match baked.iter_mut().find(|(_, c)| {
                    std::ptr::eq(c.as_ptr(), cubin.as_ptr()) && c.len() == cubin.len()
                }) {
                    Some((names, _)) => names.push(name.clone()),
                    None => baked.push((vec![name.clone()], cubin)),
                },
                None => missing.push(&l.kernel),
            }
        }
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 32);
        let compiled = self
            .nvrtc
            .compile_many(&missing, &[self.arch], threads)
            .map_err(kerr)?;
        let mut out: Vec<ModuleImage> = baked
            .into_iter()
            .map(|(names, cubin)| (names, cubin.to_vec()))
            .collect();
        out.extend(compiled.into_iter().map(|m| (m.entries, m.compiled.cubin)));
        Ok(out)
    }

    /// Issues a loaded graph's launches directly (not captured).
    pub fn launch(&self, g: &LoadedGraph) -> Result<(), RuntimeError> {
        super::launch_all(&self.dev, &g.launches)
    }

    /// Captures a loaded graph as one CUDA graph.
    pub fn capture(&self, g: &LoadedGraph) -> Result<StepGraph, RuntimeError> {
        StepGraph::from_launches(&self.dev, g.launches.clone(), vec![])
    }

    pub fn state(&self, name: &str) -> Result<&Arc<DeviceBuffer>, RuntimeError> {
        self.states.get(name)
    }

    pub fn write_state(&self, name: &str, bytes: &[u8]) -> Result<(), RuntimeError> {
        self.states.get(name)?.write(0, bytes)
    }

    pub fn read_state(&self, name: &str) -> Result<Vec<u8>, RuntimeError> {
        let b = self.states.get(name)?;
        b.read(0, b.bytes())
    }

    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.dev.synchronize()
    }
}
