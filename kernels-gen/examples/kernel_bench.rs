//! Times generated kernels at Llama-3.1-8B shapes on the device and prints effective HBM
//! bandwidth (bytes a kernel must move / time) against the measured copy ceiling.
//!
//! ```text
//! cargo build --release -p specc-kernels-gen --features cuda --example kernel_bench
//! # on the device: target/release/examples/kernel_bench
//! ```
//! Weights rotate through enough copies (one set of operand tables each) to exceed L2, so every run
//! streams them from HBM. Times are the mean of back-to-back launches after a warm-up.
//!
//! GEMVs run at M = 1, 8, 16, 64 on CUDA cores (`gemv`, "simt") and on tensor cores
//! (`gemv_mma`, "mma", default tiling; M = 1 included to show where it would stand), and
//! a summary adds up one Llama-3.1-8B forward's matmuls (32 layers of qkv, o, gate/up,
//! down, then the lm-head) per M and kernel; `qkv_rope` times the q|k|v projection with
//! RoPE + KV write fused in its epilogue against GEMV + `rope_kv`. `kernel_bench mma` (or `simt`, `qkv_rope`, `attention`,
//! `tree`: DDTree verify attention at T = 1, 8, 64, 256 and ctx 1024, 8192, `attn_tile`
//! against `attn_split`) runs one part only; `kernel_bench sweep` times every tensor-core work split (up to 8
//! warps per block) of the 8B GEMVs at M = 8 and prints the fastest per shape; `kernel_bench
//! wide [Ms] [bulk|xbulk] [SHAPE]` sweeps the splits of row tiles above 16 (register prefetch,
//! split-K, operands staged in shared memory; `bulk`: only the copy-engine feeds, `xbulk`: only
//! x staged by the copy engine; SHAPE: the shapes whose label contains it) as the plan runs them; `kernel_bench wide_default [SHAPE]` times
//! the plan's M = 64 kernel of the shapes whose label contains SHAPE (or the split
//! `KB_TILING=tn,wn,wk,unroll,ks[,stages[,bulk|xbulk]]` names; one kernel to put under `ncu`);
//! `kernel_bench tree_splits` times tree attention's KV splits against the cost model's.
//! `kernel_bench tree_tilings [T,..]` times every `attn_tile` block shape and split (ctx 1024).
//! `kernel_bench batch_splits` times decode and verify(8) attention of 1–64 sequences at
//! every context split (ctx 1024, 8192).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/gpu/mod.rs"]
mod gpu;

use common::Plan;
use gpu::{Gpu, Mem};
use specc_codegen::choose::matmul::tiling;
use specc_codegen::choose::{
    self, attention::simt_splits as attention_splits, attention::simt_wave,
};
use specc_kernels_gen::abi::{Bucket, Dtype, KernelSource, Loc, Rows, View};
use specc_kernels_gen::argmax::{argmax, ArgmaxInput, ArgmaxParams};
use specc_kernels_gen::attention::{
    attention, attention_tiles_tiled, AttentionKernels, AttentionParams, AttnMask,
};
use specc_kernels_gen::attention_mma;
use specc_kernels_gen::gemv::{gemv, GemvParams, GemvWeights, RmsNormPrologue};
use specc_kernels_gen::gemv_mma::{
    gemv_mma_split, partials_per_row, split_needs, Feed, MmaTiling, SplitScratch,
};
use specc_kernels_gen::qkv_rope::QkvRope;
use specc_kernels_gen::rope::{rope_kv, RopeKvParams, RopeStyle, RopeTable};

const BF: Dtype = Dtype::BF16;

/// Copy bandwidth (read + write counted) of the device's reference part, GB/s: the ceiling
/// the tables print percentages of.
fn ceiling_gbs(gpu: &Gpu) -> f64 {
    gpu.target().bytes_per_s as f64 / 1e9
}

struct Row {
    label: String,
    us: f64,
    bytes: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Simt,
    /// The default tiling, or the given one.
    Mma(Option<MmaTiling>),
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Simt => "simt",
            Variant::Mma(_) => "mma",
        }
    }
}

/// The GEMV of one bench case, its buffers allocated from `plan`.
fn case_params(plan: &mut Plan, m: u32, k: u32, n: u32, shape: Fusions) -> GemvParams {
    let (norm, gate_up, residual, am) = shape;
    let x = plan.view(m, k, BF);
    let out = plan.view(m, n, BF);
    let parts = plan.alloc(m as u64 * 8 * n as u64);
    GemvParams {
        rows: Rows::Tokens,
        row_tile: m,
        k,
        n,
        x,
        weights: if gate_up {
            GemvWeights::gate_up_concat(Loc::table(0), n, k, BF)
        } else {
            GemvWeights::Single(Loc::table(0))
        },
        w_dtype: BF,
        norm: norm.then_some(RmsNormPrologue {
            weight: Loc::table(1),
            dtype: BF,
            eps: 1e-5,
        }),
        residual: residual.then_some(out),
        out: (!am).then_some(out),
        argmax_partials: am.then_some(parts),
        rope: None,
    }
}

