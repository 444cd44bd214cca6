//! Times generated kernels at Llama-3.1-8B shapes on the device and prints effective HBM
//! bandwidth (bytes a kernel must move / time) against the measured copy ceiling.
//!
//! ```text
//! cargo build --release -p specc-kernels-gen --features cuda --example kernel_bench
//! # on the device: target/release/examples/kernel_bench
//! ```
//! Weights rotate through enough copies (one set of operand tables each) to exceed L2, so every run
//! streams them from HBM. Times are the mean of back-to-back launches after a warm-up.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/gpu/mod.rs"]
mod gpu;

use common::Plan;
use gpu::{Gpu, Mem};
use specc_kernels_gen::abi::{Bucket, Dtype, KernelSource, Loc, Rows, View};
use specc_kernels_gen::argmax::{argmax, ArgmaxInput, ArgmaxParams};
use specc_kernels_gen::attention::{attention, AttentionParams, AttnMask};
use specc_kernels_gen::gemv::{gemv, GemvParams, GemvWeights, RmsNormPrologue};

/// Copy bandwidth of the H200 (read + write counted), BENCH.md.
const CEILING_GBS: f64 = 4260.0;
const BF: Dtype = Dtype::BF16;

struct Row {
    label: String,
    us: f64,
    bytes: f64,
}

fn gemv_case(
    gpu: &Gpu,
    label: &str,
    m: u32,
    k: u32,
    n: u32,
    shape: (bool, bool, bool, bool),
) -> Row {
    let (norm, gate_up, residual, am) = shape;
    let g = if gate_up { 2 } else { 1 };
    let mut plan = Plan::new();
    let x = plan.view(m, k, BF);
    let out = plan.view(m, n, BF);
    let parts = plan.alloc(m as u64 * 8 * n as u64);
    let p = GemvParams {
        rows: Rows::Tokens,
        row_tile: m,
        k,
        n,
        x,
        weights: if gate_up {
            GemvWeights::gate_up_concat(Loc::table(0), n, k, BF)
        } else {
            GemvWeights::Single(Loc::table(0))
        },
        w_dtype: BF,
        norm: norm.then_some(RmsNormPrologue {
            weight: Loc::table(1),
            dtype: BF,
            eps: 1e-5,
        }),
        residual: residual.then_some(out),
        out: (!am).then_some(out),
        argmax_partials: am.then_some(parts),
    };
    let mut ks: Vec<KernelSource> = vec![gemv(&p).unwrap()];
    if am {
        let tok = View::new(plan.alloc(m as u64 * 4), Dtype::I32, 1);
        let input = ArgmaxInput::Partials {
            loc: parts,
            count: p.partials_per_row(),
        };
        ks.push(
            argmax(&ArgmaxParams {
                rows: Rows::Tokens,
                input,
                out: tok,
            })
            .unwrap(),
        );
    }
    let wbytes = (g * n as u64 * k as u64) * 2;
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[wbytes, k as u64 * 2]);
    let mut rng = gpu::Rng::new(1);
    mem.put(x.loc, BF, &rng.vec((m * k) as usize, 1.0));
    let copies = (400e6 / wbytes as f64).ceil().max(2.0) as usize;
    let us = gpu.time(
        &mem,
        &ks.iter().collect::<Vec<_>>(),
        Bucket { b: 1, t: m, ctx: 1 },
        copies,
        50,
    );
    let t = p.tiling();
    Row {
        label: format!(
            "{label} M={m} [{}w x {}c, kc {}]",
            t.warps, t.cols_per_warp, t.k_chunk
        ),
        us,
        bytes: wbytes as f64,
    }
}

fn attention_case(gpu: &Gpu, b: u32, t: u32, len: u32, splits: u32) -> Row {
    let (hq, hkv, d, ctx) = (32u32, 8u32, 128u32, 4096u32);
    let m = b * t;
    let mut plan = Plan::new();
    let q = plan.view(m, hq * d, BF);
    let out = plan.view(m, hq * d, BF);
    let pos = plan.alloc(m as u64 * 4);
    let mut p = AttentionParams {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        head_dim_v: d,
        q,
        k_cache: Loc::table(0),
        v_cache: Loc::table(1),
        cache_dtype: BF,
        pos,
        pos_dtype: Dtype::I32,
        mask: AttnMask::Causal,
        out,
        scale: 0.088,
        max_t: t,
        splits,
        scratch: Loc::arena(0),
    };
    p.scratch = plan.alloc(p.scratch_bytes(m));
    let ks = attention(&p).unwrap();
    let cache = (b * ctx * hkv * d) as u64 * 2;
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[cache, cache]);
    let pv: Vec<f64> = (0..m).map(|i| (len - t + i % t) as f64).collect();
    mem.put(pos, Dtype::I32, &pv);
    let us = gpu.time(&mem, &[&ks.split, &ks.combine], Bucket { b, t, ctx }, 8, 50);
    Row {
        label: format!("attention B={b} T={t} len={len} splits={splits}"),
        us,
        bytes: (b * len * hkv * d * 2 * 2) as f64,
    }
}

fn main() {
    let Some(gpu) = Gpu::new() else { return };
    let (h, f, v, qkv) = (4096, 14336, 128256, 6144);
    let mut rows = Vec::new();
    for m in [1, 8, 64] {
        rows.push(gemv_case(
            &gpu,
            "qkv +norm",
            m,
            h,
            qkv,
            (true, false, false, false),
        ));
        rows.push(gemv_case(
            &gpu,
            "o_proj +res",
            m,
            h,
            h,
            (false, false, true, false),
        ));
        rows.push(gemv_case(
            &gpu,
            "gate_up +norm +silu",
            m,
            h,
            f,
            (true, true, false, false),
        ));
        rows.push(gemv_case(
            &gpu,
            "down +res",
            m,
            f,
            h,
            (false, false, true, false),
        ));
        rows.push(gemv_case(
            &gpu,
            "lm_head +norm +argmax",
            m,
            h,
            v,
            (true, false, false, true),
        ));
    }
    for (b, t) in [(1, 1), (1, 8), (4, 8)] {
        rows.push(attention_case(&gpu, b, t, 1024, 16));
        rows.push(attention_case(&gpu, b, t, 4000, 32));
    }
    println!(
        "device arch {}; ceiling {CEILING_GBS} GB/s (copy, BENCH.md)",
        gpu.arch()
    );
    println!(
        "{:<58} {:>10} {:>10} {:>8}",
        "kernel", "us", "GB/s", "% ceil"
    );
    for r in rows {
        let gbs = r.bytes / r.us / 1e3;
        println!(
            "{:<58} {:>10.1} {:>10.0} {:>7.1}%",
            r.label,
            r.us,
            gbs,
            100.0 * gbs / CEILING_GBS
        );
    }
}
