//! Every kernel family run on the GPU and compared with the IR interpreter (the oracle),
//! at tiny-Llama shapes and at Llama-3.1-8B-like shapes for the GEMV and attention.
//! Needs `--features cuda` and a device; skips with a message without a driver or NVRTC.

#![cfg(feature = "cuda")]

mod common;
mod gpu;

use common::Plan;
use gpu::{assert_close, bf16_tol, tensor, Gpu, Mem, Reference, Rng};
use specc_ir::op::{AttnMask as IrMask, BinaryOp, RopeScaling, RopeStyle as IrStyle};
use specc_ir::{DType, Op};
use specc_kernels_gen::abi::{Bucket, Dtype, Loc, Rows, View};
use specc_kernels_gen::argmax::{argmax, ArgmaxInput, ArgmaxParams};
use specc_kernels_gen::attention::{attention, AttentionParams, AttnMask};
use specc_kernels_gen::elementwise::{binary, embedding, BinaryFn, BinaryParams, EmbeddingParams};
use specc_kernels_gen::gemv::{gemv, GemvParams, GemvWeights, RmsNormPrologue};
use specc_kernels_gen::norm::{rmsnorm, RmsNormParams};
use specc_kernels_gen::rope::{rope_kv, QkNorm, RopeKvParams, RopeStyle, RopeTable};

const BF: Dtype = Dtype::BF16;

#[derive(Clone, Copy, Debug)]
struct GemvCase {
    b: u32,
    t: u32,
    k: u32,
    n: u32,
    row_tile: u32,
    w_dtype: Dtype,
    norm: bool,
    gate_up: bool,
    residual: bool,
    out: Option<Dtype>,
    argmax: bool,
}

const BASE: GemvCase = GemvCase {
    b: 2,
    t: 4,
    k: 128,
    n: 512,
    row_tile: 8,
    w_dtype: BF,
    norm: false,
    gate_up: false,
    residual: false,
    out: Some(BF),
    argmax: false,
};

