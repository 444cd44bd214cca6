//! GPU parity harness: host images of the arena and the slot buffers, launches through the
//! kernel ABI (one operand table per launch), and one-op (or few-op) reference graphs run by the IR interpreter.

#![allow(dead_code)]

pub mod quant;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use specc_ir::interp::{run, Env, Tensor};
use specc_ir::{Bindings, DType, Dim, Graph, Op, TensorType, ValueId};
use specc_kernels_gen::abi::{Bucket, Dtype, KernelSource, Loc, StepConsts, TensorMap};
use specc_kernels_gen::tensor_map::DESCRIPTOR_BYTES;
use specc_kernels_gen::{Arch, Error, Nvrtc, Target};
use specc_runtime::cuda::encode_tensor_map;
use std::collections::HashMap;
use std::sync::Arc;

pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    nvrtc: Nvrtc,
    arch: Arch,
    target: Target,
    /// Cubins of [`Gpu::precompile`], by kernel entry.
    precompiled: std::sync::Mutex<HashMap<String, Arc<Vec<u8>>>>,
}

impl Gpu {
    /// The device, or `None` (with a printed reason) when no driver or NVRTC is present.
    pub fn new() -> Option<Gpu> {
        // SAFETY: probing the driver library; see GPU.md (CudaContext::new panics without it).
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            specc_ir::testing::skip("no CUDA driver library");
            return None;
        }
        let nvrtc = match Nvrtc::new() {
            Ok(n) => n.with_cache_dir(None),
            Err(e @ (Error::NvrtcUnavailable { .. } | Error::HeadersNotFound { .. })) => {
                specc_ir::testing::skip(&e);
                return None;
            }
            Err(e) => panic!("{e}"),
        };
        let ctx = CudaContext::new(0).expect("CUDA context");
        let (major, _) = ctx.compute_capability().expect("compute capability");
        let arch = match major {
            9 => Arch::Sm90a,
            10 => Arch::Sm100a,
            12 => Arch::Sm120,
            other => panic!("no supported arch for compute capability {other}.x"),
        };
        let attr = |a| ctx.attribute(a).expect("device attribute") as u32;
        use cudarc::driver::sys::CUdevice_attribute as A;
        let target = Target::for_device(
            arch,
            attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            &ctx.name().unwrap_or_else(|_| arch.name().to_string()),
        );
        // SAFETY: everything runs on the one default stream, which orders all work; no
        // per-buffer events are needed (and timing loops should not carry them).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        Some(Gpu {
            ctx,
            stream,
            nvrtc,
            arch,
            target,
            precompiled: Default::default(),
        })
    }

    /// Compiles `kernels` on every CPU of the machine at once (a sweep's hundreds of
    /// variants); [`Gpu::time`] and [`Gpu::run`] then load them without compiling.
    pub fn precompile(&self, kernels: &[&KernelSource]) {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let modules = self
            .nvrtc
            .compile_many(kernels, &[self.arch], threads)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut map = self.precompiled.lock().unwrap();
        for m in modules {
            let cubin = Arc::new(m.compiled.cubin);
            for e in m.entries {
                map.insert(e, cubin.clone());
            }
        }
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The device as a build target (its SMs and shared memory per block): the kernel
    /// choices the plan would make for it.
    pub fn target(&self) -> &Target {
        &self.target
    }

    fn load(&self, k: &KernelSource) -> CudaFunction {
        let pre = self.precompiled.lock().unwrap().get(&k.entry).cloned();
        let cubin = match pre {
            Some(c) => c.as_ref().clone(),
            None => {
                self.nvrtc
                    .compile(k, self.arch)
                    .unwrap_or_else(|e| panic!("{e}"))
                    .cubin
            }
        };
        let module = self.ctx.load_module(Ptx::from_binary(cubin)).unwrap();
        let f = module.load_function(&k.entry).unwrap();
        // Above its current limit (48 KiB minus its static shared memory by default) a
        // kernel must opt in, as the runtime does.
        let smem = k.launch.smem_bytes;
        let limit = f
            .get_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            )
            .unwrap_or(0)
            .max(0) as u32;
        if smem > limit {
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .unwrap_or_else(|e| panic!("{}: {smem} bytes of dynamic smem: {e}", k.name));
        }
        f
    }

    fn config(k: &KernelSource, bucket: Bucket) -> LaunchConfig {
        let g = k.launch.resolve(&bucket);
        LaunchConfig {
            grid_dim: (g.grid[0], g.grid[1], g.grid[2]),
            block_dim: (g.block[0], g.block[1], g.block[2]),
            shared_mem_bytes: g.smem_bytes,
        }
    }

    /// Microseconds per run of `kernels` (mean of `iters` back-to-back runs after a
    /// warm-up), cycling through `copies` copies of the table buffers, each with its own
    /// `bufs` table, so that weights stream from HBM rather than L2.
    pub fn time(
        &self,
        mem: &Mem,
        kernels: &[&KernelSource],
        bucket: Bucket,
        copies: usize,
        iters: usize,
    ) -> f64 {
        self.time_many(mem, &[kernels], bucket, copies, iters)[0]
    }

    /// [`Gpu::time`] of each list of kernels in turn, over one upload of `mem` (the arena
    /// carries over from list to list).
    pub fn time_many(
        &self,
        mem: &Mem,
        lists: &[&[&KernelSource]],
        bucket: Bucket,
        copies: usize,
        iters: usize,
    ) -> Vec<f64> {
        let s = &self.stream;
        let arena: CudaSlice<u8> = s.clone_htod(&mem.arena).unwrap();
        let sets: Vec<Vec<CudaSlice<u8>>> = (0..copies)
            .map(|_| mem.bufs.iter().map(|b| s.clone_htod(b).unwrap()).collect())
            .collect();
        let arena_ptr = arena.device_ptr(s).0;
        let consts = StepConsts::of(&bucket);
        let mut out = Vec::new();
        for kernels in lists {
            // Per copy, per kernel: the launch's operand table.
            let tables: Vec<Vec<CudaSlice<u64>>> = sets
                .iter()
                .map(|set| {
                    let slots: Vec<u64> = set.iter().map(|b| b.device_ptr(s).0).collect();
                    kernels
                        .iter()
                        .map(|k| operand_table(s, k, arena_ptr, &slots, bucket))
                        .collect()
                })
                .collect();
            let fns: Vec<_> = kernels
                .iter()
                .map(|k| (self.load(k), Self::config(k, bucket)))
                .collect();
            let launch_all = |i: usize| {
                for (j, (f, cfg)) in fns.iter().enumerate() {
                    let mut b = s.launch_builder(f);
                    b.arg(&tables[i % copies][j]).arg(&consts);
                    // SAFETY: as in `run`.
                    unsafe { b.launch(*cfg) }.unwrap();
                }
            };
            for i in 0..copies.max(3) {
                launch_all(i);
            }
            let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let start = s.record_event(flags).unwrap();
            for i in 0..iters {
                launch_all(i);
            }
            let end = s.record_event(flags).unwrap();
            end.synchronize().unwrap();
            out.push(start.elapsed_ms(&end).unwrap() as f64 * 1e3 / iters as f64);
        }
        out
    }

    /// Device-to-device copy bandwidth in GB/s (bytes read plus bytes written), over 1 GiB
    /// copied `iters` times after a warm-up: the ceiling the streaming kernels are held to.
    pub fn copy_gbps(&self, iters: usize) -> f64 {
        let s = &self.stream;
        let n = 1usize << 30;
        let src: CudaSlice<u8> = s.alloc_zeros(n).unwrap();
        let mut dst: CudaSlice<u8> = s.alloc_zeros(n).unwrap();
        s.memcpy_dtod(&src, &mut dst).unwrap();
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = s.record_event(flags).unwrap();
        for _ in 0..iters {
            s.memcpy_dtod(&src, &mut dst).unwrap();
        }
        let end = s.record_event(flags).unwrap();
        end.synchronize().unwrap();
        let ms = start.elapsed_ms(&end).unwrap() as f64 / iters as f64;
        2.0 * n as f64 / (ms * 1e-3) / 1e9
    }

    /// Uploads `mem`, runs `kernels` in order for `bucket`, downloads `mem` again.
    pub fn run(&self, mem: &mut Mem, kernels: &[&KernelSource], bucket: Bucket) {
        let s = &self.stream;
        let arena: CudaSlice<u8> = s.clone_htod(&mem.arena).unwrap();
        let bufs: Vec<CudaSlice<u8>> = mem.bufs.iter().map(|b| s.clone_htod(b).unwrap()).collect();
        let slots: Vec<u64> = bufs.iter().map(|b| b.device_ptr(s).0).collect();
        let arena_ptr = arena.device_ptr(s).0;
        let consts = StepConsts::of(&bucket);
        for k in kernels {
            let f = self.load(k);
            let cfg = Self::config(k, bucket);
            let table = operand_table(s, k, arena_ptr, &slots, bucket);
            let mut b = s.launch_builder(&f);
            b.arg(&table).arg(&consts);
            // SAFETY: every kernel takes exactly (void* const*, StepConsts); its operand
            // table points into the arena and buffers, sized by the test's plan.
            unsafe { b.launch(cfg) }.unwrap_or_else(|e| panic!("launch {}: {e}", k.name));
        }
        s.synchronize().unwrap();
        mem.arena = s.clone_dtoh(&arena).unwrap();
        for (host, dev) in mem.bufs.iter_mut().zip(&bufs) {
            *host = s.clone_dtoh(dev).unwrap();
        }
    }
}

