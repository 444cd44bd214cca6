//! Rope + KV write and attention kernels run on the GPU and compared with the IR
//! interpreter (the oracle), at tiny-Llama and Llama-3.1-8B-like shapes.
//! Needs `--features cuda` and a device; skips with a message without a driver or NVRTC.

#![cfg(feature = "cuda")]

mod common;
mod gpu;

use common::Plan;
use gpu::{assert_close, bf16_tol, tensor, Gpu, Mem, Reference, Rng};
use specc_codegen::choose::attention as choose_attention;
use specc_ir::op::{AttnMask as IrMask, RopeScaling, RopeStyle as IrStyle};
use specc_ir::Op;
use specc_kernels_gen::abi::{Bucket, Dtype, Loc};
use specc_kernels_gen::attention::{
    attention, attention_tiles_fused, attention_tiles_tiled, AttentionParams, AttnMask,
};
use specc_kernels_gen::attention_mma::{
    fused_combine_fits, fused_combine_tiles, FusedCombine, TileTiling,
};
use specc_kernels_gen::qkv_rope::QkvRope;
use specc_kernels_gen::rope::{rope_kv, QkNorm, RopeKvParams, RopeStyle, RopeTable};

const BF: Dtype = Dtype::BF16;

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
        out: QkvRope {
            q_heads: hq as u32,
            kv_heads: hkv as u32,
            head_dim: d as u32,
            q_out: q,
            k_cache: Loc::table(0),
            v_cache: Loc::table(1),
            cache_dtype: BF,
            pos,
            pos_dtype: Dtype::I32,
            slots: None,
            rope: RopeTable {
                style,
                rotary_dim: d as u32,
                inv_freq,
                cos_sin_scale: 1.0,
            },
        },
        head_dim_v: d as u32,
        q,
        k: kview,
        v: vview,
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
    /// The value head dim when it differs from `d`.
    dv: Option<usize>,
    splits: u32,
    tree: bool,
    /// Ancestor words per tree node (rows of `[B, T, words]` when > 1).
    words: usize,
    /// The tensor-core kernel (`attn_tile`) instead of `attn_split`.
    tiles: bool,
    /// `attn_tile` with this block shape instead of the plan's.
    tiling: Option<TileTiling>,
}

