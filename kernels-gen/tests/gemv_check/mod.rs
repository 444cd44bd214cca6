//! One GEMV launch (SIMT `gemv` or tensor-core `gemv_mma`) checked against the IR
//! interpreter: x (optionally RMS-normed) times W, SwiGLU, residual add, cast, argmax.
//! Outputs and argmax partials are poisoned before the launch (NaN values, partials that
//! would win every argmax), so an element the kernel does not write fails the check.

#![allow(dead_code)]

use crate::common::Plan;
use crate::gpu::{assert_close, bf16_tol, tensor, Gpu, Mem, Reference, Rng};
use specc_codegen::choose::matmul::tiling;
use specc_ir::op::BinaryOp;
use specc_ir::{DType, Op};
use specc_kernels_gen::abi::{Bucket, Dtype, KernelSource, Loc, Rows, View};
use specc_kernels_gen::argmax::{argmax, ArgmaxInput, ArgmaxParams};
use specc_kernels_gen::gemv::{gemv, GemvParams, GemvWeights, RmsNormPrologue};
use specc_kernels_gen::gemv_mma::{
    gemv_mma_split, partials_per_row, split_needs, MmaTiling, SplitScratch,
};

/// Which generator a case runs.
#[derive(Clone, Copy, Debug)]
pub enum Kernel {
    Simt,
    /// The tensor-core kernel with its default tiling, or the given one.
    Mma(Option<MmaTiling>),
}

#[derive(Clone, Copy, Debug)]
pub struct GemvCase {
    pub b: u32,
    pub t: u32,
    pub k: u32,
    pub n: u32,
    pub row_tile: u32,
    /// x, residual (and weight, for the tensor-core kernel) dtype.
    pub x_dtype: Dtype,
    pub w_dtype: Dtype,
    pub norm: bool,
    pub gate_up: bool,
    pub residual: bool,
    pub out: Option<Dtype>,
    pub argmax: bool,
    pub kernel: Kernel,
}

pub const BF: Dtype = Dtype::BF16;

pub const BASE: GemvCase = GemvCase {
    b: 2,
    t: 4,
    k: 128,
    n: 512,
    row_tile: 8,
    x_dtype: BF,
    w_dtype: BF,
    norm: false,
    gate_up: false,
    residual: false,
    out: Some(BF),
    argmax: false,
    kernel: Kernel::Simt,
};

/// NaN in every float dtype the outputs use (all bits set).
const POISON: u8 = 0xff;

