//! The q|k|v GEMV with its RoPE + KV-write epilogue (`gemv_rope`, `gemv_mma_rope`) on the
//! GPU, against
//! - the two-kernel path it replaces (the same GEMV into scratch, then `rope_kv`), run in
//!   the same launch sequence: q, the k cache and the v cache must match bit for bit (the
//!   column permutation moves weight rows, not the summation order);
//! - the IR interpreter (rmsnorm → matmul, then rope → kv_write), within bf16 tolerance.
//!
//! Cases: one row on CUDA cores and on tensor cores, 2..=64 rows on tensor cores (ragged
//! tiles), head_dim 64 and 128 with G = 4 q heads per kv head, partial rotary dims, both
//! rotation styles, separate cache slots with a negative one, a position past the cache.
//! Needs `--features cuda` and a device; skips with a message without a driver or NVRTC.

#![cfg(feature = "cuda")]

mod common;
mod gpu;

use common::Plan;
use gpu::{assert_close, bf16_tol, tensor, Gpu, Mem, Reference, Rng};
use specc_codegen::choose::matmul::tiling;
use specc_ir::op::{RopeScaling, RopeStyle as IrStyle};
use specc_ir::Op;
use specc_kernels_gen::abi::{Bucket, Dtype, KernelSource, Loc, Rows};
use specc_kernels_gen::gemv::{gemv, GemvParams, GemvWeights, RmsNormPrologue};
use specc_kernels_gen::gemv_mma::gemv_mma_tiled;
use specc_kernels_gen::qkv_rope::QkvRope;
use specc_kernels_gen::rope::{rope_kv, RopeKvParams, RopeStyle, RopeTable};

const BF: Dtype = Dtype::BF16;
const THETA: f64 = 500000.0;
/// Above every slot the cases use (positions ≤ 86, slots ≤ 150) but the clamped one.
const CTX: usize = 256;
// Buffer table: weight, norm weight, fused k/v caches, two-kernel k/v caches.
const T_W: u32 = 0;
const T_NORM: u32 = 1;
const T_KC: u32 = 2;
const T_VC: u32 = 3;
const T_KC2: u32 = 4;
const T_VC2: u32 = 5;

#[derive(Clone, Copy, Debug)]
struct Case {
    b: usize,
    t: usize,
    row_tile: u32,
    kv_heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    style: RopeStyle,
    mma: bool,
    slots: bool,
    /// In-features (the hidden size).
    k: usize,
}

const BASE: Case = Case {
    b: 1,
    t: 1,
    row_tile: 1,
    kv_heads: 2,
    head_dim: 128,
    rotary_dim: 128,
    style: RopeStyle::Half,
    mma: false,
    slots: false,
    k: 256,
};

fn gemv_kernel(gpu: &Gpu, p: &GemvParams, mma: bool) -> KernelSource {
    if mma {
        gemv_mma_tiled(p, &tiling(p, gpu.target())).unwrap()
    } else {
        gemv(p).unwrap()
    }
}

fn ir_style(s: RopeStyle) -> IrStyle {
    match s {
        RopeStyle::Half => IrStyle::Half,
        RopeStyle::Interleaved => IrStyle::Interleaved,
    }
}

