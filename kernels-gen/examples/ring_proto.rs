//! Experiment, not used by the plan: does a 64-row matmul whose weights reach shared memory
//! through a deep ring of large copy-engine transfers (no register prefetch) stream faster
//! than the x-staged `gemv_mma` splits? Those are latency-bound inside the SM at 64 rows
//! (the same time from HBM and from L2, with or without their mma and x reads), and only the
//! per-warp weight prefetch depth moved them.
//!
//! Answer: yes, at every 8B shape (4 stages, 8 consumer warps; the figures are in
//! bench/NOTES.md, "Measurements behind the kernel-choice heuristics"). The generator's
//! version is `gemv_mma::Feed::Tma` (`src/gemv_mma/tma.rs`): the same ring and producer
//! warp, with the weights read in place through tensor-map boxes instead of a pre-tiled copy.
//!
//! ```text
//! cargo build --release -p specc-kernels-gen --features cuda --example ring_proto
//! # on the device: target/release/examples/ring_proto [STAGES,..]
//! ```
//! The kernel: 8 (or 4) consumer warps own 16 weight rows each (a block owns 128 or 64 output columns),
//! one producer warp streams K in chunks of 64 k: per chunk one 16 (or 8) KiB copy of the block's
//! weight tile and one 8 KiB copy of the x tile (`cp.async.bulk`, completing on the stage's
//! `full` mbarrier), `STAGES` chunks in flight; consumers release a stage on its `empty`
//! mbarrier. K is split across blocks (grid z) and each split stores f32 partials; their
//! reduction is not timed (the planned kernels' split-K reduction is a few µs).
//!
//! Operand layout (what a load-time re-layout of the weights would store): `W[NB][KC][BN
//! rows][128 B]`, `x[KC][64 rows][128 B]`, every 128-byte row holding 64 k as eight 16-byte
//! pieces, piece `c` stored at `c ^ 4·(row & 1)` so that the lanes of a quarter warp (rows
//! `g`, `g + 1`, pieces `t`) hit distinct banks. Lane `(g, t)` reads pieces `4h + t`, h = 0, 1,
//! of weight rows `g`, `g + 8` and x rows `8·mt + g`: the K permutation `mma_k32` expects.
//!
//! Each case is checked against an f64 dot product on 512 sampled outputs before it is timed.

#[path = "../tests/gpu/mod.rs"]
mod gpu;

use gpu::{Gpu, Mem};
use specc_kernels_gen::abi::{Bucket, Extent, KernelSource, LaunchSpec, Loc, PARAMS, PRELUDE};
use specc_kernels_gen::{Arch, Target};

const M: usize = 64;
/// k per chunk: one 128-byte row of bf16.
const KCH: usize = 64;

/// One case: a weight of `n` rows by `k`, split across `ks` blocks along K, `stages` deep,
/// `cw` consumer warps of 16 output columns each per block.
#[derive(Clone, Copy)]
struct Case {
    label: &'static str,
    n: usize,
    k: usize,
    ks: usize,
    stages: usize,
    cw: usize,
}

impl Case {
    /// Output columns (weight rows) per block.
    fn bn(&self) -> usize {
        16 * self.cw
    }

    /// Dynamic shared memory: `stages` × (weight tile + x tile).
    fn smem(&self) -> usize {
        self.stages * (self.bn() + M) * 128
    }
}

