//! GPU smoke tests of the runtime's CUDA backend (`specc_runtime::cuda`). They live here,
//! not in the runtime, because they compile their kernels with NVRTC, which the runtime does
//! not link. Each prints "skipped: no CUDA driver" and passes on a machine without one; with
//! a driver they run for real.
//!
//! On the device: `cargo test -p specc-kernels-gen --features cuda --release --test
//! runtime_smoke --no-run` here, copy the `runtime_smoke-*` executable over, run it with
//! `--nocapture`.
#![cfg(feature = "cuda")]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::sys::CUstreamCaptureStatus;
use specc_ir::DType;
use specc_runtime::cuda::{
    driver_present, operand_table, BufRef, CudaDevice, CudaError, DeviceArena, DeviceWeights,
    HostTensor, KernelImage, KernelModule, KernelParam, PreparedLaunch, Retained, StateBuffers,
    StepGraph, TokenRing,
};
use specc_runtime::RuntimeError;

const SRC: &str = r#"
extern "C" __global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}

// Lane b appends n + b tokens (step * 100 + b * 10 + i) to its ring row, then advances its
// emitted count; thread 0 advances the step.
extern "C" __global__ void emit(int* ring, int* emitted, int* step, int lanes, int cap, int n) {
    int b = threadIdx.x;
    int s = step[0];
    __syncthreads();
    if (b < lanes) {
        int e = emitted[b];
        for (int i = 0; i < n + b; i++) ring[b * cap + (e + i) % cap] = s * 100 + b * 10 + i;
        emitted[b] = e + n + b;
    }
    if (b == 0) step[0] = s + 1;
}

// The generated kernels' ABI: the launch's operand table, bucket constants by value.
struct StepConsts { int b; int t; int ctx; int m; };
extern "C" __global__ void abi_probe(void* const* __restrict__ ops, const StepConsts c) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int* out = reinterpret_cast<int*>(ops[2]);
    out[0] = c.b; out[1] = c.t; out[2] = c.ctx; out[3] = c.m;
    out[4] = reinterpret_cast<const int*>(ops[0])[0];
    out[5] = reinterpret_cast<const int*>(ops[1])[0];
}
"#;

fn device() -> Option<CudaDevice> {
    if !driver_present() {
        specc_ir::testing::skip("no CUDA driver");
        return None;
    }
    match CudaDevice::open(0) {
        Ok(d) => {
            println!("{}", d.info());
            Some(d)
        }
        Err(RuntimeError::Cuda(e @ CudaError::NoDevice { .. })) => {
            specc_ir::testing::skip(&e);
            None
        }
        Err(e) => panic!("opening device 0: {e}"),
    }
}

fn module(dev: &CudaDevice) -> Option<KernelModule> {
    // SAFETY: only tries to dlopen the NVRTC library by its known names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        specc_ir::testing::skip("no NVRTC library (add its folder to LD_LIBRARY_PATH)");
        return None;
    }
    let (major, minor) = dev.info().compute_capability;
    let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        ..Default::default()
    };
    let ptx =
        cudarc::nvrtc::compile_ptx_with_opts(SRC, opts).expect("NVRTC compiles the smoke kernels");
    match KernelModule::load(dev, "smoke", KernelImage::Ptx(ptx.to_src())) {
        Ok(m) => Some(m),
        // An NVRTC newer than the driver writes PTX the driver cannot JIT: use a cubin.
        Err(e) => {
            println!("PTX did not load ({e}); loading a cubin for sm_{major}{minor} instead");
            let cubin = compile_cubin(SRC, &format!("sm_{major}{minor}"));
            Some(KernelModule::load(dev, "smoke", KernelImage::Binary(cubin)).expect("cubin loads"))
        }
    }
}

fn compile_cubin(src: &str, arch: &str) -> Vec<u8> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(src).unwrap();
    let prog = result::create_program(&src, None).expect("nvrtcCreateProgram");
    let opts = [format!("--gpu-architecture={arch}")];
    // SAFETY: `prog` is a live program (destroyed once at the end); the size query and the
    // copy write into buffers of the reported size.
    unsafe {
        result::compile_program(prog, &opts).expect("NVRTC compiles the smoke kernels to a cubin");
        let mut n = 0usize;
        sys::nvrtcGetCUBINSize(prog, &mut n)
            .result()
            .expect("cubin size");
        let mut cubin = vec![0u8; n];
        sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
            .result()
            .expect("cubin");
        result::destroy_program(prog).expect("nvrtcDestroyProgram");
        cubin
    }
}

fn capture_status(dev: &CudaDevice) -> CUstreamCaptureStatus {
    dev.stream().capture_status().expect("capture status")
}

