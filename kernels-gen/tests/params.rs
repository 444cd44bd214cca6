//! Generators reject invalid parameters with typed errors naming the family and field,
//! before printing anything.

mod common;

use specc_codegen::choose::{self, attention_kernels as select, attention_tiles};
use specc_ir::engine::choice::EpilogueChoice;
use specc_kernels_gen::abi::{Dtype, Loc, Rows, View};
use specc_kernels_gen::attention::{attention, AttentionParams, AttnMask};
use specc_kernels_gen::gemv::{gemv, GemvParams, GemvWeights};
use specc_kernels_gen::gemv_mma::gemv_mma_tiled;
use specc_kernels_gen::qkv_rope::QkvRope;
use specc_kernels_gen::rope::{rope_kv, RopeKvParams, RopeStyle, RopeTable};
use specc_kernels_gen::{Error, Target};

use common::target;

/// The tensor-core matmul with the work split the build chooses for `target`.
fn gemv_mma(
    p: &GemvParams,
    target: &Target,
) -> Result<specc_kernels_gen::abi::KernelSource, Error> {
    gemv_mma_tiled(p, &choose::matmul::tiling(p, target))
}

/// Whether the build fuses RoPE + KV write into the q|k|v matmul `p` (no per-head norm).
fn select_carries_rope(p: &GemvParams, head_dim: u32, rotary_dim: u32) -> bool {
    choose::matmul::rope_epilogue(p, head_dim, rotary_dim, false, false)
        == EpilogueChoice::RopeKv { fused: true }
}

fn gemv_params() -> GemvParams {
    GemvParams {
        rows: Rows::Tokens,
        row_tile: 4,
        k: 128,
        n: 256,
        x: View::new(Loc::arena(0), Dtype::BF16, 128),
        weights: GemvWeights::Single(Loc::table(0)),
        w_dtype: Dtype::BF16,
        norm: None,
        residual: None,
        out: Some(View::new(Loc::arena(4096), Dtype::BF16, 256)),
        argmax_partials: None,
        rope: None,
    }
}

fn field_of(e: Error) -> (&'static str, &'static str) {
    match e {
        Error::Param { family, field, .. } => (family, field),
        other => panic!("expected a parameter error, got {other}"),
    }
}

#[test]
fn gemv_rejects_bad_parameters() {
    assert!(gemv(&gemv_params()).is_ok());
    let bad = |p: GemvParams| field_of(gemv(&p).unwrap_err());
    assert_eq!(
        bad(GemvParams {
            k: 100,
            ..gemv_params()
        }),
        ("gemv", "k")
    );
    assert_eq!(
        bad(GemvParams {
            row_tile: 65,
            ..gemv_params()
        }),
        ("gemv", "row_tile")
    );
    assert_eq!(
        bad(GemvParams {
            out: None,
            ..gemv_params()
        }),
        ("gemv", "out")
    );
    let misaligned = View::new(Loc::arena(2), Dtype::BF16, 128);
    assert_eq!(
        bad(GemvParams {
            x: misaligned,
            ..gemv_params()
        }),
        ("gemv", "x")
    );
    let w_i32 = GemvParams {
        w_dtype: Dtype::I32,
        ..gemv_params()
    };
    assert_eq!(bad(w_i32), ("gemv", "w_dtype"));
}

#[test]
fn gemv_tiling_fills_the_gpu_and_bounds_registers() {
    for (row_tile, n, gate_up) in [
        (1, 4096, false),
        (8, 6144, false),
        (64, 4096, false),
        (8, 14336, true),
    ] {
        let weights = if gate_up {
            GemvWeights::gate_up_concat(Loc::table(0), n, 4096, Dtype::BF16)
        } else {
            GemvWeights::Single(Loc::table(0))
        };
        let p = GemvParams {
            row_tile,
            n,
            k: 4096,
            weights,
            ..gemv_params()
        };
        let t = p.tiling();
        let accumulators = row_tile * t.cols_per_warp * if gate_up { 2 } else { 1 };
        assert!(accumulators <= 32 || t.cols_per_warp == 1, "{p:?} -> {t:?}");
        assert!(p.partials_per_row() >= 256, "{p:?} -> {t:?}");
        assert!(row_tile as u64 * t.k_chunk as u64 * 2 <= 32 * 1024, "{t:?}");
    }
}