fn kernel(c: &Case) -> KernelSource {
    let (nb, kc, bn, cw) = (c.n / c.bn(), c.k / KCH, c.bn(), c.cw);
    let threads = 32 * (cw + 1);
    let name = format!(
        "ring_proto_bf16_{}x{}_ks{}_s{}_w{}",
        c.n, c.k, c.ks, c.stages, c.cw
    );
    let text = format!(
        r#"
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {{
  asm volatile("{{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}}"
               ::"r"(smem_addr(bar)) : "memory");
}}

extern "C" __global__ void __launch_bounds__({threads}) {name}({PARAMS}) {{
  constexpr int NS = {ns}, KC = {kc}, KS = {ks}, N = {n}, NB = {nb};
  constexpr unsigned WT = {bn} * 128, XT = {m} * 128, ST = WT + XT;  // bytes per stage
  const unsigned char* wt = reinterpret_cast<const unsigned char*>(ops[0]);
  const unsigned char* xt = reinterpret_cast<const unsigned char*>(ops[1]);
  float* part = reinterpret_cast<float*>(ops[2]);  // [KS][M][N]
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long full[NS], empty[NS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int cb = blockIdx.x, z = blockIdx.z;
  const int k0 = z * (KC / KS), k1 = k0 + KC / KS;
  if (threadIdx.x == 0) {{
    for (int s = 0; s < NS; ++s) {{ mbar_init(&full[s], 1); mbar_init(&empty[s], {cw}); }}
  }}
  __syncthreads();
  if (warp == {cw}) {{
    // producer: chunk n lives in stage n % NS; it waits until the consumer warps have
    // released that stage's previous chunk (phase (n / NS - 1) & 1 of empty).
    if (lane == 0) {{
      for (int kc = k0, n = 0; kc < k1; ++kc, ++n) {{
        const int s = n % NS;
        if (n >= NS) mbar_wait(&empty[s], (n / NS - 1) & 1);
        mbar_arrive_expect_tx(&full[s], ST);
        bulk_copy_g2s(smem + s * ST, wt + ((long long)cb * KC + kc) * WT, WT, &full[s]);
        bulk_copy_g2s(smem + s * ST + WT, xt + (long long)kc * XT, XT, &full[s]);
      }}
    }}
    return;
  }}
  const int g = lane >> 2, t = lane & 3;
  float acc[8][4];
  #pragma unroll
  for (int mt = 0; mt < 8; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
  #pragma unroll 1
  for (int kc = k0, n = 0; kc < k1; ++kc, ++n) {{
    const int s = n % NS;
    mbar_wait(&full[s], (n / NS) & 1);
    const unsigned char* ws = smem + s * ST;
    const unsigned char* xs = ws + WT;
    #pragma unroll
    for (int h = 0; h < 2; ++h) {{
      const int pc = (4 * h + t) ^ (4 * (g & 1));  // rows 16w + g, + 8 and 8mt + g share g's parity
      const uint4 lo = *reinterpret_cast<const uint4*>(ws + (16 * warp + g) * 128 + pc * 16);
      const uint4 hi = *reinterpret_cast<const uint4*>(ws + (16 * warp + g + 8) * 128 + pc * 16);
      #pragma unroll
      for (int mt = 0; mt < 8; ++mt) {{
        const uint4 xf = *reinterpret_cast<const uint4*>(xs + (8 * mt + g) * 128 + pc * 16);
        mma_k32_bf16(acc[mt], lo, hi, xf);
      }}
    }}
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s]);
  }}
  float* pz = part + (long long)z * {m} * N;
  const int n0 = cb * {bn} + 16 * warp + g;
  #pragma unroll
  for (int mt = 0; mt < 8; ++mt) {{
    #pragma unroll
    for (int d = 0; d < 4; ++d) {{
      const int m = 8 * mt + 2 * t + (d & 1);
      pz[(long long)m * N + n0 + 8 * (d >> 1)] = acc[mt][d];
    }}
  }}
  (void)NB;
}}
"#,
        ns = c.stages,
        ks = c.ks,
        n = c.n,
        m = M,
    );
    let helpers = concat!(
        include_str!("../cuda/cp_async.cuh"),
        "\n",
        include_str!("../cuda/bulk_copy.cuh"),
        "\n",
        include_str!("../cuda/mma.cuh"),
    );
    KernelSource {
        name: name.clone(),
        entry: name,
        source: format!("{PRELUDE}\n{helpers}\n{text}"),
        kernel: text,
        launch: LaunchSpec {
            grid: [
                Extent::Fixed(nb as u32),
                Extent::Fixed(1),
                Extent::Fixed(c.ks as u32),
            ],
            block: [threads as u32, 1, 1],
            smem_bytes: c.smem() as u32,
        },
        operands: vec![Loc::table(0), Loc::table(1), Loc::arena(0)],
        grid_stride: false,
    }
}

/// Byte offset of element `(row, k)` of a `rows`-row tile group in the swizzled layout, for
/// a matrix whose tiles are `[row / rows_per_tile][k / 64][row % rows_per_tile][128 B]`.
fn tiled_offset(row: usize, k: usize, rows_per_tile: usize, kc: usize) -> usize {
    let (tile, r) = (row / rows_per_tile, row % rows_per_tile);
    let (chunk, kk) = (k / KCH, k % KCH);
    let piece = (kk / 8) ^ (4 * (r & 1));
    ((tile * kc + chunk) * rows_per_tile + r) * 128 + piece * 16 + (kk % 8) * 2
}

/// bf16 bytes of a logical `rows × k` matrix in the tiled layout.
fn tiled(vals: &[half::bf16], rows: usize, k: usize, rows_per_tile: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows * k * 2];
    for row in 0..rows {
        for kk in 0..k {
            let o = tiled_offset(row, kk, rows_per_tile, k / KCH);
            out[o..o + 2].copy_from_slice(&vals[row * k + kk].to_le_bytes());
        }
    }
    out
}

fn random_bf16(rng: &mut gpu::Rng, n: usize) -> Vec<half::bf16> {
    rng.vec(n, 1.0)
        .into_iter()
        .map(half::bf16::from_f64)
        .collect()
}

/// Max |error| / max |reference| over 512 sampled outputs (the split partials summed).
fn check(c: &Case, gpu: &Gpu, w: &[half::bf16], x: &[half::bf16], mem: &mut Mem) -> f64 {
    let k = kernel(c);
    gpu.run(
        mem,
        &[&k],
        Bucket {
            b: 1,
            t: M as u32,
            ctx: 1,
        },
    );
    let parts = mem.get(
        Loc::arena(0),
        specc_kernels_gen::abi::Dtype::F32,
        c.ks * M * c.n,
    );
    let (mut err, mut scale) = (0.0f64, 0.0f64);
    for i in 0..512usize {
        let (m, n) = ((i * 37) % M, (i * 7919) % c.n);
        let want: f64 = (0..c.k)
            .map(|kk| w[n * c.k + kk].to_f64() * x[m * c.k + kk].to_f64())
            .sum();
        let got: f64 = (0..c.ks).map(|z| parts[(z * M + m) * c.n + n]).sum();
        err = err.max((got - want).abs());
        scale = scale.max(want.abs());
    }
    err / scale
}