fn gemv_case(
    gpu: &Gpu,
    label: &str,
    m: u32,
    k: u32,
    n: u32,
    shape: Fusions,
    variant: Variant,
) -> Row {
    let g = if shape.1 { 2 } else { 1 };
    let mut plan = Plan::new();
    let p = case_params(&mut plan, m, k, n, shape);
    let mma_tiling = match variant {
        Variant::Simt => None,
        Variant::Mma(t) => Some(t.unwrap_or_else(|| tiling(&p, gpu.target()))),
    };
    let (kernel, count, split) = match mma_tiling {
        None => {
            let t = p.tiling();
            let split = format!(
                "{}w x {}c x {}kw, kc {}",
                t.warps, t.cols_per_warp, t.k_warps, t.k_chunk
            );
            (gemv(&p).unwrap(), p.partials_per_row(), split)
        }
        Some(t) => {
            let label = format!(
                "tn {} wn {} wk {} u {} ks {}{}",
                t.tn,
                t.wn,
                t.wk,
                t.unroll,
                t.ks,
                match t.feed {
                    Feed::Prefetch => String::new(),
                    Feed::XAtUse => " x@use".into(),
                    Feed::Smem { stages } => format!(" smem{stages}"),
                    Feed::Bulk { stages } => format!(" bulk{stages}"),
                    Feed::XBulk { stages } => format!(" xbulk{stages}"),
                    Feed::Tma { stages } => format!(" tma{stages}"),
                }
            );
            let scratch = split_needs(&p, &t, m).map(|nd| SplitScratch {
                partials: plan.alloc(nd.partial_bytes),
                counters: plan.alloc(nd.counters as u64 * 4),
                tiles: nd.counters,
            });
            (
                gemv_mma_split(&p, &t, scratch).unwrap(),
                partials_per_row(&p, &t),
                label,
            )
        }
    };
    let mut ks: Vec<KernelSource> = vec![kernel];
    if let Some(parts) = p.argmax_partials {
        let tok = View::new(plan.alloc(m as u64 * 4), Dtype::I32, 1);
        let input = ArgmaxInput::Partials { loc: parts, count };
        ks.push(
            argmax(&ArgmaxParams {
                rows: Rows::Tokens,
                input,
                out: tok,
            })
            .unwrap(),
        );
    }
    let wbytes = (g * n as u64 * k as u64) * 2;
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[wbytes, k as u64 * 2]);
    let mut rng = gpu::Rng::new(1);
    mem.put(p.x.loc, BF, &rng.vec((m * k) as usize, 1.0));
    let copies = (400e6 / wbytes as f64).ceil().max(2.0) as usize;
    let us = gpu.time(
        &mem,
        &ks.iter().collect::<Vec<_>>(),
        Bucket { b: 1, t: m, ctx: 1 },
        copies,
        50,
    );
    Row {
        label: format!("{} {label} M={m} [{split}]", variant.name()),
        us,
        bytes: wbytes as f64,
    }
}

/// Llama-3.1-8B's normed q|k|v projection (48 heads of 128 over K = 4096) with RoPE and the
/// KV write at M = B·T rows (B = 1, ctx 1024): the GEMV with the RoPE epilogue (`fused`),
/// or the GEMV into scratch followed by `rope_kv` (the path of per-head-norm layers). The
/// GEMV is the build's choice (`specc_codegen::choose`); bytes = the weights.
fn qkv_rope_case(gpu: &Gpu, m: u32, fused: bool) -> Row {
    let (k, hq, hkv, d, ctx) = (4096u32, 32u32, 8u32, 128u32, 1024u32);
    let n = (hq + 2 * hkv) * d;
    let mut plan = Plan::new();
    let x = plan.view(m, k, BF);
    let qkv = plan.view(m, n, BF);
    let q_out = plan.view(m, hq * d, BF);
    let pos = plan.alloc(m as u64 * 4);
    let table = RopeTable {
        style: RopeStyle::Half,
        rotary_dim: d,
        inv_freq: common::inv_freq(500000.0, d),
        cos_sin_scale: 1.0,
    };
    let mut p = GemvParams {
        rows: Rows::Tokens,
        row_tile: m,
        k,
        n,
        x,
        weights: GemvWeights::Single(Loc::table(0)),
        w_dtype: BF,
        norm: Some(RmsNormPrologue {
            weight: Loc::table(1),
            dtype: BF,
            eps: 1e-5,
        }),
        residual: None,
        out: None,
        argmax_partials: None,
        rope: None,
    };
    // The heads, destinations and rotation: the fused epilogue's, or `rope_kv`'s.
    let out = QkvRope {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        q_out,
        k_cache: Loc::table(2),
        v_cache: Loc::table(3),
        cache_dtype: BF,
        pos,
        pos_dtype: Dtype::I32,
        slots: None,
        rope: table,
    };
    let ks = if fused {
        p.rope = Some(out);
        vec![choose::matmul_kernel(&p, None, gpu.target()).unwrap()]
    } else {
        p.out = Some(qkv);
        let rope = RopeKvParams {
            out,
            head_dim_v: d,
            q: qkv,
            k: qkv.cols_from((hq * d) as u64),
            v: qkv.cols_from(((hq + hkv) * d) as u64),
            qk_norm: None,
        };
        vec![
            choose::matmul_kernel(&p, None, gpu.target()).unwrap(),
            rope_kv(&rope).unwrap(),
        ]
    };
    let wbytes = n as u64 * k as u64 * 2;
    let cache = (ctx * hkv * d) as u64 * 2;
    let mut mem = Mem::new(
        plan.alloc(0).byte_offset(),
        &[wbytes, k as u64 * 2, cache, cache],
    );
    let mut rng = gpu::Rng::new(1);
    mem.put(x.loc, BF, &rng.vec((m * k) as usize, 1.0));
    mem.put(Loc::table(1), BF, &vec![1.0; k as usize]);
    let pv: Vec<f64> = (0..m).map(|i| (500 + i) as f64).collect();
    mem.put(pos, Dtype::I32, &pv);
    let copies = (400e6 / wbytes as f64).ceil().max(2.0) as usize;
    let us = gpu.time(
        &mem,
        &ks.iter().collect::<Vec<_>>(),
        Bucket { b: 1, t: m, ctx },
        copies,
        50,
    );
    let names: Vec<&str> = ks.iter().map(|k| k.name.as_str()).collect();
    Row {
        label: format!(
            "qkv+rope {} M={m} [{}]",
            if fused { "fused" } else { "two kernels" },
            names.join(" + ")
        ),
        us,
        bytes: wbytes as f64,
    }
}

