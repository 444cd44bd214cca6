//! The tiled tensor-core GEMMs on the GPU — `gemm_mma` (every arch) and `gemm_wgmma`
//! (sm_90a: TMA producer warp, wgmma consumer warpgroups) — with the tiles the selection
//! gives the device (`specc_codegen::choose::gemm::{tile, wgmma_tile}`): every epilogue
//! (store, residual in place, SwiGLU over the gate/up pair, f32 logits, argmax partials +
//! `argmax`) at M = 33, 64, 100, 256 and 1024 over the Llama-3.1-8B shapes and small odd
//! ones (N and K tails), against an f64 CPU reference with the GEMV numerics (product
//! rounded to x's dtype, then the epilogue's roundings), printing the largest error; row
//! invariance (rows 0..64 of an M = 1024 launch equal the M = 64 launch's bit for bit);
//! and, ignored by default (`--ignored`), timings: `gemm_mma` against the `gemv_mma` split
//! the plan used before at M = 32..256, and the three kernels side by side in TFLOP/s at
//! M = 32..1024 (`time_wgmma_vs_gemm_vs_gemv_mma`). Needs `--features cuda` and a device;
//! skips with a message without them (the wgmma tests also on devices other than sm_90a).

#![cfg(feature = "cuda")]

mod common;
mod gpu;

use common::Plan;
use gpu::{assert_close, bf16_tol, Gpu, Mem, Rng};
use specc_codegen::choose::gemm::{tile as gemm_tiling, wgmma_ring, wgmma_tile};
use specc_codegen::choose::matmul::{tiling as gemv_tiling, SPLIT_COUNTERS};
use specc_kernels_gen::abi::{Bucket, Dtype, KernelSource, Loc, Rows, View};
use specc_kernels_gen::argmax::{argmax, ArgmaxInput, ArgmaxParams};
use specc_kernels_gen::gemm_mma::{gemm_mma, partials_per_row};
use specc_kernels_gen::gemm_wgmma::{self as wgmma, gemm_wgmma, WgmmaTiling};
use specc_kernels_gen::gemv::{GemvParams, GemvWeights};
use specc_kernels_gen::gemv_mma::{gemv_mma_split, split_needs, SplitScratch};
use specc_kernels_gen::Arch;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Epi {
    Store,
    Residual,
    SiluMul,
    LogitsF32,
    Argmax,
}

/// Which GEMM a case runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Gemm {
    /// `gemm_mma` (mma.sync, cp.async ring).
    Mma,
    /// `gemm_wgmma` (sm_90a: TMA + wgmma).
    Wgmma,
}

/// The device for the `gemm` tests: `None` (with a printed reason) without a device, or for
/// the wgmma GEMM on a device other than sm_90a.
fn gpu_for(gemm: Gemm) -> Option<Gpu> {
    let gpu = Gpu::new()?;
    if gemm == Gemm::Wgmma && gpu.arch() != Arch::Sm90a {
        println!(
            "SKIP gemm_wgmma: needs sm_90a, the device is {}",
            gpu.arch().name()
        );
        return None;
    }
    Some(gpu)
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: u32,
    k: u32,
    n: u32,
    epi: Epi,
    dt: Dtype,
}

/// A launch's operands in the arena and weight slot 0.
struct Setup {
    p: GemvParams,
    plan: Plan,
    x: View,
    res: View,
    out: Option<View>,
    parts: Loc,
    tokens: Loc,
}

fn setup(c: Case) -> Setup {
    let mut plan = Plan::new();
    let x = plan.view(c.m, c.k, c.dt);
    let res = plan.view(c.m, c.n, c.dt);
    let out = match c.epi {
        Epi::Residual => Some(res),
        Epi::LogitsF32 => Some(plan.view(c.m, c.n, Dtype::F32)),
        Epi::Argmax => None,
        _ => Some(plan.view(c.m, c.n, c.dt)),
    };
    let parts = plan.alloc(c.m as u64 * c.n.div_ceil(16) as u64 * 8);
    let tokens = plan.alloc(c.m as u64 * 4);
    let p = GemvParams {
        rows: Rows::Fixed(c.m),
        row_tile: c.m.min(64),
        k: c.k,
        n: c.n,
        x,
        weights: match c.epi {
            Epi::SiluMul => GemvWeights::gate_up_concat(Loc::table(0), c.n, c.k, c.dt),
            _ => GemvWeights::Single(Loc::table(0)),
        },
        w_dtype: c.dt,
        norm: None,
        residual: (c.epi == Epi::Residual).then_some(res),
        out,
        argmax_partials: (c.epi == Epi::Argmax).then_some(parts),
        rope: None,
    };
    Setup {
        p,
        plan,
        x,
        res,
        out,
        parts,
        tokens,
    }
}

fn round(dt: Dtype, v: f64) -> f64 {
    match dt {
        Dtype::BF16 => half::bf16::from_f64(v).to_f64(),
        Dtype::F16 => half::f16::from_f64(v).to_f64(),
        _ => v as f32 as f64,
    }
}

/// Operand values (rounded to the dtype), the same for every M: x and the residual are
/// generated row after row, and a case of fewer rows uses a prefix of them.
struct Data {
    x: Vec<f32>,
    w: Vec<f32>,
    res: Vec<f32>,
}

