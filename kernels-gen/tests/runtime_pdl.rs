//! Programmatic dependent launch (PDL) on the GPU: a chain of dependent kernels with the
//! generated kernels' ABI and prelude (`pdl_enter()`, `prefetch_l2`), ping-ponging between
//! reused arena offsets (read-after-write and write-after-read hazards on every link), with a
//! device-to-device copy node in the middle, captured into one graph with PDL on and replayed;
//! the same chain launched eagerly; and PDL off for comparison. Prints "skipped: ..." and
//! passes without a driver or NVRTC.
//!
//! A runtime test (`specc_runtime::cuda`) that lives here because it compiles its kernels
//! with NVRTC, which the runtime does not link. On the device: `cargo test -p
//! specc-kernels-gen --features cuda --release --test runtime_pdl --no-run` here, copy the
//! `runtime_pdl-*` executable over, run it with `--nocapture`.
#![cfg(feature = "cuda")]

use std::time::Instant;

use specc_kernels_gen::abi::PRELUDE;
use specc_kernels_gen::{Arch, Nvrtc};
use specc_runtime::cuda::{
    driver_present, launch_all, pointer_table, BufRef, CudaDevice, CudaError, DeviceArena,
    KernelImage, KernelModule, KernelParam, PreparedLaunch, Retained, StepGraph,
};
use specc_runtime::RuntimeError;

/// `link`: `dst[i] = src[i] + bufs[0][0]` over `c.m` ints, `src` at int offset `c.b` and
/// `dst` at int offset `c.t` of the arena, written like a generated kernel (prefetch of
/// read-only memory, then the PDL wait, then everything else). `racy_link` is the same
/// without the wait: a control that shows whether launches really overlap.
const KERNELS: &str = r#"
extern "C" __global__ void __launch_bounds__(256)
link(char* __restrict__ arena, void* const* __restrict__ bufs, const StepConsts c) {
  prefetch_l2(bufs[0]);
  pdl_enter();
  const int* src = reinterpret_cast<const int*>(arena) + c.b;
  int* dst = reinterpret_cast<int*>(arena) + c.t;
  const int step = static_cast<const int*>(bufs[0])[0];
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < c.m;
       i += (long long)gridDim.x * blockDim.x) {
    dst[i] = src[i] + step;
  }
}

extern "C" __global__ void __launch_bounds__(256)
racy_link(char* __restrict__ arena, void* const* __restrict__ bufs, const StepConsts c) {
  pdl_launch_dependents();
  const int* src = reinterpret_cast<const int*>(arena) + c.b;
  int* dst = reinterpret_cast<int*>(arena) + c.t;
  const int step = static_cast<const int*>(bufs[0])[0];
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < c.m;
       i += (long long)gridDim.x * blockDim.x) {
    dst[i] = src[i] + step;
  }
}
"#;

/// Ints per arena region; three regions A, B, C.
const N: usize = 1 << 22;
/// Links before and after the copy node; both even, so each segment ends where it started.
const LINKS_BEFORE: usize = 20;
const LINKS_AFTER: usize = 20;

fn device() -> Option<CudaDevice> {
    if !driver_present() {
        specc_ir::testing::skip("no CUDA driver");
        return None;
    }
    match CudaDevice::open(0) {
        Ok(d) => {
            println!("{} (PDL {})", d.info(), d.pdl_enabled());
            Some(d)
        }
        Err(RuntimeError::Cuda(e @ CudaError::NoDevice { .. })) => {
            specc_ir::testing::skip(&e);
            None
        }
        Err(e) => panic!("opening device 0: {e}"),
    }
}

/// The kernels, compiled like the engine compiles generated ones.
fn module(dev: &CudaDevice) -> Option<KernelModule> {
    let nvrtc = match Nvrtc::new() {
        Ok(n) => n.with_cache_dir(None),
        Err(e) => {
            specc_ir::testing::skip(&e);
            return None;
        }
    };
    let arch: Arch = match dev.info().arch.parse() {
        Ok(a) => a,
        Err(e) => {
            specc_ir::testing::skip(&e);
            return None;
        }
    };
    let source = format!("{PRELUDE}\n{KERNELS}");
    let compiled = nvrtc
        .compile_source("pdl_chain", &source, arch)
        .unwrap_or_else(|e| panic!("{e}"));
    Some(KernelModule::load(dev, "pdl_chain", KernelImage::Binary(compiled.cubin)).unwrap())
}

