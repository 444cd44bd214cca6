//! Test fixtures: every kernel family instantiated at the shapes of a model, the way
//! codegen will call the generators (arena offsets from a bump planner, weights and KV
//! caches in the buffer table).

#![allow(dead_code)]

use specc_codegen::choose::{self, attention_tiles};
use specc_kernels_gen::abi::{Dtype, KernelSource, Loc, Rows, View};
use specc_kernels_gen::argmax::{argmax, ArgmaxInput, ArgmaxParams};
use specc_kernels_gen::attention::{attention, attention_tiles_fused, AttentionParams, AttnMask};
use specc_kernels_gen::attention_mma::FusedCombine;
use specc_kernels_gen::elementwise::{binary, embedding, BinaryFn, BinaryParams, EmbeddingParams};
use specc_kernels_gen::gemv::{gemv, GemvParams, GemvWeights, RmsNormPrologue};
use specc_kernels_gen::gemv_mma::{gemv_mma_alloc, Feed, MmaTiling};
use specc_kernels_gen::norm::{rmsnorm, RmsNormParams};
use specc_kernels_gen::qkv_rope::QkvRope;
use specc_kernels_gen::rope::{rope_kv, QkNorm, RopeKvParams, RopeStyle, RopeTable};
use specc_kernels_gen::{Arch, Target};

/// The build target the fixtures' kernel choices are made for: an sm_90a build (the H200's
/// 132 SMs, 227 KiB of shared memory per block), the target the snapshots were taken at.
pub fn target() -> Target {
    Target::for_archs(&[Arch::Sm90a])
}

/// An explicit `gemv_mma` work split: `(tn, wn, wk, unroll, ks)` and the operand feed.
pub fn mma_split((tn, wn, wk, unroll, ks): (u32, u32, u32, u32, u32), feed: Feed) -> MmaTiling {
    MmaTiling {
        tn,
        wn,
        wk,
        unroll,
        feed,
        ks,
    }
}

/// The model dimensions the fixtures need.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub hidden: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub ffn: u32,
    pub vocab: u32,
    pub theta: f64,
    /// The bucket the fixtures are tuned for: B sequences of T tokens.
    pub b: u32,
    pub t: u32,
}

pub const TINY: Shape = Shape {
    name: "tiny-llama",
    hidden: 128,
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    ffn: 352,
    vocab: 512,
    theta: 10000.0,
    b: 2,
    t: 4,
};

pub const LLAMA_8B: Shape = Shape {
    name: "llama-3.1-8b",
    hidden: 4096,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    ffn: 14336,
    vocab: 128256,
    theta: 500000.0,
    b: 1,
    t: 8,
};

/// A bump allocator standing in for the static memory plan.
pub struct Plan {
    next: u64,
}

impl Plan {
    pub fn new() -> Plan {
        Plan { next: 0 }
    }

    pub fn alloc(&mut self, bytes: u64) -> Loc {
        let at = self.next;
        self.next = (self.next + bytes).next_multiple_of(256);
        Loc::arena(at)
    }

    pub fn view(&mut self, rows: u32, cols: u32, dtype: Dtype) -> View {
        let loc = self.alloc(rows as u64 * cols as u64 * dtype.size());
        View::new(loc, dtype, cols as u64)
    }
}

/// Default rope inverse frequencies `theta^(-2i/d)` in f32, as HF computes them.
pub fn inv_freq(theta: f64, dim: u32) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / dim as f32))
        .collect()
}