/// The cases: the 8B matmuls at M = 64, blocks of 8 and of 4 consumer warps, with K splits
/// that give 96–256 blocks, at each depth whose block (with 1 KiB of slack) fits `target`'s
/// shared memory per block.
fn cases(stages: &[usize], target: &Target) -> Vec<Case> {
    let budget = target.smem_per_block as usize - 1024;
    // K splits for 8 consumer warps (128 columns per block); 4 warps take half as many.
    let shapes: [(&'static str, usize, usize, &[usize]); 4] = [
        ("o_proj", 4096, 4096, &[4, 8]),
        ("qkv", 6144, 4096, &[2, 4]),
        ("gate_up (one 28672-row weight)", 28672, 4096, &[1]),
        ("down", 4096, 14336, &[4, 8]),
    ];
    let mut out = Vec::new();
    for (label, n, k, kss) in shapes {
        for cw in [8, 4] {
            let mut kss: Vec<usize> = kss.iter().map(|&ks| (ks * cw / 8).max(1)).collect();
            kss.dedup();
            for ks in kss {
                for &stages in stages {
                    let c = Case {
                        label,
                        n,
                        k,
                        ks,
                        stages,
                        cw,
                    };
                    if (k / KCH).is_multiple_of(ks) && c.smem() <= budget {
                        out.push(c);
                    }
                }
            }
        }
    }
    out
}

/// `ring_proto compile`: NVRTC + ptxas for sm_90a only (no GPU needed), registers and spills.
fn compile_only(cases: &[Case]) {
    let nvrtc = specc_kernels_gen::Nvrtc::new().expect("NVRTC");
    for c in cases {
        let k = kernel(c);
        let out = nvrtc
            .compile(&k, Arch::Sm90a)
            .unwrap_or_else(|e| panic!("{}: {e}", k.name));
        println!("{}: {:?}", k.name, out.stats);
    }
}

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_default();
    if arg == "compile" {
        compile_only(&cases(&[4, 6, 8], &Target::for_archs(&[Arch::Sm90a])));
        return;
    }
    let Some(gpu) = Gpu::new() else {
        return;
    };
    let stages: Vec<usize> = if arg.is_empty() {
        vec![4, 6, 8]
    } else {
        arg.split(',')
            .map(|v| v.parse().expect("STAGES: integers"))
            .collect()
    };
    // Copy bandwidth (read + write counted) of the device's reference part.
    let ceiling_gbs = gpu.target().bytes_per_s as f64 / 1e9;
    println!(
        "device {} ({:?}); ceiling {ceiling_gbs} GB/s (copy); M = {M}",
        gpu.target().device,
        gpu.arch()
    );
    println!(
        "{:<58} {:>9} {:>8} {:>8} {:>10}",
        "case", "us", "GB/s", "% ceil", "rel err"
    );
    let mut rng = gpu::Rng::new(7);
    let all = cases(&stages, gpu.target());
    let mut shape = None; // (n, k, block columns) of the tiled operands
    let (mut w, mut x, mut wt, mut xt) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for c in all {
        if shape.map(|(n, k, _)| (n, k)) != Some((c.n, c.k)) {
            w = random_bf16(&mut rng, c.n * c.k);
            x = random_bf16(&mut rng, M * c.k);
            xt = tiled(&x, M, c.k, M);
        }
        if shape != Some((c.n, c.k, c.bn())) {
            shape = Some((c.n, c.k, c.bn()));
            wt = tiled(&w, c.n, c.k, c.bn());
        }
        let wbytes = (c.n * c.k * 2) as f64;
        let mut mem = Mem::new(
            (c.ks * M * c.n * 4) as u64,
            &[wt.len() as u64, xt.len() as u64],
        );
        mem.bufs[0].copy_from_slice(&wt);
        mem.bufs[1].copy_from_slice(&xt);
        let rel = check(&c, &gpu, &w, &x, &mut mem);
        let copies = (400e6 / wbytes).ceil().max(2.0) as usize;
        let kern = kernel(&c);
        let bucket = Bucket {
            b: 1,
            t: M as u32,
            ctx: 1,
        };
        let us = gpu.time(&mem, &[&kern], bucket, copies, 50);
        let gbs = wbytes / us / 1e3;
        println!(
            "{:<58} {us:>9.1} {gbs:>8.0} {:>7.1}% {rel:>10.2e}",
            format!(
                "{} N={} K={} ks {} stages {} warps {}",
                c.label, c.n, c.k, c.ks, c.stages, c.cw
            ),
            100.0 * gbs / ceiling_gbs
        );
    }
}