/// Causal attention of `b` sequences × `t` query rows at context `len` (Llama-3.1-8B heads)
/// with `splits` context splits, on CUDA cores (`attn_split`) or on the tensor-core tiles
/// the plan would pick (`tiles`); bytes = the K and V slots read. The caches rotate through
/// enough copies to exceed L2.
fn batch_attention_case(gpu: &Gpu, b: u32, t: u32, len: u32, tiles: bool, splits: u32) -> Row {
    let (hq, hkv, d) = (32u32, 8u32, 128u32);
    let ctx = len.next_multiple_of(64);
    let m = b * t;
    let mut plan = Plan::new();
    let q = plan.view(m, hq * d, BF);
    let out = plan.view(m, hq * d, BF);
    let pos = plan.alloc(m as u64 * 4);
    let mut p = AttentionParams {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        head_dim_v: d,
        q,
        k_cache: Loc::table(0),
        v_cache: Loc::table(1),
        cache_dtype: BF,
        pos,
        pos_dtype: Dtype::I32,
        mask: AttnMask::Causal,
        out,
        scale: 0.088,
        max_t: t,
        splits,
        scratch: Loc::arena(0),
    };
    p.scratch = plan.alloc(p.scratch_bytes(m));
    let name = if tiles { "attn_tile" } else { "attn_split" };
    let label = format!("{name} B={b} T={t} len={len} splits={splits}");
    let ks = if tiles {
        choose::attention::tiling(&p, gpu.target())
            .ok_or_else(|| "no tile fits".to_string())
            .and_then(|tl| attention_tiles_tiled(&p, tl).map_err(|e| e.to_string()))
    } else {
        attention(&p).map_err(|e| e.to_string())
    };
    let ks = match ks {
        Ok(ks) => ks,
        Err(e) => {
            return Row {
                label: format!("{label}: {e}"),
                us: f64::NAN,
                bytes: 0.0,
            }
        }
    };
    let cache = (b * ctx * hkv * d) as u64 * 2;
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[cache, cache]);
    let pv: Vec<f64> = (0..m).map(|i| (len - t + i % t) as f64).collect();
    mem.put(pos, Dtype::I32, &pv);
    let copies = (200e6 / (2 * cache) as f64).ceil().max(2.0) as usize;
    let us = gpu.time(
        &mem,
        &[&ks.split, &ks.combine],
        Bucket { b, t, ctx },
        copies,
        50,
    );
    Row {
        label,
        us,
        bytes: (b * len * hkv * d * 2 * 2) as f64,
    }
}

/// Causal Llama-3.1-8B attention parameters of `t` rows per sequence (only the shape
/// fields matter: what the choice of splits reads).
fn batch_probe(t: u32) -> AttentionParams {
    let mut plan = Plan::new();
    AttentionParams {
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        head_dim_v: 128,
        q: plan.view(t, 32 * 128, BF),
        k_cache: Loc::table(0),
        v_cache: Loc::table(1),
        cache_dtype: BF,
        pos: plan.alloc(t as u64 * 4),
        pos_dtype: Dtype::I32,
        mask: AttnMask::Causal,
        out: plan.view(t, 32 * 128, BF),
        scale: 0.088,
        max_t: t,
        splits: 1,
        scratch: Loc::arena(0),
    }
}

/// Which attention kernels a tree case runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AttnVariant {
    /// What the plan picks (`attn_tile` above 32 rows per sequence, with its splits).
    Planned,
    /// `attn_split` with the plan's splits for it (the kernel before `attn_tile`).
    Simt,
    /// `attn_tile` with p rounded once to bf16 (no hi/lo split of P).
    TileRoundedP,
    /// `attn_tile` with the given KV splits instead of the cost model's.
    TileSplits(u32),
    /// `attn_tile` with the given block shape and KV splits.
    Tiled(attention_mma::TileTiling, u32),
    /// `attn_combine` alone after `attn_tile` with the given KV splits.
    CombineOnly(u32),
}