#[test]
fn graph_of_100_launches_replays() {
    let Some(dev) = device() else { return };
    let Some(m) = module(&dev) else { return };
    let add_one = m.function("add_one", 0).unwrap();
    let n = 4096i32;
    let x = dev.alloc_zeroed("x", n as u64 * 4).unwrap();
    let launch = || {
        PreparedLaunch::new(
            "add_one",
            add_one.clone(),
            ((n as u32).div_ceil(256), 1, 1),
            (256, 1, 1),
            0,
            vec![KernelParam::buf(&x, 0).unwrap(), KernelParam::I32(n)],
        )
        .unwrap()
    };
    let launches: Vec<_> = (0..100).map(|_| launch()).collect();
    let kernels_before = dev.counters().kernel_launches();
    let graphs_before = dev.counters().graph_launches();
    let g = StepGraph::from_launches(&dev, launches, vec![]).unwrap();
    assert_eq!(g.node_count(), 100);
    assert_eq!(
        capture_status(&dev),
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    );
    // The graph keeps `x` alive through its launches: drop ours and read through the graph.
    let weak = Arc::downgrade(&x);
    drop(x);
    for _ in 0..3 {
        g.replay().unwrap();
    }
    let x = weak.upgrade().expect("the graph retains the buffer");
    let got = x.read(0, n as u64 * 4).unwrap();
    for (i, c) in got.chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        assert_eq!(
            v, 300.0,
            "x[{i}] = {v}, want 300 after 3 replays of 100 launches"
        );
    }
    assert_eq!(g.replays(), 3);
    assert_eq!(dev.counters().graph_launches() - graphs_before, 3);
    // Kernels were enqueued only while capturing: replays add graph launches only.
    assert_eq!(dev.counters().kernel_launches() - kernels_before, 100);
    drop(x);
    drop(g);
    assert!(
        weak.upgrade().is_none(),
        "dropping the graph frees the buffer"
    );
}

#[test]
fn launch_checks_reject_bad_params() {
    let Some(dev) = device() else { return };
    let Some(m) = module(&dev) else { return };
    let add_one = m.function("add_one", 0).unwrap();
    let x = dev.alloc_zeroed("x", 1024).unwrap();
    let bad_block = PreparedLaunch::new(
        "add_one",
        add_one.clone(),
        (1, 1, 1),
        (2048, 1, 1),
        0,
        vec![KernelParam::buf(&x, 0).unwrap(), KernelParam::I32(1)],
    );
    assert!(bad_block.is_err());
    let too_much_smem = PreparedLaunch::new(
        "add_one",
        add_one.clone(),
        (1, 1, 1),
        (32, 1, 1),
        64 * 1024,
        vec![KernelParam::buf(&x, 0).unwrap(), KernelParam::I32(1)],
    );
    assert!(too_much_smem.is_err());
    assert!(KernelParam::buf(&x, 2048).is_err());
    let wrong_params = PreparedLaunch::new(
        "add_one",
        add_one,
        (1, 1, 1),
        (32, 1, 1),
        0,
        vec![KernelParam::buf(&x, 0).unwrap(), KernelParam::I64(1)],
    );
    if dev.info().driver_version >= 12040 {
        let e = wrong_params
            .expect_err("cuFuncGetParamInfo sees the 8-byte int")
            .to_string();
        assert!(e.contains("parameter 1 is 4 bytes"), "{e}");
    }
    let smem = m.function("add_one", 100 * 1024);
    println!("add_one with 100 KiB dynamic smem: {:?}", smem.map(|_| ()));
}

#[test]
fn capture_guard_ends_capture_on_error_and_panic() {
    let Some(dev) = device() else { return };
    let Some(m) = module(&dev) else { return };
    let add_one = m.function("add_one", 0).unwrap();
    let x = dev.alloc_zeroed("x", 1024).unwrap();
    let l = PreparedLaunch::new(
        "add_one",
        add_one,
        (1, 1, 1),
        (256, 1, 1),
        0,
        vec![KernelParam::buf(&x, 0).unwrap(), KernelParam::I32(256)],
    )
    .unwrap();
    let retained = Retained {
        launches: vec![l],
        ..Default::default()
    };
    // An error from the closure.
    let r = StepGraph::capture(&dev, retained.clone(), |_, _| {
        Err(CudaError::Capture("test error".into()).into())
    });
    assert!(r.is_err());
    assert_eq!(
        capture_status(&dev),
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    );
    // A call that cannot be captured (a stream sync) invalidates the capture.
    let r = StepGraph::capture(&dev, retained.clone(), |dev, r| {
        specc_runtime::cuda::launch_all(dev, &r.launches)?;
        dev.synchronize()
    });
    assert!(r.is_err(), "a sync inside capture must fail the capture");
    assert_eq!(
        capture_status(&dev),
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    );
    // A panic.
    let r = catch_unwind(AssertUnwindSafe(|| {
        let _ = StepGraph::capture(&dev, retained.clone(), |_, _| panic!("boom"));
    }));
    assert!(r.is_err());
    assert_eq!(
        capture_status(&dev),
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    );
    // The stream still captures and runs normally afterwards.
    let g = StepGraph::capture(&dev, retained, |dev, r| {
        specc_runtime::cuda::launch_all(dev, &r.launches)
    })
    .unwrap();
    g.replay().unwrap();
    let v = x.read(0, 4).unwrap();
    assert_eq!(f32::from_le_bytes([v[0], v[1], v[2], v[3]]), 1.0);
}

