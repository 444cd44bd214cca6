//! The device side of a loaded [`Engine`]: the engine's cubins for this device's arch, its
//! states, the weights every plan names (one slab), and per (graph, bucket) plan the arena,
//! the operand table and the prepared launches. Nothing here plans, generates or compiles:
//! every launch is the engine's, as `plan.txt` lists it.

use std::collections::HashMap;
use std::sync::Arc;

use specc_ir::engine::abi::{Loc, DESCRIPTOR_BYTES as TENSOR_MAP_BYTES};
use specc_ir::engine::{Arch, BucketPlan, Engine, Slot};
use specc_ir::DType;
use specc_models::Checkpoint;

use super::tensor_map::encode_tensor_map;
use super::weights::WEIGHT_ALIGN;
use super::{
    operand_table, pointer_table, BufRef, CudaDevice, DeviceArena, DeviceBuffer, DeviceWeights,
    HostTensor, KernelImage, KernelModule, KernelParam, PreparedLaunch, StateBuffers, StepGraph,
    TABLE_ENTRY_ALIGN,
};
use crate::memory::{Budget, Footprint};
use crate::RuntimeError;

/// Where the weights named by the plans come from: checkpoints, each under a name prefix
/// (`""` for the target, `draft/` or `eagle/` for a draft).
pub struct WeightSources<'a> {
    pub sources: Vec<(&'a str, &'a Checkpoint)>,
}

impl WeightSources<'_> {
    /// The checkpoint holding graph weight `name` (its index in `sources`), and the
    /// tensor's name in it.
    fn resolve<'n>(&self, name: &'n str) -> Option<(usize, &Checkpoint, &'n str)> {
        // Longest prefix first so `draft/x` never resolves in the target.
        let mut best: Option<(usize, &str, &Checkpoint)> = None;
        for (i, (p, ck)) in self.sources.iter().enumerate() {
            if name.starts_with(p) && best.is_none_or(|(_, bp, _)| p.len() > bp.len()) {
                best = Some((i, p, ck));
            }
        }
        let (i, p, ck) = best?;
        Some((i, ck, &name[p.len()..]))
    }

    /// Stored dtype, shape and bytes of graph weight `name`, checked to be finite while
    /// they are staged (the error names the tensor and its file).
    pub fn get(&self, name: &str) -> Result<(DType, Vec<usize>, &[u8]), RuntimeError> {
        let (dt, shape, _) = self.get_unscanned(name)?;
        let (_, ck, inner) = self.resolve(name).expect("resolved above");
        Ok((dt, shape, ck.checked_bytes(inner)?))
    }

    /// [`Self::get`] without the finite-value scan (a streaming upload scans each tensor
    /// with [`Self::check`] just before staging it, so its pages are read once while hot).
    fn get_unscanned(&self, name: &str) -> Result<(DType, Vec<usize>, &[u8]), RuntimeError> {
        let missing = || engine_err(format!("weight `{name}` is in no checkpoint"));
        let (_, ck, inner) = self.resolve(name).ok_or_else(missing)?;
        let e = ck.tensor(inner).ok_or_else(missing)?;
        let bytes = ck.bytes(inner).ok_or_else(missing)?;
        // An int4 `weight_packed` (i32 words of 8 nibbles) is the IR's int4g [out, in].
        if let Some(dt) = ck.int4_dtype(inner)? {
            let mut shape = e.shape.clone();
            if let Some(l) = shape.last_mut() {
                *l *= 8;
            }
            return Ok((dt, shape, bytes));
        }
        let dt = specc_models::checkpoint::ir_dtype(e.dtype).ok_or_else(missing)?;
        Ok((dt, e.shape.clone(), bytes))
    }

    /// Bytes of `dequantize(weight, scale)` to `to`, computed by the interpreter's
    /// definition of the op (a weight derived once at upload, e.g. fp8 `kv_b_proj`).
    fn dequantized(&self, weight: &str, scale: &str, to: DType) -> Result<Vec<u8>, RuntimeError> {
        let load = |name: &str| {
            let missing = || engine_err(format!("weight `{name}` is in no checkpoint"));
            let (_, ck, inner) = self.resolve(name).ok_or_else(missing)?;
            ck.load_f32(inner).map_err(RuntimeError::from)
        };
        let t = specc_ir::interp::dequantize_weight(&load(weight)?, &load(scale)?, to)
            .map_err(|e| engine_err(format!("weight `{weight}` (scale `{scale}`): {e}")))?;
        Ok(t.le_bytes())
    }

    /// Checks graph weight `name` holds no NaN or infinity.
    fn check(&self, name: &str) -> Result<(), RuntimeError> {
        self.get(name).map(|_| ())
    }

    /// Where graph weight `name` is stored: (source, file in it, byte offset). Uploading in
    /// this order reads every shard once, front to back.
    fn location(&self, name: &str) -> Option<StoredAt> {
        let (source, ck, inner) = self.resolve(name)?;
        let e = ck.tensor(inner)?;
        Some(StoredAt {
            source,
            file: e.file,
            offset: e.range.start,
        })
    }

    /// Drops the resident host pages of one file (its tensors are all staged).
    fn release(&self, at: StoredAt) {
        self.sources[at.source].1.release_file(at.file);
    }

    /// Stored bytes of graph weight `name` from its header alone (0 when no checkpoint
    /// holds it: the upload then names it).
    pub fn stored_bytes(&self, name: &str) -> u64 {
        self.resolve(name)
            .and_then(|(_, ck, inner)| ck.tensor(inner))
            .map_or(0, |e| e.range.len() as u64)
    }

    /// Stored dtype, shape and byte count of graph weight `name` from its header alone.
    fn header(&self, name: &str) -> Option<(DType, Vec<usize>, u64)> {
        let (_, ck, inner) = self.resolve(name)?;
        let e = ck.tensor(inner)?;
        let dt = specc_models::checkpoint::ir_dtype(e.dtype)?;
        Some((dt, e.shape.clone(), e.range.len() as u64))
    }
}