fn data(c: Case) -> Data {
    let g = if c.epi == Epi::SiluMul { 2 } else { 1 };
    let (m, k, n) = (c.m as usize, c.k as usize, c.n as usize);
    let gen = |seed: u64, len: usize, scale: f64| {
        let mut rng = Rng::new(seed);
        (0..len)
            .map(|_| round(c.dt, rng.next(scale)) as f32)
            .collect::<Vec<f32>>()
    };
    Data {
        x: gen(1 + k as u64, m * k, 2.0),
        w: gen(2 + (k * n) as u64, g * n * k, 2.0 / (k as f64).sqrt()),
        res: gen(3 + n as u64, m * n, 1.0),
    }
}

fn put(mem: &mut Mem, loc: Loc, dt: Dtype, v: &[f32]) {
    let bytes: &mut [u8] = match loc {
        Loc::Arena { offset } => &mut mem.arena[offset as usize..],
        Loc::Table { slot, offset } => &mut mem.bufs[slot as usize][offset as usize..],
        Loc::TensorMap(_) => unreachable!(),
    };
    for (i, &e) in v.iter().enumerate() {
        let b = match dt {
            Dtype::BF16 => half::bf16::from_f32(e).to_le_bytes(),
            _ => half::f16::from_f32(e).to_le_bytes(),
        };
        bytes[2 * i..2 * i + 2].copy_from_slice(&b);
    }
}

/// The kernels of case `c` over `s`: the GEMM `gemm` with the device's tile, `argmax`
/// after it.
fn gemm_kernels(gpu: &Gpu, s: &Setup, c: Case, gemm: Gemm) -> Vec<KernelSource> {
    let (kernel, count) = match gemm {
        Gemm::Mma => {
            let t = gemm_tiling(&s.p, c.m, gpu.target()).expect("the GEMM applies");
            (gemm_mma(&s.p, &t), partials_per_row(&s.p, &t))
        }
        Gemm::Wgmma => {
            let t = wgmma_tile(&s.p, c.m, gpu.target()).expect("the wgmma GEMM applies");
            return wgmma_kernels(s, c, &t);
        }
    };
    with_argmax(s, c, kernel.unwrap(), count)
}

/// The wgmma GEMM of case `c` over `s` with tile `t`, `argmax` after it.
fn wgmma_kernels(s: &Setup, c: Case, t: &WgmmaTiling) -> Vec<KernelSource> {
    let kernel = gemm_wgmma(&s.p, t).unwrap();
    with_argmax(s, c, kernel, wgmma::partials_per_row(&s.p, t))
}

/// `kernel`, then for the argmax epilogue the `argmax` over its `count` partials a row.
fn with_argmax(s: &Setup, c: Case, kernel: KernelSource, count: u32) -> Vec<KernelSource> {
    let mut kernels = vec![kernel];
    if c.epi == Epi::Argmax {
        kernels.push(
            argmax(&ArgmaxParams {
                rows: Rows::Fixed(c.m),
                input: ArgmaxInput::Partials {
                    loc: s.parts,
                    count,
                },
                out: View::new(s.tokens, Dtype::I32, 1),
            })
            .unwrap(),
        );
    }
    kernels
}

/// The memory image of case `c` over `s` (its plan's arena, as allocated so far) with the
/// operands of `d`; outputs poisoned.
fn memory(s: &mut Setup, c: Case, d: &Data) -> Mem {
    let mut mem = Mem::new(s.plan.alloc(0).byte_offset(), &[d.w.len() as u64 * 2]);
    if let Some(o) = s.out.filter(|_| c.epi != Epi::Residual) {
        let Loc::Arena { offset } = o.loc else {
            unreachable!()
        };
        let len = (c.m * c.n) as usize * o.dtype.size() as usize;
        mem.arena[offset as usize..][..len].fill(0xff);
    }
    put(&mut mem, s.x.loc, c.dt, &d.x[..(c.m * c.k) as usize]);
    put(&mut mem, s.res.loc, c.dt, &d.res[..(c.m * c.n) as usize]);
    put(&mut mem, Loc::table(0), c.dt, &d.w);
    mem
}

/// The kernels of case `c` (the GEMM `gemm` with the device's tile, `argmax` after it) and
/// the memory image with its operands.
fn prepare(gpu: &Gpu, c: Case, d: &Data, gemm: Gemm) -> (Setup, Vec<KernelSource>, Mem) {
    let mut s = setup(c);
    let kernels = gemm_kernels(gpu, &s, c, gemm);
    let mem = memory(&mut s, c, d);
    (s, kernels, mem)
}

fn bucket(m: u32) -> Bucket {
    Bucket { b: 1, t: m, ctx: 1 }
}

/// The output row `r` (or its argmax token) of a finished run.
fn output(c: Case, s: &Setup, mem: &Mem) -> Vec<f64> {
    match s.out {
        Some(o) => mem.get(o.loc, o.dtype, (c.m * c.n) as usize),
        None => mem.get(s.tokens, Dtype::I32, c.m as usize),
    }
}