/// `k`'s operand table for this arena and these buffers on the device (never empty: a
/// kernel without operands still gets a valid pointer). Tensor-map operands point at
/// descriptors encoded for `bucket` and stored past the addresses, 128-byte aligned.
fn operand_table(
    s: &Arc<CudaStream>,
    k: &KernelSource,
    arena: u64,
    slots: &[u64],
    bucket: Bucket,
) -> CudaSlice<u64> {
    let mut t = k.operand_addresses(arena, slots);
    if t.is_empty() {
        t.push(arena);
    }
    let maps: Vec<(usize, TensorMap)> = k
        .operands
        .iter()
        .enumerate()
        .filter_map(|(i, l)| match l {
            Loc::TensorMap(m) => Some((i, *m)),
            _ => None,
        })
        .collect();
    let words = DESCRIPTOR_BYTES as usize / 8;
    let first = t.len().next_multiple_of(words);
    let mut table: CudaSlice<u64> = s.alloc_zeros(first + maps.len() * words).unwrap();
    let base = table.device_ptr(s).0;
    t.resize(first, 0);
    for (j, (i, m)) in maps.into_iter().enumerate() {
        let desc =
            encode_tensor_map(&m, t[i], &bucket).unwrap_or_else(|e| panic!("{}: {e}", k.name));
        t[i] = base + ((first + j * words) * 8) as u64;
        t.extend(
            desc.chunks(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap())),
        );
    }
    s.memcpy_htod(&t, &mut table).unwrap();
    table
}