fn check_attention(gpu: &Gpu, c: AttnCase) {
    let AttnCase {
        b,
        t,
        ctx,
        hq,
        hkv,
        d,
        dv,
        splits,
        tree,
        words,
        tiles,
        tiling,
    } = c;
    let m = b * t;
    let dv = dv.unwrap_or(d);
    let mut rng = Rng::new((b * 1000 + t * 10 + d) as u64);
    let mut plan = Plan::new();
    let q = plan.view(m as u32, (hq * d) as u32, BF);
    let out = plan.view(m as u32, (hq * dv) as u32, BF);
    let pos = plan.alloc(m as u64 * 4);
    let prefix = plan.alloc(b as u64 * 4);
    let anc = plan.alloc((m * words) as u64 * 8);
    let scale = 1.0 / (d as f32).sqrt();
    let params = AttentionParams {
        q_heads: hq as u32,
        kv_heads: hkv as u32,
        head_dim: d as u32,
        head_dim_v: dv as u32,
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
                words: words as u32,
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
    let params = AttentionParams { scratch, ..params };
    let tl = match (tiles, tiling) {
        (_, Some(tl)) => Some(tl),
        (true, None) => Some(choose_attention::tiling(&params, gpu.target()).unwrap_or(
            TileTiling {
                warps: 1,
                tile_slots: 16,
                split_p: true,
                slot_warps: 1,
            },
        )),
        (false, None) => None,
    };
    let ks = match tl {
        Some(tl) => attention_tiles_tiled(&params, tl).unwrap(),
        None => attention(&params).unwrap(),
    };
    let fused_tiles = tl.map(|tl| fused_combine_tiles(&params, tl, b as u32) as u32);
    let counters = plan.alloc(u64::from(fused_tiles.unwrap_or(0)) * 4);
    // Sequence b's prefix is 300 + 137·b slots (clamped to the cache), its last lane padding.
    let prefixes: Vec<usize> = (0..b).map(|s| (300 + 137 * s).min(ctx - t)).collect();
    let mut pv = Vec::new();
    let mut av = Vec::new();
    for (s, &p0) in prefixes.iter().enumerate() {
        for i in 0..t {
            let padding = !tree && s == b - 1 && i == t - 1 && b > 1;
            pv.push(if padding { -1.0 } else { (p0 + i) as f64 });
            // Tree: node i's ancestors are the even nodes below it and itself.
            for wd in 0..words {
                let bits: u64 = (0..=i)
                    .filter(|&u| (u == i || u % 2 == 0) && u / 64 == wd)
                    .map(|u| 1u64 << (u % 64))
                    .sum();
                av.push(bits as i64 as f64);
            }
        }
    }
    let plv: Vec<f64> = prefixes.iter().map(|&p| p as f64).collect();
    let qv = rng.vec(m * hq * d, 2.0);
    let (cache_n, vcache_n) = (b * ctx * hkv * d, b * ctx * hkv * dv);
    let (kc, vc) = (rng.vec(cache_n, 2.0), rng.vec(vcache_n, 1.0));
    let (cb, vcb) = (cache_n as u64 * 2, vcache_n as u64 * 2);
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[cb, vcb]);
    mem.put(q.loc, BF, &qv);
    mem.put(pos, Dtype::I32, &pv);
    mem.put(prefix, Dtype::I32, &plv);
    mem.put(anc, Dtype::I64, &av);
    mem.put(Loc::table(0), BF, &kc);
    mem.put(Loc::table(1), BF, &vc);
    // Poison: every output and every split partial must be written.
    mem.put(out.loc, BF, &vec![f64::NAN; m * hq * dv]);
    let scratch_floats = (params.scratch_bytes(m as u32) / 4) as usize;
    mem.put(scratch, Dtype::F32, &vec![f64::NAN; scratch_floats]);
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
    let vi = r.input("v", tensor(BF, &[b, ctx, hkv, dv], &vc));
    let pi = r.input("pos", tensor(Dtype::I32, &[b, t], &pv));
    let o = if tree {
        let pl = r.input("pl", tensor(Dtype::I32, &[b], &plv));
        let an = if words == 1 {
            r.input("anc", tensor(Dtype::I64, &[b, t], &av))
        } else {
            r.input("anc", tensor(Dtype::I64, &[b, t, words], &av))
        };
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
    let two_launches = mem.get(out.loc, BF, m * hq * dv);
    assert_close(
        &format!("attention {c:?}"),
        &two_launches,
        &want["o"],
        rtol,
        atol,
    );
    // The combine folded into the tiles: the same bits, twice (its counters are zero again
    // after each launch, whichever split finished last).
    let (Some(tl), Some(tiles)) = (tl, fused_tiles) else {
        return;
    };
    if !fused_combine_fits(&params, tl) {
        return;
    }
    let fc = FusedCombine { counters, tiles };
    let fused = attention_tiles_fused(&params, tl, fc).unwrap();
    mem.put(counters, Dtype::I32, &vec![0.0; tiles as usize]);
    for round in 0..2 {
        mem.put(out.loc, BF, &vec![f64::NAN; m * hq * dv]);
        mem.put(scratch, Dtype::F32, &vec![f64::NAN; scratch_floats]);
        let bucket = Bucket {
            b: b as u32,
            t: t as u32,
            ctx: ctx as u32,
        };
        gpu.run(&mut mem, &[&fused], bucket);
        let got = mem.get(out.loc, BF, m * hq * dv);
        let same = got
            .iter()
            .zip(&two_launches)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "fused combine, round {round}: bits differ, {c:?}");
        let left = mem.get(counters, Dtype::I32, tiles as usize);
        assert!(
            left.iter().all(|&v| v == 0.0),
            "counters left non-zero: {c:?}"
        );
    }
    println!("PASS fused combine {c:?}");
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
        dv: None,
        splits: 4,
        tree: false,
        words: 1,
        tiles: false,
        tiling: None,
    };
    check_attention(&gpu, tiny);
    check_attention(&gpu, AttnCase { splits: 1, ..tiny });
    check_attention(&gpu, AttnCase { tree: true, ..tiny });
    // A 100-node draft tree: two ancestor words per node.
    check_attention(
        &gpu,
        AttnCase {
            tree: true,
            t: 100,
            words: 2,
            ..tiny
        },
    );
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
        dv: None,
        splits: 16,
        tree: false,
        words: 1,
        tiles: false,
        tiling: None,
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

/// The split kernel at head dims whose PV step is ragged over its threads or whose qk and v
/// dims differ (`common::RAGGED_HEAD_DIMS`): decode, a chain of 4, a tree of 4.
#[test]
fn attention_at_ragged_head_dims_matches_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    for (d, dv) in common::RAGGED_HEAD_DIMS {
        let (d, dv) = (d as usize, dv as usize);
        let base = AttnCase {
            b: 2,
            t: 4,
            ctx: 512,
            hq: 4,
            hkv: 2,
            d,
            dv: Some(dv),
            splits: 4,
            tree: false,
            words: 1,
            tiles: false,
            tiling: None,
        };
        check_attention(&gpu, base);
        check_attention(&gpu, AttnCase { t: 1, ..base });
        check_attention(&gpu, AttnCase { tree: true, ..base });
    }
}