/// Llama-3.1-8B attention (32 q heads, 8 kv heads, head dim 128) over a DDTree of `t`
/// nodes after a prefix of `ctx − t` slots, B = 1; bytes = the K and V slots read.
fn tree_attention_case(gpu: &Gpu, t: u32, ctx: u32, variant: AttnVariant) -> Row {
    let (hq, hkv, d) = (32u32, 8u32, 128u32);
    let words = t.div_ceil(64);
    let mut plan = Plan::new();
    let q = plan.view(t, hq * d, BF);
    let out = plan.view(t, hq * d, BF);
    let pos = plan.alloc(t as u64 * 4);
    let prefix_len = plan.alloc(4);
    let ancestors = plan.alloc((t * words) as u64 * 8);
    let mut p = AttentionParams {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        head_dim_v: d,
        q,
        k_cache: Loc::table(0),
        v_cache: Loc::table(1),
        cache_dtype: BF,
        pos,
        pos_dtype: Dtype::I32,
        mask: AttnMask::Tree {
            prefix_len,
            ancestors,
            words,
        },
        out,
        scale: 0.088,
        max_t: t,
        splits: 1,
        scratch: Loc::arena(0),
    };
    p.splits = attention_splits(ctx, 1, hkv, simt_wave(&p, gpu.target()));
    let tiles = variant != AttnVariant::Simt && choose::attention::uses_tiles(&p, gpu.target());
    if tiles {
        p.splits = match variant {
            AttnVariant::TileSplits(s) | AttnVariant::Tiled(_, s) | AttnVariant::CombineOnly(s) => {
                s
            }
            _ => choose::attention::splits(&p, 1, t, ctx, gpu.target()),
        };
    }
    let m = t;
    p.scratch = plan.alloc(p.scratch_bytes(m));
    let ks: AttentionKernels = match variant {
        AttnVariant::Planned | AttnVariant::TileSplits(_) | AttnVariant::CombineOnly(_) => {
            choose::attention_kernels(&p, gpu.target()).unwrap()
        }
        AttnVariant::Tiled(tl, _) => match attention_tiles_tiled(&p, tl) {
            Ok(ks) => ks,
            Err(e) => {
                return Row {
                    label: format!("attn_tile tree T={t} ctx={ctx} {tl:?}: {e}"),
                    us: f64::NAN,
                    bytes: 0.0,
                }
            }
        },
        AttnVariant::Simt => attention(&p).unwrap(),
        AttnVariant::TileRoundedP => {
            let tl = choose::attention::tiling(&p, gpu.target()).unwrap();
            attention_tiles_tiled(
                &p,
                attention_mma::TileTiling {
                    split_p: false,
                    ..tl
                },
            )
            .unwrap()
        }
    };
    let cache = (ctx * hkv * d) as u64 * 2;
    let mut mem = Mem::new(plan.alloc(0).byte_offset(), &[cache, cache]);
    let prefix = ctx - t;
    let pv: Vec<f64> = (0..t).map(|i| (prefix + i) as f64).collect();
    mem.put(pos, Dtype::I32, &pv);
    mem.put(prefix_len, Dtype::I32, &[prefix as f64]);
    // A chain: node i sees nodes 0..=i (bits below 2^53 survive the f64 staging).
    let av: Vec<f64> = (0..t)
        .flat_map(|i| {
            (0..words).map(move |w| {
                let lo = 64 * w;
                let n = (i + 1).saturating_sub(lo).min(52);
                ((1u64 << n) - 1) as f64
            })
        })
        .collect();
    mem.put(ancestors, Dtype::I64, &av);
    let copies = (200e6 / (2 * cache) as f64).ceil().max(2.0) as usize;
    let bucket = Bucket { b: 1, t, ctx };
    let kernels: Vec<&KernelSource> = match variant {
        AttnVariant::CombineOnly(_) => vec![&ks.combine],
        _ => vec![&ks.split, &ks.combine],
    };
    let us = gpu.time(&mem, &kernels, bucket, copies, 50);
    let name = match variant {
        AttnVariant::Planned | AttnVariant::TileSplits(_) if tiles => "attn_tile",
        AttnVariant::Planned | AttnVariant::TileSplits(_) | AttnVariant::Simt => "attn_split",
        AttnVariant::TileRoundedP => "attn_tile (rounded P)",
        AttnVariant::Tiled(..) => "attn_tile (tiled)",
        AttnVariant::CombineOnly(_) => "attn_combine alone",
    };
    let shape = match variant {
        AttnVariant::Tiled(tl, _) => format!(" w{} ts{}", tl.warps, tl.tile_slots),
        _ => String::new(),
    };
    let kernel = match variant {
        AttnVariant::CombineOnly(_) => &ks.combine.name,
        _ => &ks.split.name,
    };
    Row {
        label: format!(
            "{name} tree T={t} ctx={ctx} splits={}{shape} [{kernel}]",
            p.splits
        ),
        us,
        bytes: (ctx * hkv * d * 2 * 2) as f64,
    }
}