fn check_gemv(gpu: &Gpu, c: GemvCase) {
    let label = format!("{c:?}");
    let (m, k, n) = ((c.b * c.t) as usize, c.k as usize, c.n as usize);
    let g = if c.gate_up { 2 } else { 1 };
    let mut rng = Rng::new((m * 31 + k * 7 + n) as u64);
    let mut plan = Plan::new();
    let x = plan.view(m as u32, c.k, BF);
    let res = plan.view(m as u32, c.n, BF);
    // A residual add stores in place, as the fused o_proj / down_proj do.
    let out = match (c.residual, c.out) {
        (true, Some(BF)) => Some(res),
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
    };
    let mut kernels = vec![gemv(&p).unwrap()];
    if c.argmax {
        kernels.push(
            argmax(&ArgmaxParams {
                rows: Rows::Tokens,
                input: ArgmaxInput::Partials {
                    loc: parts,
                    count: p.partials_per_row(),
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
    mem.put(x.loc, BF, &xv);
    mem.put(Loc::table(0), c.w_dtype, &wv);
    mem.put(Loc::table(1), BF, &nv);
    mem.put(res.loc, BF, &rv);
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
    let mut xi = r.input("x", tensor(BF, &[m, k], &xv));
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
        let rr = r.input("res", tensor(BF, &[m, n], &rv));
        y = r.op(Op::Binary(BinaryOp::Add), &[y, rr]);
    }
    if c.out == Some(Dtype::F32) {
        y = r.op(Op::Cast { to: DType::F32 }, &[y]);
    }
    let am = r.op(Op::Argmax, &[y]);
    let want = r.run(&[("y", y), ("am", am), ("mm", mm)]);
    let (rtol, mut atol) = bf16_tol(&want["y"]);
    if c.residual {
        // The matmul result is rounded before the add: one bf16 ulp of its magnitude may
        // flip with the summation order and survive the add.
        let peak = want["mm"].iter().fold(0.0f64, |a, &v| a.max(v.abs()));
        atol = atol.max(peak / 128.0);
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
                "argmax row {row}: got {gi} ({}), want {wi} ({})",
                logits[gi],
                logits[wi]
            );
        }
        println!("argmax {label}: {m} rows agree");
    }
}

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

fn check_rope(gpu: &Gpu, style: RopeStyle, qk_norm: bool) {
    let (b, t, ctx, hq, hkv, d) = (2usize, 4usize, 16usize, 4usize, 2usize, 32usize);
    let m = b * t;
    let width = (hq + 2 * hkv) * d;
    let theta = 10000.0;
    let mut rng = Rng::new(11);
    let mut plan = Plan::new();
    let qkv = plan.view(m as u32, width as u32, BF);
    let pos = plan.alloc(m as u64 * 4);
    let q = qkv;
    let kview = q.cols_from((hq * d) as u64);
    let vview = kview.cols_from((hkv * d) as u64);
    let inv_freq = specc_ir::interp::rope_inv_freq(theta, &RopeScaling::None, d);
    let kern = rope_kv(&RopeKvParams {
        q_heads: hq as u32,
        kv_heads: hkv as u32,
        head_dim: d as u32,
        head_dim_v: d as u32,
        q,
        k: kview,
        v: vview,
        q_out: q,
        k_cache: Loc::table(0),
        v_cache: Loc::table(1),
        cache_dtype: BF,
        pos,
        pos_dtype: Dtype::I32,
        rope: RopeTable {
            style,
            rotary_dim: d as u32,
            inv_freq,
            cos_sin_scale: 1.0,
        },
        qk_norm: qk_norm.then_some(QkNorm {
            q_weight: Loc::table(2),
            k_weight: Loc::table(3),
            dtype: BF,
            eps: 1e-6,
        }),
    })
    .unwrap();
    let xv = rng.vec(m * width, 2.0);
    // Sequence 1 has a padding lane (-1) and a position past the cache (clamped).
    let pv = [5.0, 6.0, 7.0, 8.0, 13.0, 14.0, 40.0, -1.0];
    let cache_n = b * ctx * hkv * d;
    let (kc, vc) = (rng.vec(cache_n, 1.0), rng.vec(cache_n, 1.0));
    let (qn, kn) = (rng.vec(d, 2.0), rng.vec(d, 2.0));
    let cb = cache_n as u64 * 2;
    let mut mem = Mem::new(
        plan.alloc(0).byte_offset(),
        &[cb, cb, d as u64 * 2, d as u64 * 2],
    );
    mem.put(qkv.loc, BF, &xv);
    mem.put(pos, Dtype::I32, &pv);
    mem.put(Loc::table(0), BF, &kc);
    mem.put(Loc::table(1), BF, &vc);
    mem.put(Loc::table(2), BF, &qn);
    mem.put(Loc::table(3), BF, &kn);
    gpu.run(
        &mut mem,
        &[&kern],
        Bucket {
            b: b as u32,
            t: t as u32,
            ctx: ctx as u32,
        },
    );

    let split = |h0: usize, nh: usize| -> Vec<f64> {
        (0..m)
            .flat_map(|row| xv[row * width + h0 * d..row * width + (h0 + nh) * d].to_vec())
            .collect()
    };
    let mut r = Reference::new();
    let mut qi = r.input("q", tensor(BF, &[b, t, hq, d], &split(0, hq)));
    let mut ki = r.input("k", tensor(BF, &[b, t, hkv, d], &split(hq, hkv)));
    let vi = r.input("v", tensor(BF, &[b, t, hkv, d], &split(hq + hkv, hkv)));
    let pi = r.input("pos", tensor(Dtype::I32, &[b, t], &pv));
    if qk_norm {
        let qw = r.input("qn", tensor(BF, &[d], &qn));
        let kw = r.input("kn", tensor(BF, &[d], &kn));
        qi = r.op(
            Op::RmsNorm {
                eps: 1e-6f32 as f64,
            },
            &[qi, qw],
        );
        ki = r.op(
            Op::RmsNorm {
                eps: 1e-6f32 as f64,
            },
            &[ki, kw],
        );
    }
    let ir_style = match style {
        RopeStyle::Half => IrStyle::Half,
        RopeStyle::Interleaved => IrStyle::Interleaved,
    };
    let rope = Op::Rope {
        theta,
        scaling: RopeScaling::None,
        style: ir_style,
        rotary_dim: d as u64,
    };
    let qr = r.op(rope.clone(), &[qi, pi]);
    let kr = r.op(rope, &[ki, pi]);
    let kcs = r.state("kc", tensor(BF, &[b, ctx, hkv, d], &kc));
    let vcs = r.state("vc", tensor(BF, &[b, ctx, hkv, d], &vc));
    let k2 = r.op(Op::KvWrite, &[kcs, kr, pi]);
    let v2 = r.op(Op::KvWrite, &[vcs, vi, pi]);
    let want = r.run(&[("q", qr), ("k2", k2), ("v2", v2)]);
    let got_q: Vec<f64> = {
        let all = mem.get(qkv.loc, BF, m * width);
        (0..m)
            .flat_map(|row| all[row * width..row * width + hq * d].to_vec())
            .collect()
    };
    let label = format!("rope_kv {style:?} qk_norm={qk_norm}");
    // cos/sin and every product are rounded like the interpreter: only libm-vs-CUDA ulps
    // before rounding can differ.
    let (rtol, atol) = bf16_tol(&want["q"]);
    assert_close(&format!("{label}: q"), &got_q, &want["q"], rtol, atol);
    assert_close(
        &format!("{label}: k cache"),
        &mem.get(Loc::table(0), BF, cache_n),
        &want["k2"],
        rtol,
        atol,
    );
    assert_close(
        &format!("{label}: v cache"),
        &mem.get(Loc::table(1), BF, cache_n),
        &want["v2"],
        0.0,
        0.0,
    );
}

#[test]
fn rope_kv_matches_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    check_rope(&gpu, RopeStyle::Half, false);
    check_rope(&gpu, RopeStyle::Half, true);
    check_rope(&gpu, RopeStyle::Interleaved, false);
}

#[derive(Clone, Copy, Debug)]
struct AttnCase {
    b: usize,
    t: usize,
    ctx: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    splits: u32,
    tree: bool,
}

fn check_attention(gpu: &Gpu, c: AttnCase) {
    let AttnCase {
        b,
        t,
        ctx,
        hq,
        hkv,
        d,
        splits,
        tree,
    } = c;
    let m = b * t;
    let mut rng = Rng::new((b * 1000 + t * 10 + d) as u64);
    let mut plan = Plan::new();
    let q = plan.view(m as u32, (hq * d) as u32, BF);
    let out = plan.view(m as u32, (hq * d) as u32, BF);
    let pos = plan.alloc(m as u64 * 4);
    let prefix = plan.alloc(b as u64 * 4);
    let anc = plan.alloc(m as u64 * 8);
    let scale = 1.0 / (d as f32).sqrt();
    let params = AttentionParams {
        q_heads: hq as u32,
        kv_heads: hkv as u32,
        head_dim: d as u32,
        head_dim_v: d as u32,
        q,
        k_cache: Loc::table(0),
        v_cache: Loc::table(1),
        cache_dtype: BF,
        pos,
        pos_dtype: Dtype::I32,
        mask: if tree {
            AttnMask::Tree {
                prefix_len: prefix,
                ancestors: anc,
            }
        } else {
            AttnMask::Causal
        },
        out,
        scale,
        max_t: t as u32,
        splits,
        scratch: Loc::arena(0),
    };
    let scratch = plan.alloc(params.scratch_bytes(m as u32));
    let ks = attention(&AttentionParams { scratch, ..params }).unwrap();
    // Sequence b's prefix is 300 + 137·b slots (clamped to the cache), its last lane padding.
    let prefixes: Vec<usize> = (0..b).map(|s| (300 + 137 * s).min(ctx - t)).collect();
    let mut pv = Vec::new();
    let mut av = Vec::new();
    for (s, &p0) in prefixes.iter().enumerate() {
        for i in 0..t {
            let padding = !tree && s == b - 1 && i == t - 1 && b > 1;
            pv.push(if padding { -1.0 } else { (p0 + i) as f64 });
            // Tree: node i's ancestors are the even nodes below it and itself.
            let bits: u64 = (0..=i)
                .filter(|&u| u == i || u % 2 == 0)
                .map(|u| 1u64 << u)
                .sum();
            av.push(bits as i64 as f64);
        }
    }
    let plv: Vec<f64> = prefixes.iter().map(|&p| p as f64).collect();
    let qv = rng.vec(m * hq * d, 2.0);
    let cache_n = b * ctx * hkv * d;
    let (kc, vc) = (rng.vec(cache_n, 2.0), rng.vec(cache_n, 1.0));
    let cb = cache_n as u64 * 2;
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[cb, cb]);
    mem.put(q.loc, BF, &qv);
    mem.put(pos, Dtype::I32, &pv);
    mem.put(prefix, Dtype::I32, &plv);
    mem.put(anc, Dtype::I64, &av);
    mem.put(Loc::table(0), BF, &kc);
    mem.put(Loc::table(1), BF, &vc);
    gpu.run(
        &mut mem,
        &[&ks.split, &ks.combine],
        Bucket {
            b: b as u32,
            t: t as u32,
            ctx: ctx as u32,
        },
    );

    let mut r = Reference::new();
    let qi = r.input("q", tensor(BF, &[b, t, hq, d], &qv));
    let ki = r.input("k", tensor(BF, &[b, ctx, hkv, d], &kc));
    let vi = r.input("v", tensor(BF, &[b, ctx, hkv, d], &vc));
    let pi = r.input("pos", tensor(Dtype::I32, &[b, t], &pv));
    let o = if tree {
        let pl = r.input("pl", tensor(Dtype::I32, &[b], &plv));
        let an = r.input("anc", tensor(Dtype::I64, &[b, t], &av));
        r.op(
            Op::Attention {
                scale: scale as f64,
                mask: IrMask::Tree,
            },
            &[qi, ki, vi, pi, pl, an],
        )
    } else {
        r.op(
            Op::Attention {
                scale: scale as f64,
                mask: IrMask::Causal,
            },
            &[qi, ki, vi, pi],
        )
    };
    let want = r.run(&[("o", o)]);
    let (rtol, atol) = bf16_tol(&want["o"]);
    assert_close(
        &format!("attention {c:?}"),
        &mem.get(out.loc, BF, m * hq * d),
        &want["o"],
        rtol,
        atol,
    );
}

#[test]
fn attention_matches_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let tiny = AttnCase {
        b: 2,
        t: 4,
        ctx: 512,
        hq: 4,
        hkv: 2,
        d: 32,
        splits: 4,
        tree: false,
    };
    check_attention(&gpu, tiny);
    check_attention(&gpu, AttnCase { splits: 1, ..tiny });
    check_attention(&gpu, AttnCase { tree: true, ..tiny });
    if std::env::var_os("SPECC_GPU_QUICK").is_some() {
        return;
    }
    let llama = AttnCase {
        b: 1,
        t: 8,
        ctx: 1024,
        hq: 32,
        hkv: 8,
        d: 128,
        splits: 16,
        tree: false,
    };
    check_attention(&gpu, llama);
    check_attention(&gpu, AttnCase { t: 1, ..llama });
    check_attention(
        &gpu,
        AttnCase {
            b: 3,
            t: 16,
            tree: true,
            ..llama
        },
    );
    check_attention(
        &gpu,
        AttnCase {
            b: 2,
            t: 3,
            ..llama
        },
    );
}
