//! The fused MLA preparation kernels (`generic::mla_prep`) on the GPU: each bitwise equal
//! to the unfused kernels it replaces (generic `slice`, `crate::norm`'s `rmsnorm`, generic
//! `rope` and `kv_write`), and within bf16 rounding of the IR interpreter running the
//! unfused ops, at Kimi-K2 dims (latent 512, rope 64, 64 heads of 128 + 64, YaRN) and the
//! DeepSeek-V3 fixtures' dims (latent 32, rope 8, 4 heads of 16 + 8, no scaling); slots
//! with a repeat inside a sequence (the later token wins), a negative slot (no write) and
//! one past the cache (clamped).
//!
//! Also `head_matmul`: a row of a many-row launch bitwise equal to that row alone.
//!
//! `cargo test -p specc-kernels-gen --features cuda --test gpu_mla_prep -- --nocapture`

#![cfg(feature = "cuda")]

mod gpu;

use gpu::{assert_close, bf16_tol, tensor, Gpu, Mem, Reference, Rng};
use specc_ir::op::{RopeScaling, RopeStyle};
use specc_ir::{DType, Dim, Op, Shape};
use specc_kernels_gen::abi::{Bucket, Dtype, KernelSource, Loc, Rows, View};
use specc_kernels_gen::generic::mla_prep::{mla_kv_write, mla_q_split, MlaKvWrite, MlaQSplit};
use specc_kernels_gen::generic::{single, TensorArg};
use specc_kernels_gen::norm::{rmsnorm, RmsNormParams};

const BF: Dtype = Dtype::BF16;
const EPS: f32 = 1e-6;

#[derive(Clone, Copy)]
struct Dims {
    latent: u64,
    rope: u64,
    heads: u64,
    nope: u64,
    yarn: bool,
}

const KIMI: Dims = Dims {
    latent: 512,
    rope: 64,
    heads: 64,
    nope: 128,
    yarn: true,
};
const FIXTURE: Dims = Dims {
    latent: 32,
    rope: 8,
    heads: 4,
    nope: 16,
    yarn: false,
};

fn rope_op(d: Dims) -> Op {
    Op::Rope {
        theta: 50_000.0,
        scaling: if d.yarn {
            RopeScaling::Yarn {
                factor: 32.0,
                original_max_position: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: 1.2,
            }
        } else {
            RopeScaling::None
        },
        style: RopeStyle::Interleaved,
        rotary_dim: d.rope,
    }
}

fn arg(slot: u32, dtype: DType, dims: &[u64]) -> TensorArg {
    TensorArg::new(Loc::table(slot), dtype, dims)
}

fn round_bf16(v: Vec<f64>) -> Vec<f64> {
    v.into_iter()
        .map(|x| half::bf16::from_f64(x).to_f64())
        .collect()
}

/// Positions near the cache's end and slots: lane 0's token 1 repeats token 2's slot, lane
/// 1's token 0 has no slot, the last token of the last lane is past the cache.
fn positions(b: u64, t: u64, ctx: u64) -> (Vec<f64>, Vec<f64>) {
    let mut pos = Vec::new();
    let mut slots = Vec::new();
    for bi in 0..b {
        for ti in 0..t {
            let p = (ctx - t - 2 * bi + ti) as f64;
            pos.push(p);
            let s = match (bi, ti) {
                (0, 1) if t > 2 => p + 1.0,
                (1, 0) => -1.0,
                _ if bi == b - 1 && ti == t - 1 => (ctx + 3) as f64,
                _ => p,
            };
            slots.push(s);
        }
    }
    (pos, slots)
}

/// Buffer-table slots.
const KVA: u32 = 0;
const NORM_W: u32 = 1;
const POS: u32 = 2;
const SLOTS: u32 = 3;
const C_FUSED: u32 = 4;
const PE_FUSED: u32 = 5;
const C_SLICE: u32 = 6;
const C_NORMED: u32 = 7;
const PE_SLICE: u32 = 8;
const PE_ROPED: u32 = 9;
const C_UNFUSED: u32 = 10;
const PE_UNFUSED: u32 = 11;