/// A tensor uploaded from its checkpoint bytes: its key in the slab, the graph weight it
/// is, and where it is stored.
struct Borrowed<'a> {
    key: String,
    weight: String,
    dtype: DType,
    shape: Vec<usize>,
    bytes: &'a [u8],
    at: Option<StoredAt>,
}

impl<'a> Borrowed<'a> {
    fn new(sources: &'a WeightSources, key: String, weight: &str) -> Result<Self, RuntimeError> {
        let (dtype, shape, bytes) = sources.get_unscanned(weight)?;
        Ok(Borrowed {
            key,
            weight: weight.to_string(),
            dtype,
            shape,
            bytes,
            at: sources.location(weight),
        })
    }
}

/// Where a stored tensor lies: checkpoint (index in [`WeightSources::sources`]), file, byte
/// offset; ordered as an upload should read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct StoredAt {
    source: usize,
    file: usize,
    offset: usize,
}

fn slot_key(s: &Slot) -> String {
    match s {
        Slot::Weight(n) | Slot::State(n) => n.clone(),
        Slot::ConcatRows(names) => format!("concat[{}]", names.join("+")),
        Slot::WeightBlocks(b) => format!(
            "blocks[{}:{}x{}@{}+{}{}]",
            b.name,
            b.outer,
            b.period,
            b.start,
            b.len,
            b.dequant
                .as_ref()
                .map_or(String::new(), |d| format!(" dequant {} {}", d.scale, d.to))
        ),
        // Constants are small (codegen caps them): their bytes are their key.
        Slot::Const(bytes) => format!(
            "const[{}]",
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}

fn engine_err(what: String) -> RuntimeError {
    RuntimeError::Engine(what)
}

/// One plan loaded: launches ready to issue or capture.
pub struct LoadedGraph {
    pub plan: BucketPlan,
    /// Kernel name of each launch.
    pub kernel_names: Vec<String>,
    pub arena: DeviceArena,
    pub launches: Vec<PreparedLaunch>,
    pub table: Arc<DeviceBuffer>,
    /// States the plan reads and writes through an aligned copy of its lanes
    /// ([`CudaEngine::load_at`]): [`LoadedGraph::shadow_in`] before a replay,
    /// [`LoadedGraph::shadow_out`] after it.
    pub shadows: Vec<Shadow>,
}

/// Lanes `offset..offset + bytes` of a small state, moved to a buffer of their own whose
/// base is 16-byte aligned (kernels pick vector widths from offsets alone, so a slot base
/// must be), for a plan loaded at a lane where the state's own bytes are not.
pub struct Shadow {
    pub state: Arc<DeviceBuffer>,
    pub offset: u64,
    pub bytes: u64,
    pub copy: Arc<DeviceBuffer>,
}

impl LoadedGraph {
    /// Arena offset and bytes of graph input or output `name`.
    pub fn io(&self, name: &str) -> Result<(u64, u64), RuntimeError> {
        self.plan
            .io
            .iter()
            .find(|r| r.name == name)
            .map(|r| (r.offset, r.bytes))
            .ok_or_else(|| RuntimeError::MissingOutput(leak(name)))
    }

    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), RuntimeError> {
        let (off, len) = self.io(name)?;
        if bytes.len() as u64 != len {
            return Err(engine_err(format!(
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

    /// Enqueues the copies of the shadowed states' lanes into their shadows.
    pub fn shadow_in(&self) -> Result<(), RuntimeError> {
        for s in &self.shadows {
            s.copy.copy_from(0, &s.state, s.offset, s.bytes)?;
        }
        Ok(())
    }

    /// Enqueues the copies of the shadows back into their states' lanes.
    pub fn shadow_out(&self) -> Result<(), RuntimeError> {
        for s in &self.shadows {
            s.state.copy_from(s.offset, &s.copy, 0, s.bytes)?;
        }
        Ok(())
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// The device side of an engine: its modules, weights and states, shared by every plan.
pub struct CudaEngine<'e> {
    pub dev: CudaDevice,
    pub arch: Arch,
    pub engine: &'e Engine,
    weights: Option<DeviceWeights>,
    pub states: StateBuffers,
    /// Concatenated weights and folded constants built at upload, by slot key.
    derived: HashMap<String, BufRef>,
    modules: HashMap<u32, Arc<KernelModule>>,
}

impl<'e> CudaEngine<'e> {
    /// Opens GPU 0, checks the engine has cubins for its arch and that `need` (the run's
    /// estimate) fits the device's free memory, and allocates the engine's states (weights
    /// come with [`CudaEngine::upload`]).
    pub fn new(engine: &'e Engine, need: &Footprint) -> Result<CudaEngine<'e>, RuntimeError> {
        let dev = CudaDevice::open(0)?;
        let (major, minor) = dev.info().compute_capability;
        let arch = Arch::of_capability(major, minor).ok_or_else(|| {
            engine_err(format!(
                "{} (compute capability {major}.{minor}) is not a GPU specc compiles for (sm_90a, sm_100a, sm_120)",
                dev.info().name
            ))
        })?;
        check_loadable(engine, arch)?;
        let (free, _) = dev.mem_info()?;
        need.check(
            &Budget::gpu(free),
            &format!(
                "it grows with the engine's max context ({}) and batch buckets ({:?})",
                engine.max_context,
                engine.batch_buckets()
            ),
        )?;
        let states = StateBuffers::new(
            &dev,
            engine.states.iter().map(|s| (s.name.as_str(), s.bytes)),
        )?;
        Ok(CudaEngine {
            dev,
            arch,
            engine,
            weights: None,
            states,
            derived: HashMap::new(),
            modules: HashMap::new(),
        })
    }

    /// Uploads the weights the plans of `roles` name (each once, concatenations built on the
    /// host), in one slab. Checkpoint tensors go in storage order, shard after shard, each
    /// scanned for NaN / infinity just before it is staged and each shard's host pages
    /// dropped after its last tensor: host memory holds about one shard, not the model.
    pub fn upload(
        &mut self,
        plans: &[&BucketPlan],
        sources: &WeightSources,
    ) -> Result<(), RuntimeError> {
        let mut owned: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
        // Tensors uploaded from the checkpoint bytes as they are, in units that stay
        // contiguous in the slab (a stack's parts), each with its graph weight names.
        let mut borrowed: Vec<Vec<Borrowed>> = Vec::new();
        let mut stacked: Vec<String> = Vec::new();
        for plan in plans {
            for s in &plan.slots {
                let key = slot_key(s);
                if owned.iter().any(|o| o.0 == key)
                    || borrowed.iter().flatten().any(|b| b.key == key)
                    || stacked.contains(&key)
                {
                    continue;
                }
                match s {
                    Slot::State(_) => {}
                    Slot::Weight(n) => {
                        borrowed.push(vec![Borrowed::new(sources, key, n)?]);
                    }
                    // Parts whose sizes keep the next part at the following aligned offset
                    // are uploaded in place, one after another (a MoE layer's experts: no
                    // host copy of the stack); the stack's address is its first part's.
                    Slot::ConcatRows(names) if contiguous_parts(names, sources) => {
                        let parts = names.iter().enumerate();
                        borrowed.push(
                            parts
                                .map(|(i, n)| Borrowed::new(sources, part_key(&key, i), n))
                                .collect::<Result<_, _>>()?,
                        );
                        stacked.push(key);
                    }
                    Slot::ConcatRows(names) => {
                        let mut data = Vec::new();
                        let mut rows = 0;
                        let mut cols = 0;
                        let mut dtype = DType::BF16;
                        for n in names {
                            let (dt, shape, bytes) = sources.get(n)?;
                            rows += shape[0];
                            cols = shape[1];
                            dtype = dt;
                            data.extend_from_slice(bytes);
                        }
                        owned.push((key, dtype, vec![rows, cols], data));
                    }
                    Slot::WeightBlocks(b) => {
                        let dequantized;
                        let (dt, bytes) = match &b.dequant {
                            None => {
                                let (dt, _, bytes) = sources.get(&b.name)?;
                                (dt, bytes)
                            }
                            Some(d) => {
                                dequantized = sources.dequantized(&b.name, &d.scale, d.to)?;
                                (d.to, dequantized.as_slice())
                            }
                        };
                        let gathered = dt.size_bytes().and_then(|e| b.gather(bytes, e));
                        let data = gathered.ok_or_else(|| {
                            engine_err(format!(
                                "weight {}: {} bytes do not hold {} blocks of {} {dt} elements",
                                b.name,
                                bytes.len(),
                                b.outer,
                                b.period
                            ))
                        })?;
                        owned.push((key, dt, vec![b.outer as usize, b.len as usize], data));
                    }
                    // Raw bytes, uploaded as a byte tensor (bool is 1 byte per element).
                    Slot::Const(bytes) => {
                        owned.push((key, DType::Bool, vec![bytes.len()], bytes.clone()));
                    }
                }
            }
        }
        // Shard by shard, front to back: each file is read once and its pages dropped
        // after its last tensor is staged.
        borrowed.sort_by_key(|unit| unit.iter().map(|b| b.at).min());
        let borrowed: Vec<Borrowed> = borrowed.into_iter().flatten().collect();
        let mut last_of_file: HashMap<StoredAt, usize> = HashMap::new();
        for (i, b) in borrowed.iter().enumerate() {
            if let Some(at) = b.at {
                last_of_file.insert(StoredAt { offset: 0, ..at }, i);
            }
        }
        let tensors: Vec<HostTensor> = borrowed
            .iter()
            .map(|b| HostTensor {
                name: &b.key,
                dtype: b.dtype,
                shape: &b.shape,
                data: b.bytes,
            })
            .chain(owned.iter().map(|(n, d, s, b)| HostTensor {
                name: n,
                dtype: *d,
                shape: s,
                data: b,
            }))
            .collect();
        let staged = |i: usize| match borrowed.get(i) {
            Some(b) => sources.check(&b.weight),
            None => Ok(()),
        };
        let done = |i: usize| {
            for (file, _) in last_of_file.iter().filter(|(_, &last)| last == i) {
                sources.release(*file);
            }
        };
        let w = DeviceWeights::upload_streamed(&self.dev, tensors, true, staged, done)?;
        for (n, ..) in &owned {
            self.derived.insert(n.clone(), w.buf_ref(n)?);
        }
        for n in &stacked {
            self.derived.insert(n.clone(), w.buf_ref(&part_key(n, 0))?);
        }
        self.weights = Some(w);
        Ok(())
    }

    fn module(&mut self, m: u32) -> Result<Arc<KernelModule>, RuntimeError> {
        if let Some(k) = self.modules.get(&m) {
            return Ok(k.clone());
        }
        let info = &self.engine.modules[m as usize];
        let cubin = self.engine.cubin(m, self.arch).ok_or_else(|| {
            engine_err(format!(
                "module {}: no {} cubin in the engine",
                info.name, self.arch
            ))
        })?;
        let k = Arc::new(KernelModule::load(
            &self.dev,
            &info.name,
            KernelImage::Binary(cubin.to_vec()),
        )?);
        self.modules.insert(m, k.clone());
        Ok(k)
    }

    /// Loads one plan: its arena, its operand table and its launches (weights must be
    /// uploaded already).
    pub fn load(&mut self, plan: &BucketPlan) -> Result<LoadedGraph, RuntimeError> {
        self.load_at(plan, 0, None)
    }

    /// Bytes of one lane of the lane-major state `name` (`[B, ...]`): states are sized for
    /// the engine's largest batch bucket, whatever bucket a plan runs at.
    pub fn state_lane_bytes(&self, name: &str) -> Result<u64, RuntimeError> {
        let most = self.engine.batch_buckets().into_iter().max().unwrap_or(1);
        Ok(self.states.get(name)?.bytes() / u64::from(most.max(1)))
    }

    /// [`CudaEngine::load`] with every state slot moved `lane` lanes in, so a bucket-`b`
    /// plan reads and writes lanes `lane..lane + b` of the lane-major states (a state whose
    /// moved base is not 16-byte aligned goes through a [`Shadow`]), and its activations in
    /// `arena` where given (shared by plans that never run at once; it must hold the
    /// plan's arena).
    pub fn load_at(
        &mut self,
        plan: &BucketPlan,
        lane: u64,
        arena: Option<&DeviceArena>,
    ) -> Result<LoadedGraph, RuntimeError> {
        let most = self.engine.batch_buckets().into_iter().max().unwrap_or(1);
        if lane + u64::from(plan.bucket.b) > u64::from(most) {
            return Err(engine_err(format!(
                "lanes {lane}..{} are past the states' {most} lanes",
                lane + u64::from(plan.bucket.b)
            )));
        }
        // Constants of a plan `upload` did not see: uploaded here, kept alive by the operand
        // table that points into them.
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
        let weights = self
            .weights
            .as_ref()
            .ok_or_else(|| engine_err("weights are not uploaded".into()))?;
        let mut slots = Vec::with_capacity(plan.slots.len());
        let mut shadows = Vec::new();
        for s in &plan.slots {
            slots.push(match s {
                Slot::State(n) => {
                    let per = self.state_lane_bytes(n)?;
                    let state = self.states.get(n)?.clone();
                    let offset = lane * per;
                    if offset.is_multiple_of(TABLE_ENTRY_ALIGN) {
                        BufRef { buf: state, offset }
                    } else {
                        let bytes = per * u64::from(plan.bucket.b);
                        let label = format!("state `{n}`, lanes from {lane}");
                        let copy = Arc::new(DeviceBuffer::alloc_uninit(
                            self.dev.stream(),
                            &label,
                            bytes,
                        )?);
                        shadows.push(Shadow {
                            state,
                            offset,
                            bytes,
                            copy: copy.clone(),
                        });
                        BufRef {
                            buf: copy,
                            offset: 0,
                        }
                    }
                }
                Slot::Weight(n) => weights.buf_ref(n)?,
                Slot::Const(_) if !self.derived.contains_key(&slot_key(s)) => late_consts
                    .as_ref()
                    .expect("late constants were uploaded")
                    .buf_ref(&slot_key(s))?,
                Slot::ConcatRows(_) | Slot::WeightBlocks(_) | Slot::Const(_) => {
                    self.derived[&slot_key(s)].clone()
                }
            });
        }
        // Slot bases must be 16-byte aligned: kernels chose vector widths from offsets alone.
        pointer_table(&self.dev, "slot bases", &slots)?;
        let arena = match arena {
            Some(a) if a.bytes() >= plan.arena_bytes => a.clone(),
            Some(a) => {
                return Err(engine_err(format!(
                    "a shared arena of {} bytes cannot hold a plan's {}",
                    a.bytes(),
                    plan.arena_bytes
                )))
            }
            None => DeviceArena::new(&self.dev, plan.arena_bytes.max(256))?,
        };
        // A tensor map resolves to its tensor; its table entry is replaced by its descriptor.
        let resolve = |loc: Loc| match loc {
            Loc::TensorMap(m) => m.tensor(),
            other => other,
        };
        let resolve = |loc: Loc| match resolve(loc) {
            Loc::Table { slot, offset } => {
                let base = &slots[slot as usize];
                BufRef {
                    buf: base.buf.clone(),
                    offset: base.offset + offset,
                }
            }
            arena_loc => BufRef {
                buf: arena.buffer().clone(),
                offset: arena_loc.byte_offset(),
            },
        };
        // Tensor-map operands point into one buffer of descriptors, each encoded for its
        // launch's bucket after checking that every row it may read lies in the tensor's buffer.
        let mut descriptors: Vec<u8> = Vec::new();
        let mut described: Vec<BufRef> = Vec::new();
        for l in &plan.launches {
            for loc in &l.operands {
                if let Loc::TensorMap(m) = *loc {
                    let at = resolve(*loc);
                    let addr = at.buf.addr(at.offset, m.span_bytes(&l.bucket))?;
                    let d = encode_tensor_map(&m, addr, &l.bucket).map_err(|e| {
                        engine_err(format!(
                            "{}: {e}",
                            self.engine.kernels[l.kernel as usize].name
                        ))
                    })?;
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
            for loc in &l.operands {
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
        let mut launches = Vec::with_capacity(plan.launches.len());
        let mut kernel_names = Vec::with_capacity(plan.launches.len());
        for (l, &start) in plan.launches.iter().zip(&starts) {
            let k = &self.engine.kernels[l.kernel as usize];
            let module = self.module(k.module)?;
            let f = module.function(&k.name, l.smem_bytes)?;
            let g = (l.grid[0], l.grid[1], l.grid[2]);
            let b = (l.block[0], l.block[1], l.block[2]);
            launches.push(
                PreparedLaunch::new(
                    &k.name,
                    f,
                    g,
                    b,
                    l.smem_bytes,
                    vec![
                        KernelParam::buf(&table, 8 * start)?,
                        KernelParam::i32s(&l.bucket.consts()),
                    ],
                )?
                // Every generated kernel runs `pdl_enter()` before touching activations.
                .with_pdl(),
            );
            kernel_names.push(k.name.clone());
        }
        Ok(LoadedGraph {
            plan: plan.clone(),
            kernel_names,
            arena,
            launches,
            table,
            shadows,
        })
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

/// Why `engine` cannot run on a device of `arch`, if it cannot: no plans, no cubins, or a
/// module without this arch's cubin.
pub fn check_loadable(engine: &Engine, arch: Arch) -> Result<(), RuntimeError> {
    if let Some(why) = &engine.uncompiled {
        return Err(engine_err(format!(
            "the engine holds no cubins (NVRTC was unavailable when it was built: {why}); it runs on the CPU backend only"
        )));
    }
    if engine.plans.is_empty() {
        return Err(engine_err(
            "the engine was built without GPU kernels (for the CPU backend); rebuild it with --arch".into(),
        ));
    }
    if !engine.target.archs.contains(&arch) {
        let have: Vec<&str> = engine.target.archs.iter().map(|a| a.name()).collect();
        return Err(engine_err(format!(
            "the engine has cubins for {} but this GPU is {arch} (rebuild with --arch {arch})",
            have.join(", ")
        )));
    }
    for m in &engine.modules {
        if !m.cubins.iter().any(|c| c.arch == arch) {
            return Err(engine_err(format!(
                "module {}: no {arch} cubin in the engine",
                m.name
            )));
        }
    }
    Ok(())
}

/// The slab name of part `i` of the concatenation `key`.
fn part_key(key: &str, i: usize) -> String {
    format!("{key}#{i}")
}

/// Whether the weights `names`, uploaded one after another, lie back to back in the slab:
/// every part but the last a whole number of [`WEIGHT_ALIGN`] bytes, all 2-D with one
/// column count and one dtype (what `Slot::ConcatRows` stacks).
/// From the headers alone (the bytes are read, and checked, once, when staged).
fn contiguous_parts(names: &[String], sources: &WeightSources) -> bool {
    let mut first = None;
    names.iter().enumerate().all(|(i, n)| {
        sources.header(n).is_some_and(|(dt, shape, bytes)| {
            shape.len() == 2
                && *first.get_or_insert((dt, shape[1])) == (dt, shape[1])
                && (i + 1 == names.len() || bytes.is_multiple_of(WEIGHT_ALIGN))
        })
    })
}
