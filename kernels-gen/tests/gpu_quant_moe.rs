//! The grouped MoE kernels (`moe_dispatch`, `moe_gate_up`, `moe_down`, `moe_combine`; bf16
//! stacks, int4 group 32 with bf16 scales on the CUDA cores and on tensor cores, fp8 blocks
//! with f32 scales and partial edge blocks) on the GPU against the IR interpreter's
//! `moe_experts`, at 1, 2, 4,
//! 8 and 16 tokens (experts shared by up to all of them, so both the one-token and the
//! multi-token passes run), and batch invariance: each token's output is bit-identical
//! whatever the number of tokens it runs with. The stacks are uploaded as the checkpoint
//! stores them. At Kimi's shapes (`kimi_bandwidth`) the same checks on token 0 and the
//! time of the kernels, in GB/s over the selected experts' bytes. Needs `--features cuda` and a device; skips with a message without a
//! driver or NVRTC.

#![cfg(feature = "cuda")]

mod gpu;
mod kimi_bandwidth;
mod quant_cases;

use gpu::quant::{scale_dtype, weight};
use gpu::{assert_close, bf16_tol, tensor, Gpu, Mem, Rng};
use quant_cases::grouped::case_with;
use specc_ir::{DType, Op};
use specc_kernels_gen::abi::{Bucket, Dtype, Loc};
use specc_kernels_gen::generic::moe_grouped::{
    CoreTiling, ExpertMatmul, Int4MmaGeometry, Int4MmaTiling, MoeGroupedShape,
};
use specc_kernels_gen::quant::QuantFormat;

const TOKENS: [u64; 5] = [1, 2, 4, 8, 16];

/// Dense gates `[t, e]`: `top_k` distinct experts per token with gates in `[0.1, 1)`; even
/// tokens draw from the first `top_k + 1` experts (so those gather many tokens: several
/// passes of 4 with a partial last one), odd tokens from all `e`.
fn gates(t: usize, e: usize, top_k: usize, rng: &mut Rng) -> Vec<f64> {
    let mut g = vec![0.0; t * e];
    for (tk, row) in g.chunks_mut(e).enumerate() {
        let pool = if tk % 2 == 0 { (top_k + 1).min(e) } else { e };
        let mut picked = 0;
        while picked < top_k {
            let ex = ((rng.next(0.5) + 0.5) * pool as f64) as usize % pool;
            if row[ex] == 0.0 {
                row[ex] = 0.55 + rng.next(0.45);
                picked += 1;
            }
        }
    }
    g
}