fn check_kv(gpu: &Gpu, name: &str, d: Dims, b: u64, t: u64, ctx: u64) {
    let (l, r) = (d.latent, d.rope);
    let w = l + r;
    let label = format!("mla_kv_write {name} B={b} T={t} ctx={ctx}");
    let mut rng = Rng::new(b * 100 + t * 10 + l);
    let kva = round_bf16(rng.vec((b * t * w) as usize, 2.0));
    let norm_w = round_bf16(rng.vec(l as usize, 1.0));
    let c0 = round_bf16(rng.vec((b * ctx * l) as usize, 1.0));
    let pe0 = round_bf16(rng.vec((b * ctx * r) as usize, 1.0));
    let (pos, slots) = positions(b, t, ctx);
    let rope = rope_op(d);

    let bf = DType::BF16;
    let i32t = DType::I32;
    let kva_a = arg(KVA, bf, &[b, t, w]);
    let fused = mla_kv_write(&MlaKvWrite {
        kva: &kva_a,
        kva_row_stride: w,
        norm_weight: &arg(NORM_W, bf, &[l]),
        eps: EPS,
        rope: &rope,
        positions: &arg(POS, i32t, &[b, t]),
        slots: &arg(SLOTS, i32t, &[b, t]),
        c_cache: &arg(C_FUSED, bf, &[b, ctx, 1, l]),
        pe_cache: &arg(PE_FUSED, bf, &[b, ctx, 1, r]),
    })
    .unwrap_or_else(|e| panic!("{label}: {e}"));
    let mut unfused: Vec<KernelSource> = Vec::new();
    let mut one = |op: Op, ins: &[TensorArg], out: TensorArg| {
        unfused.extend(single(&op, ins, &out).unwrap_or_else(|e| panic!("{label}: {e}")));
    };
    one(
        Op::Slice {
            axis: 2,
            start: 0,
            len: l,
        },
        std::slice::from_ref(&kva_a),
        arg(C_SLICE, bf, &[b, t, l]),
    );
    one(
        Op::Slice {
            axis: 2,
            start: l,
            len: r,
        },
        std::slice::from_ref(&kva_a),
        arg(PE_SLICE, bf, &[b, t, r]),
    );
    one(
        rope.clone(),
        &[arg(PE_SLICE, bf, &[b, t, 1, r]), arg(POS, i32t, &[b, t])],
        arg(PE_ROPED, bf, &[b, t, 1, r]),
    );
    one(
        Op::KvWrite,
        &[
            arg(PE_UNFUSED, bf, &[b, ctx, 1, r]),
            arg(PE_ROPED, bf, &[b, t, 1, r]),
            arg(SLOTS, i32t, &[b, t]),
        ],
        arg(PE_UNFUSED, bf, &[b, ctx, 1, r]),
    );
    let norm = rmsnorm(&RmsNormParams {
        rows: Rows::Fixed((b * t) as u32),
        heads: 1,
        dim: l as u32,
        x: View::new(Loc::table(C_SLICE), BF, l),
        out: View::new(Loc::table(C_NORMED), BF, l),
        weight: Loc::table(NORM_W),
        w_dtype: BF,
        eps: EPS,
    })
    .unwrap();
    let write_c = single(
        &Op::KvWrite,
        &[
            arg(C_UNFUSED, bf, &[b, ctx, 1, l]),
            arg(C_NORMED, bf, &[b, t, 1, l]),
            arg(SLOTS, i32t, &[b, t]),
        ],
        &arg(C_UNFUSED, bf, &[b, ctx, 1, l]),
    )
    .unwrap();

    let bytes = |n: u64, size: u64| n * size;
    let buf_bytes = vec![
        bytes(b * t * w, 2),
        bytes(l, 2),
        bytes(b * t, 4),
        bytes(b * t, 4),
        bytes(b * ctx * l, 2),
        bytes(b * ctx * r, 2),
        bytes(b * t * l, 2),
        bytes(b * t * l, 2),
        bytes(b * t * r, 2),
        bytes(b * t * r, 2),
        bytes(b * ctx * l, 2),
        bytes(b * ctx * r, 2),
    ];
    let mut mem = Mem::new(256, &buf_bytes);
    mem.put(Loc::table(KVA), BF, &kva);
    mem.put(Loc::table(NORM_W), BF, &norm_w);
    mem.put(Loc::table(POS), Dtype::I32, &pos);
    mem.put(Loc::table(SLOTS), Dtype::I32, &slots);
    for (slot, v) in [
        (C_FUSED, &c0),
        (C_UNFUSED, &c0),
        (PE_FUSED, &pe0),
        (PE_UNFUSED, &pe0),
    ] {
        mem.put(Loc::table(slot), BF, v);
    }
    let mut kernels: Vec<&KernelSource> = vec![&fused];
    kernels.extend(unfused.iter());
    kernels.push(&norm);
    kernels.extend(write_c.iter());
    let bucket = Bucket {
        b: b as u32,
        t: t as u32,
        ctx: ctx as u32,
    };
    gpu.run(&mut mem, &kernels, bucket);
    let get = |slot: u32, n: u64| mem.get(Loc::table(slot), BF, n as usize);
    let (c_f, pe_f) = (get(C_FUSED, b * ctx * l), get(PE_FUSED, b * ctx * r));
    let (c_u, pe_u) = (get(C_UNFUSED, b * ctx * l), get(PE_UNFUSED, b * ctx * r));
    assert!(
        c_f == c_u,
        "{label}: the latent cache differs from the unfused kernels'"
    );
    assert!(
        pe_f == pe_u,
        "{label}: the rope-key cache differs from the unfused kernels'"
    );

    let mut g = Reference::new();
    let x = g.input(
        "kva",
        tensor(BF, &[b as usize, t as usize, w as usize], &kva),
    );
    let wt = g.input("w", tensor(BF, &[l as usize], &norm_w));
    let p = g.input("pos", tensor(Dtype::I32, &[b as usize, t as usize], &pos));
    let s = g.input(
        "slots",
        tensor(Dtype::I32, &[b as usize, t as usize], &slots),
    );
    let cache = |n: u64| [b as usize, ctx as usize, 1, n as usize];
    let c = g.state("c", tensor(BF, &cache(l), &c0));
    let pe = g.state("pe", tensor(BF, &cache(r), &pe0));
    let view = |n: u64| Op::Reshape {
        shape: Shape::new([Dim::from(b), Dim::from(t), Dim::from(1u64), Dim::from(n)]),
    };
    let cs = g.op(
        Op::Slice {
            axis: 2,
            start: 0,
            len: l,
        },
        &[x],
    );
    let cn = g.op(Op::RmsNorm { eps: EPS as f64 }, &[cs, wt]);
    let cn = g.op(view(l), &[cn]);
    let cw = g.op(Op::KvWrite, &[c, cn, s]);
    let ps = g.op(
        Op::Slice {
            axis: 2,
            start: l,
            len: r,
        },
        &[x],
    );
    let ps = g.op(view(r), &[ps]);
    let pr = g.op(rope, &[ps, p]);
    let pw = g.op(Op::KvWrite, &[pe, pr, s]);
    let want = g.run(&[("c", cw), ("pe", pw)]);
    let (rtol, atol) = bf16_tol(&want["c"]);
    assert_close(&format!("{label} latent"), &c_f, &want["c"], rtol, atol);
    let (rtol, atol) = bf16_tol(&want["pe"]);
    assert_close(&format!("{label} rope key"), &pe_f, &want["pe"], rtol, atol);
    println!("PASS {label}: bitwise equal to the unfused kernels");
}