/// The chain over one arena: regions A = [0, N), B = [N, 2N), C = [2N, 3N) (ints), and a
/// table whose slot 0 holds the increment 1.
struct Chain {
    arena: DeviceArena,
    /// Ping-pong A -> B -> A ... (`LINKS_BEFORE` links, ends in A).
    before: Vec<PreparedLaunch>,
    /// Ping-pong C -> B -> C ... (`LINKS_AFTER` links, ends in C).
    after: Vec<PreparedLaunch>,
}

fn chain(dev: &CudaDevice, m: &KernelModule, kernel: &str) -> Chain {
    let arena = DeviceArena::new(dev, (3 * N * 4) as u64).unwrap();
    arena.buffer().zero(0, arena.bytes()).unwrap();
    let one = dev.alloc("increment", 16).unwrap();
    one.write(0, &1i32.to_ne_bytes()).unwrap();
    let table = pointer_table(
        dev,
        "bufs",
        &[BufRef {
            buf: one,
            offset: 0,
        }],
    )
    .unwrap();
    let f = m.function(kernel, 0).unwrap();
    let blocks = dev.info().sm_count * 2;
    let link = |src: usize, dst: usize| {
        let l = PreparedLaunch::new(
            kernel,
            f.clone(),
            (blocks, 1, 1),
            (256, 1, 1),
            0,
            vec![
                KernelParam::buf(arena.buffer(), 0).unwrap(),
                KernelParam::buf(&table, 0).unwrap(),
                KernelParam::i32s(&[src as i32, dst as i32, 0, N as i32]),
            ],
        )
        .unwrap();
        l.with_pdl()
    };
    let (a, b, c) = (0, N, 2 * N);
    let pingpong = |x: usize, links: usize| -> Vec<PreparedLaunch> {
        (0..links)
            .map(|i| if i % 2 == 0 { link(x, b) } else { link(b, x) })
            .collect()
    };
    Chain {
        before: pingpong(a, LINKS_BEFORE),
        after: pingpong(c, LINKS_AFTER),
        arena,
    }
}

/// Enqueues the chain: the first segment, a device copy A -> C, the second segment.
fn issue(dev: &CudaDevice, ch: &Chain) -> Result<(), RuntimeError> {
    launch_all(dev, &ch.before)?;
    let base = ch.arena.ptr();
    let bytes = N * 4;
    // SAFETY: both ranges lie inside the arena (3N ints), which outlives the call and any
    // graph capturing it (the launches retain the arena's buffer); the copy is ordered on
    // the device's stream.
    unsafe {
        cudarc::driver::result::memcpy_dtod_async(
            base + 2 * bytes as u64,
            base,
            bytes,
            dev.stream().cu_stream(),
        )
    }
    .map_err(|e| CudaError::Driver {
        op: "copying A to C".into(),
        source: e,
    })?;
    launch_all(dev, &ch.after)
}

/// (ints of region `r` that differ from `want`, first bad index and value).
fn check(ch: &Chain, region: usize, want: i32) -> (usize, Option<(usize, i32)>) {
    let bytes = ch
        .arena
        .read((region * N * 4) as u64, (N * 4) as u64)
        .unwrap();
    let mut bad = 0;
    let mut first = None;
    for (i, c) in bytes.chunks_exact(4).enumerate() {
        let v = i32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
        if v != want {
            bad += 1;
            first.get_or_insert((i, v));
        }
    }
    (bad, first)
}

fn assert_region(ch: &Chain, region: usize, want: i32, what: &str) {
    let (bad, first) = check(ch, region, want);
    assert_eq!(
        bad, 0,
        "{what}: {bad} of {N} ints differ from {want}; first {first:?}"
    );
}

fn capture(dev: &CudaDevice, ch: &Chain) -> StepGraph {
    let retained = Retained {
        launches: ch.before.iter().chain(&ch.after).cloned().collect(),
        buffers: vec![ch.arena.buffer().clone()],
        functions: Vec::new(),
    };
    StepGraph::capture(dev, retained, |dev, _| issue(dev, ch)).unwrap()
}