/// The reference value of every column of row `r`: the epilogue applied to the f64 dot
/// products, rounded as the GEMV numerics round.
fn reference_row(c: Case, d: &Data, r: usize) -> Vec<f64> {
    let (k, n) = (c.k as usize, c.n as usize);
    let x = &d.x[r * k..(r + 1) * k];
    let dot = |row: &[f32]| -> f64 { x.iter().zip(row).map(|(&a, &b)| a as f64 * b as f64).sum() };
    (0..n)
        .map(|j| {
            let acc = dot(&d.w[j * k..(j + 1) * k]);
            match c.epi {
                Epi::SiluMul => {
                    let gate = round(c.dt, acc);
                    let up = round(c.dt, dot(&d.w[(n + j) * k..(n + j + 1) * k]));
                    let silu = round(c.dt, gate / (1.0 + (-gate).exp()));
                    round(c.dt, silu * up)
                }
                Epi::Residual => round(c.dt, round(c.dt, acc) + d.res[r * n + j] as f64),
                _ => round(c.dt, acc),
            }
        })
        .collect()
}

/// The rows checked against the reference: all of them for small products, else the edges
/// of the row tiles and a few others (the CPU reference would take minutes).
fn checked_rows(c: Case) -> Vec<usize> {
    let m = c.m as usize;
    if m as u64 * c.n as u64 * c.k as u64 <= 1 << 28 {
        return (0..m).collect();
    }
    let mut rows: Vec<usize> = [
        0,
        1,
        15,
        16,
        31,
        32,
        63,
        64,
        100,
        127,
        128,
        m / 2 + 3,
        m - 1,
    ]
    .into_iter()
    .filter(|&r| r < m)
    .collect();
    rows.dedup();
    rows
}

/// Checks case `c` of `gemm` with `d` (generated for at least `c.m` rows).
fn check(gpu: &Gpu, c: Case, d: &Data, gemm: Gemm) {
    let (s, kernels, mem) = prepare(gpu, c, d, gemm);
    check_kernels(gpu, c, d, &s, &kernels, mem);
}

/// Checks case `c` of the wgmma GEMM with tile `t` against the f64 reference.
fn check_wgmma_tile(gpu: &Gpu, c: Case, d: &Data, t: &WgmmaTiling) {
    let mut s = setup(c);
    let kernels = wgmma_kernels(&s, c, t);
    let mem = memory(&mut s, c, d);
    check_kernels(gpu, c, d, &s, &kernels, mem);
}

/// Runs `kernels` of case `c` on `mem` and checks their output against the f64 reference.
fn check_kernels(gpu: &Gpu, c: Case, d: &Data, s: &Setup, kernels: &[KernelSource], mut mem: Mem) {
    gpu.run(&mut mem, &kernels.iter().collect::<Vec<_>>(), bucket(c.m));
    let got = output(c, s, &mem);
    let rows = checked_rows(c);
    let want: Vec<Vec<f64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = rows
            .iter()
            .map(|&r| sc.spawn(move || reference_row(c, d, r)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let n = c.n as usize;
    let label = format!("{c:?} ({})", kernels[0].name);
    if c.epi == Epi::Argmax {
        let flat: Vec<f64> = want.iter().flatten().copied().collect();
        let (_, atol) = bf16_tol(&flat);
        for (&r, row) in rows.iter().zip(&want) {
            let gi = got[r] as usize;
            let best = row.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v));
            assert!(
                gi < n && row[gi] >= best - atol,
                "{label}: argmax row {r}: got {gi}, want a value of {best}"
            );
        }
        println!("PASS {label}: argmax of {} rows", rows.len());
        return;
    }
    let got: Vec<f64> = rows
        .iter()
        .flat_map(|&r| got[r * n..(r + 1) * n].iter().copied())
        .collect();
    let want: Vec<f64> = want.into_iter().flatten().collect();
    let (mut rtol, mut atol) = bf16_tol(&want);
    if c.epi == Epi::SiluMul {
        rtol = rtol.max(3.0 / 128.0);
    }
    if c.epi == Epi::Residual {
        atol *= 8.0;
    }
    let max_err = got
        .iter()
        .zip(&want)
        .fold(0.0f64, |a, (g, w)| a.max((g - w).abs()));
    println!(
        "{label}: {} rows checked, max |err| {max_err:.3e}",
        rows.len()
    );
    assert_close(&label, &got, &want, rtol, atol);
    println!("PASS {label}");
}

const BF: Dtype = Dtype::BF16;

/// The 8B projections with the epilogues the step graphs give them.
const LLAMA_8B: [(u32, u32, Epi); 6] = [
    (4096, 4096, Epi::Residual),
    (4096, 6144, Epi::Store),
    (4096, 14336, Epi::SiluMul),
    (14336, 4096, Epi::Residual),
    (4096, 128256, Epi::LogitsF32),
    (4096, 128256, Epi::Argmax),
];

/// Every epilogue of `gemm` at the 8B shapes, M = 33 .. 1024.
fn eight_b_shapes_every_epilogue(gemm: Gemm) {
    let Some(gpu) = gpu_for(gemm) else { return };
    for (k, n, epi) in LLAMA_8B {
        let d = data(Case {
            m: 1024,
            k,
            n,
            epi,
            dt: BF,
        });
        for m in [33, 64, 100, 256, 1024] {
            let c = Case {
                m,
                k,
                n,
                epi,
                dt: BF,
            };
            check(&gpu, c, &d, gemm);
        }
    }
}