const Q: u32 = 0;
const Q_POS: u32 = 1;
const NOPE_FUSED: u32 = 2;
const PE_Q_FUSED: u32 = 3;
const NOPE_UNFUSED: u32 = 4;
const PE_Q_SLICE: u32 = 5;
const PE_Q_UNFUSED: u32 = 6;

fn check_q(gpu: &Gpu, name: &str, d: Dims, b: u64, t: u64) {
    let (h, dn, dr) = (d.heads, d.nope, d.rope);
    let qk = dn + dr;
    let label = format!("mla_q_split {name} B={b} T={t}");
    let mut rng = Rng::new(b * 7 + t * 3 + h);
    let q = round_bf16(rng.vec((b * t * h * qk) as usize, 2.0));
    let (pos, _) = positions(b, t, 8192);
    let rope = rope_op(d);
    let bf = DType::BF16;
    let pos_a = arg(Q_POS, DType::I32, &[b, t]);
    let q_a = arg(Q, bf, &[b, t, h, qk]);
    let fused = mla_q_split(&MlaQSplit {
        q: &q_a,
        rope: &rope,
        positions: &pos_a,
        q_nope: &arg(NOPE_FUSED, bf, &[b, t, h, dn]),
        q_pe: &arg(PE_Q_FUSED, bf, &[b, t, h, dr]),
    })
    .unwrap_or_else(|e| panic!("{label}: {e}"));
    let mut kernels = vec![fused];
    kernels.extend(
        single(
            &Op::Slice {
                axis: 3,
                start: 0,
                len: dn,
            },
            std::slice::from_ref(&q_a),
            &arg(NOPE_UNFUSED, bf, &[b, t, h, dn]),
        )
        .unwrap(),
    );
    kernels.extend(
        single(
            &Op::Slice {
                axis: 3,
                start: dn,
                len: dr,
            },
            std::slice::from_ref(&q_a),
            &arg(PE_Q_SLICE, bf, &[b, t, h, dr]),
        )
        .unwrap(),
    );
    kernels.extend(
        single(
            &rope,
            &[arg(PE_Q_SLICE, bf, &[b, t, h, dr]), pos_a.clone()],
            &arg(PE_Q_UNFUSED, bf, &[b, t, h, dr]),
        )
        .unwrap(),
    );
    let rows = b * t * h;
    let buf_bytes = vec![
        rows * qk * 2,
        b * t * 4,
        rows * dn * 2,
        rows * dr * 2,
        rows * dn * 2,
        rows * dr * 2,
        rows * dr * 2,
    ];
    let mut mem = Mem::new(256, &buf_bytes);
    mem.put(Loc::table(Q), BF, &q);
    mem.put(Loc::table(Q_POS), Dtype::I32, &pos);
    let bucket = Bucket {
        b: b as u32,
        t: t as u32,
        ctx: 8192,
    };
    gpu.run(&mut mem, &kernels.iter().collect::<Vec<_>>(), bucket);
    let get = |slot: u32, n: u64| mem.get(Loc::table(slot), BF, n as usize);
    let (nope_f, pe_f) = (get(NOPE_FUSED, rows * dn), get(PE_Q_FUSED, rows * dr));
    assert!(
        nope_f == get(NOPE_UNFUSED, rows * dn),
        "{label}: q_nope differs from the unfused slice"
    );
    assert!(
        pe_f == get(PE_Q_UNFUSED, rows * dr),
        "{label}: q_pe differs from the unfused slice + rope"
    );
    let dims = [b as usize, t as usize, h as usize, qk as usize];
    let mut g = Reference::new();
    let x = g.input("q", tensor(BF, &dims, &q));
    let p = g.input("pos", tensor(Dtype::I32, &dims[..2], &pos));
    let nope = g.op(
        Op::Slice {
            axis: 3,
            start: 0,
            len: dn,
        },
        &[x],
    );
    let ps = g.op(
        Op::Slice {
            axis: 3,
            start: dn,
            len: dr,
        },
        &[x],
    );
    let pr = g.op(rope, &[ps, p]);
    let want = g.run(&[("nope", nope), ("pe", pr)]);
    assert!(
        nope_f == want["nope"],
        "{label}: q_nope differs from the interpreter"
    );
    let (rtol, atol) = bf16_tol(&want["pe"]);
    assert_close(&format!("{label} q_pe"), &pe_f, &want["pe"], rtol, atol);
    println!("PASS {label}: bitwise equal to the unfused kernels");
}

