//! Timing sweep (ignored by default; `--ignored` on the device): the work splits of the
//! tensor-core GEMV (`gemv_mma`) at the Kimi-K2 shapes of an 8-row verify step — q_a and
//! kv_a (two launches in today's plan; also as one stacked matrix), q_b, o, the shared expert and the dense layer's MLP, each
//! with its step-graph prologue and epilogue — and of the CUDA-core GEMV for the f32
//! router, against the split the selection (`specc_codegen::choose::matmul`) makes. Per
//! shape: µs per launch with weights streamed from HBM (copies past L2), GB/s of the bytes
//! the launch must move, the plan's split first, then the fastest five. The table the
//! narrow-matrix rules of `choose::matmul::tiling` are set from (bench/NOTES.md).

#![cfg(feature = "cuda")]

mod common;
mod gpu;

use common::Plan;
use gpu::{Gpu, Mem};
use specc_codegen::choose::matmul::{fits, tiling as plan_tiling, SPLIT_COUNTERS};
use specc_kernels_gen::abi::{Bucket, Dtype, KernelSource, Loc, Rows};
use specc_kernels_gen::gemv::{gemv_tiled, GemvParams, GemvTiling, GemvWeights, RmsNormPrologue};
use specc_kernels_gen::gemv_mma::{gemv_mma_split, split_needs, Feed, MmaTiling, SplitScratch};

const BF: Dtype = Dtype::BF16;
const ROWS: u32 = 8;

/// A projection of the Kimi-K2 verify step: `(name, k, n, gate/up, normed x, residual)`.
type Shape = (&'static str, u32, u32, bool, bool, bool);

const KIMI: [Shape; 9] = [
    ("q_a", 7168, 1536, false, true, false),
    ("kv_a", 7168, 576, false, true, false),
    ("q_a|kv_a stacked", 7168, 2112, false, true, false),
    ("q_b", 1536, 12288, false, true, false),
    ("o", 8192, 7168, false, false, true),
    ("shared gate/up", 7168, 2048, true, true, false),
    ("shared down", 2048, 7168, false, false, true),
    ("dense gate/up", 7168, 18432, true, true, false),
    ("dense down", 18432, 7168, false, false, true),
];

/// The launch of `shape` at [`ROWS`] rows: x, out / residual and split scratch in the
/// arena; weights in slot 0, the norm weight in slot 1.
fn params(
    plan: &mut Plan,
    (_, k, n, gate_up, norm, residual): Shape,
    xd: Dtype,
    wd: Dtype,
) -> GemvParams {
    let x = plan.view(ROWS, k, xd);
    let out = plan.view(ROWS, n, xd);
    GemvParams {
        rows: Rows::Fixed(ROWS),
        row_tile: ROWS,
        k,
        n,
        x,
        weights: if gate_up {
            GemvWeights::gate_up_concat(Loc::table(0), n, k, wd)
        } else {
            GemvWeights::Single(Loc::table(0))
        },
        w_dtype: wd,
        norm: norm.then_some(RmsNormPrologue {
            weight: Loc::table(1),
            dtype: xd,
            eps: 1e-6,
        }),
        residual: residual.then_some(out),
        out: Some(out),
        argmax_partials: None,
        rope: None,
    }
}

fn weight_bytes(p: &GemvParams) -> u64 {
    let g = if p.gate_up() { 2 } else { 1 };
    g * p.n as u64 * p.k as u64 * p.w_dtype.size()
}

/// Bytes the launch must move: weights once, x once, the output (and the residual) once.
fn bytes(p: &GemvParams) -> f64 {
    let (m, n) = (ROWS as u64, p.n as u64);
    let out = if p.residual.is_some() { 2 } else { 1 } * m * n * p.x.dtype.size();
    (weight_bytes(p) + m * p.k as u64 * p.x.dtype.size() + out) as f64
}

/// The kernel of split `t` (its split-K scratch allocated in `plan`), `None` where the
/// split is invalid for `p` or does not fit the device.
fn mma_kernel(gpu: &Gpu, plan: &mut Plan, p: &GemvParams, t: MmaTiling) -> Option<KernelSource> {
    if !fits(p, &t, gpu.target()) {
        return None;
    }
    let needs = split_needs(p, &t, ROWS);
    if needs
        .as_ref()
        .is_some_and(|nd| nd.counters > SPLIT_COUNTERS)
    {
        return None;
    }
    let split = needs.map(|nd| SplitScratch {
        partials: plan.alloc(nd.partial_bytes),
        counters: plan.alloc(nd.counters as u64 * 4),
        tiles: nd.counters,
    });
    gemv_mma_split(p, &t, split).ok()
}

fn candidates(plan_t: MmaTiling) -> Vec<MmaTiling> {
    let mut out = vec![plan_t];
    for tn in [1, 2] {
        for (wn, wk) in [(1, 8), (2, 4), (4, 2), (8, 1), (1, 4), (2, 2)] {
            for unroll in [2, 4, 8] {
                for ks in [1, 2, 4] {
                    let t = MmaTiling {
                        tn,
                        wn,
                        wk,
                        unroll,
                        feed: Feed::Prefetch,
                        ks,
                    };
                    if !out.contains(&t) {
                        out.push(t);
                    }
                }
            }
        }
    }
    out
}

/// Times `kernels` (one per split) over one memory image; `(µs, name)` per kernel.
fn time_all(gpu: &Gpu, p: &GemvParams, plan: &mut Plan, kernels: &[KernelSource]) -> Vec<f64> {
    gpu.precompile(&kernels.iter().collect::<Vec<_>>());
    let w = weight_bytes(p);
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[w, p.k as u64 * 2]);
    let x: Vec<f64> = (0..(ROWS * p.k) as usize)
        .map(|i| ((i % 17) as f64 - 8.0) / 8.0)
        .collect();
    mem.put(p.x.loc, p.x.dtype, &x);
    mem.put(Loc::table(1), BF, &vec![1.0; p.k as usize]);
    let copies = (256e6 / w as f64).ceil().max(2.0) as usize;
    let bucket = Bucket {
        b: 1,
        t: ROWS,
        ctx: 1,
    };
    kernels
        .iter()
        .map(|k| gpu.time(&mem, &[k], bucket, copies, 30))
        .collect()
}