fn check(gpu: &Gpu, c: Case) {
    let label = format!("{c:?}");
    let (m, d, hkv) = (c.b * c.t, c.head_dim, c.kv_heads);
    let hq = 4 * hkv;
    let (k, n) = (c.k, (hq + 2 * hkv) * d);
    let qn = hq * d;
    let mut plan = Plan::new();
    let x = plan.view(m as u32, k as u32, BF);
    let q_out = plan.view(m as u32, qn as u32, BF);
    let q_out2 = plan.view(m as u32, qn as u32, BF);
    let qkv = plan.view(m as u32, n as u32, BF);
    let pos = plan.alloc(m as u64 * 4);
    let slots = plan.alloc(m as u64 * 4);
    let table = RopeTable {
        style: c.style,
        rotary_dim: c.rotary_dim as u32,
        inv_freq: specc_ir::interp::rope_inv_freq(THETA, &RopeScaling::None, c.rotary_dim),
        cos_sin_scale: 1.0,
    };
    let slot_arg = c.slots.then_some((slots, Dtype::I32));
    let base = GemvParams {
        rows: Rows::Tokens,
        row_tile: c.row_tile,
        k: k as u32,
        n: n as u32,
        x,
        weights: GemvWeights::Single(Loc::table(T_W)),
        w_dtype: BF,
        norm: Some(RmsNormPrologue {
            weight: Loc::table(T_NORM),
            dtype: BF,
            eps: 1e-5,
        }),
        residual: None,
        out: None,
        argmax_partials: None,
        rope: None,
    };
    let fused_out = QkvRope {
        q_heads: hq as u32,
        kv_heads: hkv as u32,
        head_dim: d as u32,
        q_out,
        k_cache: Loc::table(T_KC),
        v_cache: Loc::table(T_VC),
        cache_dtype: BF,
        pos,
        pos_dtype: Dtype::I32,
        slots: slot_arg,
        rope: table,
    };
    let fused = GemvParams {
        rope: Some(fused_out.clone()),
        ..base.clone()
    };
    let unfused = GemvParams {
        out: Some(qkv),
        ..base
    };
    // The two-kernel path writes its own q and caches.
    let rope = RopeKvParams {
        out: QkvRope {
            q_out: q_out2,
            k_cache: Loc::table(T_KC2),
            v_cache: Loc::table(T_VC2),
            ..fused_out
        },
        head_dim_v: d as u32,
        q: qkv,
        k: qkv.cols_from(qn as u64),
        v: qkv.cols_from((qn + hkv * d) as u64),
        qk_norm: None,
    };
    let kernels = [
        gemv_kernel(gpu, &fused, c.mma),
        gemv_kernel(gpu, &unfused, c.mma),
        rope_kv(&rope).unwrap(),
    ];
    let want_family = if c.mma {
        "gemv_mma_rope_"
    } else {
        "gemv_rope_"
    };
    assert!(kernels[0].name.starts_with(want_family), "{label}");

    // Positions 2 + 3·seq + t; the last row of sequence 0 lies past the cache (clamped to
    // its last slot). Slots (a draft tree's nodes) are position + T, the last row's -1.
    let mut pv: Vec<f64> = (0..m)
        .map(|r| (2 + 3 * (r / c.t) + r % c.t) as f64)
        .collect();
    pv[c.t - 1] = 1000.0;
    let mut sv: Vec<f64> = pv.iter().map(|p| p + c.t as f64).collect();
    sv[m - 1] = -1.0;
    let mut rng = Rng::new((m * 131 + d * 7 + c.rotary_dim) as u64);
    let xv = rng.vec(m * k, 2.0);
    let wv = rng.vec(n * k, 2.0 / (k as f64).sqrt());
    let nv: Vec<f64> = rng.vec(k, 0.5).iter().map(|v| 1.0 + v).collect();
    let cache_n = c.b * CTX * hkv * d;
    let (kc, vc) = (rng.vec(cache_n, 1.0), rng.vec(cache_n, 1.0));
    let cb = cache_n as u64 * 2;
    let mut mem = Mem::new(
        plan.alloc(0).byte_offset(),
        &[(n * k) as u64 * 2, k as u64 * 2, cb, cb, cb, cb],
    );
    mem.put(x.loc, BF, &xv);
    mem.put(Loc::table(T_W), BF, &wv);
    mem.put(Loc::table(T_NORM), BF, &nv);
    mem.put(pos, Dtype::I32, &pv);
    mem.put(slots, Dtype::I32, &sv);
    for t in [T_KC, T_KC2] {
        mem.put(Loc::table(t), BF, &kc);
    }
    for t in [T_VC, T_VC2] {
        mem.put(Loc::table(t), BF, &vc);
    }
    // An element the fused kernel does not write reads NaN.
    let Loc::Arena { offset } = q_out.loc else {
        unreachable!()
    };
    mem.arena[offset as usize..][..m * qn * 2].fill(0xff);
    gpu.run(
        &mut mem,
        &kernels.iter().collect::<Vec<_>>(),
        Bucket {
            b: c.b as u32,
            t: c.t as u32,
            ctx: CTX as u32,
        },
    );

    let got_q = mem.get(q_out.loc, BF, m * qn);
    let got_k = mem.get(Loc::table(T_KC), BF, cache_n);
    let got_v = mem.get(Loc::table(T_VC), BF, cache_n);
    assert_close(
        &format!("{label}: q vs two kernels"),
        &got_q,
        &mem.get(q_out2.loc, BF, m * qn),
        0.0,
        0.0,
    );
    assert_close(
        &format!("{label}: k cache vs two kernels"),
        &got_k,
        &mem.get(Loc::table(T_KC2), BF, cache_n),
        0.0,
        0.0,
    );
    assert_close(
        &format!("{label}: v cache vs two kernels"),
        &got_v,
        &mem.get(Loc::table(T_VC2), BF, cache_n),
        0.0,
        0.0,
    );

    // The interpreter: the projection first, then RoPE and the KV writes of its columns.
    let mut r = Reference::new();
    let xi = r.input("x", tensor(BF, &[m, k], &xv));
    let nw = r.input("norm", tensor(BF, &[k], &nv));
    let xn = r.op(
        Op::RmsNorm {
            eps: 1e-5f32 as f64,
        },
        &[xi, nw],
    );
    let w = r.input("w", tensor(BF, &[n, k], &wv));
    let y = r.op(Op::MatMul, &[xn, w]);
    let yv = r.run(&[("y", y)]).remove("y").unwrap();
    let heads = |h0: usize, nh: usize| -> Vec<f64> {
        (0..m)
            .flat_map(|row| yv[row * n + h0 * d..row * n + (h0 + nh) * d].to_vec())
            .collect()
    };
    let (b, t) = (c.b, c.t);
    let mut r = Reference::new();
    let qi = r.input("q", tensor(BF, &[b, t, hq, d], &heads(0, hq)));
    let ki = r.input("k", tensor(BF, &[b, t, hkv, d], &heads(hq, hkv)));
    let vi = r.input("v", tensor(BF, &[b, t, hkv, d], &heads(hq + hkv, hkv)));
    let pi = r.input("pos", tensor(Dtype::I32, &[b, t], &pv));
    let si = if c.slots {
        r.input("slots", tensor(Dtype::I32, &[b, t], &sv))
    } else {
        pi
    };
    let rope_op = Op::Rope {
        theta: THETA,
        scaling: RopeScaling::None,
        style: ir_style(c.style),
        rotary_dim: c.rotary_dim as u64,
    };
    let qr = r.op(rope_op.clone(), &[qi, pi]);
    let kr = r.op(rope_op, &[ki, pi]);
    let kcs = r.state("kc", tensor(BF, &[b, CTX, hkv, d], &kc));
    let vcs = r.state("vc", tensor(BF, &[b, CTX, hkv, d], &vc));
    let k2 = r.op(Op::KvWrite, &[kcs, kr, si]);
    let v2 = r.op(Op::KvWrite, &[vcs, vi, si]);
    let want = r.run(&[("q", qr), ("k2", k2), ("v2", v2)]);
    // The projection's columns may differ from the interpreter's by a bf16 ulp (another
    // summation order). The rotation mixes the two features of a pair, so an ulp of the
    // larger one can land on the smaller one: the absolute bound is an ulp of the
    // projection's peak magnitude.
    let (rtol, atol) = bf16_tol(&want["q"]);
    let peak = yv.iter().fold(0.0f64, |a, &v| a.max(v.abs()));
    let atol = atol.max(peak / 128.0);
    assert_close(&format!("{label}: q"), &got_q, &want["q"], rtol, atol);
    assert_close(
        &format!("{label}: k cache"),
        &got_k,
        &want["k2"],
        rtol,
        atol,
    );
    assert_close(
        &format!("{label}: v cache"),
        &got_v,
        &want["v2"],
        rtol,
        atol,
    );
}