#[test]
fn attention_rejects_bad_parameters() {
    let q = View::new(Loc::arena(0), Dtype::BF16, 4 * 32);
    let good = AttentionParams {
        q_heads: 4,
        kv_heads: 2,
        head_dim: 32,
        head_dim_v: 32,
        q,
        k_cache: Loc::table(0),
        v_cache: Loc::table(1),
        cache_dtype: Dtype::BF16,
        pos: Loc::arena(4096),
        pos_dtype: Dtype::I32,
        mask: AttnMask::Causal,
        out: q,
        scale: 0.17,
        max_t: 4,
        splits: 4,
        scratch: Loc::arena(8192),
    };
    assert!(attention(&good).is_ok());
    let bad = |p: AttentionParams| field_of(attention(&p).unwrap_err());
    assert_eq!(
        bad(AttentionParams {
            kv_heads: 3,
            ..good.clone()
        }),
        ("attn_split", "q_heads")
    );
    assert_eq!(
        bad(AttentionParams {
            head_dim: 20,
            ..good.clone()
        }),
        ("attn_split", "head_dim")
    );
    assert_eq!(
        bad(AttentionParams {
            head_dim_v: 44,
            ..good.clone()
        }),
        ("attn_split", "head_dim_v")
    );
    // Any multiple of 8 is accepted, ragged over the block's threads or not.
    for dv in [8, 48, 96, 136, 192] {
        assert!(attention(&AttentionParams {
            head_dim_v: dv,
            ..good.clone()
        })
        .is_ok());
    }
    assert_eq!(
        bad(AttentionParams {
            pos_dtype: Dtype::F32,
            ..good.clone()
        }),
        ("attn_split", "pos_dtype")
    );
    let t = good.tiling().unwrap();
    assert!(
        t.rows_per_block >= 4 * 2,
        "all T·G rows of a sequence share one block: {t:?}"
    );
}

/// Llama-3.1-8B attention (G = 4) over a tree of `max_t` nodes.
fn llama_tree(max_t: u32) -> AttentionParams {
    let q = View::new(Loc::arena(0), Dtype::BF16, 32 * 128);
    AttentionParams {
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        head_dim_v: 128,
        q,
        k_cache: Loc::table(0),
        v_cache: Loc::table(1),
        cache_dtype: Dtype::BF16,
        pos: Loc::arena(1 << 20),
        pos_dtype: Dtype::I32,
        mask: AttnMask::Tree {
            prefix_len: Loc::arena(2 << 20),
            ancestors: Loc::arena(3 << 20),
            words: max_t.div_ceil(64),
        },
        out: q,
        scale: 0.088,
        max_t,
        splits: 8,
        scratch: Loc::arena(4 << 20),
    }
}

/// `attn_tile` runs from one token per sequence (decode) on, in blocks of up to 4 warps (64
/// rows; T = 1 or 2 × G = 4 take one warp, T = 64 nodes × G = 4 take 4 row blocks).
#[test]
fn attention_selects_tiles_for_many_rows() {
    for (t, warps) in [(1, 1), (2, 1), (8, 2), (9, 3), (32, 4), (64, 4), (256, 4)] {
        let p = llama_tree(t);
        let k = select(&p, &target()).unwrap().split;
        assert!(k.name.starts_with("attn_tile"), "T = {t}: {}", k.name);
        let tl = choose::attention::tiling(&p, &target()).unwrap();
        assert_eq!(tl.warps, warps, "T = {t}");
        assert_eq!(k.launch.block[0], 32 * warps);
        assert!(
            k.launch.smem_bytes > 0,
            "q tile and K/V stages in dynamic smem"
        );
    }
    // Head dim 64 takes the tensor-core kernel at any row count too (its static + dynamic
    // shared memory exceeds the 48 KiB default: the runtime opts in).
    let d64 = |t: u32| AttentionParams {
        head_dim: 64,
        head_dim_v: 64,
        q: View::new(Loc::arena(0), Dtype::BF16, 32 * 64),
        ..llama_tree(t)
    };
    assert!(select(&d64(16), &target())
        .unwrap()
        .split
        .name
        .starts_with("attn_tile"));
    assert!(select(&d64(100), &target())
        .unwrap()
        .split
        .name
        .starts_with("attn_tile"));
    // f32 caches have no mma: the CUDA-core kernel.
    let f32_cache = AttentionParams {
        q: View::new(Loc::arena(0), Dtype::F32, 32 * 128),
        cache_dtype: Dtype::F32,
        ..llama_tree(64)
    };
    assert!(select(&f32_cache, &target())
        .unwrap()
        .split
        .name
        .starts_with("attn_split"));
    assert_eq!(
        field_of(attention_tiles(&f32_cache, &target()).unwrap_err()),
        ("attn_tile", "dtype")
    );
}