/// Every family at this shape: `(label, kernel)`.
pub fn all_kernels(s: &Shape) -> Vec<(String, KernelSource)> {
    let bf = Dtype::BF16;
    let m = s.b * s.t;
    let (h, d) = (s.hidden, s.head_dim);
    let qkv_n = (s.heads + 2 * s.kv_heads) * d;
    let mut plan = Plan::new();
    let ids = plan.alloc(m as u64 * 4);
    let pos = plan.alloc(m as u64 * 4);
    let x = plan.view(m, h, bf);
    let qkv = plan.view(m, qkv_n, bf);
    let attn = plan.view(m, s.heads * d, bf);
    let act = plan.view(m, s.ffn, bf);
    let gate_up = plan.view(m, 2 * s.ffn, bf);
    let logits = plan.view(m, s.vocab, Dtype::F32);
    let tokens = View::new(plan.alloc(m as u64 * 4), Dtype::I32, 1);
    let prefix_len = plan.alloc(s.b as u64 * 4);
    let ancestors = plan.alloc(m as u64 * 8);
    // Weight / state table slots.
    let (t_embed, t_norm, t_qkv, t_o, t_gu, t_down, t_lm) = (0, 1, 2, 3, 4, 5, 6);
    let (t_kc, t_vc, t_qn, t_kn, t_router) = (7, 8, 9, 10, 11);
    let norm = |slot| RmsNormPrologue {
        weight: Loc::table(slot),
        dtype: bf,
        eps: 1e-5,
    };
    let q = View::new(qkv.loc, bf, qkv_n as u64);
    let k = q.cols_from((s.heads * d) as u64);
    let v = k.cols_from((s.kv_heads * d) as u64);

    let mut out = Vec::new();
    let mut add = |label: &str, k: KernelSource| out.push((label.to_string(), k));

    add(
        "embedding",
        embedding(&EmbeddingParams {
            rows: Rows::Tokens,
            ids,
            ids_dtype: Dtype::I32,
            table: Loc::table(t_embed),
            table_dtype: bf,
            vocab: s.vocab,
            hidden: h,
            out: x,
        })
        .unwrap(),
    );
    let base_gemv = GemvParams {
        rows: Rows::Tokens,
        row_tile: m,
        k: h,
        n: qkv_n,
        x,
        weights: GemvWeights::Single(Loc::table(t_qkv)),
        w_dtype: bf,
        norm: Some(norm(t_norm)),
        residual: None,
        out: Some(qkv),
        argmax_partials: None,
        rope: None,
    };
    add("gemv qkv +rmsnorm", gemv(&base_gemv).unwrap());
    add(
        "gemv o_proj +residual",
        gemv(&GemvParams {
            k: s.heads * d,
            n: h,
            x: attn,
            weights: GemvWeights::Single(Loc::table(t_o)),
            norm: None,
            residual: Some(x),
            out: Some(x),
            ..base_gemv.clone()
        })
        .unwrap(),
    );
    add(
        "gemv gate_up +rmsnorm +silu_mul",
        gemv(&GemvParams {
            k: h,
            n: s.ffn,
            weights: GemvWeights::gate_up_concat(Loc::table(t_gu), s.ffn, h, bf),
            out: Some(act),
            ..base_gemv.clone()
        })
        .unwrap(),
    );
    add(
        "gemv down +residual (row tile 64)",
        gemv(&GemvParams {
            row_tile: 64,
            k: s.ffn,
            n: h,
            x: act,
            weights: GemvWeights::Single(Loc::table(t_down)),
            norm: None,
            residual: Some(x),
            out: Some(x),
            ..base_gemv.clone()
        })
        .unwrap(),
    );
    let lm = GemvParams {
        k: h,
        n: s.vocab,
        weights: GemvWeights::Single(Loc::table(t_lm)),
        out: None,
        argmax_partials: Some(plan.alloc(m as u64 * 8 * s.vocab.div_ceil(8) as u64)),
        ..base_gemv.clone()
    };
    let partials = lm.partials_per_row();
    add("gemv lm_head +rmsnorm +argmax", gemv(&lm).unwrap());
    add(
        "gemv lm_head +cast f32",
        gemv(&GemvParams {
            out: Some(logits),
            argmax_partials: None,
            ..lm.clone()
        })
        .unwrap(),
    );
    add(
        "gemv f32 weights (row tile 64)",
        gemv(&GemvParams {
            row_tile: 64,
            n: 64,
            w_dtype: Dtype::F32,
            weights: GemvWeights::Single(Loc::table(t_router)),
            norm: None,
            out: Some(plan.view(m, 64, Dtype::F32)),
            ..base_gemv.clone()
        })
        .unwrap(),
    );
    for (label, p) in mma_fixtures(&base_gemv, &lm, s, [attn, act, logits]) {
        let rows = p.row_tile;
        add(
            &label,
            gemv_mma_alloc(&p, &choose::matmul::tiling(&p, &target()), rows, |b| {
                plan.alloc(b)
            })
            .unwrap(),
        );
    }
    add(
        "argmax partials",
        argmax(&ArgmaxParams {
            rows: Rows::Tokens,
            input: ArgmaxInput::Partials {
                loc: lm.argmax_partials.unwrap(),
                count: partials,
            },
            out: tokens,
        })
        .unwrap(),
    );
    add(
        "argmax logits",
        argmax(&ArgmaxParams {
            rows: Rows::Tokens,
            input: ArgmaxInput::Values {
                x: logits,
                n: s.vocab,
            },
            out: tokens,
        })
        .unwrap(),
    );
    let rope = RopeKvParams {
        out: QkvRope {
            q_heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: d,
            q_out: q,
            k_cache: Loc::table(t_kc),
            v_cache: Loc::table(t_vc),
            cache_dtype: bf,
            pos,
            pos_dtype: Dtype::I32,
            slots: None,
            rope: RopeTable {
                style: RopeStyle::Half,
                rotary_dim: d,
                inv_freq: inv_freq(s.theta, d),
                cos_sin_scale: 1.0,
            },
        },
        head_dim_v: d,
        q,
        k,
        v,
        qk_norm: None,
    };
    add("rope_kv", rope_kv(&rope).unwrap());
    // The same rotation and KV write in the q|k|v projection's epilogue (one launch), on
    // CUDA cores and on tensor cores; the tensor-core one with separate cache slots.
    let fused = GemvParams {
        out: None,
        // The same heads, destinations and rotation as the `rope_kv` fixture.
        rope: Some(rope.out.clone()),
        ..base_gemv.clone()
    };
    add("gemv qkv +rmsnorm +rope_kv", gemv(&fused).unwrap());
    let mut fused_slots = fused.clone();
    if let Some(r) = &mut fused_slots.rope {
        r.slots = Some((ancestors, Dtype::I32));
        r.rope.style = RopeStyle::Interleaved;
    }
    add(
        "gemv_mma qkv +rmsnorm +rope_kv (interleaved, slots)",
        gemv_mma_alloc(
            &fused_slots,
            &choose::matmul::tiling(&fused_slots, &target()),
            fused_slots.row_tile,
            |b| plan.alloc(b),
        )
        .unwrap(),
    );
    add(
        "rope_kv +qk_norm (interleaved)",
        rope_kv(&RopeKvParams {
            out: QkvRope {
                rope: RopeTable {
                    style: RopeStyle::Interleaved,
                    ..rope.out.rope.clone()
                },
                ..rope.out.clone()
            },
            qk_norm: Some(QkNorm {
                q_weight: Loc::table(t_qn),
                k_weight: Loc::table(t_kn),
                dtype: bf,
                eps: 1e-6,
            }),
            ..rope.clone()
        })
        .unwrap(),
    );
    let att = AttentionParams {
        q_heads: s.heads,
        kv_heads: s.kv_heads,
        head_dim: d,
        head_dim_v: d,
        q,
        k_cache: Loc::table(t_kc),
        v_cache: Loc::table(t_vc),
        cache_dtype: bf,
        pos,
        pos_dtype: Dtype::I32,
        mask: AttnMask::Causal,
        out: attn,
        scale: 1.0 / (d as f32).sqrt(),
        max_t: s.t,
        splits: 16,
        scratch: Loc::arena(0),
    };
    let scratch = plan.alloc(att.scratch_bytes(m));
    let causal = attention(&AttentionParams {
        scratch,
        ..att.clone()
    })
    .unwrap();
    add("attention causal: split", causal.split);
    add("attention causal: combine", causal.combine);
    let tree = attention(&AttentionParams {
        scratch,
        mask: AttnMask::Tree {
            prefix_len,
            ancestors,
            words: 1,
        },
        max_t: 64,
        ..att.clone()
    })
    .unwrap();
    add("attention tree (T<=64): split", tree.split);
    let tree256 = attention(&AttentionParams {
        scratch,
        mask: AttnMask::Tree {
            prefix_len,
            ancestors,
            words: 4,
        },
        max_t: 256,
        ..att.clone()
    })
    .unwrap();
    add("attention tree (T<=256, 4 words): split", tree256.split);
    // The tensor-core kernel (4-warp blocks; 3 at T <= 12 with G = 4), causal and tree
    // with 1 and 4 ancestor words.
    let tiles = |mask, max_t| {
        attention_tiles(
            &AttentionParams {
                scratch,
                mask,
                max_t,
                ..att.clone()
            },
            &target(),
        )
        .unwrap()
        .split
    };
    let tree_mask = |words| AttnMask::Tree {
        prefix_len,
        ancestors,
        words,
    };
    add("attn_tile causal (T<=16)", tiles(AttnMask::Causal, 16));
    add("attn_tile tree (T<=12)", tiles(tree_mask(1), 12));
    add("attn_tile tree (T<=64)", tiles(tree_mask(1), 64));
    add("attn_tile tree (T<=256, 4 words)", tiles(tree_mask(4), 256));
    // Decode blocks whose warps split each tile's slots (2 and 4 slot warps), combine
    // separate and folded.
    for sw in [2u32, 4] {
        let p = AttentionParams {
            scratch,
            max_t: 1,
            ..att.clone()
        };
        let tl = specc_kernels_gen::attention_mma::TileTiling {
            warps: sw,
            tile_slots: 64,
            split_p: true,
            slot_warps: sw,
        };
        add(
            &format!("attn_tile decode, {sw} slot warps"),
            specc_kernels_gen::attention::attention_tiles_tiled(&p, tl)
                .unwrap()
                .split,
        );
        if sw == 2 {
            // Folded into 2 slot warps the combine spills on sm_90a: the choice never asks.
            continue;
        }
        let fc = FusedCombine {
            counters: plan.alloc(4 * 512),
            tiles: 512,
        };
        add(
            &format!("attn_tile decode, {sw} slot warps, combine fused"),
            attention_tiles_fused(&p, tl, fc).unwrap(),
        );
    }
    // The tensor-core kernel with the combine folded in, decode (one warp a block) and a
    // causal verify block.
    for max_t in [1, 16] {
        let p = AttentionParams {
            scratch,
            max_t,
            ..att.clone()
        };
        let tl = choose::attention::tiling(&p, &target()).unwrap();
        let fc = FusedCombine {
            counters: plan.alloc(4 * 512),
            tiles: 512,
        };
        add(
            &format!("attn_tile causal (T<={max_t}), combine fused"),
            attention_tiles_fused(&p, tl, fc).unwrap(),
        );
    }
    add(
        "rmsnorm",
        rmsnorm(&RmsNormParams {
            rows: Rows::Tokens,
            heads: 1,
            dim: h,
            x,
            out: x,
            weight: Loc::table(t_norm),
            w_dtype: bf,
            eps: 1e-5,
        })
        .unwrap(),
    );
    add(
        "rmsnorm per head",
        rmsnorm(&RmsNormParams {
            rows: Rows::Tokens,
            heads: s.heads,
            dim: d,
            x: q,
            out: q,
            weight: Loc::table(t_qn),
            w_dtype: bf,
            eps: 1e-6,
        })
        .unwrap(),
    );
    add(
        "silu_mul",
        binary(&BinaryParams {
            op: BinaryFn::SiluMul,
            rows: Rows::Tokens,
            cols: s.ffn,
            a: gate_up,
            b: gate_up.cols_from(s.ffn as u64),
            out: act,
        })
        .unwrap(),
    );
    add(
        "add",
        binary(&BinaryParams {
            op: BinaryFn::Add,
            rows: Rows::Tokens,
            cols: h,
            a: x,
            b: attn.cols_from(0),
            out: x,
        })
        .unwrap(),
    );
    out
}