/// Every epilogue of `gemm` at odd shapes (N and K tails) of `dtypes`, M = 33 .. 1024.
fn odd_shapes(gemm: Gemm, dtypes: &[Dtype]) {
    let Some(gpu) = gpu_for(gemm) else { return };
    let epis = [
        Epi::Store,
        Epi::Residual,
        Epi::SiluMul,
        Epi::LogitsF32,
        Epi::Argmax,
    ];
    let shapes = [
        (1000, 520, BF),
        (136, 40, BF),
        (360, 200, BF),
        (1064, 1000, BF),
        (8, 8, BF),
        (4096, 1000, Dtype::F16),
    ];
    for (k, n, dt) in shapes.into_iter().filter(|s| dtypes.contains(&s.2)) {
        for epi in epis {
            let d = data(Case {
                m: 1024,
                k,
                n,
                epi,
                dt,
            });
            for m in [33, 64, 100, 256, 1024] {
                check(&gpu, Case { m, k, n, epi, dt }, &d, gemm);
            }
        }
    }
}

#[test]
fn gemm_mma_8b_shapes_every_epilogue() {
    eight_b_shapes_every_epilogue(Gemm::Mma);
}

#[test]
fn gemm_mma_odd_shapes_and_f16() {
    odd_shapes(Gemm::Mma, &[BF, Dtype::F16]);
}

#[test]
fn gemm_wgmma_8b_shapes_every_epilogue() {
    eight_b_shapes_every_epilogue(Gemm::Wgmma);
}

/// bf16 only: the selection keeps f16 on `gemm_mma` (`choose::gemm::wgmma_tile`).
#[test]
fn gemm_wgmma_odd_shapes() {
    odd_shapes(Gemm::Wgmma, &[BF]);
}

/// Rows 0..64 of an M = 1024 launch equal those of the M = 64 launch bit for bit (other
/// tiles, other blocks, other rows around them), for every epilogue at the 8B shapes. The
/// wgmma GEMM's split of K is part of its sum's order: both launches take the chosen tiles
/// where they split alike, else the M = 1024 tile's split (`SPECC_GEMM_SPLIT_K` = 2 or 4: that
/// split in both; a forced split runs unclustered, where it is valid).
fn rows_do_not_depend_on_the_batch(gemm: Gemm) {
    let Some(gpu) = gpu_for(gemm) else { return };
    let forced_split: Option<u32> = std::env::var("SPECC_GEMM_SPLIT_K")
        .ok()
        .and_then(|v| v.parse().ok());
    for (k, n, epi) in LLAMA_8B {
        let case = |m| Case {
            m,
            k,
            n,
            epi,
            dt: BF,
        };
        let d = data(case(1024));
        // The tile at `m` rows with K split `split_k` ways (unclustered, one block a tile).
        let split_tile = |m: u32, split_k: u32| {
            let s = setup(case(m));
            let t = WgmmaTiling {
                split_k,
                ..unsplit(wgmma_tile(&s.p, m, gpu.target()).unwrap())
            };
            wgmma::validate(&s.p, &t).is_ok().then_some(t)
        };
        // Where the chosen tiles split K differently (a build with `SPECC_WGMMA_SPLIT_K=1`),
        // both take the M = 1024 tile's split.
        let chosen_split = |m: u32| {
            wgmma_tile(&setup(case(m)).p, m, gpu.target())
                .unwrap()
                .split_k
        };
        let differing = (gemm == Gemm::Wgmma && chosen_split(64) != chosen_split(1024))
            .then(|| chosen_split(1024));
        let split = match (gemm, forced_split.or(differing)) {
            (Gemm::Wgmma, Some(split_k)) => {
                if split_tile(64, split_k).is_none() || split_tile(1024, split_k).is_none() {
                    println!(
                        "row invariance K={k} N={n} {epi:?}: split {split_k} not valid: skipped"
                    );
                    continue;
                }
                Some(split_k)
            }
            _ => None,
        };
        let run = |m: u32| {
            let c = case(m);
            let (s, kernels, mut mem) = match split {
                Some(split_k) => {
                    let mut s = setup(c);
                    let t = split_tile(m, split_k).expect("checked above");
                    let kernels = wgmma_kernels(&s, c, &t);
                    let mem = memory(&mut s, c, &d);
                    (s, kernels, mem)
                }
                None => prepare(&gpu, c, &d, gemm),
            };
            gpu.run(&mut mem, &kernels.iter().collect::<Vec<_>>(), bucket(m));
            (output(c, &s, &mem), kernels[0].name.clone())
        };
        let (small, ks) = run(64);
        let (large, kl) = run(1024);
        let per_row = if epi == Epi::Argmax { 1 } else { n as usize };
        let prefix = &large[..64 * per_row];
        let differ = small
            .iter()
            .zip(prefix)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        println!("row invariance K={k} N={n} {epi:?}: {ks} (M=64) vs {kl} (M=1024): {differ} of {} values differ", small.len());
        assert_eq!(differ, 0, "K={k} N={n} {epi:?}: rows depend on M");
        println!("PASS row invariance K={k} N={n} {epi:?}");
    }
}

#[test]
fn gemm_mma_rows_do_not_depend_on_the_batch() {
    rows_do_not_depend_on_the_batch(Gemm::Mma);
}