#[test]
fn qkv_rope_one_row_cuda_and_tensor_cores() {
    let Some(gpu) = Gpu::new() else { return };
    for mma in [false, true] {
        for (head_dim, rotary_dim) in [(64, 64), (128, 128), (128, 64), (64, 32)] {
            check(
                &gpu,
                Case {
                    head_dim,
                    rotary_dim,
                    mma,
                    ..BASE
                },
            );
        }
        check(
            &gpu,
            Case {
                style: RopeStyle::Interleaved,
                mma,
                ..BASE
            },
        );
        check(
            &gpu,
            Case {
                slots: true,
                mma,
                ..BASE
            },
        );
    }
}

#[test]
fn qkv_rope_tensor_cores_2_to_64_rows() {
    let Some(gpu) = Gpu::new() else { return };
    let rows = |b: usize, t: usize, row_tile: u32| Case {
        b,
        t,
        row_tile,
        mma: true,
        ..BASE
    };
    let cases = [
        rows(1, 2, 2),
        Case {
            head_dim: 64,
            rotary_dim: 64,
            slots: true,
            ..rows(2, 4, 8)
        },
        // 8-row tiles compute cos / sin before the main loop: partial rotation, and 9
        // rows whose second tile has one live row.
        Case {
            style: RopeStyle::Interleaved,
            rotary_dim: 64,
            ..rows(1, 8, 8)
        },
        Case {
            slots: true,
            ..rows(3, 3, 8)
        },
        Case {
            style: RopeStyle::Interleaved,
            slots: true,
            ..rows(1, 16, 16)
        },
        Case {
            rotary_dim: 64,
            ..rows(4, 8, 32)
        },
        // 33 rows in tiles of 16: the last tile has one row.
        Case {
            head_dim: 64,
            rotary_dim: 32,
            kv_heads: 1,
            ..rows(3, 11, 16)
        },
        Case {
            slots: true,
            kv_heads: 8,
            ..rows(8, 8, 64)
        },
        Case {
            style: RopeStyle::Interleaved,
            head_dim: 64,
            rotary_dim: 64,
            ..rows(1, 64, 64)
        },
    ];
    for c in cases {
        check(&gpu, c);
    }
}