/// Host images of the arena and of the table's buffers.
#[derive(Clone)]
pub struct Mem {
    pub arena: Vec<u8>,
    pub bufs: Vec<Vec<u8>>,
}

impl Mem {
    pub fn new(arena_bytes: u64, buf_bytes: &[u64]) -> Mem {
        Mem {
            arena: vec![0; arena_bytes as usize],
            bufs: buf_bytes.iter().map(|&n| vec![0; n as usize]).collect(),
        }
    }

    fn bytes_mut(&mut self, loc: Loc) -> &mut [u8] {
        match loc {
            Loc::Arena { offset } => &mut self.arena[offset as usize..],
            Loc::Table { slot, offset } => &mut self.bufs[slot as usize][offset as usize..],
            Loc::TensorMap(m) => self.bytes_mut(m.tensor()),
        }
    }

    fn bytes(&self, loc: Loc) -> &[u8] {
        match loc {
            Loc::Arena { offset } => &self.arena[offset as usize..],
            Loc::Table { slot, offset } => &self.bufs[slot as usize][offset as usize..],
            Loc::TensorMap(m) => self.bytes(m.tensor()),
        }
    }

    /// Writes floats (rounded to `dtype`) or integers (`as` the int type) at `loc`.
    pub fn put(&mut self, loc: Loc, dtype: Dtype, vals: &[f64]) {
        let size = dtype.size() as usize;
        let out = self.bytes_mut(loc);
        for (i, &v) in vals.iter().enumerate() {
            let dst = &mut out[i * size..(i + 1) * size];
            match dtype {
                Dtype::BF16 => dst.copy_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
                Dtype::F16 => dst.copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
                Dtype::F32 => dst.copy_from_slice(&(v as f32).to_le_bytes()),
                Dtype::I32 => dst.copy_from_slice(&(v as i32).to_le_bytes()),
                Dtype::I64 => dst.copy_from_slice(&(v as i64).to_le_bytes()),
            }
        }
    }

    /// Reads `n` values at `loc` as f64.
    pub fn get(&self, loc: Loc, dtype: Dtype, n: usize) -> Vec<f64> {
        let size = dtype.size() as usize;
        let src = self.bytes(loc);
        (0..n)
            .map(|i| {
                let b = &src[i * size..(i + 1) * size];
                match dtype {
                    Dtype::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
                    Dtype::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
                    Dtype::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
                    Dtype::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
                    Dtype::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
                }
            })
            .collect()
    }
}