/// Runs the grouped kernels (expert matmuls as `mm`) for `e` experts of `[f, h]` / `[h, f]`
/// stored as `w`, `top_k` per token, activations `act`, at every count of [`TOKENS`] over
/// the leading tokens of the same inputs; checks each against the interpreter and against
/// the 16-token run.
#[allow(clippy::too_many_arguments)]
fn check(
    gpu: &Gpu,
    mm: ExpertMatmul,
    w: DType,
    act: Dtype,
    e: usize,
    h: usize,
    f: usize,
    top_k: usize,
) {
    let fmt = QuantFormat::of(w);
    let sdt = fmt.map_or(Dtype::BF16, scale_dtype);
    let label = format!(
        "moe grouped {} {} {mm:?} E={e} H={h} F={f}",
        fmt.map_or(w.to_string(), |f| f.name()),
        act.name()
    );
    let mut rng = Rng::new((h * 131 + f) as u64);
    let tmax = *TOKENS.last().unwrap() as usize;
    let x = rng.vec(tmax * h, 1.0);
    let g = gates(tmax, e, top_k, &mut rng);
    let dims = [(f, h), (f, h), (h, f)];
    let stacks: Vec<_> = dims
        .iter()
        .map(|&(n, k)| match fmt {
            Some(fmt) => {
                let (bytes, mut t) = weight(fmt, e * n, k, &mut rng);
                t.shape = vec![e, n, k];
                (bytes, t)
            }
            None => bf16_weight(&[e, n, k], &mut rng),
        })
        .collect();
    let scales: Vec<(Vec<usize>, Vec<f64>)> = dims
        .iter()
        .filter_map(|&dims| fmt.map(|fmt| (fmt, dims)))
        .map(|(fmt, (n, k))| {
            let shape = vec![
                e,
                fmt.scale_rows(n as u64) as usize,
                fmt.scale_cols(k as u64) as usize,
            ];
            let vals = (0..shape.iter().product::<usize>())
                .map(|_| (1.0 + rng.next(0.5)) * 0.02)
                .collect();
            (shape, vals)
        })
        .collect();
    let mut full: Option<Vec<f64>> = None;
    let mut scale: Option<(f64, f64)> = None;
    for &t in TOKENS.iter().rev() {
        let tu = t as usize;
        let shape = MoeGroupedShape {
            tokens: t,
            experts: e as u64,
            hidden: h as u64,
            ffn: f as u64,
            top_k: top_k as u64,
        };
        let c = case_with(mm, w, ir(sdt), ir(act), shape);
        let kernels = c.kernels();
        let mut bufs: Vec<u64> = stacks.iter().map(|s| s.0.len() as u64).collect();
        bufs.extend(scales.iter().map(|s| s.1.len() as u64 * sdt.size()));
        let mut mem = Mem::new(c.arena_bytes, &bufs);
        mem.put(c.ops[0].loc, act, &x[..tu * h]);
        mem.put(c.ops[1].loc, act, &g[..tu * e]);
        for (i, (bytes, _)) in stacks.iter().enumerate() {
            mem.bufs[i].copy_from_slice(bytes);
        }
        for (i, (_, vals)) in scales.iter().enumerate() {
            mem.put(Loc::table(3 + i as u32), sdt, vals);
        }
        let refs: Vec<_> = kernels.iter().collect();
        gpu.run(
            &mut mem,
            &refs,
            Bucket {
                b: 1,
                t: t as u32,
                ctx: 1,
            },
        );
        let got = mem.get(c.out.loc, act, tu * h);

        let mut r = gpu::Reference::new();
        let mut args = vec![
            r.input("x", tensor(act, &[tu, h], &x[..tu * h])),
            r.input("gates", tensor(act, &[tu, e], &g[..tu * e])),
        ];
        for (i, (_, t)) in stacks.iter().enumerate() {
            args.push(r.input(&format!("w{i}"), t.clone()));
        }
        for (i, (shape, vals)) in scales.iter().enumerate() {
            args.push(r.input(&format!("s{i}"), tensor(sdt, shape, vals)));
        }
        let y = r.op(Op::MoeExperts, &args);
        let want = r.run(&[("y", y)]).remove("y").unwrap();
        // One scale for every token count: the 16-token run's (the first), so a token's
        // bound does not shrink when fewer tokens (a smaller peak) share the run.
        let (rtol, atol) = *scale.get_or_insert_with(|| match act {
            Dtype::F32 => {
                let peak = want.iter().fold(0.0f64, |m, &v| m.max(v.abs()));
                (1e-4, peak * 1e-5)
            }
            // The SwiGLU product is rounded to bf16 before `moe_down` (as the interpreter
            // does), and the kernel's gate/up sums run in another order than the
            // interpreter's: one ulp of a rounded product moves every output term it feeds,
            // so where the F-term sum cancels the error is a few ulps of the terms, not of
            // the result (measured on the H200: 2 of 8192 values at 1.5× `bf16_tol`'s atol).
            // The tensor-core int4 path has the same error sources and no other: its
            // products (u − 8)·x are exact in the mma, each group's 32-term sum is f32 (as
            // the interpreter's), times the group's scale once, then f32 over the groups —
            // a reordering of the interpreter's f32 sum of f32 products q·s·x, so within
            // f32 rounding (≈ 1e-6 relative) of it before the bf16 roundings; no weight is
            // rounded to bf16. More SwiGLU terms, more such flips: at F = 384 one of 16384
            // values measured 2.15× `bf16_tol`'s atol (H200), hence 3×.
            _ => {
                let (rtol, atol) = bf16_tol(&want);
                (rtol, 3.0 * atol)
            }
        });
        assert_close(&format!("{label} T={t}"), &got, &want, rtol, atol);
        // Batch invariance: the leading tokens' outputs are the 16-token run's, bit for bit.
        match &full {
            None => full = Some(got),
            Some(all) => {
                for (i, (a, b)) in got.iter().zip(all).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{label}: T={t} token {} col {}: {a} vs {b} with 16 tokens",
                        i / h,
                        i % h
                    );
                }
            }
        }
    }
    println!("PASS {label}: T = 16, 8, 4, 2, 1 within tolerance and bit-identical to T = 16");
}