/// Several rows on CUDA cores (the plan's choice for non-16-bit operands; here bf16 to
/// share the fixture): the pairing does not depend on the row tile.
#[test]
fn qkv_rope_cuda_cores_several_rows() {
    let Some(gpu) = Gpu::new() else { return };
    for (b, t, row_tile, slots) in [(2, 4, 8, true), (1, 24, 16, false)] {
        check(
            &gpu,
            Case {
                b,
                t,
                row_tile,
                slots,
                head_dim: 64,
                rotary_dim: 32,
                ..BASE
            },
        );
    }
}

/// Split-K inside the block on CUDA cores (K = 4096 over 1536 q|k|v features, 2 splits):
/// the fused and the two-kernel paths split K alike (bit for bit), at 1, 8, 24 rows in
/// tiles of 12, and 40 rows (chunks of one group of 256: each chunk's first group rotates
/// between the splits).
#[test]
fn qkv_rope_cuda_cores_split_k() {
    let Some(gpu) = Gpu::new() else { return };
    for (b, t, row_tile, slots) in [
        (1, 1, 1, false),
        (1, 8, 8, true),
        (2, 12, 12, false),
        (1, 40, 40, false),
    ] {
        check(
            &gpu,
            Case {
                b,
                t,
                row_tile,
                slots,
                k: 4096,
                ..BASE
            },
        );
    }
}
