//! GEMV, RMSNorm, elementwise, embedding and argmax kernels run on the GPU and compared
//! with the IR interpreter (the oracle), at tiny-Llama and Llama-3.1-8B-like shapes
//! (rope / KV write / attention: `gpu_parity_attn.rs`).
//! Needs `--features cuda` and a device; skips with a message without a driver or NVRTC.

#![cfg(feature = "cuda")]

mod common;
mod gemv_check;
mod gpu;

use common::Plan;
use gemv_check::{check_gemv, GemvCase, BASE};
use gpu::{assert_close, bf16_tol, tensor, Gpu, Mem, Reference, Rng};
use specc_ir::op::BinaryOp;
use specc_ir::Op;
use specc_kernels_gen::abi::{Bucket, Dtype, Loc, Rows, View};
use specc_kernels_gen::argmax::{argmax, ArgmaxInput, ArgmaxParams};
use specc_kernels_gen::elementwise::{binary, embedding, BinaryFn, BinaryParams, EmbeddingParams};
use specc_kernels_gen::norm::{rmsnorm, RmsNormParams};

const BF: Dtype = Dtype::BF16;

#[test]
fn gemv_matches_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let cases = [
        BASE,
        GemvCase { norm: true, ..BASE },
        GemvCase {
            norm: true,
            gate_up: true,
            n: 352,
            ..BASE
        },
        GemvCase {
            residual: true,
            n: 128,
            k: 352,
            ..BASE
        },
        GemvCase {
            row_tile: 3,
            n: 500,
            ..BASE
        },
        GemvCase {
            out: Some(Dtype::F32),
            norm: true,
            ..BASE
        },
        GemvCase {
            w_dtype: Dtype::F32,
            n: 64,
            ..BASE
        },
        GemvCase {
            argmax: true,
            out: None,
            norm: true,
            ..BASE
        },
        // Llama-3.1-8B-like: qkv with norm at M = 8; down_proj at M = 64 (K chunked in
        // shared memory); lm-head-like argmax over a ragged N.
        GemvCase {
            b: 1,
            t: 8,
            k: 4096,
            n: 6144,
            row_tile: 8,
            norm: true,
            ..BASE
        },
        GemvCase {
            b: 8,
            t: 8,
            k: 14336,
            n: 1024,
            row_tile: 64,
            residual: true,
            ..BASE
        },
        GemvCase {
            b: 1,
            t: 8,
            k: 4096,
            n: 20000,
            argmax: true,
            out: None,
            norm: true,
            ..BASE
        },
        GemvCase {
            b: 1,
            t: 1,
            k: 4096,
            n: 2048,
            row_tile: 1,
            gate_up: true,
            norm: true,
            ..BASE
        },
    ];
    for c in cases {
        check_gemv(&gpu, c);
    }
}

/// Split-K inside the block (`GemvTiling::k_warps > 1`, chosen by the tiling where the
/// columns are too few): the Kimi-K2 f32 router at decode and verify, ragged K (a last
/// chunk short of the others, chunks that are no multiple of a split round), a narrow bf16
/// residual projection, SwiGLU, and argmax partials with the fused norm.
#[test]
fn gemv_split_k_matches_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let router = GemvCase {
        b: 1,
        t: 1,
        k: 7168,
        n: 384,
        row_tile: 1,
        x_dtype: Dtype::F32,
        w_dtype: Dtype::F32,
        out: Some(Dtype::F32),
        ..BASE
    };
    let cases = [
        router,
        GemvCase {
            t: 8,
            row_tile: 8,
            ..router
        },
        // 11 rows in tiles of 8 (a second tile with 3 live rows).
        GemvCase {
            t: 11,
            row_tile: 8,
            ..router
        },
        // Chunks of 2048 (two rounds of 8 splits), a last chunk of 1136; 2 tiles of 3 rows.
        GemvCase {
            b: 2,
            t: 3,
            k: 7280,
            n: 256,
            row_tile: 3,
            ..router
        },
        // f32 chunks of 512 (half a round of 8 splits: the first split rotates) at 16 rows.
        GemvCase {
            t: 16,
            k: 5000,
            n: 192,
            row_tile: 16,
            ..router
        },
        GemvCase {
            b: 1,
            t: 8,
            k: 4096,
            n: 128,
            row_tile: 8,
            residual: true,
            ..BASE
        },
        GemvCase {
            b: 1,
            t: 1,
            k: 4104,
            n: 96,
            row_tile: 1,
            residual: true,
            ..BASE
        },
        GemvCase {
            b: 1,
            t: 4,
            k: 4096,
            n: 256,
            row_tile: 4,
            gate_up: true,
            norm: true,
            ..BASE
        },
        GemvCase {
            b: 1,
            t: 8,
            k: 2048,
            n: 500,
            row_tile: 8,
            argmax: true,
            out: None,
            norm: true,
            ..BASE
        },
    ];
    for c in cases {
        check_gemv(&gpu, c);
    }
}