/// The tensor-core kernel as the plan makes it (blocks of up to 4 warps, 64 rows): rows
/// per sequence T·G = 40, 64, 100, 256, 400 and 1024 (1 to 16 row blocks), causal and
/// tree with 1-, 2- and 4-word masks, GQA groups 1, 4 and 8, head dims 64 and 128,
/// contexts that are no multiple of the tile, one split and many.
#[test]
fn attention_tiles_match_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let llama = AttnCase {
        b: 2,
        t: 10,
        ctx: 1000,
        hq: 32,
        hkv: 8,
        d: 128,
        dv: None,
        splits: 5,
        tree: true,
        words: 1,
        tiles: true,
        tiling: None,
    };
    // T·G = 40: one 4-warp block, tree.
    check_attention(&gpu, llama);
    // Decode: one token a sequence (one warp a block, 4 of its 16 rows used), 3 splits.
    check_attention(
        &gpu,
        AttnCase {
            b: 4,
            t: 1,
            tree: false,
            splits: 3,
            ..llama
        },
    );
    // Decode blocks whose warps split each tile's slots (merged softmax states): 4 slot warps
    // of 16 slots, and 2 of 32 slots over 16 splits (short sequences leave splits empty).
    for (sw, ts, splits) in [(4u32, 64u32, 3u32), (2, 64, 16), (4, 64, 16)] {
        check_attention(
            &gpu,
            AttnCase {
                b: 4,
                t: 1,
                tree: false,
                splits,
                tiling: Some(TileTiling {
                    warps: sw,
                    tile_slots: ts,
                    split_p: true,
                    slot_warps: sw,
                }),
                ..llama
            },
        );
    }
    // Decode, G = 3 with 5 splits: an odd count of (m, l) pairs a token, so the fused
    // combine reads the partials two floats at a time.
    check_attention(
        &gpu,
        AttnCase {
            b: 2,
            t: 1,
            hq: 3,
            hkv: 1,
            d: 64,
            tree: false,
            splits: 5,
            ..llama
        },
    );
    // Decode, G = 1, head dim 64, one split.
    check_attention(
        &gpu,
        AttnCase {
            b: 3,
            t: 1,
            hq: 4,
            hkv: 4,
            d: 64,
            tree: false,
            splits: 1,
            ..llama
        },
    );
    // T·G = 64, causal with a padding lane, one split.
    check_attention(
        &gpu,
        AttnCase {
            t: 16,
            tree: false,
            splits: 1,
            ..llama
        },
    );
    // T·G = 256: four row blocks.
    check_attention(
        &gpu,
        AttnCase {
            b: 1,
            t: 64,
            ctx: 1100,
            splits: 7,
            ..llama
        },
    );
    // G = 1, head dim 64, causal, T·G = 40.
    check_attention(
        &gpu,
        AttnCase {
            t: 40,
            hq: 4,
            hkv: 4,
            d: 64,
            dv: None,
            splits: 3,
            tree: false,
            ..llama
        },
    );
    // Head dim 64 with many rows: G = 1, T·G = 100 (2 row blocks) and G = 4, T·G = 400 (7
    // row blocks, a 100-node tree: 2 ancestor words). Their dynamic shared memory is under 48 KiB but static +
    // dynamic is not: the launch must opt in (it failed with CUDA_ERROR_INVALID_VALUE when
    // only dynamic sizes above 48 KiB opted in).
    check_attention(
        &gpu,
        AttnCase {
            b: 1,
            t: 100,
            hq: 4,
            hkv: 4,
            d: 64,
            dv: None,
            splits: 2,
            tree: false,
            ..llama
        },
    );
    check_attention(
        &gpu,
        AttnCase {
            b: 1,
            t: 100,
            ctx: 700,
            hq: 4,
            hkv: 1,
            d: 64,
            dv: None,
            splits: 3,
            words: 2,
            ..llama
        },
    );
    if std::env::var_os("SPECC_GPU_QUICK").is_some() {
        return;
    }
    // A 256-node tree (4 words), G = 4: T·G = 1024 in 16 row blocks.
    check_attention(
        &gpu,
        AttnCase {
            b: 1,
            t: 256,
            ctx: 1100,
            hq: 8,
            hkv: 2,
            splits: 3,
            words: 4,
            ..llama
        },
    );
    // The same rows causal, 16 splits.
    check_attention(
        &gpu,
        AttnCase {
            b: 1,
            t: 256,
            ctx: 1100,
            hq: 8,
            hkv: 2,
            splits: 16,
            tree: false,
            ..llama
        },
    );
}

/// `attn_tile` block shapes other than the plan's (the bench's alternatives): 2 to 16 warps
/// over several row blocks, tiles of 16 to 64 slots, tree and causal masks (tiles wholly
/// inside the prefix skip the per-slot mask), one split and several.
#[test]
fn attention_tile_shapes_match_interpreter() {
    let Some(gpu) = Gpu::new() else { return };
    let base = AttnCase {
        b: 2,
        t: 64,
        ctx: 1100,
        hq: 32,
        hkv: 8,
        d: 128,
        dv: None,
        splits: 4,
        tree: true,
        words: 1,
        tiles: true,
        tiling: None,
    };
    for (warps, tile_slots, splits, tree) in [
        (4, 32, 1, true),
        (4, 16, 3, false),
        (8, 32, 2, true),
        (2, 64, 5, false),
        (16, 16, 7, true),
    ] {
        let tiling = Some(TileTiling {
            warps,
            tile_slots,
            split_p: true,
            slot_warps: 1,
        });
        check_attention(
            &gpu,
            AttnCase {
                splits,
                tree,
                tiling,
                ..base
            },
        );
    }
}