/// The comma-separated counts of command-line argument `n` (`what` names them in the panic
/// on a bad one); 64 when absent.
fn counts_arg(n: usize, what: &str) -> Vec<u32> {
    std::env::args().nth(n).map_or(vec![64], |a| {
        a.split(',')
            .map(|c| c.parse().unwrap_or_else(|_| panic!("{what}: {a:?}")))
            .collect()
    })
}

/// `attn_tile` at T nodes × G = 4 rows over `ctx` slots: blocks of 4 / 8 / 16 warps,
/// tiles of 16 / 32 / 64 slots, 1..16 KV splits (each with `attn_combine`); the plan's
/// first, then the ten fastest, then the combine alone per split count.
fn sweep_tree_tilings(gpu: &Gpu, t: u32, ctx: u32) {
    println!("\nattn_tile block shapes, T = {t}, ctx = {ctx} (plan first, then the fastest):");
    let planned = tree_attention_case(gpu, t, ctx, AttnVariant::Planned);
    let mut rows = Vec::new();
    for warps in [4u32, 8, 16] {
        if 16 * warps > (4 * t).next_multiple_of(64) {
            continue;
        }
        for tile_slots in [16u32, 32, 64] {
            let tl = attention_mma::TileTiling {
                warps,
                tile_slots,
                split_p: true,
                slot_warps: 1,
            };
            for s in [1u32, 2, 4, 8, 16] {
                rows.push(tree_attention_case(gpu, t, ctx, AttnVariant::Tiled(tl, s)));
            }
        }
    }
    rows.retain(|r| r.us.is_finite());
    rows.sort_by(|a, b| a.us.total_cmp(&b.us));
    rows.truncate(10);
    rows.insert(0, planned);
    for s in [4u32, 8, 16] {
        rows.push(tree_attention_case(
            gpu,
            t,
            ctx,
            AttnVariant::CombineOnly(s),
        ));
    }
    print_rows(gpu, &rows);
}

/// Fusions of a GEMV case: (norm, gate_up, residual, argmax).
type Fusions = (bool, bool, bool, bool);

/// The Llama-3.1-8B matmul groups: (label, K, N, fusions, launches per forward).
const LLAMA_8B_GEMVS: [(&str, u32, u32, Fusions, u32); 5] = [
    ("qkv +norm", 4096, 6144, (true, false, false, false), 32),
    ("o_proj +res", 4096, 4096, (false, false, true, false), 32),
    (
        "gate_up +norm +silu",
        4096,
        14336,
        (true, true, false, false),
        32,
    ),
    ("down +res", 14336, 4096, (false, false, true, false), 32),
    (
        "lm_head +norm +argmax",
        4096,
        128256,
        (true, false, false, true),
        1,
    ),
];

fn print_rows(gpu: &Gpu, rows: &[Row]) {
    let ceiling = ceiling_gbs(gpu);
    println!(
        "{:<64} {:>10} {:>10} {:>8}",
        "kernel", "us", "GB/s", "% ceil"
    );
    for r in rows {
        let gbs = r.bytes / r.us / 1e3;
        println!(
            "{:<64} {:>10.1} {:>10.0} {:>7.1}%",
            r.label,
            r.us,
            gbs,
            100.0 * gbs / ceiling
        );
    }
}