/// Deterministic pseudo-random values (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in `[-scale, scale)`.
    pub fn next(&mut self, scale: f64) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let u = (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
        (2.0 * u - 1.0) * scale
    }

    pub fn vec(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| self.next(scale)).collect()
    }
}

pub fn ir_dtype(d: Dtype) -> DType {
    match d {
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::F32 => DType::F32,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
    }
}

/// A tensor of the IR dtype matching `dtype`, from f64 values.
pub fn tensor(dtype: Dtype, shape: &[usize], vals: &[f64]) -> Tensor {
    let d = ir_dtype(dtype);
    if dtype.is_int() {
        Tensor::from_i64(d, shape.to_vec(), vals.iter().map(|&v| v as i64).collect())
    } else {
        Tensor::from_f32(d, shape.to_vec(), vals.iter().map(|&v| v as f32).collect())
    }
}

/// A small reference graph run by the interpreter.
pub struct Reference {
    g: Graph,
    inputs: HashMap<String, Tensor>,
    states: HashMap<String, Tensor>,
}

impl Reference {
    pub fn new() -> Reference {
        Reference {
            g: Graph::new("reference"),
            inputs: HashMap::new(),
            states: HashMap::new(),
        }
    }

    fn ty(t: &Tensor) -> TensorType {
        TensorType::new(t.dtype, t.shape.iter().map(|&d| Dim::from(d)))
    }

    pub fn input(&mut self, name: &str, t: Tensor) -> ValueId {
        let v = self.g.input(name, Self::ty(&t)).unwrap();
        self.inputs.insert(name.to_string(), t);
        v
    }

    pub fn state(&mut self, name: &str, t: Tensor) -> ValueId {
        let v = self.g.state(name, Self::ty(&t)).unwrap();
        self.states.insert(name.to_string(), t);
        v
    }

    pub fn op(&mut self, op: Op, args: &[ValueId]) -> ValueId {
        self.g.add(op, args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs the graph; returns the named outputs and the final states, as f64.
    pub fn run(mut self, outputs: &[(&str, ValueId)]) -> HashMap<String, Vec<f64>> {
        for (name, v) in outputs {
            self.g.set_output(name, *v);
        }
        let weights: HashMap<String, Tensor> = HashMap::new();
        let mut env = Env {
            bind: Bindings::default(),
            inputs: std::mem::take(&mut self.inputs),
            weights: &weights,
            states: &mut self.states,
        };
        let outs = run(&self.g, &mut env).unwrap_or_else(|e| panic!("interpreter: {e}"));
        let as_f64 = |t: &Tensor| -> Vec<f64> {
            match t.as_f32() {
                Ok(v) => v.iter().map(|&x| x as f64).collect(),
                Err(_) => t.as_i64().unwrap().iter().map(|&x| x as f64).collect(),
            }
        };
        let mut res: HashMap<String, Vec<f64>> =
            outs.iter().map(|(k, t)| (k.clone(), as_f64(t))).collect();
        for (k, t) in &self.states {
            res.insert(format!("state:{k}"), as_f64(t));
        }
        res
    }
}

/// Asserts `|got − want| ≤ rtol·|want| + atol` everywhere; prints the first failures with
/// index, got, want and tolerance, and how many values were bit-exact.
#[track_caller]
pub fn assert_close(label: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{label}: length");
    let mut bad = Vec::new();
    let mut exact = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g == w || (g.is_nan() && w.is_nan()) {
            exact += 1;
        } else if (g - w).abs() > rtol * w.abs() + atol || g.is_nan() || w.is_nan() {
            bad.push(format!(
                "  [{i}] got {g}, want {w}, tol {}",
                rtol * w.abs() + atol
            ));
        }
    }
    println!(
        "{label}: {} values, {exact} exact, {} outside tolerance",
        got.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "{label}: {} of {} values outside tolerance (rtol {rtol}, atol {atol}):\n{}",
        bad.len(),
        got.len(),
        bad.iter().take(12).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// Tolerance for a bf16 result whose f32 inputs were summed in another order: two bf16
/// ulps relative, plus a floor scaled to the largest magnitude.
pub fn bf16_tol(want: &[f64]) -> (f64, f64) {
    let peak = want.iter().fold(0.0f64, |m, &w| m.max(w.abs()));
    (1.0 / 128.0, peak / 1024.0)
}