#[test]
fn token_ring_round_trip() {
    let Some(dev) = device() else { return };
    let Some(m) = module(&dev) else { return };
    let emit = m.function("emit", 0).unwrap();
    let (lanes, cap, n) = (2usize, 13usize, 5i32);
    let mut ring = TokenRing::new(&dev, lanes, cap, 2).unwrap();
    let step = dev.alloc_zeroed("step", 4).unwrap();
    let l = PreparedLaunch::new(
        "emit",
        emit,
        (1, 1, 1),
        (32, 1, 1),
        0,
        vec![
            KernelParam::buf(ring.ring_buffer(), 0).unwrap(),
            KernelParam::buf(ring.emitted_buffer(), 0).unwrap(),
            KernelParam::buf(&step, 0).unwrap(),
            KernelParam::I32(lanes as i32),
            KernelParam::I32(cap as i32),
            KernelParam::I32(n),
        ],
    )
    .unwrap();
    let g = StepGraph::from_launches(&dev, vec![l], vec![]).unwrap();
    let want = |steps: std::ops::Range<i32>, b: i32| -> Vec<i32> {
        steps
            .flat_map(|s| (0..n + b).map(move |i| s * 100 + b * 10 + i))
            .collect()
    };
    let mut got = vec![Vec::new(); lanes];
    // 7 steps of 5 and 6 tokens through 13-slot rings with 2 mirrors: the host reads at least
    // every other step (after_replay harvests when both mirrors are pending), so nothing is
    // lost, and the slots wrap several times.
    for _ in 0..7 {
        g.replay().unwrap();
        ring.after_replay().unwrap();
        for (b, t) in ring.poll().unwrap().into_iter().enumerate() {
            got[b].extend(t);
        }
    }
    for (b, t) in ring.wait().unwrap().into_iter().enumerate() {
        got[b].extend(t);
    }
    assert_eq!(got[0], want(0..7, 0));
    assert_eq!(got[1], want(0..7, 1));
    assert!(ring.poll().unwrap().iter().all(|t| t.is_empty()));

    // 4 steps without a copy: 20 tokens overflow lane 0's 13 slots, and the host is told.
    for _ in 0..4 {
        g.replay().unwrap();
    }
    ring.after_replay().unwrap();
    match ring.wait() {
        Err(RuntimeError::Cuda(CudaError::RingOverflow {
            lane: 0,
            unread: 20,
            capacity: 13,
        })) => {}
        other => panic!("want overflow, got {other:?}"),
    }
    ring.reset_lane(0).unwrap();
    ring.reset_lane(1).unwrap();
    g.replay().unwrap();
    ring.after_replay().unwrap();
    assert_eq!(ring.wait().unwrap(), vec![want(11..12, 0), want(11..12, 1)]);
}

#[test]
fn weights_upload_and_table() {
    let Some(dev) = device() else { return };
    let pattern = |n: usize, seed: usize| -> Vec<u8> {
        (0..n).map(|i| ((i * 7 + seed) % 251) as u8).collect()
    };
    let a = pattern(30, 1);
    let b = pattern(28, 2);
    // Larger than two 64 MiB staging buffers, so both alternate.
    let big_shape = [130usize << 20];
    let c = pattern(big_shape[0], 3);
    let tensors = [
        HostTensor {
            name: "a",
            dtype: DType::BF16,
            shape: &[3, 5],
            data: &a,
        },
        HostTensor {
            name: "b",
            dtype: DType::F32,
            shape: &[7],
            data: &b,
        },
        HostTensor {
            name: "c",
            dtype: DType::Fp8E4M3,
            shape: &big_shape,
            data: &c,
        },
    ];
    let w = DeviceWeights::upload(&dev, tensors, true).unwrap();
    for (name, data) in [("a", &a), ("b", &b), ("c", &c)] {
        let e = w.entry(name).unwrap();
        assert_eq!(e.offset % 256, 0);
        let got = w.slab().read(e.offset, e.bytes).unwrap();
        assert!(got == *data, "weight `{name}` differs after upload");
    }
    // Padding between tensors is zero.
    let pad = w.slab().read(30, 256 - 30).unwrap();
    assert!(pad.iter().all(|&x| x == 0));
    let table = w.table(&dev, &["c", "a"]).unwrap();
    let t = table.read(0, 16).unwrap();
    assert_eq!(
        u64::from_le_bytes(t[..8].try_into().unwrap()),
        w.ptr("c").unwrap()
    );
    assert_eq!(
        u64::from_le_bytes(t[8..].try_into().unwrap()),
        w.ptr("a").unwrap()
    );
    assert!(w.table(&dev, &["nope"]).is_err());
    let wrong = [HostTensor {
        name: "x",
        dtype: DType::BF16,
        shape: &[4],
        data: &a,
    }];
    assert!(matches!(
        DeviceWeights::upload(&dev, wrong, false),
        Err(RuntimeError::Cuda(CudaError::WeightSize {
            got: 30,
            want: 8,
            ..
        }))
    ));
}