fn main() {
    let Some(gpu) = Gpu::new() else { return };
    let only = std::env::args().nth(1);
    let want = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let t = gpu.target();
    println!(
        "device {} ({}, {} SMs, {} KiB smem per block); ceiling {} GB/s (copy)",
        t.device,
        gpu.arch(),
        t.sms,
        t.smem_per_block / 1024,
        ceiling_gbs(&gpu)
    );
    let mut summary = Vec::new();
    for variant in [Variant::Simt, Variant::Mma(None)] {
        if !want(variant.name()) {
            continue;
        }
        let mut rows = Vec::new();
        for m in [1, 8, 16, 64] {
            let (mut forward_us, mut forward_bytes) = (0.0, 0.0);
            for (label, k, n, shape, per_forward) in LLAMA_8B_GEMVS {
                let r = gemv_case(&gpu, label, m, k, n, shape, variant);
                forward_us += r.us * per_forward as f64;
                forward_bytes += r.bytes * per_forward as f64;
                rows.push(r);
            }
            summary.push((variant, m, forward_us, forward_bytes));
        }
        print_rows(&gpu, &rows);
    }
    if want("qkv_rope") {
        let mut rows = Vec::new();
        for m in [1, 8, 16, 64] {
            rows.push(qkv_rope_case(&gpu, m, false));
            rows.push(qkv_rope_case(&gpu, m, true));
        }
        print_rows(&gpu, &rows);
    }
    if want("attention") {
        let mut rows = Vec::new();
        for (b, t) in [(1, 1), (1, 8), (4, 8)] {
            rows.push(batch_attention_case(&gpu, b, t, 1024, false, 16));
            rows.push(batch_attention_case(&gpu, b, t, 4000, false, 32));
        }
        print_rows(&gpu, &rows);
    }
    if want("attention") || only.as_deref() == Some("tree") {
        println!("\nDDTree verify attention, Llama-3.1-8B shapes (GB/s: K and V bytes / time):");
        let mut rows = Vec::new();
        for ctx in [1024, 8192] {
            for t in [1, 8, 64, 256] {
                rows.push(tree_attention_case(&gpu, t, ctx, AttnVariant::Planned));
                if t >= 64 {
                    rows.push(tree_attention_case(&gpu, t, ctx, AttnVariant::TileRoundedP));
                    rows.push(tree_attention_case(&gpu, t, ctx, AttnVariant::Simt));
                }
            }
        }
        print_rows(&gpu, &rows);
    }
    if only.as_deref() == Some("wide_default") {
        // `kernel_bench wide_default [SHAPE]`: the plan's kernel of each 8B matmul at M = 64
        // (those whose label contains SHAPE), e.g. one kernel to profile; `KB_TILING=tn,wn,
        // wk,unroll,ks[,stages]` times that split instead (stages: operands staged in smem).
        let filter = std::env::args().nth(2).unwrap_or_default();
        let mut rows = Vec::new();
        for (label, k, n, shape, _) in LLAMA_8B_GEMVS {
            if label.contains(&filter) {
                let shape = (false, shape.1, shape.2, shape.3);
                rows.push(gemv_case(
                    &gpu,
                    label,
                    64,
                    k,
                    n,
                    shape,
                    Variant::Mma(env_tiling()),
                ));
            }
        }
        print_rows(&gpu, &rows);
    }
    if only.as_deref() == Some("tree_splits") {
        // `kernel_bench tree_splits`: the cost model's KV splits against fixed ones.
        println!("\nDDTree verify attention, KV splits (cost model first):");
        for (t, ctx) in [(64, 1024), (256, 1024), (64, 8192)] {
            let mut rows = vec![tree_attention_case(&gpu, t, ctx, AttnVariant::Planned)];
            for s in [1, 2, 4, 8, 16, 32] {
                rows.push(tree_attention_case(
                    &gpu,
                    t,
                    ctx,
                    AttnVariant::TileSplits(s),
                ));
            }
            print_rows(&gpu, &rows);
        }
    }
    if only.as_deref() == Some("batch_splits") {
        // `kernel_bench batch_splits`: decode (T = 1, `attn_split`) and verify (T = 8,
        // `attn_tile`) attention of many sequences at every context split, the plan's first.
        for (t, tiles) in [(1, false), (1, true), (8, true)] {
            for len in [1024, 8192] {
                for b in [1, 8, 32, 64] {
                    let planned = if tiles {
                        let p = batch_probe(t);
                        choose::attention::splits(&p, b, t, len, gpu.target())
                    } else {
                        let p = batch_probe(t);
                        attention_splits(len, b, 8, simt_wave(&p, gpu.target()))
                    };
                    let mut rows = vec![batch_attention_case(&gpu, b, t, len, tiles, planned)];
                    for s in [1, 2, 3, 4, 6, 8, 12, 16, 32] {
                        if s != planned && s * 64 <= len {
                            rows.push(batch_attention_case(&gpu, b, t, len, tiles, s));
                        }
                    }
                    print_rows(&gpu, &rows);
                }
            }
        }
    }
    if only.as_deref() == Some("tree_tilings") {
        // `kernel_bench tree_tilings [T,..]`: every attn_tile block shape and KV split at
        // ctx 1024 (default T = 64), the fastest ten after the plan's, and the combine alone.
        for t in counts_arg(2, "node counts") {
            sweep_tree_tilings(&gpu, t, 1024);
        }
    }
    if only.as_deref() == Some("sweep") {
        sweep(&gpu);
    }
    if only.as_deref() == Some("tma") {
        // `kernel_bench tma [Ms] [SHAPE]`: the tensor-map splits (default M = 16, 64).
        let ms = std::env::args()
            .nth(2)
            .map_or(vec![16, 64], |_| counts_arg(2, "row counts"));
        let filter = std::env::args().nth(3).unwrap_or_default();
        sweep_tma(&gpu, &ms, &filter);
    }
    if only.as_deref() == Some("wide") {
        // `kernel_bench wide 1,8,64`: the row counts to sweep (default 64).
        let ms = counts_arg(2, "row counts");
        // A third argument `bulk` sweeps the copy-engine splits only (`xbulk`: the x-staged
        // ones only); a fourth keeps the shapes whose label contains it.
        let feeds = std::env::args().nth(3).unwrap_or_default();
        let filter = std::env::args().nth(4).unwrap_or_default();
        sweep_wide(&gpu, &ms, &feeds, &filter);
    }
    if !summary.is_empty() {
        println!("\nLlama-3.1-8B forward, matmuls only (sum of the kernels above, launch gaps excluded):");
        println!(
            "{:<8} {:>4} {:>10} {:>10} {:>8}",
            "kernel", "M", "ms", "GB/s", "% ceil"
        );
        for (variant, m, us, bytes) in summary {
            let gbs = bytes / us / 1e3;
            println!(
                "{:<8} {m:>4} {:>10.3} {gbs:>10.0} {:>7.1}%",
                variant.name(),
                us / 1e3,
                100.0 * gbs / ceiling_gbs(&gpu)
            );
        }
    }
}