pub fn check_gemv(gpu: &Gpu, c: GemvCase) {
    let label = format!("{c:?}");
    let (m, k, n) = ((c.b * c.t) as usize, c.k as usize, c.n as usize);
    let g = if c.gate_up { 2 } else { 1 };
    let xd = c.x_dtype;
    let mut rng = Rng::new((m * 31 + k * 7 + n) as u64);
    let mut plan = Plan::new();
    let x = plan.view(m as u32, c.k, xd);
    let res = plan.view(m as u32, c.n, xd);
    // A residual add stores in place, as the fused o_proj / down_proj do.
    let out = match (c.residual, c.out) {
        (true, Some(d)) if d == xd => Some(res),
        (_, Some(d)) => Some(plan.view(m as u32, c.n, d)),
        (_, None) => None,
    };
    let parts = plan.alloc(m as u64 * 8 * n as u64);
    let tokens = View::new(plan.alloc(m as u64 * 4), Dtype::I32, 1);
    let p = GemvParams {
        rows: Rows::Tokens,
        row_tile: c.row_tile,
        k: c.k,
        n: c.n,
        x,
        weights: if c.gate_up {
            GemvWeights::gate_up_concat(Loc::table(0), c.n, c.k, c.w_dtype)
        } else {
            GemvWeights::Single(Loc::table(0))
        },
        w_dtype: c.w_dtype,
        norm: c.norm.then_some(RmsNormPrologue {
            weight: Loc::table(1),
            dtype: BF,
            eps: 1e-5,
        }),
        residual: c.residual.then_some(res),
        out,
        argmax_partials: c.argmax.then_some(parts),
        rope: None,
    };
    // Split-K scratch: partials, and counters that must be zero before and after.
    let mut counters = None;
    let (kernel, per_row): (KernelSource, u32) = match c.kernel {
        Kernel::Simt => {
            println!("{label}: {:?}", p.tiling());
            (gemv(&p).unwrap(), p.partials_per_row())
        }
        Kernel::Mma(t) => {
            let t = t.unwrap_or_else(|| tiling(&p, gpu.target()));
            let split = split_needs(&p, &t, m as u32).map(|nd| SplitScratch {
                partials: plan.alloc(nd.partial_bytes),
                counters: plan.alloc(nd.counters as u64 * 4),
                tiles: nd.counters,
            });
            counters = split.map(|s| (s.counters, s.tiles as usize));
            (
                gemv_mma_split(&p, &t, split).unwrap(),
                partials_per_row(&p, &t),
            )
        }
    };
    let mut kernels = vec![kernel];
    if c.argmax {
        kernels.push(
            argmax(&ArgmaxParams {
                rows: Rows::Tokens,
                input: ArgmaxInput::Partials {
                    loc: parts,
                    count: per_row,
                },
                out: tokens,
            })
            .unwrap(),
        );
    }
    let xv = rng.vec(m * k, 2.0);
    let wv = rng.vec(g * n * k, 2.0 / (k as f64).sqrt());
    let nv: Vec<f64> = rng.vec(k, 0.5).iter().map(|v| 1.0 + v).collect();
    let rv = rng.vec(m * n, 1.0);
    let mut mem = Mem::new(
        plan.alloc(0).byte_offset(),
        &[(g * n * k) as u64 * c.w_dtype.size(), k as u64 * 2],
    );
    // The in-place residual output holds the residual; every other output is poisoned.
    if let Some(o) = out.filter(|o| !(c.residual && o.loc == res.loc)) {
        let Loc::Arena { offset } = o.loc else {
            unreachable!()
        };
        let bytes = m * n * o.dtype.size() as usize;
        mem.arena[offset as usize..][..bytes].fill(POISON);
    }
    if c.argmax {
        // (+inf, index 0) beats every real candidate: an unwritten partial picks token 0.
        let inf = f32::INFINITY.to_le_bytes();
        let Loc::Arena { offset } = parts else {
            unreachable!()
        };
        for chunk in mem.arena[offset as usize..][..m * per_row as usize * 8].chunks_mut(8) {
            chunk[..4].copy_from_slice(&inf);
            chunk[4..].copy_from_slice(&0i32.to_le_bytes());
        }
    }
    mem.put(x.loc, xd, &xv);
    mem.put(Loc::table(0), c.w_dtype, &wv);
    mem.put(Loc::table(1), BF, &nv);
    mem.put(res.loc, xd, &rv);
    gpu.run(
        &mut mem,
        &kernels.iter().collect::<Vec<_>>(),
        Bucket {
            b: c.b,
            t: c.t,
            ctx: 1,
        },
    );

    let mut r = Reference::new();
    let mut xi = r.input("x", tensor(xd, &[m, k], &xv));
    if c.norm {
        let w = r.input("norm", tensor(BF, &[k], &nv));
        xi = r.op(
            Op::RmsNorm {
                eps: 1e-5f32 as f64,
            },
            &[xi, w],
        );
    }
    let wd = c.w_dtype;
    let mut y = if c.gate_up {
        let wg = r.input("wg", tensor(wd, &[n, k], &wv[..n * k]));
        let wu = r.input("wu", tensor(wd, &[n, k], &wv[n * k..]));
        let gate = r.op(Op::MatMul, &[xi, wg]);
        let up = r.op(Op::MatMul, &[xi, wu]);
        r.op(Op::SiluMul, &[gate, up])
    } else {
        let w = r.input("w", tensor(wd, &[n, k], &wv));
        r.op(Op::MatMul, &[xi, w])
    };
    let mm = y;
    if c.residual {
        let rr = r.input("res", tensor(xd, &[m, n], &rv));
        y = r.op(Op::Binary(BinaryOp::Add), &[y, rr]);
    }
    if c.out == Some(Dtype::F32) {
        y = r.op(Op::Cast { to: DType::F32 }, &[y]);
    }
    let am = r.op(Op::Argmax, &[y]);
    let want = r.run(&[("y", y), ("am", am), ("mm", mm)]);
    let (mut rtol, mut atol) = bf16_tol(&want["y"]);
    if c.gate_up {
        // gate and up are each rounded to bf16 before silu·mul: with another summation order
        // each may land one ulp (up to 2^-7 relative) away, and the product is rounded again,
        // so two output ulps plus a half are within the contract.
        rtol = rtol.max(3.0 / 128.0);
    }
    if c.residual {
        // The matmul result is rounded before the add: one bf16 ulp of its magnitude may
        // flip with the summation order and survive the add.
        let peak = want["mm"].iter().fold(0.0f64, |a, &v| a.max(v.abs()));
        atol = atol.max(peak / 128.0);
    }
    if let Some((loc, count)) = counters {
        let left = mem.get(loc, Dtype::I32, count);
        assert!(
            left.iter().all(|&c| c == 0.0),
            "{label}: split-K counters not reset: {left:?}"
        );
    }
    if let Some(o) = out {
        let got = mem.get(o.loc, o.dtype, m * n);
        assert_close(&format!("gemv {label}"), &got, &want["y"], rtol, atol);
    }
    if c.argmax {
        let got = mem.get(tokens.loc, Dtype::I32, m);
        for row in 0..m {
            let (gi, wi) = (got[row] as usize, want["am"][row] as usize);
            let logits = &want["y"][row * n..(row + 1) * n];
            assert!(
                gi == wi || logits[gi] >= logits[wi] - atol,
                "{label}: argmax row {row}: got {gi} ({}), want {wi} ({})",
                logits[gi],
                logits[wi]
            );
        }
        println!("argmax {label}: {m} rows agree");
    }
}