/// Decode (`attn_split`, one row per sequence) splits of the context at 1–64 sequences: the
/// fastest (or within 5 % of it) in the H200 table of session 34 (bench/NOTES.md): 6 blocks
/// a SM fit, so 3 splits fill a wave of 32 sequences and 64 sequences take 3 (two waves).
#[test]
fn attention_simt_splits_fill_whole_waves() {
    let mut p = llama_tree(1);
    p.mask = AttnMask::Causal;
    let wave = choose::attention::simt_wave(&p, &target());
    assert_eq!(wave, 6 * 132, "six 37 KiB blocks a SM");
    let at = |b: u32, ctx: u32| choose::attention::simt_splits(ctx, b, 8, wave);
    assert_eq!(
        [at(1, 1024), at(8, 1024), at(32, 1024), at(64, 1024)],
        [16, 12, 3, 3]
    );
    assert_eq!([at(8, 8192), at(32, 8192), at(64, 8192)], [12, 3, 3]);
    assert_eq!(at(1, 8192), 64, "one sequence spreads to the most splits");
    assert_eq!(at(4, 128), 2, "at most one split per 64 slots");
}

/// Decode on the tiles splits the context as the CUDA-core kernel's waves would with 6
/// blocks a SM: 3 splits at 32 and 64 sequences, 16 for one sequence at ctx 1024.
#[test]
fn attention_decode_tile_splits() {
    let mut p = llama_tree(1);
    p.mask = AttnMask::Causal;
    let at = |b: u32, ctx: u32| choose::attention::choose(&p, b, 1, ctx, &target()).unwrap();
    assert!(matches!(
        at(32, 1024).kernel,
        specc_ir::engine::choice::AttentionKernel::TensorCores(_)
    ));
    let splits = |b: u32, ctx: u32| at(b, ctx).splits;
    assert_eq!(
        [
            splits(1, 1024),
            splits(8, 8192),
            splits(32, 1024),
            splits(64, 8192)
        ],
        [16, 12, 3, 3]
    );
}

/// Splits fill one wave of resident blocks (2 per SM of the target's 132) and give each
/// split ≥ 64 slots: at ctx 1024, T = 32 / 64 / 128 nodes × G = 4 take the 16 / 8 / 4 splits
/// measured fastest (bench/NOTES.md); a long context with few rows spreads wider.
#[test]
fn attention_tile_splits_fill_one_wave() {
    let at =
        |t: u32, b: u32, ctx: u32| choose::attention::splits(&llama_tree(t), b, t, ctx, &target());
    assert_eq!(
        [at(32, 1, 1024), at(64, 1, 1024), at(128, 1, 1024)],
        [16, 8, 4]
    );
    assert_eq!(at(256, 1, 8192), 2);
    assert_eq!(at(64, 4, 1024), 2);
    assert_eq!(at(16, 1, 8192), 33);
    assert_eq!(at(16, 1, 128), 2, "at most one split per 64 slots");
    assert_eq!(at(256, 8, 1024), 1);
    // The wave is the target's: half the SMs, half the splits.
    let half = Target {
        sms: 66,
        ..target()
    };
    assert_eq!(
        choose::attention::splits(&llama_tree(32), 1, 32, 1024, &half),
        8
    );
}

#[test]
fn rope_rejects_bad_tables() {
    let q = View::new(Loc::arena(0), Dtype::BF16, 256);
    let p = RopeKvParams {
        out: QkvRope {
            q_heads: 4,
            kv_heads: 2,
            head_dim: 32,
            q_out: q,
            k_cache: Loc::table(0),
            v_cache: Loc::table(1),
            cache_dtype: Dtype::BF16,
            pos: Loc::arena(8192),
            pos_dtype: Dtype::I32,
            slots: None,
            rope: RopeTable {
                style: RopeStyle::Half,
                rotary_dim: 32,
                inv_freq: common::inv_freq(10000.0, 32),
                cos_sin_scale: 1.0,
            },
        },
        head_dim_v: 32,
        q,
        k: q.cols_from(128),
        v: q.cols_from(192),
        qk_norm: None,
    };
    assert!(rope_kv(&p).is_ok());
    let mut short = p.clone();
    short.out.rope.inv_freq.pop();
    assert_eq!(
        field_of(rope_kv(&short).unwrap_err()),
        ("rope_kv", "rope.inv_freq")
    );
    let mut nan = p.clone();
    nan.out.rope.inv_freq[3] = f32::NAN;
    assert_eq!(field_of(rope_kv(&nan).unwrap_err()), ("rope_kv", "rope"));
    let mut partial = p.clone();
    partial.out.rope.rotary_dim = 16;
    partial.out.rope.inv_freq.truncate(8);
    assert!(
        rope_kv(&partial).is_ok(),
        "partial rotary dims pass the rest through"
    );
}