/// Tensor-core work splits incl. K split across blocks, at the given row counts (default
/// M = 64, tree verify), per 8B shape: the default tiling first, then the fastest
/// (`bulk_only`: the row-staged splits only).
fn sweep_wide(gpu: &Gpu, ms: &[u32], feeds: &str, filter: &str) {
    let bulk_only = feeds == "bulk" || feeds == "xbulk";
    for &m in ms {
        for (label, k, n, shape, _) in LLAMA_8B_GEMVS {
            if !label.contains(filter) {
                continue;
            }
            // As the plan runs it: above NORM_FUSED_MAX_ROWS rows x arrives normalised.
            let shape = (
                shape.0 && m <= choose::matmul::NORM_FUSED_MAX_ROWS,
                shape.1,
                shape.2,
                shape.3,
            );
            let mut rows = vec![gemv_case(gpu, label, m, k, n, shape, Variant::Mma(None))];
            let (g, tn_max) = if shape.1 { (2, 1) } else { (1, 2) };
            let tns: Vec<u32> = (1..=tn_max).collect();
            let wide = [(8, 1), (4, 2), (2, 4), (1, 8)];
            let mut tilings = Vec::new();
            if !bulk_only {
                tilings = splits(&tns, &wide, &[2, 3], &[1, 2], Feed::Prefetch);
                let staged = Feed::Smem { stages: 4 };
                tilings.extend(splits(&[1, 2], &wide[..2], &[1, 2], &[1, 2, 4], staged));
            }
            tilings.extend(xbulk_splits(
                gpu,
                &case_params(&mut Plan::new(), m, k, n, shape),
                &tns,
            ));
            if feeds != "xbulk" {
                tilings.extend(bulk_splits(
                    gpu,
                    &case_params(&mut Plan::new(), m, k, n, shape),
                    &tns,
                ));
            }
            // Split-K only where the column blocks leave SMs idle.
            let sms = gpu.target().sms;
            tilings.retain(|t| t.ks == 1 || n.div_ceil(16 * t.tn * t.wn) * g < sms);
            let p = case_params(&mut Plan::new(), m, k, n, shape);
            for t in tilings {
                if choose::matmul::fits(&p, &t, gpu.target()) {
                    rows.push(gemv_case(gpu, label, m, k, n, shape, Variant::Mma(Some(t))));
                }
            }
            rows[1..].sort_by(|a, b| a.us.total_cmp(&b.us));
            println!(
                "\nwide sweep {label} M={m} (norm fused: {}; default, then fastest first):",
                shape.0
            );
            print_rows(gpu, &rows[..rows.len().min(7)]);
        }
    }
}

/// Tensor-map splits ([`Feed::Tma`]) per 8B shape (x normalised beforehand, as the plan runs
/// row tiles above 8): the default first, then the fastest of 4 or 8 consumer warps, K split
/// 1–8 ways, 3, 4 or 6 stages where they fit the device's blocks.
fn sweep_tma(gpu: &Gpu, ms: &[u32], filter: &str) {
    for &m in ms {
        for (label, k, n, shape, _) in LLAMA_8B_GEMVS {
            if !label.contains(filter) {
                continue;
            }
            let shape = (false, shape.1, shape.2, shape.3);
            let p = case_params(&mut Plan::new(), m, k, n, shape);
            let mut rows = vec![gemv_case(gpu, label, m, k, n, shape, Variant::Mma(None))];
            for wn in [8, 4] {
                for ks in [1, 2, 4, 8] {
                    for stages in [3, 4, 6] {
                        let t = MmaTiling {
                            tn: 1,
                            wn,
                            wk: 1,
                            unroll: 1,
                            feed: Feed::Tma { stages },
                            ks,
                        };
                        let blocks = column_blocks(&p, &t) as u64 / if shape.1 { 2 } else { 1 };
                        let few = blocks * (ks as u64) < 512 || ks == 1;
                        if few && choose::matmul::fits(&p, &t, gpu.target()) {
                            rows.push(gemv_case(gpu, label, m, k, n, shape, Variant::Mma(Some(t))));
                        }
                    }
                }
            }
            rows[1..].sort_by(|a, b| a.us.total_cmp(&b.us));
            println!("\ntma sweep {label} M={m} (default, then fastest first):");
            print_rows(gpu, &rows[..rows.len().min(6)]);
        }
    }
}

/// Column blocks of a split (per matrix pair for gate/up, as the K-split filters count them).
fn column_blocks(p: &GemvParams, t: &MmaTiling) -> u32 {
    let g = if matches!(p.weights, GemvWeights::GateUp { .. }) {
        2
    } else {
        1
    };
    p.n.div_ceil(16 * t.tn * t.wn) * g
}