#[test]
fn mla_kv_write_matches_the_unfused_kernels_and_the_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    for (name, d) in [("kimi", KIMI), ("fixture", FIXTURE)] {
        for (b, t, ctx) in [(1, 1, 64), (3, 8, 100), (2, 16, 1024)] {
            check_kv(&gpu, name, d, b, t, ctx);
        }
    }
}

#[test]
fn mla_q_split_matches_the_unfused_kernels_and_the_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    for (name, d) in [("kimi", KIMI), ("fixture", FIXTURE)] {
        for (b, t) in [(1, 1), (3, 8), (2, 16)] {
            check_q(&gpu, name, d, b, t);
        }
    }
}

/// `head_matmul` at Kimi-K2's absorbed shapes (both layouts, bf16) and the fixtures': every
/// row of an 11-row launch (two passes of the vector kernels) bitwise equal to that row
/// computed alone, and within bf16 rounding of the interpreter.
#[test]
fn head_matmul_rows_do_not_depend_on_the_row_count() {
    let Some(gpu) = Gpu::new() else { return };
    let bf = DType::BF16;
    for (name, h, dn, l) in [("kimi", 64u64, 128u64, 512u64), ("fixture", 4, 16, 32)] {
        for trans_w in [false, true] {
            let (k, n) = if trans_w { (l, dn) } else { (dn, l) };
            let wdims = if trans_w { [h, n, k] } else { [h, k, n] };
            let label = format!("head_matmul {name} trans_w {trans_w}");
            let mut rng = Rng::new(h + k + trans_w as u64);
            let rows = 11u64;
            let x = round_bf16(rng.vec((rows * h * k) as usize, 1.0));
            let wv = round_bf16(rng.vec((h * k * n) as usize, 0.1));
            let op = Op::HeadMatMul { trans_w };
            let run = |r: u64, xs: &[f64]| -> Vec<f64> {
                let ks = single(
                    &op,
                    &[arg(0, bf, &[r, 1, h, k]), arg(1, bf, &wdims)],
                    &arg(2, bf, &[r, 1, h, n]),
                )
                .unwrap();
                let mut mem = Mem::new(256, &[r * h * k * 2, h * k * n * 2, r * h * n * 2]);
                mem.put(Loc::table(0), BF, xs);
                mem.put(Loc::table(1), BF, &wv);
                let bucket = Bucket {
                    b: 1,
                    t: r as u32,
                    ctx: 1,
                };
                gpu.run(&mut mem, &ks.iter().collect::<Vec<_>>(), bucket);
                mem.get(Loc::table(2), BF, (r * h * n) as usize)
            };
            let all = run(rows, &x);
            let per = (h * k) as usize;
            for r in [0usize, 7, 8, 10] {
                let alone = run(1, &x[r * per..(r + 1) * per]);
                let got = &all[r * (h * n) as usize..(r + 1) * (h * n) as usize];
                assert!(
                    got == alone.as_slice(),
                    "{label}: row {r} of 11 differs from it alone"
                );
            }
            let mut g = Reference::new();
            let xi = g.input(
                "x",
                tensor(BF, &[rows as usize, 1, h as usize, k as usize], &x),
            );
            let wd: Vec<usize> = wdims.iter().map(|&d| d as usize).collect();
            let wi = g.input("w", tensor(BF, &wd, &wv));
            let y = g.op(op.clone(), &[xi, wi]);
            let want = g.run(&[("y", y)]).remove("y").unwrap();
            let (rtol, atol) = bf16_tol(&want);
            assert_close(&label, &all, &want, rtol, atol);
            println!("PASS {label}: 11 rows, each bitwise equal to it alone");
        }
    }
}
