//! The tensor-core GEMV (`gemv_mma`) compiled by NVRTC for every supported architecture at
//! the tiny-Llama and Llama-3.1-8B fixture shapes (every fusion) and at row tiles
//! 2..=64: no spills, no local memory, registers within the launch bound's budget.
//!
//! Skips with a printed reason when NVRTC is absent, unless `SPECC_REQUIRE_NVRTC=1`.

mod common;

use specc_codegen::choose::matmul::tiling;
use specc_kernels_gen::abi::{Dtype, KernelSource, Loc, Rows, View};
use specc_kernels_gen::gemv::{GemvParams, GemvWeights, RmsNormPrologue};
use specc_kernels_gen::gemv_mma::{
    gemv_mma_alloc, gemv_mma_split, split_needs, Feed, MmaTiling, SplitScratch,
};
use specc_kernels_gen::qkv_rope::QkvRope;
use specc_kernels_gen::rope::{RopeStyle, RopeTable};
use specc_kernels_gen::{Arch, Nvrtc, Target};

/// Local memory of CUDA's double-precision trig argument reduction (5 × u64).
const TRIG_REDUCTION_BYTES: u32 = 40;

/// Llama-3.1-8B gate/up (+norm +silu) and lm-head (+norm +argmax) at row tile `m`.
fn row_tile_params(m: u32) -> Vec<(&'static str, GemvParams)> {
    let bf = Dtype::BF16;
    let (h, f, v) = (4096u32, 14336u32, 128256u32);
    let x = View::new(Loc::arena(0), bf, h as u64);
    let out = View::new(Loc::arena(1 << 20), bf, f as u64);
    let base = GemvParams {
        rows: Rows::Tokens,
        row_tile: m,
        k: h,
        n: f,
        x,
        weights: GemvWeights::gate_up_concat(Loc::table(0), f, h, bf),
        w_dtype: bf,
        norm: Some(RmsNormPrologue {
            weight: Loc::table(1),
            dtype: bf,
            eps: 1e-5,
        }),
        residual: None,
        out: Some(out),
        argmax_partials: None,
        rope: None,
    };
    let lm = GemvParams {
        n: v,
        weights: GemvWeights::Single(Loc::table(2)),
        out: None,
        argmax_partials: Some(Loc::arena(1 << 24)),
        ..base.clone()
    };
    // q|k|v (32 + 2·8 heads of 128) with the RoPE + KV-write epilogue.
    let qkv_rope = GemvParams {
        n: 48 * 128,
        weights: GemvWeights::Single(Loc::table(3)),
        out: None,
        rope: Some(QkvRope {
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            q_out: View::new(Loc::arena(1 << 22), bf, 32 * 128),
            k_cache: Loc::table(4),
            v_cache: Loc::table(5),
            cache_dtype: bf,
            pos: Loc::arena(1 << 23),
            pos_dtype: Dtype::I32,
            slots: None,
            rope: RopeTable {
                style: RopeStyle::Half,
                rotary_dim: 128,
                inv_freq: common::inv_freq(500000.0, 128),
                cos_sin_scale: 1.0,
            },
        }),
        ..base.clone()
    };
    vec![
        ("gate_up", base),
        ("lm_head", lm),
        ("qkv +rope_kv", qkv_rope),
    ]
}

/// The default kernel of each [`row_tile_params`] fixture on a target of `arch` alone (the
/// tiling that target chooses), its split-K scratch (if any) allocated past the fixtures'
/// buffers.
fn row_tile_cases(m: u32, arch: Arch) -> Vec<(String, KernelSource)> {
    row_tile_params(m)
        .into_iter()
        .map(|(l, p)| {
            let t = tiling(&p, &Target::for_archs(&[arch]));
            let mut next = 1u64 << 26;
            let alloc = |b: u64| {
                let at = next;
                next += b.next_multiple_of(256);
                Loc::arena(at)
            };
            (
                format!("{l} M={m} {t:?}"),
                gemv_mma_alloc(&p, &t, m, alloc).unwrap(),
            )
        })
        .collect()
}

/// K split across blocks (no default tiling does it; the benchmarks sweep it): every
/// [`row_tile_params`] fixture at 8 and 64 rows with 4 splits.
fn split_k_cases() -> Vec<(String, KernelSource)> {
    let mut out = Vec::new();
    for m in [8, 64] {
        for (l, p) in row_tile_params(m) {
            let t = MmaTiling {
                ks: 4,
                ..tiling(&p, &common::target())
            };
            let needs = split_needs(&p, &t, m).expect("ks > 1 needs scratch");
            let scratch = SplitScratch {
                partials: Loc::arena(1 << 26),
                counters: Loc::arena(1 << 25),
                tiles: needs.counters,
            };
            let k = gemv_mma_split(&p, &t, Some(scratch)).unwrap();
            out.push((format!("split-K {l} M={m} {t:?}"), k));
        }
    }
    out
}

/// The kernel of split `t` over `m` rows, with split-K scratch where `t` asks for it.
fn with_split_scratch(p: &GemvParams, t: &MmaTiling, m: u32) -> KernelSource {
    let scratch = split_needs(p, t, m).map(|nd| SplitScratch {
        partials: Loc::arena(1 << 26),
        counters: Loc::arena(1 << 25),
        tiles: nd.counters,
    });
    gemv_mma_split(p, t, scratch).unwrap()
}