/// Row-staged (bulk copy) splits: per block shape, 3 stages and the deepest ring (≤ 8) that
/// fits the device's blocks (where K allows the chunks), K split across blocks while the
/// column blocks leave SMs idle twice over.
fn bulk_splits(gpu: &Gpu, p: &GemvParams, tns: &[u32]) -> Vec<MmaTiling> {
    let two_per_sm = 2 * gpu.target().sms;
    let mut out = Vec::new();
    for t in splits(
        tns,
        &[(2, 4), (4, 2), (1, 8), (2, 2)],
        &[1, 2],
        &[1, 2, 4],
        Feed::Prefetch,
    ) {
        if t.ks > 1 && column_blocks(p, &t) >= two_per_sm {
            continue;
        }
        let bulk = |stages| MmaTiling {
            feed: Feed::Bulk { stages },
            ..t
        };
        if let Some(deepest) = (2..=8)
            .rev()
            .find(|&s| choose::matmul::fits(p, &bulk(s), gpu.target()))
        {
            let mut depths = vec![deepest.min(3), deepest];
            depths.dedup();
            out.extend(depths.into_iter().map(bulk));
        }
    }
    out
}

/// x-staged (bulk copy) splits with weights prefetched 2, 4 or 8 units deep per warp, 2 and 3
/// stages, K split across blocks while the column blocks leave SMs idle twice over; those
/// whose block fits the device.
fn xbulk_splits(gpu: &Gpu, p: &GemvParams, tns: &[u32]) -> Vec<MmaTiling> {
    let two_per_sm = 2 * gpu.target().sms;
    let mut candidates = splits(
        tns,
        &[(8, 1), (4, 2), (2, 4), (1, 8)],
        &[2, 4, 8],
        &[1, 2, 4],
        Feed::Prefetch,
    );
    // More weight bytes in flight per SM: 4-warp blocks (several resident per SM), 16 units
    // per warp, K split 8 ways.
    candidates.extend(splits(
        tns,
        &[(4, 1), (2, 2)],
        &[8, 16],
        &[1, 2, 4, 8],
        Feed::Prefetch,
    ));
    candidates.extend(splits(
        tns,
        &[(8, 1), (4, 2)],
        &[16],
        &[1, 2, 4, 8],
        Feed::Prefetch,
    ));
    candidates.extend(splits(tns, &[(8, 1), (4, 2)], &[8], &[8], Feed::Prefetch));
    let mut out = Vec::new();
    for t in candidates {
        if t.ks > 1 && column_blocks(p, &t) >= two_per_sm {
            continue;
        }
        for stages in [2, 3] {
            let x = MmaTiling {
                feed: Feed::XBulk { stages },
                ..t
            };
            if choose::matmul::fits(p, &x, gpu.target()) {
                out.push(x);
            }
        }
    }
    out
}

/// Every combination of the given tiles per warp, (warps across N, warps across K), units
/// in flight and K splits, with one feed.
fn splits(
    tns: &[u32],
    wnk: &[(u32, u32)],
    unrolls: &[u32],
    kss: &[u32],
    feed: Feed,
) -> Vec<MmaTiling> {
    let mut out = Vec::new();
    for &tn in tns {
        for &(wn, wk) in wnk {
            for &unroll in unrolls {
                for &ks in kss {
                    out.push(common::mma_split((tn, wn, wk, unroll, ks), feed));
                }
            }
        }
    }
    out
}

/// The split `KB_TILING=tn,wn,wk,unroll,ks[,stages[,bulk|xbulk]]` names (`None` when unset);
/// a seventh field `bulk` stages rows with the copy engine ([`Feed::Bulk`]), `xbulk` x rows
/// only ([`Feed::XBulk`]).
fn env_tiling() -> Option<MmaTiling> {
    let spec = std::env::var("KB_TILING").ok()?;
    let (bulk, xbulk) = (spec.ends_with(",bulk"), spec.ends_with(",xbulk"));
    let tma = spec.ends_with(",tma");
    let v: Vec<u32> = spec
        .trim_end_matches(",bulk")
        .trim_end_matches(",xbulk")
        .trim_end_matches(",tma")
        .split(',')
        .map(|x| x.parse().expect("KB_TILING: comma-separated integers"))
        .collect();
    Some(MmaTiling {
        tn: v[0],
        wn: v[1],
        wk: v[2],
        unroll: v[3],
        ks: v[4],
        feed: match v.get(5) {
            Some(&stages) if bulk => Feed::Bulk { stages },
            Some(&stages) if xbulk => Feed::XBulk { stages },
            Some(&stages) if tma => Feed::Tma { stages },
            Some(&stages) => Feed::Smem { stages },
            None => Feed::Prefetch,
        },
    })
}

/// Every `gemv_mma` work split with at most 8 warps per block, at M = 8, per 8B shape.
fn sweep(gpu: &Gpu) {
    for (label, k, n, shape, _) in LLAMA_8B_GEMVS {
        let mut rows = Vec::new();
        for tn in [1, 2] {
            for wn in [1, 2, 4] {
                for wk in [1, 2, 4, 8] {
                    for unroll in [2, 4] {
                        if wn * wk > 8 || wn * wk < 2 {
                            continue;
                        }
                        let t = MmaTiling {
                            tn,
                            wn,
                            wk,
                            unroll,
                            feed: Feed::Prefetch,
                            ks: 1,
                        };
                        rows.push(gemv_case(gpu, label, 8, k, n, shape, Variant::Mma(Some(t))));
                    }
                }
            }
        }
        rows.sort_by(|a, b| a.us.total_cmp(&b.us));
        println!("\nsweep {label} M=8 (fastest first):");
        print_rows(gpu, &rows[..rows.len().min(8)]);
    }
}