fn check_rmsnorm(gpu: &Gpu, rows: u32, heads: u32, dim: u32) {
    let (m, n) = (rows as usize, (heads * dim) as usize);
    let mut rng = Rng::new(7 + n as u64);
    let mut plan = Plan::new();
    let x = plan.view(rows, heads * dim, BF);
    let y = plan.view(rows, heads * dim, BF);
    let k = rmsnorm(&RmsNormParams {
        rows: Rows::Tokens,
        heads,
        dim,
        x,
        out: y,
        weight: Loc::table(0),
        w_dtype: BF,
        eps: 1e-6,
    })
    .unwrap();
    let (xv, wv) = (rng.vec(m * n, 3.0), rng.vec(dim as usize, 2.0));
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[dim as u64 * 2]);
    mem.put(x.loc, BF, &xv);
    mem.put(Loc::table(0), BF, &wv);
    gpu.run(
        &mut mem,
        &[&k],
        Bucket {
            b: rows,
            t: 1,
            ctx: 1,
        },
    );
    let mut r = Reference::new();
    let xi = r.input("x", tensor(BF, &[m, heads as usize, dim as usize], &xv));
    let wi = r.input("w", tensor(BF, &[dim as usize], &wv));
    let o = r.op(
        Op::RmsNorm {
            eps: 1e-6f32 as f64,
        },
        &[xi, wi],
    );
    let want = r.run(&[("y", o)]);
    let (rtol, atol) = bf16_tol(&want["y"]);
    let got = mem.get(y.loc, BF, m * n);
    assert_close(
        &format!("rmsnorm {rows}x{heads}x{dim}"),
        &got,
        &want["y"],
        rtol,
        atol,
    );
}

#[test]
fn rmsnorm_matches_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    check_rmsnorm(&gpu, 8, 1, 128);
    check_rmsnorm(&gpu, 8, 1, 4096);
    check_rmsnorm(&gpu, 8, 4, 32);
    check_rmsnorm(&gpu, 3, 32, 128);
}

#[test]
fn elementwise_embedding_argmax_match_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let (m, h, v) = (6usize, 128usize, 512usize);
    let mut rng = Rng::new(3);
    let mut plan = Plan::new();
    let ids = plan.alloc(m as u64 * 4);
    let emb = plan.view(m as u32, h as u32, BF);
    let a = plan.view(m as u32, h as u32, BF);
    let bias = View::new(plan.alloc(h as u64 * 2), BF, 0);
    let sum = plan.view(m as u32, h as u32, BF);
    let act = plan.view(m as u32, h as u32, BF);
    let logits = plan.view(m as u32, v as u32, Dtype::F32);
    let tok = View::new(plan.alloc(m as u64 * 4), Dtype::I32, 1);
    let rows = Rows::Tokens;
    let ks = [
        embedding(&EmbeddingParams {
            rows,
            ids,
            ids_dtype: Dtype::I32,
            table: Loc::table(0),
            table_dtype: BF,
            vocab: v as u32,
            hidden: h as u32,
            out: emb,
        })
        .unwrap(),
        binary(&BinaryParams {
            op: BinaryFn::Add,
            rows,
            cols: h as u32,
            a,
            b: bias,
            out: sum,
        })
        .unwrap(),
        binary(&BinaryParams {
            op: BinaryFn::SiluMul,
            rows,
            cols: h as u32,
            a,
            b: emb,
            out: act,
        })
        .unwrap(),
        argmax(&ArgmaxParams {
            rows,
            input: ArgmaxInput::Values {
                x: logits,
                n: v as u32,
            },
            out: tok,
        })
        .unwrap(),
    ];
    let idv = [3.0, -5.0, 1e6, 511.0, 0.0, 17.0];
    let (tv, av, bv) = (rng.vec(v * h, 1.0), rng.vec(m * h, 4.0), rng.vec(h, 1.0));
    // Logits with exact ties: the lowest index must win.
    let mut lv: Vec<f64> = rng.vec(m * v, 8.0).iter().map(|x| x.round()).collect();
    lv[2 * v + 100] = 50.0;
    lv[2 * v + 7] = 50.0;
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[(v * h * 2) as u64]);
    mem.put(ids, Dtype::I32, &idv);
    mem.put(Loc::table(0), BF, &tv);
    mem.put(a.loc, BF, &av);
    mem.put(bias.loc, BF, &bv);
    mem.put(logits.loc, Dtype::F32, &lv);
    gpu.run(
        &mut mem,
        &ks.iter().collect::<Vec<_>>(),
        Bucket {
            b: m as u32,
            t: 1,
            ctx: 1,
        },
    );

    let mut r = Reference::new();
    let table = r.input("table", tensor(BF, &[v, h], &tv));
    let idt = r.input("ids", tensor(Dtype::I32, &[m], &idv));
    let e = r.op(Op::Embedding, &[table, idt]);
    let ai = r.input("a", tensor(BF, &[m, h], &av));
    let bi = r.input("b", tensor(BF, &[h], &bv));
    let s = r.op(Op::Binary(BinaryOp::Add), &[ai, bi]);
    let sm = r.op(Op::SiluMul, &[ai, e]);
    let li = r.input("l", tensor(Dtype::F32, &[m, v], &lv));
    let am = r.op(Op::Argmax, &[li]);
    let want = r.run(&[("e", e), ("s", s), ("sm", sm), ("am", am)]);
    assert_close(
        "embedding",
        &mem.get(emb.loc, BF, m * h),
        &want["e"],
        0.0,
        0.0,
    );
    assert_close(
        "add (broadcast)",
        &mem.get(sum.loc, BF, m * h),
        &want["s"],
        0.0,
        0.0,
    );
    let (rtol, atol) = bf16_tol(&want["sm"]);
    assert_close(
        "silu_mul",
        &mem.get(act.loc, BF, m * h),
        &want["sm"],
        rtol,
        atol,
    );
    assert_close(
        "argmax",
        &mem.get(tok.loc, Dtype::I32, m),
        &want["am"],
        0.0,
        0.0,
    );
    assert_eq!(want["am"][2], 7.0, "the fixture has a tie at row 2");
}