/// The tensor-core GEMV at every fusion of the SIMT fixtures (`base`: qkv + norm at the
/// shape's M; `lm`: lm-head + norm + argmax), at M and at row tile 64 for the o_proj and
/// down_proj.
fn mma_fixtures(
    base: &GemvParams,
    lm: &GemvParams,
    s: &Shape,
    [attn, act, logits]: [View; 3],
) -> Vec<(String, GemvParams)> {
    let (h, x) = (s.hidden, base.x);
    let o_proj = GemvParams {
        k: s.heads * s.head_dim,
        n: h,
        x: attn,
        weights: GemvWeights::Single(Loc::table(3)),
        norm: None,
        residual: Some(x),
        out: Some(x),
        ..base.clone()
    };
    vec![
        ("gemv_mma qkv +rmsnorm".into(), base.clone()),
        ("gemv_mma o_proj +residual".into(), o_proj.clone()),
        (
            "gemv_mma gate_up +rmsnorm +silu_mul".into(),
            GemvParams {
                n: s.ffn,
                weights: GemvWeights::gate_up_concat(Loc::table(4), s.ffn, h, Dtype::BF16),
                out: Some(act),
                ..base.clone()
            },
        ),
        (
            // K = 128: whole 64-k chunks, so the tensor-map feed (split 2 ways: one column block).
            "gemv_mma o_proj +residual (row tile 64, tensor maps)".into(),
            GemvParams {
                row_tile: 64,
                ..o_proj
            },
        ),
        (
            "gemv_mma down +residual (row tile 64)".into(),
            GemvParams {
                row_tile: 64,
                k: s.ffn,
                n: h,
                x: act,
                weights: GemvWeights::Single(Loc::table(5)),
                norm: None,
                residual: Some(x),
                out: Some(x),
                ..base.clone()
            },
        ),
        ("gemv_mma lm_head +rmsnorm +argmax".into(), lm.clone()),
        (
            "gemv_mma lm_head +cast f32".into(),
            GemvParams {
                out: Some(logits),
                argmax_partials: None,
                ..lm.clone()
            },
        ),
    ]
}