#[test]
fn gemm_wgmma_rows_do_not_depend_on_the_batch() {
    rows_do_not_depend_on_the_batch(Gemm::Wgmma);
}

/// `t` unclustered, one block per tile, K unsplit (what a split may be added to).
fn unsplit(t: WgmmaTiling) -> WgmmaTiling {
    WgmmaTiling {
        split_k: 1,
        cluster_m: 1,
        cluster_n: 1,
        persistent_blocks: 0,
        ..t
    }
}

/// Every split of K (1, 2, 4 blocks, where valid) of the chosen tile against the f64
/// reference, at the 8B shapes and odd ones whose K tails leave a chunk short, at row
/// counts that leave the last row tile padded; and each split twice, bitwise the same
/// (the partial sums are added in rank order, nothing races).
#[test]
fn gemm_wgmma_split_k_every_split() {
    let Some(gpu) = gpu_for(Gemm::Wgmma) else {
        return;
    };
    let shapes = LLAMA_8B.iter().copied().filter(|s| s.1 != 128256).chain([
        (1000, 520, Epi::SiluMul),
        (360, 200, Epi::Residual),
        (1064, 1000, Epi::Argmax),
        (200, 136, Epi::Store),
    ]);
    let mut splits_ran = 0;
    for (k, n, epi) in shapes {
        let d = data(Case {
            m: 256,
            k,
            n,
            epi,
            dt: BF,
        });
        for m in [100, 256] {
            let c = Case {
                m,
                k,
                n,
                epi,
                dt: BF,
            };
            let s = setup(c);
            let chosen = wgmma_tile(&s.p, m, gpu.target()).unwrap();
            let mut ran = 0;
            for split_k in [1, 2, 4] {
                let base = WgmmaTiling {
                    cluster_m: 1,
                    cluster_n: 1,
                    persistent_blocks: 0,
                    ..chosen
                };
                // The ring of the split's tile: the most stages, as the selection builds it.
                let Some(ring) = wgmma_ring(&s.p, base.bm, base.bn, gpu.target()) else {
                    continue;
                };
                let t = WgmmaTiling {
                    split_k,
                    stages: ring.stages,
                    ..base
                };
                if wgmma::validate(&s.p, &t).is_err() {
                    continue;
                }
                check_wgmma_tile(&gpu, c, &d, &t);
                let mut s2 = setup(c);
                let kernels = wgmma_kernels(&s2, c, &t);
                let mem0 = memory(&mut s2, c, &d);
                let outs: Vec<Vec<f64>> = (0..2)
                    .map(|_| {
                        let mut mem = mem0.clone();
                        gpu.run(&mut mem, &kernels.iter().collect::<Vec<_>>(), bucket(m));
                        output(c, &s2, &mem)
                    })
                    .collect();
                let differ = outs[0]
                    .iter()
                    .zip(&outs[1])
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(differ, 0, "K={k} N={n} {epi:?} M={m} {t:?}: runs differ");
                ran += 1;
            }
            assert!(ran >= 1, "K={k} N={n} M={m}: no split ran");
            splits_ran += ran - 1;
            println!("PASS split-k K={k} N={n} {epi:?} M={m}: {ran} splits, chosen {chosen:?}");
        }
    }
    assert!(splits_ran >= 20, "{splits_ran} split tiles ran");
}

/// `t` one block per tile and persistent on one block (cluster) per SM of `sms` and on 3
/// clusters, each where valid for `p` and unlike `t`.
fn persistent_variants(p: &GemvParams, t: WgmmaTiling, sms: u32) -> Vec<WgmmaTiling> {
    [0, sms / t.cluster_m * t.cluster_m, 3 * t.cluster_m]
        .into_iter()
        .map(|persistent_blocks| WgmmaTiling {
            persistent_blocks,
            ..t
        })
        .filter(|v| *v != t && wgmma::validate(p, v).is_ok())
        .collect()
}