/// The q|k|v GEMV with the RoPE epilogue: `n` must be the heads' width, the epilogue stores
/// alone, and head / rotary dims must fit the kernel's pair stride (1 on CUDA cores, 8 on
/// tensor cores: multiples of 16 there).
#[test]
fn gemv_rope_epilogue_rejects_bad_parameters() {
    // 4 q heads + 2 × 2 kv heads of 32 = 256 columns.
    let rope = |head_dim: u32, rotary_dim: u32| QkvRope {
        q_heads: 4,
        kv_heads: 2,
        head_dim,
        q_out: View::new(Loc::arena(1 << 16), Dtype::BF16, 128),
        k_cache: Loc::table(1),
        v_cache: Loc::table(2),
        cache_dtype: Dtype::BF16,
        pos: Loc::arena(1 << 17),
        pos_dtype: Dtype::I32,
        slots: None,
        rope: RopeTable {
            style: RopeStyle::Half,
            rotary_dim,
            inv_freq: common::inv_freq(10000.0, rotary_dim),
            cos_sin_scale: 1.0,
        },
    };
    let fused = |head_dim, rotary_dim| GemvParams {
        n: 8 * head_dim,
        out: None,
        rope: Some(rope(head_dim, rotary_dim)),
        ..gemv_params()
    };
    assert!(gemv(&fused(32, 32)).is_ok());
    assert!(gemv_mma(&fused(32, 32), &target()).is_ok());
    assert!(gemv(&fused(32, 8)).is_ok(), "partial rotary on CUDA cores");
    assert_eq!(
        field_of(gemv_mma(&fused(32, 8), &target()).unwrap_err()),
        ("gemv_mma", "rope.head_dim"),
        "rotary dims not a multiple of 16 on tensor cores"
    );
    assert_eq!(
        field_of(gemv_mma(&fused(24, 24), &target()).unwrap_err()),
        ("gemv_mma", "rope.head_dim")
    );
    // The plan asks before fusing: tiles up to 8 rows fuse (the register-fed tensor-core
    // splits), 16 rows do not, and the tensor-core kernel needs 16 | dims.
    let one_row = |head_dim, rotary_dim| GemvParams {
        row_tile: 1,
        norm: None,
        ..fused(head_dim, rotary_dim)
    };
    assert!(select_carries_rope(&one_row(32, 32), 32, 32));
    assert!(!select_carries_rope(&one_row(24, 24), 24, 24));
    assert!(select_carries_rope(&fused(32, 32), 32, 32), "4-row tile");
    assert!(
        !select_carries_rope(&fused(24, 24), 24, 24),
        "4 rows, 16 ∤ 24"
    );
    assert!(
        !select_carries_rope(
            &GemvParams {
                row_tile: 16,
                ..fused(32, 32)
            },
            32,
            32
        ),
        "16-row tile"
    );
    assert!(select_carries_rope(
        &GemvParams {
            x: View::new(Loc::arena(0), Dtype::F32, 128),
            ..one_row(24, 24)
        },
        24,
        24
    ));
    let with_out = GemvParams {
        out: gemv_params().out,
        ..fused(32, 32)
    };
    assert_eq!(field_of(gemv(&with_out).unwrap_err()), ("gemv", "rope"));
    let wrong_n = GemvParams {
        n: 200,
        ..fused(32, 32)
    };
    assert_eq!(field_of(gemv(&wrong_n).unwrap_err()), ("gemv", "n"));
    let mut short = fused(32, 32);
    short.rope.as_mut().unwrap().rope.inv_freq.pop();
    assert_eq!(
        field_of(gemv(&short).unwrap_err()),
        ("gemv", "rope.inv_freq")
    );
}