/// Head dims `(qk, v)` whose PV step splits unevenly over the split kernel's 128 threads
/// (neither dividing nor a multiple of 128), or whose qk and v dims differ.
pub const RAGGED_HEAD_DIMS: [(u32, u32); 6] = [
    (96, 96),
    (80, 80),
    (40, 40),
    (192, 128),
    (64, 192),
    (24, 16),
];

/// The split attention kernels (causal, and a one-word tree) for heads of `d` / `dv`, four
/// query heads over two KV heads, up to `max_t` query tokens per sequence.
pub fn attention_at_dims(d: u32, dv: u32, max_t: u32) -> Vec<(String, KernelSource)> {
    let bf = Dtype::BF16;
    let (hq, hkv, m) = (4u32, 2u32, 8 * max_t);
    let mut plan = Plan::new();
    let q = plan.view(m, hq * d, bf);
    let out = plan.view(m, hq * dv, bf);
    let pos = plan.alloc(m as u64 * 4);
    let prefix_len = plan.alloc(64);
    let ancestors = plan.alloc(m as u64 * 8);
    let att = AttentionParams {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        head_dim_v: dv,
        q,
        k_cache: Loc::table(0),
        v_cache: Loc::table(1),
        cache_dtype: bf,
        pos,
        pos_dtype: Dtype::I32,
        mask: AttnMask::Causal,
        out,
        scale: 1.0 / (d as f32).sqrt(),
        max_t,
        splits: 4,
        scratch: Loc::arena(0),
    };
    let scratch = plan.alloc(att.scratch_bytes(m));
    let att = AttentionParams { scratch, ..att };
    let tree = AttentionParams {
        mask: AttnMask::Tree {
            prefix_len,
            ancestors,
            words: 1,
        },
        ..att.clone()
    };
    let mut v = Vec::new();
    for (label, p) in [("causal", att), ("tree", tree)] {
        let k = attention(&p).unwrap_or_else(|e| panic!("d {d} dv {dv} {label}: {e}"));
        v.push((format!("attention d {d} dv {dv} {label}: split"), k.split));
        v.push((
            format!("attention d {d} dv {dv} {label}: combine"),
            k.combine,
        ));
    }
    v
}