#[test]
fn arena_and_states() {
    let Some(dev) = device() else { return };
    let arena = DeviceArena::new(&dev, 4096).unwrap();
    assert!(arena.read(0, 4096).unwrap().iter().all(|&b| b == 0));
    arena.write_input(256, &[1, 2, 3, 4]).unwrap();
    assert_eq!(arena.read(254, 8).unwrap(), vec![0, 0, 1, 2, 3, 4, 0, 0]);
    assert!(matches!(
        arena.write_input(4094, &[1, 2, 3]),
        Err(RuntimeError::Cuda(CudaError::OutOfBounds { .. }))
    ));
    let states = StateBuffers::new(&dev, [("k", 1000), ("v", 2000)]).unwrap();
    assert_ne!(states.ptr("k").unwrap(), states.ptr("v").unwrap());
    assert!(states
        .get("v")
        .unwrap()
        .read(0, 2000)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    assert!(states.ptr("q").is_err());
    assert_eq!(states.total_bytes(), 3000);
    let (free, total) = dev.mem_info().unwrap();
    assert!(free <= total);
    match dev.alloc("too big", total * 2) {
        Err(RuntimeError::Cuda(CudaError::OutOfMemory { requested, .. })) => {
            assert!(requested >= total * 2)
        }
        other => panic!("want out of memory, got {:?}", other.map(|b| b.bytes())),
    }
}

#[test]
fn abi_kernel_reads_table_and_consts() {
    let Some(dev) = device() else { return };
    let Some(m) = module(&dev) else { return };
    let probe = m.function("abi_probe", 0).unwrap();
    let w_data: Vec<u8> = [42i32, 0, 0, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let w = DeviceWeights::upload(
        &dev,
        [HostTensor {
            name: "w",
            dtype: DType::I32,
            shape: &[4],
            data: &w_data,
        }],
        false,
    )
    .unwrap();
    let states = StateBuffers::new(&dev, [("kv", 64)]).unwrap();
    states
        .get("kv")
        .unwrap()
        .write(4, &7i32.to_le_bytes())
        .unwrap();
    let arena = DeviceArena::new(&dev, 1024).unwrap();
    let mut kv = states.buf_ref("kv").unwrap();
    kv.offset += 4;
    let arena_out = BufRef {
        buf: arena.buffer().clone(),
        offset: 256,
    };
    let table = operand_table(&dev, "ops", &[w.buf_ref("w").unwrap(), kv, arena_out]).unwrap();
    let params = vec![
        KernelParam::buf(&table, 0).unwrap(),
        KernelParam::i32s(&[2, 3, 64, 6]),
    ];
    if dev.info().driver_version >= 12040 {
        let mut short = params.clone();
        short[1] = KernelParam::I32(2);
        assert!(
            PreparedLaunch::new("abi_probe", probe.clone(), (1, 1, 1), (32, 1, 1), 0, short)
                .is_err()
        );
    }
    let l = PreparedLaunch::new("abi_probe", probe, (1, 1, 1), (32, 1, 1), 0, params).unwrap();
    // The table holds the weight slab, the state and the arena: retaining it is enough.
    let g = StepGraph::from_launches(&dev, vec![l], vec![]).unwrap();
    drop((w, states, table));
    g.replay().unwrap();
    let got: Vec<i32> = arena
        .read(256, 24)
        .unwrap()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(got, vec![2, 3, 64, 6, 42, 7]);
}

/// Needs only NVRTC (no driver): the smoke kernels build for Hopper.
#[test]
fn smoke_kernels_compile_to_cubin() {
    // SAFETY: only tries to dlopen the NVRTC library by its known names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        specc_ir::testing::skip("no NVRTC library");
        return;
    }
    let cubin = compile_cubin(SRC, "sm_90a");
    assert!(matches!(
        KernelImage::from_bytes(cubin),
        Ok(KernelImage::Binary(_))
    ));
}