/// Operands staged in shared memory ([`Feed::Smem`], 4 stages), one K range
/// and split across blocks, for every [`row_tile_params`] fixture at 9, 40 and 64 rows.
fn staged_cases() -> Vec<(String, KernelSource)> {
    let mut out = Vec::new();
    for m in [9, 40, 64] {
        // The RoPE epilogue is fused only at one row, where no default uses this feed.
        for (l, p) in row_tile_params(m)
            .into_iter()
            .filter(|(_, p)| p.rope.is_none())
        {
            for (tn, wn, wk, unroll, ks) in [(1, 4, 2, 1, 1), (2, 2, 2, 1, 2)] {
                let t = MmaTiling {
                    tn,
                    wn,
                    wk,
                    unroll,
                    feed: Feed::Smem { stages: 4 },
                    ks,
                };
                let k = with_split_scratch(&p, &t, m);
                out.push((format!("staged {l} M={m} {t:?}"), k));
            }
        }
    }
    out
}

/// Rows staged by the copy engine ([`Feed::Bulk`], [`Feed::XBulk`], [`Feed::Tma`]): x arrives normalised (no fused norm, as
/// the plan runs row tiles above 16), one K range and split across blocks, 9, 40, 64 rows.
fn bulk_cases() -> Vec<(String, KernelSource)> {
    let mut out = Vec::new();
    for m in [9, 40, 64] {
        for (l, mut p) in row_tile_params(m)
            .into_iter()
            .filter(|(_, p)| p.rope.is_none())
        {
            p.norm = None;
            let mut cases = vec![
                common::mma_split((2, 2, 4, 1, 2), Feed::Bulk { stages: 2 }),
                common::mma_split((1, 4, 2, 4, 2), Feed::XBulk { stages: 2 }),
                common::mma_split((1, 8, 1, 1, 1), Feed::Tma { stages: 4 }),
                common::mma_split((1, 4, 1, 1, 2), Feed::Tma { stages: 3 }),
            ];
            // The default split where it stages x (above 16 rows).
            cases.extend(
                Some(tiling(&p, &common::target()))
                    .filter(|t| matches!(t.feed, Feed::XBulk { .. })),
            );
            for t in cases {
                let k = with_split_scratch(&p, &t, m);
                out.push((format!("bulk {l} M={m} {t:?}"), k));
            }
        }
    }
    out
}

#[test]
fn gemv_mma_compiles_for_every_arch_without_spills() {
    let Some(nvrtc) = Nvrtc::or_skip() else {
        return;
    };
    // (label, kernel, the one arch it is compiled for, or every arch)
    let mut jobs: Vec<(String, KernelSource, Option<Arch>)> = Vec::new();
    let everywhere = |cases: Vec<(String, KernelSource)>| {
        cases
            .into_iter()
            .map(|(l, k)| (l, k, None))
            .collect::<Vec<_>>()
    };
    for shape in [common::TINY, common::LLAMA_8B] {
        for (label, k) in common::all_kernels(&shape) {
            if label.starts_with("gemv_mma") {
                jobs.push((format!("{} / {label}", shape.name), k, None));
            }
        }
    }
    for m in [1, 2, 3, 8, 9, 16, 24, 33, 40, 48, 56, 64] {
        for arch in Arch::ALL {
            for (l, k) in row_tile_cases(m, arch) {
                jobs.push((l, k, Some(arch)));
            }
        }
    }
    jobs.extend(everywhere(split_k_cases()));
    jobs.extend(everywhere(staged_cases()));
    jobs.extend(everywhere(bulk_cases()));
    let mut failures = Vec::new();
    println!(
        "{:<70} {:<8} {:>5} {:>7} {:>6} {:>7}",
        "fixture", "arch", "regs", "spill B", "smem", "threads"
    );
    for (label, k, only) in &jobs {
        for arch in Arch::ALL {
            if only.is_some_and(|a| a != arch) {
                continue;
            }
            match nvrtc.compile(k, arch) {
                Ok(c) => {
                    let s = c.stats;
                    let threads = k.launch.threads();
                    println!(
                        "{label:<70} {arch:<8} {:>5} {:>7} {:>6} {threads:>7}",
                        s.registers,
                        s.spill_stores + s.spill_loads,
                        s.smem_bytes
                    );
                    // The RoPE epilogue's f64 sincos keeps the 40-byte local array of its
                    // large-argument reduction (never taken at real positions): the only
                    // stack frame allowed.
                    // The x-staged gate/up default keeps 8 units of both matrices in flight
                    // (128 registers of weights): sm_120's allocator spills one 8-byte value
                    // at 255 registers, sm_90a / sm_100a none. Allowed there only.
                    // The tensor-map feed gets an 8-byte stack frame from sm_120's allocator
                    // at some row tiles (no spills), none on sm_90a / sm_100a.
                    let tma_feed = k.kernel.contains("tma_load_2d(st");
                    let sm120_gate_up_spill = arch == Arch::Sm120
                        && ((label.starts_with("bulk gate_up") && label.contains("XBulk"))
                            || tma_feed)
                        && s.spill_stores <= 8
                        && s.stack_bytes <= 8;
                    let stack_ok = s.stack_bytes == 0
                        || (label.contains("rope_kv") && s.stack_bytes <= TRIG_REDUCTION_BYTES)
                        || sm120_gate_up_spill;
                    let spill_ok = s.spill_stores + s.spill_loads == 0 || sm120_gate_up_spill;
                    if !spill_ok || !stack_ok {
                        failures.push(format!("{label} [{arch}]: spills or stack: {s:?}"));
                    }
                    if s.registers * threads > 65536 {
                        failures.push(format!("{label} [{arch}]: {} registers", s.registers));
                    }
                }
                Err(e) => failures.push(format!("{label} [{arch}]: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