fn report(name: &str, p: &GemvParams, labels: &[String], us: &[f64], copy_gbps: f64) {
    let gbs = |t: f64| bytes(p) / (t * 1e3);
    println!(
        "{name}: k {} n {} at {ROWS} rows, {:.1} MB; plan {} {:.1} µs ({:.0} GB/s, {:.0} % of copy)",
        p.k,
        p.n,
        bytes(p) / 1e6,
        labels[0],
        us[0],
        gbs(us[0]),
        100.0 * gbs(us[0]) / copy_gbps
    );
    let mut order: Vec<usize> = (0..us.len()).collect();
    order.sort_by(|&a, &b| us[a].total_cmp(&us[b]));
    for &i in order.iter().take(5) {
        println!(
            "  {:<44} {:>7.1} µs {:>6.0} GB/s {:>4.0} %",
            labels[i],
            us[i],
            gbs(us[i]),
            100.0 * gbs(us[i]) / copy_gbps
        );
    }
}

#[test]
#[ignore = "timing: run with --ignored on the device"]
fn kimi_verify_gemv_splits() {
    let Some(gpu) = Gpu::new() else { return };
    let copy = gpu.copy_gbps(20);
    println!("copy bandwidth {copy:.0} GB/s");
    for shape in KIMI {
        let mut plan = Plan::new();
        let p = params(&mut plan, shape, BF, BF);
        let chosen = plan_tiling(&p, gpu.target());
        let mut labels = Vec::new();
        let mut kernels = Vec::new();
        for t in candidates(chosen) {
            if let Some(k) = mma_kernel(&gpu, &mut plan, &p, t) {
                labels.push(format!(
                    "tn {} wn {} wk {} unroll {} ks {}",
                    t.tn, t.wn, t.wk, t.unroll, t.ks
                ));
                kernels.push(k);
            }
        }
        let us = time_all(&gpu, &p, &mut plan, &kernels);
        report(shape.0, &p, &labels, &us, copy);
    }
    // The router: f32 x and weights on CUDA cores, split K inside the block.
    let mut plan = Plan::new();
    let p = params(
        &mut plan,
        ("router", 7168, 384, false, false, false),
        Dtype::F32,
        Dtype::F32,
    );
    let chosen = p.tiling();
    let mut labels = vec![format!("{chosen:?}")];
    let mut kernels = vec![gemv_tiled(&p, &chosen).unwrap()];
    for warps in [1, 2, 4] {
        for k_warps in [4, 8, 16] {
            for k_chunk in [512, 1024] {
                let t = GemvTiling {
                    warps,
                    cols_per_warp: 1,
                    vec: 4,
                    k_chunk,
                    k_warps,
                };
                if t != chosen {
                    if let Ok(k) = gemv_tiled(&p, &t) {
                        labels.push(format!("warps {warps} k_warps {k_warps} k_chunk {k_chunk}"));
                        kernels.push(k);
                    }
                }
            }
        }
    }
    let us = time_all(&gpu, &p, &mut plan, &kernels);
    report("router (f32)", &p, &labels, &us, copy);
}