fn ir(d: Dtype) -> DType {
    gpu::ir_dtype(d)
}

/// A random bf16 stack `dims` (values in ±0.05): its bytes and the interpreter's tensor of
/// the same (rounded) values.
fn bf16_weight(dims: &[usize], rng: &mut Rng) -> (Vec<u8>, specc_ir::interp::Tensor) {
    let n = dims.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|_| half::bf16::from_f64(rng.next(0.05)).to_f64())
        .collect();
    let bytes = vals
        .iter()
        .flat_map(|&v| half::bf16::from_f64(v).to_le_bytes())
        .collect();
    (bytes, tensor(Dtype::BF16, dims, &vals))
}

#[test]
fn bf16_grouped_experts_match_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    // Kimi-K2's layout (bf16 stacks and activations) at a small width, and f32 activations.
    let cuda = ExpertMatmul::CUDA_CORES;
    check(&gpu, cuda, DType::BF16, Dtype::BF16, 8, 512, 256, 2);
    check(&gpu, cuda, DType::BF16, Dtype::F32, 8, 64, 32, 2);
}

#[test]
fn int4_grouped_experts_match_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let i4 = DType::Int4Group { group: 32 };
    // Kimi's layout (bf16 activations, group 32) at a small width; the fixture's shape; in
    // every CUDA-core tiling the benchmark times.
    for tl in CoreTiling::VARIANTS {
        let cuda = ExpertMatmul::CudaCores(tl);
        check(&gpu, cuda, i4, Dtype::BF16, 8, 512, 256, 2);
        check(&gpu, cuda, i4, Dtype::F32, 8, 64, 32, 2);
    }
}

#[test]
fn int4_tensor_core_experts_match_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let i4 = DType::Int4Group { group: 32 };
    // Every tiling the benchmark times, at each of these (E, H, F, top-k) whose widths are
    // whole stages of it: Kimi's layout at a small width (row blocks of gate/up and of down
    // both partial and whole), and wider ones with more stages than any ring.
    let shapes = [(8, 512, 256, 2), (4, 1024, 384, 3), (4, 2048, 512, 3)];
    for tl in Int4MmaTiling::VARIANTS {
        let mma = ExpertMatmul::Int4TensorCores(tl);
        let cols = tl.stage_cols() as usize;
        for (e, h, f, k) in shapes {
            if h % cols == 0 && f % cols == 0 {
                check(&gpu, mma, i4, Dtype::BF16, e, h, f, k);
            }
        }
    }
}

#[test]
fn fp8_grouped_experts_match_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    // The fixture's shape (partial edge blocks both ways), and 136 in-features (8-element
    // loads) with bf16 activations.
    for tl in CoreTiling::VARIANTS {
        let cuda = ExpertMatmul::CudaCores(tl);
        check(&gpu, cuda, DType::Fp8E4M3, Dtype::F32, 8, 160, 48, 2);
        check(&gpu, cuda, DType::Fp8E4M3, Dtype::BF16, 8, 136, 200, 2);
    }
}