#[test]
fn captured_pdl_chain_with_reused_offsets_and_a_copy_node() {
    let Some(dev) = device() else { return };
    let Some(m) = module(&dev) else { return };
    if !dev.set_pdl(true) {
        println!("note: this device has no PDL; the chain runs fully serialised");
    }
    let ch = chain(&dev, &m, "link");
    let g = capture(&dev, &ch);
    println!(
        "graph: {} nodes, {:?} programmatic edges",
        g.node_count(),
        g.programmatic_edges()
    );
    assert_eq!(g.node_count(), LINKS_BEFORE + LINKS_AFTER + 1);
    if dev.pdl_enabled() {
        // Every link after another link may be programmatic; the first node and the link
        // after the copy depend fully.
        let max = LINKS_BEFORE - 1 + LINKS_AFTER - 1;
        if let Some(e) = g.programmatic_edges() {
            assert!(e > 0 && e <= max, "{e} programmatic edges, want 1..={max}");
        }
    }
    for r in 1..=3 {
        g.replay().unwrap();
        dev.synchronize().unwrap();
        let a = (r * LINKS_BEFORE) as i32;
        assert_region(&ch, 0, a, &format!("A after replay {r}"));
        assert_region(
            &ch,
            2,
            a + LINKS_AFTER as i32,
            &format!("C after replay {r}"),
        );
    }
}

#[test]
fn eager_pdl_chain_is_correct() {
    let Some(dev) = device() else { return };
    let Some(m) = module(&dev) else { return };
    dev.set_pdl(true);
    let ch = chain(&dev, &m, "link");
    for r in 1..=2 {
        issue(&dev, &ch).unwrap();
        dev.synchronize().unwrap();
        let a = (r * LINKS_BEFORE) as i32;
        assert_region(&ch, 0, a, &format!("A after eager run {r}"));
        assert_region(
            &ch,
            2,
            a + LINKS_AFTER as i32,
            &format!("C after eager run {r}"),
        );
    }
}

/// PDL off: no programmatic edges, same results; then the replay time of both (printed, not
/// asserted), and the control without the wait, whose mismatches (printed) show whether
/// kernels overlap at all.
#[test]
fn pdl_off_matches_and_timings() {
    let Some(dev) = device() else { return };
    let Some(m) = module(&dev) else { return };
    let supported = dev.set_pdl(true);
    let mut ms = Vec::new();
    for on in [false, true] {
        dev.set_pdl(on);
        let ch = chain(&dev, &m, "link");
        let g = capture(&dev, &ch);
        if !on {
            assert_eq!(g.programmatic_edges().unwrap_or(0), 0, "PDL off");
        }
        g.replay().unwrap();
        dev.synchronize().unwrap();
        assert_region(&ch, 2, (LINKS_BEFORE + LINKS_AFTER) as i32, "C");
        let t = Instant::now();
        for _ in 0..20 {
            g.replay().unwrap();
        }
        dev.synchronize().unwrap();
        ms.push(t.elapsed().as_secs_f64() * 1e3 / 20.0);
    }
    println!(
        "replay of {} links + copy: PDL off {:.3} ms, on {:.3} ms",
        LINKS_BEFORE + LINKS_AFTER,
        ms[0],
        ms[1]
    );
    if supported {
        dev.set_pdl(true);
        let ch = chain(&dev, &m, "racy_link");
        let g = capture(&dev, &ch);
        g.replay().unwrap();
        dev.synchronize().unwrap();
        let (bad, first) = check(&ch, 2, (LINKS_BEFORE + LINKS_AFTER) as i32);
        println!(
            "control without the wait: {bad} of {N} ints wrong (first {first:?}); \
             nonzero shows launches overlap"
        );
    }
}

/// The chain's kernels compile for every arch (no GPU needed; skipped without NVRTC).
#[test]
fn chain_kernels_compile_for_every_arch() {
    let nvrtc = match Nvrtc::new() {
        Ok(n) => n.with_cache_dir(None),
        Err(e) => {
            specc_ir::testing::skip(&e);
            return;
        }
    };
    let source = format!("{PRELUDE}\n{KERNELS}");
    for arch in Arch::ALL {
        nvrtc
            .compile_source("pdl_chain", &source, arch)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