/// The cluster shapes a wgmma tile `t` may take for `p` (multicast of the weight or the x
/// box among 2 or 4 blocks), unclustered first.
fn cluster_variants(p: &GemvParams, t: WgmmaTiling, shapes: &[(u32, u32)]) -> Vec<WgmmaTiling> {
    let base = WgmmaTiling {
        cluster_m: 1,
        cluster_n: 1,
        ..t
    };
    let mut out = vec![base];
    for &(cluster_m, cluster_n) in shapes {
        let c = WgmmaTiling {
            cluster_m,
            cluster_n,
            ..base
        };
        if wgmma::validate(p, &c).is_ok() && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

const CLUSTERS: [(u32, u32); 4] = [(2, 1), (4, 1), (1, 2), (1, 4)];

/// Every cluster shape of the chosen tile gives the unclustered tile's output bit for bit
/// (the same K order per element; the multicast only changes who loads a box), at the 8B
/// shapes and odd ones, with row counts that leave a padded block in the last cluster; so
/// do the gate/up pair as one wgmma per matrix instead of one over both, and the tile one
/// block per tile, persistent on one block (cluster) per SM, and persistent on 3 clusters
/// (many tiles a block: the ring runs on across them); and each of those with the main loop's
/// descriptors hoisted (`hoisted_descriptors`), or not where the chosen tile hoists them.
#[test]
fn gemm_wgmma_clusters_equal_the_unclustered_tile() {
    let Some(gpu) = gpu_for(Gemm::Wgmma) else {
        return;
    };
    // `SPECC_GEMM_SMALL=1`: the odd shapes alone (for the sanitizers).
    let small = std::env::var("SPECC_GEMM_SMALL").is_ok_and(|v| v == "1");
    let big = if small { &[][..] } else { &LLAMA_8B[..] };
    let shapes = big.iter().copied().chain([
        (1000, 520, Epi::SiluMul),
        (360, 200, Epi::Residual),
        (1064, 1000, Epi::Argmax),
    ]);
    for (k, n, epi) in shapes {
        let d = data(Case {
            m: 384,
            k,
            n,
            epi,
            dt: BF,
        });
        for m in [100, 256, 384] {
            let c = Case {
                m,
                k,
                n,
                epi,
                dt: BF,
            };
            let mut s = setup(c);
            let chosen = wgmma_tile(&s.p, m, gpu.target()).unwrap();
            let mut tiles = cluster_variants(&s.p, chosen, &CLUSTERS);
            if wgmma::mats(&s.p) > 1 {
                tiles.push(WgmmaTiling {
                    split_mats: !chosen.split_mats,
                    ..chosen
                });
            }
            // The main loop with hoisted descriptors, on the chosen tile and its variants.
            let hoisted: Vec<WgmmaTiling> = tiles
                .iter()
                .chain(&persistent_variants(&s.p, chosen, gpu.target().sms))
                .map(|t| WgmmaTiling {
                    hoisted_descriptors: !t.hoisted_descriptors,
                    ..*t
                })
                .collect();
            tiles.extend(persistent_variants(&s.p, chosen, gpu.target().sms));
            tiles.extend(hoisted);
            let mem0 = memory(&mut s, c, &d);
            let mut outs = Vec::new();
            for t in &tiles {
                let kernels = wgmma_kernels(&s, c, t);
                let mut mem = mem0.clone();
                gpu.run(&mut mem, &kernels.iter().collect::<Vec<_>>(), bucket(m));
                outs.push(output(c, &s, &mem));
            }
            for (t, out) in tiles.iter().zip(&outs).skip(1) {
                let differ = out
                    .iter()
                    .zip(&outs[0])
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                println!(
                    "clusters K={k} N={n} {epi:?} M={m} {t:?}: {differ} of {} values differ",
                    out.len()
                );
                assert_eq!(differ, 0, "K={k} N={n} {epi:?} M={m} {t:?}");
            }
            println!(
                "PASS clusters K={k} N={n} {epi:?} M={m}: {} tiles",
                tiles.len()
            );
        }
    }
}

/// Bytes a launch must move: weights once, x once, the output (and residual) once.
fn bytes(c: Case) -> f64 {
    let g = if c.epi == Epi::SiluMul { 2 } else { 1 };
    let (m, k, n) = (c.m as f64, c.k as f64, c.n as f64);
    let out = match c.epi {
        Epi::Residual => 2.0 * m * n * 2.0,
        Epi::LogitsF32 => m * n * 4.0,
        Epi::Argmax => 0.0,
        _ => m * n * 2.0,
    };
    g as f64 * n * k * 2.0 + m * k * 2.0 + out
}

/// The `gemv_mma` launch the plan makes for `s` at `m` rows without a GEMM (row tiles of
/// 64 at most, split-K where its counters fit), its scratch allocated in `s.plan`.
fn gemv_kernel(gpu: &Gpu, s: &mut Setup, m: u32) -> KernelSource {
    let mut t = gemv_tiling(&s.p, gpu.target());
    if split_needs(&s.p, &t, m).is_some_and(|nd| nd.counters > SPLIT_COUNTERS) {
        t.ks = 1;
    }
    let split = split_needs(&s.p, &t, m).map(|nd| SplitScratch {
        partials: s.plan.alloc(nd.partial_bytes),
        counters: s.plan.alloc(nd.counters as u64 * 4),
        tiles: nd.counters,
    });
    gemv_mma_split(&s.p, &t, split).unwrap()
}

/// Timings (µs and GB/s of the bytes a launch must move) of the GEMM against the
/// `gemv_mma` split the plan chooses for the same launch without the GEMM.
#[test]
#[ignore = "timing: run with --ignored on the device"]
fn time_gemm_vs_gemv_mma() {
    let Some(gpu) = Gpu::new() else { return };
    let names = ["o", "qkv", "gate_up", "down", "lm_head", "lm_head+argmax"];
    println!(
        "{:<16} {:>5} {:>11} {:>8} {:>11} {:>8}  tiles",
        "shape", "M", "gemm µs", "GB/s", "gemv_mma µs", "GB/s"
    );
    let mut total = [[0.0f64; 2]; 4];
    for ((k, n, epi), name) in LLAMA_8B.into_iter().zip(names) {
        let d = data(Case {
            m: 256,
            k,
            n,
            epi,
            dt: BF,
        });
        for (mi, m) in [32u32, 64, 128, 256].into_iter().enumerate() {
            let c = Case {
                m,
                k,
                n,
                epi,
                dt: BF,
            };
            let (mut s, kernels, mem) = prepare(&gpu, c, &d, Gemm::Mma);
            let copies = (256e6 / bytes(c)).ceil().max(2.0) as usize;
            let gemm = gpu.time(
                &mem,
                &kernels[..1].iter().collect::<Vec<_>>(),
                bucket(m),
                copies,
                20,
            );
            let gemv = gemv_kernel(&gpu, &mut s, m);
            let mut mem2 = Mem::new(s.plan.alloc(0).byte_offset(), &[d.w.len() as u64 * 2]);
            put(&mut mem2, Loc::table(0), c.dt, &d.w);
            let old = gpu.time(&mem2, &[&gemv], bucket(m), copies, 20);
            let gbs = |us: f64| bytes(c) / (us * 1e3);
            println!(
                "{name:<16} {m:>5} {gemm:>11.1} {:>8.0} {old:>11.1} {:>8.0}  {} | {}",
                gbs(gemm),
                gbs(old),
                kernels[0].name,
                gemv.name
            );
            // The 8B forward: 32 layers of o, qkv, gate/up, down, then the greedy lm-head.
            let times = match epi {
                Epi::LogitsF32 => 0.0,
                Epi::Argmax => 1.0,
                _ => 32.0,
            };
            total[mi][0] += times * gemm;
            total[mi][1] += times * old;
        }
    }
    for (mi, m) in [32, 64, 128, 256].into_iter().enumerate() {
        println!(
            "M={m}: the 8B forward's matmuls (32 layers + greedy lm-head): gemm {:.3} ms, gemv_mma {:.3} ms",
            total[mi][0] / 1e3,
            total[mi][1] / 1e3
        );
    }
}

/// FLOPs of a launch: 2 · M · N · K per weight matrix.
fn flops(c: Case) -> f64 {
    let g = if c.epi == Epi::SiluMul { 2.0 } else { 1.0 };
    2.0 * g * c.m as f64 * c.n as f64 * c.k as f64
}

/// The three matmul kernels side by side — `gemm_wgmma`, `gemm_mma` and the `gemv_mma`
/// split — at M = 32 .. 1024 on the 8B shapes with their step-graph epilogues: µs per
/// launch and TFLOP/s, weights streamed from HBM (copies past L2), then the 8B forward's
/// matmul total per M for each kernel and for the fastest per launch. The table the
/// selection's thresholds (`choose::gemm::{WGMMA_MIN_ROWS, GEMM_MIN_ROWS}`) are set from.
#[test]
#[ignore = "timing: run with --ignored on the device"]
fn time_wgmma_vs_gemm_vs_gemv_mma() {
    let Some(gpu) = gpu_for(Gemm::Wgmma) else {
        return;
    };
    const ROWS: [u32; 6] = [32, 64, 128, 256, 512, 1024];
    let names = ["o", "qkv", "gate_up", "down", "lm_head", "lm_head+argmax"];
    println!(
        "{:<15} {:>5} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7}  best     wgmma tile",
        "shape", "M", "wgmma µs", "TFLOP/s", "mma µs", "TFLOP/s", "gemv µs", "TFLOP/s"
    );
    // Per M: the forward's total of wgmma, gemm_mma, gemv_mma and the fastest per launch.
    let mut total = [[0.0f64; 4]; ROWS.len()];
    for ((k, n, epi), name) in LLAMA_8B.into_iter().zip(names) {
        let d = data(Case {
            m: 1024,
            k,
            n,
            epi,
            dt: BF,
        });
        for (mi, m) in ROWS.into_iter().enumerate() {
            let c = Case {
                m,
                k,
                n,
                epi,
                dt: BF,
            };
            let copies = (256e6 / bytes(c)).ceil().max(2.0) as usize;
            let iters = if flops(c) > 2e11 { 10 } else { 20 };
            // One image for the three (the GEMV's split scratch allocated first).
            let mut s = setup(c);
            let gemv = gemv_kernel(&gpu, &mut s, m);
            let wg_kernel = gemm_kernels(&gpu, &s, c, Gemm::Wgmma).swap_remove(0);
            let mma_kernel = gemm_kernels(&gpu, &s, c, Gemm::Mma).swap_remove(0);
            let mem = memory(&mut s, c, &d);
            let lists: [&[&KernelSource]; 3] = [&[&wg_kernel], &[&mma_kernel], &[&gemv]];
            let [wg, mma, gv] = gpu
                .time_many(&mem, &lists, bucket(m), copies, iters)
                .try_into()
                .unwrap();
            let tf = |us: f64| flops(c) / (us * 1e6);
            let best = [("wgmma", wg), ("mma", mma), ("gemv", gv)]
                .into_iter()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap();
            let tile = wgmma_tile(&s.p, m, gpu.target()).unwrap();
            println!(
                "{name:<15} {m:>5} {wg:>9.1} {:>7.0} {mma:>9.1} {:>7.0} {gv:>9.1} {:>7.0}  {:<8} {}x{}x{} {}",
                tf(wg),
                tf(mma),
                tf(gv),
                best.0,
                tile.bm,
                tile.bn,
                tile.stages,
                wg_kernel.name
            );
            let times = match epi {
                Epi::LogitsF32 => 0.0,
                Epi::Argmax => 1.0,
                _ => 32.0,
            };
            for (j, us) in [wg, mma, gv, best.1].into_iter().enumerate() {
                total[mi][j] += times * us;
            }
        }
    }
    for (mi, m) in ROWS.into_iter().enumerate() {
        let [wg, mma, gv, best] = total[mi].map(|us| us / 1e3);
        println!(
            "M={m}: the 8B forward's matmuls (32 layers + greedy lm-head): wgmma {wg:.3} ms, gemm_mma {mma:.3} ms, gemv_mma {gv:.3} ms, fastest per launch {best:.3} ms"
        );
    }
}

/// The wgmma GEMM's tile rule against its alternatives: per 8B shape and M = 64 .. 1024
/// (`SPECC_TILE_ROWS=256,512` for some),
/// µs of the chosen tile and of every other `bm × bn` (bm 64 or 128, bn 32 .. 256, the
/// most stages that fit), the fastest marked: the data for `choose::gemm::wgmma_tile`.
#[test]
#[ignore = "timing: run with --ignored on the device"]
fn time_wgmma_tiles() {
    let Some(gpu) = gpu_for(Gemm::Wgmma) else {
        return;
    };
    let names = ["o", "qkv", "gate_up", "down", "lm_head", "lm_head+argmax"];
    // `SPECC_TILE_SHAPES=o,down` times those shapes only (the lm-head's thousand column
    // tiles fill the GPU at any tile; its sweep is the slowest).
    let only = std::env::var("SPECC_TILE_SHAPES").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|s| s == name))
    };
    for ((k, n, epi), name) in LLAMA_8B.into_iter().zip(names) {
        if !wanted(name) {
            continue;
        }
        let d = data(Case {
            m: 1024,
            k,
            n,
            epi,
            dt: BF,
        });
        let rows: Vec<u32> = std::env::var("SPECC_TILE_ROWS")
            .ok()
            .map(|r| r.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![64, 128, 256, 512, 1024]);
        for &m in &rows {
            let c = Case {
                m,
                k,
                n,
                epi,
                dt: BF,
            };
            let mut s = setup(c);
            let chosen = wgmma_tile(&s.p, m, gpu.target()).unwrap();
            // The chosen tile, its other cluster shapes, then the other tiles, each also
            // as clusters of 2 where it has 128 rows.
            let mut tiles = vec![chosen];
            if chosen.persistent_blocks > 0 {
                tiles.push(WgmmaTiling {
                    persistent_blocks: 0,
                    ..chosen
                });
            }
            if wgmma::mats(&s.p) > 1 {
                tiles.push(WgmmaTiling {
                    split_mats: !chosen.split_mats,
                    ..chosen
                });
            }
            for t in cluster_variants(&s.p, chosen, &CLUSTERS) {
                if !tiles.contains(&t) {
                    tiles.push(t);
                }
            }
            // `SPECC_TILE_BN=96,112,128` sweeps those column tiles instead.
            let bns: Vec<u32> = std::env::var("SPECC_TILE_BN")
                .ok()
                .map(|r| r.split(',').filter_map(|x| x.trim().parse().ok()).collect())
                .unwrap_or_else(|| vec![32, 64, 128, 256]);
            for bm in [64, 128] {
                for &bn in &bns {
                    let Some(t) = wgmma_ring(&s.p, bm, bn, gpu.target()) else {
                        continue;
                    };
                    if bm == 64 && m > 256 {
                        continue;
                    }
                    let pairs: &[(u32, u32)] = if bm == 128 { &CLUSTERS[..] } else { &[] };
                    for t in cluster_variants(&s.p, t, pairs) {
                        if !tiles.contains(&t) && (t.cluster() == 1 || t.cluster() == 2) {
                            tiles.push(t);
                        }
                    }
                }
            }
            let kernels: Vec<KernelSource> =
                tiles.iter().map(|t| gemm_wgmma(&s.p, t).unwrap()).collect();
            let lists: Vec<[&KernelSource; 1]> = kernels.iter().map(|k| [k]).collect();
            let lists: Vec<&[&KernelSource]> = lists.iter().map(|l| &l[..]).collect();
            let mem = memory(&mut s, c, &d);
            let copies = (256e6 / bytes(c)).ceil().max(2.0) as usize;
            let iters = if flops(c) > 2e11 { 10 } else { 20 };
            let us = gpu.time_many(&mem, &lists, bucket(m), copies, iters);
            let best = us
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1))
                .unwrap()
                .0;
            let row: Vec<String> = tiles
                .iter()
                .zip(&us)
                .enumerate()
                .map(|(i, (t, us))| {
                    let mark = match (i == 0, i == best) {
                        (true, true) => "=*",
                        (true, false) => "=",
                        (false, true) => "*",
                        _ => "",
                    };
                    let cluster = match (t.cluster_m, t.cluster_n) {
                        (1, 1) => String::new(),
                        (cm, cn) => format!("c{cm}x{cn}"),
                    };
                    let split = if t.split_mats { "split" } else { "" };
                    let persistent = match t.persistent_blocks {
                        0 => String::new(),
                        b => format!("p{b}"),
                    };
                    format!(
                        "{}x{}s{}{cluster}{split}{persistent} {us:.1}{mark}",
                        t.bm, t.bn, t.stages
                    )
                })
                .collect();
            println!(
                "tiles {name:<15} M={m:<5} (= chosen, * fastest, µs): {}",
                row.join("  ")
            );
        }
    }
}
