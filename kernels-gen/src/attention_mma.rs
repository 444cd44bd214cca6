//! `attn_tile`: split-context attention on tensor cores for many query rows per sequence
//! (verify, drafter blocks and trees: T = 2..256 tokens × G query heads per kv head), FlashAttention-2 style.
//! Same parameters, masks, numerics and partials layout as [`crate::attention`]; its
//! `attn_combine` merges the splits. The plan picks it through [`crate::attention::select`]
//! from two tokens per sequence (`specc_codegen::choose::attention`; decode keeps the CUDA-core kernel).
//!
//! Grid `(row blocks, kv_heads · splits, B)`; a block of `NW` warps owns `RB = 16 · NW` query
//! rows `(t, g)` of one sequence (row `r = t · G + g`), one kv head and one context split.
//! Warp `w` owns rows `16w..16w + 15` (the m16 side of `mma.sync.m16n8k16`). Each K/V tile
//! of `TS` slots is copied into shared memory once per block (`cp.async`, 16-byte chunks,
//! double-buffered: tile `i + 1` loads while tile `i` is computed) and every warp computes
//! `S = Q·Kᵀ` (Q from shared memory, `ldmatrix`), masks, the online softmax (log2 domain,
//! per row, f32) and `O += P·V` (`ldmatrix.trans` for V) against it: every row of the block
//! reads each tile from shared memory, none from global memory a second time.
//!
//! Block shape: blocks of 4 warps (64 rows) with 64-slot tiles (measured fastest for trees
//! of 32–128 nodes, against 8- and 16-warp blocks of 16–32-slot tiles; bench/NOTES.md). A
//! row's f32 `O` accumulators (`DV · 4` bytes) live for the whole pass, so a 16-warp block
//! is held to 128 registers per thread and 16-slot tiles, and pays its per-tile fixed work
//! (O rescale, barriers) 4 times as often; a 4-warp block may use up to 255 registers per
//! thread, room for 64-slot tiles. Rows past 64 go to further blocks (grid x, the
//! fastest-varying index, so the row blocks of one (kv head, split) range run together and
//! all but the first read its tiles from L2: HBM traffic stays one pass over the prefix).
//! Splits fill the target's SMs (`specc_codegen::choose::attention::tile_splits`).
//!
//! Numerics: scores are exact bf16 products summed in f32, the softmax is f32 (`l` sums the
//! f32 `p`), and `P·V` runs on two 16-bit halves of `p` (see [`TileTiling::split_p`]), so
//! the kernel matches the interpreter's f32 `Σ p·v` up to summation order.
//!
//! Masks are applied per (row, slot) as in [`crate::attention`]: causal `slot ≤ pos`;
//! tree `slot < prefix_len`, or bit `slot − prefix_len` of the row's ancestor words (a tile
//! wholly inside the prefix and the split skips the per-slot test: every row attends it).

use crate::abi::{Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec, Loc, Unit};
use crate::attention::{emit_block_operands, AttentionParams, AttnMask, PARTIAL_ROW};
use crate::last_arrival::emit_last_arrival;
use crate::writer::{emit, f32_lit, Writer};
use crate::Error;
use specc_ir::engine::Arch;

const FAMILY: &str = "attn_tile";
const HELPERS: &str = include_str!("../cuda/attn_mma.cuh");
/// Shared-memory row padding in elements: 16 bytes, so the 8 rows an `ldmatrix` reads
/// start on 8 distinct 4-bank groups (row strides of 2·(D + 8) bytes, D a multiple of 16).
const PAD: u64 = 8;

pub use specc_ir::engine::choice::TileTiling;

fn group(p: &AttentionParams) -> u32 {
    p.q_heads / p.kv_heads
}

fn words(p: &AttentionParams) -> u64 {
    match p.mask {
        AttnMask::Causal => 0,
        AttnMask::Tree { words, .. } => words as u64,
    }
}

/// Whether the shapes and dtypes suit the kernel: q and cache of one 16-bit float type (the
/// mma operands), head dims multiples of 16 (whether a tile fits a device is the choice's).
pub fn shapes_supported(p: &AttentionParams) -> bool {
    p.q.dtype == p.cache_dtype
        && matches!(p.cache_dtype, Dtype::BF16 | Dtype::F16)
        && p.head_dim.is_multiple_of(16)
        && p.head_dim_v.is_multiple_of(16)
        && p.kv_heads > 0
        && p.q_heads.is_multiple_of(p.kv_heads)
}

/// Shared memory of one block of tiling `t`, static and dynamic.
pub fn block_smem_bytes(p: &AttentionParams, t: TileTiling) -> u64 {
    smem_dynamic(p, t) + smem_static(p, t)
}

/// Dynamic shared memory: the q tile and two stages of K and V tiles.
fn smem_dynamic(p: &AttentionParams, t: TileTiling) -> u64 {
    let es = p.cache_dtype.size();
    let (d, dv) = (p.head_dim as u64, p.head_dim_v as u64);
    let (rb, ts) = (t.rows() as u64, t.tile_slots as u64);
    (rb * (d + PAD) + 2 * ts * (d + PAD + dv + PAD)) * es
}

/// Static shared memory: per-row positions (causal) or ancestor words (tree), the
/// context length.
fn smem_static(p: &AttentionParams, t: TileTiling) -> u64 {
    let rb = t.rows() as u64;
    match words(p) {
        0 => rb * 4 + 16,
        w => rb * w * 8 + 16,
    }
}

/// The parameters' own checks (no tiling).
fn validate(p: &AttentionParams) -> Result<(), Error> {
    let err = |field, reason: &str| Err(Error::param(FAMILY, field, reason));
    if p.kv_heads == 0 || p.q_heads == 0 || !p.q_heads.is_multiple_of(p.kv_heads) {
        return err("q_heads", "must be a positive multiple of kv_heads");
    }
    if p.q.dtype != p.cache_dtype || !matches!(p.cache_dtype, Dtype::BF16 | Dtype::F16) {
        return err("dtype", "q and cache must share a 16-bit float type");
    }
    if !p.out.dtype.is_float() || !p.pos_dtype.is_int() {
        return err("out/pos_dtype", "out must be float, pos i32 or i64");
    }
    let dims_ok = |x: u32| x > 0 && x.is_multiple_of(16);
    if !dims_ok(p.head_dim) || !dims_ok(p.head_dim_v) {
        return err("head_dim", "head dims must be positive multiples of 16");
    }
    if !p.q.aligned(16)
        || !p.k_cache.byte_offset().is_multiple_of(16)
        || !p.v_cache.byte_offset().is_multiple_of(16)
        || !p.scratch.byte_offset().is_multiple_of(16)
    {
        return err("q/k_cache/v_cache/scratch", "must be 16-byte aligned");
    }
    if let AttnMask::Tree { words: 0, .. } = p.mask {
        return err("mask", "a tree mask needs at least one ancestor word");
    }
    if !p.scale.is_finite() || p.max_t == 0 || p.splits == 0 {
        return err(
            "scale/max_t/splits",
            "scale finite, max_t and splits positive",
        );
    }
    Ok(())
}

/// The counters of [`FusedCombine`]: `tiles` `i32`s, zero before every launch and left
/// zero by it (the last split of each row range resets its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedCombine {
    pub counters: Loc,
    pub tiles: u32,
}

/// Counters the fused combine of tiling `t` needs for `b` sequences: one per sequence, KV
/// head and row block of `max_t` tokens.
pub fn fused_combine_tiles(p: &AttentionParams, t: TileTiling, b: u32) -> u64 {
    let row_blocks = (p.max_t.max(1) * group(p)).div_ceil(t.rows());
    b.max(1) as u64 * p.kv_heads as u64 * row_blocks as u64
}

/// Whether the fused combine's split weights and reciprocal sums (`f32[RB][S + 1]`) fit the
/// dynamic shared memory the tiles leave free once the last tile is done.
pub fn fused_combine_fits(p: &AttentionParams, t: TileTiling) -> bool {
    t.rows() as u64 * (p.splits as u64 + 1) * 4 <= smem_dynamic(p, t)
}

/// The split kernel with an explicit tiling (benchmarks compare them).
pub(crate) fn split_kernel_tiled(
    p: &AttentionParams,
    t: TileTiling,
) -> Result<KernelSource, Error> {
    split_kernel_with(p, t, None)
}

/// The split kernel whose last block of each (sequence, KV head, row block) to finish
/// folds every split of its rows: one launch where [`split_kernel_tiled`] needs
/// `attn_combine` after it, the same bits.
pub(crate) fn split_kernel_fused(
    p: &AttentionParams,
    t: TileTiling,
    fc: FusedCombine,
) -> Result<KernelSource, Error> {
    if !fused_combine_fits(p, t) {
        return Err(Error::param(
            FAMILY,
            "splits",
            "the fused combine's split weights exceed the block's shared memory",
        ));
    }
    split_kernel_with(p, t, Some(fc))
}

fn split_kernel_with(
    p: &AttentionParams,
    t: TileTiling,
    fuse: Option<FusedCombine>,
) -> Result<KernelSource, Error> {
    validate(p)?;
    let ok_ts = t.tile_slots.is_multiple_of(16) && (16..=64).contains(&t.tile_slots);
    if !(1..=16).contains(&t.warps) || !ok_ts {
        return Err(Error::param(
            FAMILY,
            "tiling",
            "1..=16 warps, tiles of 16 to 64 slots in steps of 16",
        ));
    }
    let sw = t.slot_groups();
    if !t.warps.is_multiple_of(sw)
        || !(t.tile_slots / sw).is_multiple_of(16)
        || t.tile_slots < 16 * sw
    {
        return Err(Error::param(
            FAMILY,
            "slot_warps",
            "must divide the warps and leave each warp a multiple of 16 slots of a tile",
        ));
    }
    if sw > 1 && merge_bytes(p, t) > smem_dynamic(p, t) {
        return Err(Error::param(
            FAMILY,
            "slot_warps",
            "the warps' states to merge exceed the block's stages",
        ));
    }
    // Whether a block fits one device is the choice's; none of any arch holds more.
    let most = Arch::ALL.map(Arch::max_smem_per_block).into_iter().max();
    if block_smem_bytes(p, t) > most.unwrap_or(0) as u64 {
        return Err(Error::param(
            FAMILY,
            "tiling",
            "exceeds the shared memory of a block on every arch",
        ));
    }
    let ct = p.cache_dtype.c_type();
    let mma = match p.cache_dtype {
        Dtype::F16 => "mma16816_f16",
        _ => "mma16816_bf16",
    };
    let words = words(p);
    let mut kb = KernelBuilder::new(FAMILY, p.cache_dtype);
    kb.items.line(crate::CP_ASYNC_ITEMS.trim_end());
    kb.items.line(HELPERS.trim_end());
    let w = &mut kb.body;
    emit!(w, "constexpr int D = {};", p.head_dim);
    emit!(w, "constexpr int DV = {};", p.head_dim_v);
    emit!(w, "constexpr int HQ = {};", p.q_heads);
    emit!(w, "constexpr int HKV = {};", p.kv_heads);
    emit!(
        w,
        "constexpr int G = {};  // query heads per kv head",
        group(p)
    );
    emit!(w, "constexpr int S = {};  // context splits", p.splits);
    emit!(
        w,
        "constexpr int NW = {};  // warps; warp w owns block rows 16w..16w+15",
        t.warps
    );
    if sw > 1 {
        emit!(
            w,
            "constexpr int SW = {sw};  // warps a row group's slots are split over"
        );
        w.line("constexpr int RB = 16 * NW / SW;  // query rows (t, g) per block");
    } else {
        w.line("constexpr int RB = 16 * NW;  // query rows (t, g) per block");
    }
    w.line("constexpr int NT = 32 * NW;");
    emit!(
        w,
        "constexpr int TS = {};  // cache slots per tile",
        t.tile_slots
    );
    emit!(
        w,
        "constexpr int QST = D + {PAD}, KST = D + {PAD}, VST = DV + {PAD};  // smem row strides"
    );
    emit!(
        w,
        "constexpr float SCALE_LOG2 = {};  // scale * log2(e)",
        f32_lit((p.scale as f64 * std::f64::consts::LOG2_E) as f32)
    );
    w.comment("dynamic smem: q tile [RB][QST], then K [2][TS][KST] and V [2][TS][VST] stages");
    w.line("extern __shared__ __align__(16) unsigned char smem[];");
    emit!(w, "{ct}* qs = reinterpret_cast<{ct}*>(smem);");
    emit!(w, "{ct}* ks = qs + RB * QST;");
    emit!(w, "{ct}* vs = ks + 2 * TS * KST;");
    if words > 0 {
        emit!(w, "constexpr int AW = {words};  // ancestor words per row");
        w.line("__shared__ long long row_anc[RB][AW];");
    } else {
        w.line("__shared__ int row_pos[RB];  // last attended slot; -1: none");
        w.line("__shared__ int s_len;");
    }
    w.line("const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;");
    w.line("const int gq = lane >> 2, tq = lane & 3;  // mma fragment row group and column pair");
    emit_block_operands(w, p, false);
    emit_row_state(w, p);
    emit_q_tile(w, p);
    emit_range(w, p);
    emit_tile_loader(w);
    let ts = if sw > 1 {
        w.line("constexpr int TSW = TS / SW;  // slots of each tile a warp takes");
        w.line("const int wr = (warp / SW) * 16;  // first block row of this warp");
        w.line("const int so = (warp % SW) * TSW;  // this warp's first slot of each tile");
        Slots::Split
    } else {
        w.line("const int wr = warp * 16;  // first block row of this warp");
        Slots::Whole
    };
    w.line("const bool active = wr < nrows;  // warp-uniform");
    w.line("const int ra = wr + gq, rb = wr + gq + 8;  // rows of accumulators 0-1 and 2-3");
    if words == 0 {
        w.line("const int lim_a = row_pos[ra], lim_b = row_pos[rb];  // last slot per row");
    }
    w.line("float o[DV / 8][4];");
    w.for_unrolled("n", 0, "DV / 8", |w| {
        w.for_unrolled("e", 0, 4, |w| w.line("o[n][e] = 0.0f;"));
    });
    w.comment("running max (log2 domain) per row and this lane's share of the row sum");
    w.line("float m_a = neg_inf(), m_b = neg_inf(), l_a = 0.0f, l_b = 0.0f;");
    w.if_block("s_begin < s_end", |w| w.line("load_tile(0, s_begin);"));
    w.for_block(
        "int s0 = s_begin, it = 0",
        "s0 < s_end",
        "s0 += TS, ++it",
        |w| {
            w.line("const int st = it & 1;");
            w.if_else(
                "s0 + TS < s_end",
                |w| {
                    w.line("load_tile(st ^ 1, s0 + TS);");
                    w.line("cp_async_wait<1>();  // q and tile `it` have landed");
                },
                |w| w.line("cp_async_wait<0>();"),
            );
            w.line("__syncthreads();");
            w.if_block("active", |w| {
                w.line(format!("const {ct}* kt = ks + st * TS * KST;"));
                w.line(format!("const {ct}* vt = vs + st * TS * VST;"));
                emit_scores(w, mma, ts);
                emit_mask(w, p, ts);
                emit_softmax(w, ct, t.split_p, ts);
                emit_pv(w, mma, t.split_p, ts);
            });
            w.line("__syncthreads();  // stage st is refilled by the next iteration's prefetch");
        },
    );
    w.line("cp_async_wait<0>();  // an empty split still committed the q tile");
    if sw > 1 {
        emit_slot_merge(w);
    }
    emit_partials(w, sw > 1);
    if let Some(fc) = fuse {
        emit_fused_combine(w, p, fc);
    }

    let launch = LaunchSpec {
        grid: [
            Extent::Scaled {
                unit: Unit::T,
                mul: group(p),
                div: t.rows(),
            },
            Extent::Fixed(p.kv_heads * p.splits),
            Extent::Scaled {
                unit: Unit::B,
                mul: 1,
                div: 1,
            },
        ],
        block: [t.threads(), 1, 1],
        smem_bytes: smem_dynamic(p, t) as u32,
    };
    Ok(kb.finish(launch))
}

/// Per-row state of every block row: `row_pos` (causal: the last attended slot, -1 past
/// `nrows`) or `row_anc` (tree: the ancestor words, 0 past `nrows`). Rows past `nrows`
/// have zero q and unwritten partials, so the tree mask need not tell them apart.
fn emit_row_state(w: &mut Writer, p: &AttentionParams) {
    w.comment("per-row state (NT >= RB: one thread per row)");
    if words(p) > 0 {
        w.if_block("tid < RB", |w| {
            w.line("const long long m = b * c.t + (r0 + min(tid, nrows - 1)) / G;");
            w.line(
                "for (int j = 0; j < AW; ++j) row_anc[tid][j] = tid < nrows ? anc[m * AW + j] : 0;",
            );
        });
        return;
    }
    w.if_block("tid == 0", |w| w.line("s_len = 0;"));
    w.if_block("tid < RB", |w| {
        w.line("int rp = -1;");
        w.if_block("tid < nrows", |w| {
            w.line("const int m = b * c.t + (r0 + tid) / G;");
            w.line("rp = cache_slot((long long)pos[m], c.ctx);");
        });
        w.line("row_pos[tid] = rp;");
    });
}

/// The block's q rows, copied asynchronously (first commit group); rows past the end are 0.
fn emit_q_tile(w: &mut Writer, p: &AttentionParams) {
    w.comment("q tile (commit group 0); rows past the end are zero-filled from a valid row");
    w.for_block("int i = tid", "i < RB * (D / 8)", "i += NT", |w| {
        w.line("const int r = i / (D / 8), d = (i % (D / 8)) * 8;");
        w.line("const int gr = r0 + min(r, nrows - 1);");
        emit!(
            w,
            "const long long row = (long long)(b * c.t + gr / G) * {};",
            p.q.row_stride
        );
        w.line("cp_async16(qs + r * QST + d, q + row + (kvh * G + gr % G) * D + d, r < nrows);");
    });
    w.line("cp_async_commit();");
    w.line("__syncthreads();");
}

/// The context length of the block and this split's slot range (as in `attn_split`).
fn emit_range(w: &mut Writer, p: &AttentionParams) {
    if words(p) > 0 {
        w.line("const int len = min(prefix + tree_n, c.ctx);");
    } else {
        w.if_block("tid < nrows", |w| {
            w.line("atomicMax(&s_len, row_pos[tid] + 1);")
        });
        w.line("__syncthreads();");
        w.line("const int len = s_len;");
    }
    w.line("const int per = ((len + S - 1) / S + TS - 1) / TS * TS;");
    w.line("const int s_begin = split * per;");
    w.line("const int s_end = min(len, s_begin + per);");
}

/// `load_tile(stage, s0)`: K and V slots `s0..s0 + TS` into a stage, one commit group;
/// slots at or past `s_end` are zero-filled (and masked) without reading memory.
fn emit_tile_loader(w: &mut Writer) {
    w.block_semi("auto load_tile = [&](int stage, int s0)", |w| {
        for (buf, src, dim, st) in [("ks", "kc", "D", "KST"), ("vs", "vc", "DV", "VST")] {
            w.for_block("int i = tid", format_args!("i < TS * ({dim} / 8)"), "i += NT", |w| {
                emit!(w, "const int s = i / ({dim} / 8), d = (i % ({dim} / 8)) * 8;");
                w.line("const bool ok = s0 + s < s_end;");
                w.line("const long long at = (long long)(b * c.ctx + (ok ? s0 + s : s0)) * HKV + kvh;");
                emit!(
                    w,
                    "cp_async16({buf} + (stage * TS + s) * {st} + d, {src} + at * {dim} + d, ok);"
                );
            });
        }
        w.line("cp_async_commit();");
    });
}

/// `sc[j][e]`: raw scores of rows ra (e < 2) / rb (e ≥ 2) and slots s0 + 8j + 2tq + (e & 1).
/// Which slots of each tile a warp computes: all `TS`, or its `TSW` from `so`.
#[derive(Clone, Copy)]
enum Slots {
    Whole,
    Split,
}

impl Slots {
    /// The warp's slot count as a constant name.
    fn n(self) -> &'static str {
        match self {
            Slots::Whole => "TS",
            Slots::Split => "TSW",
        }
    }

    /// The warp's first slot of a tile, as a term added to a slot index ("" for all).
    fn at(self) -> &'static str {
        match self {
            Slots::Whole => "",
            Slots::Split => "so + ",
        }
    }
}

/// Shared memory the slot warps' states need to merge: per warp its `o` fragments (`DV · 16`
/// floats) and the lane's `m_a, m_b, l_a, l_b`.
fn merge_bytes(p: &AttentionParams, t: TileTiling) -> u64 {
    t.warps as u64 * (p.head_dim_v as u64 * 16 + 128) * 4
}

fn emit_scores(w: &mut Writer, mma: &str, ts: Slots) {
    let (n, at) = (ts.n(), ts.at());
    w.comment(
        "S = Q·Kᵀ: 16 rows × the warp's slots; ldmatrix x4 gives A of 16×16 q and B of two 8-slot tiles",
    );
    emit!(w, "float sc[{n} / 8][4];");
    w.for_unrolled("j", 0, format!("{n} / 8"), |w| {
        w.for_unrolled("e", 0, 4, |w| w.line("sc[j][e] = 0.0f;"));
    });
    w.for_unrolled("kd", 0, "D / 16", |w| {
        w.line("unsigned a[4];");
        w.line("ldmatrix_x4(a, qs + (wr + (lane & 7) + 8 * ((lane >> 3) & 1)) * QST + kd * 16 + 8 * (lane >> 4));");
        w.for_unrolled("n2", 0, format!("{n} / 16"), |w| {
            w.line("unsigned kb[4];");
            emit!(w, "ldmatrix_x4(kb, kt + ({at}n2 * 16 + (lane & 7) + 8 * (lane >> 4)) * KST + kd * 16 + 8 * ((lane >> 3) & 1));");
            emit!(w, "{mma}(sc[2 * n2], a, kb[0], kb[1]);");
            emit!(w, "{mma}(sc[2 * n2 + 1], a, kb[2], kb[3]);");
        });
    });
}

fn emit_mask(w: &mut Writer, p: &AttentionParams, ts: Slots) {
    let (n, at) = (ts.n(), ts.at());
    w.comment("masks per (row, slot), then the log2-domain scale");
    if words(p) > 0 {
        w.comment("a tile wholly inside the prefix and the split is allowed for every row; rows");
        w.comment("past nrows need no mask (their q is zero-filled and their partials unwritten)");
        w.line("const bool all_prefix = s0 + TS <= min(prefix, s_end);  // block-uniform");
    }
    w.for_unrolled("j", 0, format!("{n} / 8"), |w| {
        w.for_unrolled("e", 0, 4, |w| {
            emit!(w, "const int slot = s0 + {at}8 * j + 2 * tq + (e & 1);");
            if words(p) > 0 {
                w.line("const int r = e < 2 ? ra : rb;");
                w.line("const int u = slot - prefix;");
                w.line(
                    "const bool ok = all_prefix || (slot < s_end && \
                     (u < 0 || (u < tree_n && ((row_anc[r][u >> 6] >> (u & 63)) & 1))));",
                );
            } else {
                w.line("const bool ok = slot < s_end && slot <= (e < 2 ? lim_a : lim_b);");
            }
            w.line("sc[j][e] = ok ? sc[j][e] * SCALE_LOG2 : neg_inf();");
        });
    });
}

/// Online softmax per row (the 4 lanes of a quad share a row), `pa`: P as A fragments.
fn emit_softmax(w: &mut Writer, ct: &str, split_p: bool, ts: Slots) {
    let n = ts.n();
    w.comment("online softmax; a row with nothing allowed yet keeps m = -inf and p = 0");
    w.line("float mx_a = neg_inf(), mx_b = neg_inf();");
    w.for_unrolled("j", 0, format!("{n} / 8"), |w| {
        w.line("mx_a = fmaxf(mx_a, fmaxf(sc[j][0], sc[j][1]));");
        w.line("mx_b = fmaxf(mx_b, fmaxf(sc[j][2], sc[j][3]));");
    });
    w.line("const float mn_a = fmaxf(m_a, quad_max(mx_a)), mn_b = fmaxf(m_b, quad_max(mx_b));");
    w.line("const float base_a = mn_a == neg_inf() ? 0.0f : mn_a;");
    w.line("const float base_b = mn_b == neg_inf() ? 0.0f : mn_b;");
    w.line("const float al_a = exp2f(m_a - base_a), al_b = exp2f(m_b - base_b);");
    w.line("m_a = mn_a;");
    w.line("m_b = mn_b;");
    w.line("l_a *= al_a;");
    w.line("l_b *= al_b;");
    w.for_unrolled("n", 0, "DV / 8", |w| {
        w.line("o[n][0] *= al_a;");
        w.line("o[n][1] *= al_a;");
        w.line("o[n][2] *= al_b;");
        w.line("o[n][3] *= al_b;");
    });
    w.comment("P in the mma type (hi, and lo = the rest when split); slots 16k..16k+15 of C tiles 2k, 2k+1 form A of k-step k");
    emit!(w, "unsigned pa[{n} / 16][4];");
    if split_p {
        emit!(w, "unsigned pl[{n} / 16][4];");
    }
    w.for_unrolled("j", 0, format!("{n} / 8"), |w| {
        w.line("const float p0 = exp2f(sc[j][0] - base_a), p1 = exp2f(sc[j][1] - base_a);");
        w.line("const float p2 = exp2f(sc[j][2] - base_b), p3 = exp2f(sc[j][3] - base_b);");
        for (i, name) in ["p0", "p1", "p2", "p3"].iter().enumerate() {
            emit!(w, "const float h{i} = round_to<{ct}>({name});");
        }
        if split_p {
            w.line("l_a += p0 + p1;");
            w.line("l_b += p2 + p3;");
            emit!(w, "pl[j / 2][(j & 1) * 2] = pack2<{ct}>(p0 - h0, p1 - h1);");
            emit!(
                w,
                "pl[j / 2][(j & 1) * 2 + 1] = pack2<{ct}>(p2 - h2, p3 - h3);"
            );
        } else {
            w.comment("l sums the rounded p: the weights applied to V are those it normalises");
            w.line("l_a += h0 + h1;");
            w.line("l_b += h2 + h3;");
        }
        emit!(w, "pa[j / 2][(j & 1) * 2] = pack2<{ct}>(h0, h1);");
        emit!(w, "pa[j / 2][(j & 1) * 2 + 1] = pack2<{ct}>(h2, h3);");
    });
}

fn emit_pv(w: &mut Writer, mma: &str, split_p: bool, ts: Slots) {
    let (n, at) = (ts.n(), ts.at());
    w.comment("O += P·V; ldmatrix x4.trans gives B of two 8-column tiles of V for 16 slots");
    w.for_unrolled("k2", 0, format!("{n} / 16"), |w| {
        w.for_unrolled("n2", 0, "DV / 16", |w| {
            w.line("unsigned vb[4];");
            emit!(w, "ldmatrix_x4_trans(vb, vt + ({at}k2 * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * VST + n2 * 16 + 8 * (lane >> 4));");
            emit!(w, "{mma}(o[2 * n2], pa[k2], vb[0], vb[1]);");
            emit!(w, "{mma}(o[2 * n2 + 1], pa[k2], vb[2], vb[3]);");
            if split_p {
                emit!(w, "{mma}(o[2 * n2], pl[k2], vb[0], vb[1]);");
                emit!(w, "{mma}(o[2 * n2 + 1], pl[k2], vb[2], vb[3]);");
            }
        });
    });
}

/// The `SW` warps of each row group merge their softmax states into the group's first warp
/// (slot group 0), in slot-group order: the running maxima's maximum, each state rescaled to
/// it. The stages are free (every warp is past the last tile's barrier).
fn emit_slot_merge(w: &mut Writer) {
    w.comment("merge the slot warps of each row group into its first, in slot-group order");
    w.line("__syncthreads();  // every thread's q-tile copy has landed (an empty split's too)");
    w.line("constexpr int MW = DV * 16 + 128;  // floats a warp's state takes");
    w.line("float* mst = reinterpret_cast<float*>(smem) + warp * MW;");
    w.for_unrolled("n", 0, "DV / 8", |w| {
        w.for_unrolled("e", 0, 4, |w| {
            w.line("mst[(n * 4 + e) * 32 + lane] = o[n][e];")
        });
    });
    w.line("mst[DV * 16 + lane] = m_a;");
    w.line("mst[DV * 16 + 32 + lane] = m_b;");
    w.line("mst[DV * 16 + 64 + lane] = l_a;");
    w.line("mst[DV * 16 + 96 + lane] = l_b;");
    w.line("__syncthreads();");
    w.if_block("warp % SW == 0", |w| {
        w.line("float ma = m_a, mb = m_b;");
        w.for_block("int g = 1", "g < SW", "++g", |w| {
            w.line("ma = fmaxf(ma, mst[g * MW + DV * 16 + lane]);");
            w.line("mb = fmaxf(mb, mst[g * MW + DV * 16 + 32 + lane]);");
        });
        w.line("const float ba = ma == neg_inf() ? 0.0f : ma, bb = mb == neg_inf() ? 0.0f : mb;");
        w.line("const float fa = exp2f(m_a - ba), fb = exp2f(m_b - bb);");
        w.line("l_a *= fa;");
        w.line("l_b *= fb;");
        w.for_unrolled("n", 0, "DV / 8", |w| {
            w.line("o[n][0] *= fa;");
            w.line("o[n][1] *= fa;");
            w.line("o[n][2] *= fb;");
            w.line("o[n][3] *= fb;");
        });
        w.for_block("int g = 1", "g < SW", "++g", |w| {
            w.line("const float* gs = mst + g * MW;");
            w.line("const float ga = exp2f(gs[DV * 16 + lane] - ba), gb = exp2f(gs[DV * 16 + 32 + lane] - bb);");
            w.line("l_a += gs[DV * 16 + 64 + lane] * ga;");
            w.line("l_b += gs[DV * 16 + 96 + lane] * gb;");
            w.for_unrolled("n", 0, "DV / 8", |w| {
                w.line("o[n][0] += gs[(n * 4) * 32 + lane] * ga;");
                w.line("o[n][1] += gs[(n * 4 + 1) * 32 + lane] * ga;");
                w.line("o[n][2] += gs[(n * 4 + 2) * 32 + lane] * gb;");
                w.line("o[n][3] += gs[(n * 4 + 3) * 32 + lane] * gb;");
            });
        });
        w.line("m_a = ma;");
        w.line("m_b = mb;");
    });
}

/// Partials of every row of the block: an empty split writes m = -inf, l = 0, o = 0. With
/// slot warps (`merged`) only each row group's first warp writes, after [`emit_slot_merge`].
fn emit_partials(w: &mut Writer, merged: bool) {
    w.comment("partials of this split: (m, l) per row and the unnormalised o");
    let writes = if merged {
        "active && warp % SW == 0"
    } else {
        "active"
    };
    w.if_block(writes, |w| {
        w.line("const float lt_a = quad_sum(l_a), lt_b = quad_sum(l_b);");
        w.for_unrolled("h", 0, 2, |w| {
            w.line("const int r = h == 0 ? ra : rb;");
            w.if_block("r < nrows", |w| {
                w.line("const int gr = r0 + r;");
                w.line(PARTIAL_ROW);
                w.for_unrolled("n", 0, "DV / 8", |w| {
                    w.line("*reinterpret_cast<float2*>(po + pr * DV + n * 8 + 2 * tq) = make_float2(o[n][2 * h], o[n][2 * h + 1]);");
                });
                w.if_block("tq == 0", |w| {
                    w.line("ml[pr * 2] = h == 0 ? m_a : m_b;");
                    w.line("ml[pr * 2 + 1] = h == 0 ? lt_a : lt_b;");
                });
            });
        });
    });
}

/// The combine of `attn_combine` in the last block of each (sequence, KV head, row block)
/// to finish: its rows' partials of every split, read back from L2 in split order with the
/// same operations, so the output has `attn_combine`'s bits whichever block is last (a
/// zero weight skips its split by a select rather than a branch, so every load of a row's
/// splits can be in flight at once).
/// Every block reaches it (no early return above): [`emit_last_arrival`]'s invariant.
fn emit_fused_combine(w: &mut Writer, p: &AttentionParams, fc: FusedCombine) {
    let ot = p.out.dtype.c_type();
    // Partial rows start 16-byte aligned where the (m, l) pairs of a token fill 16 bytes.
    let vw = if (p.q_heads * p.splits).is_multiple_of(2) {
        4
    } else {
        2
    };
    w.comment("fused combine: the last split of this row range to finish folds every split");
    w.line("__shared__ int split_last;");
    emit!(w, "int* cnt = {};", fc.counters.ptr_as("int", true));
    w.line("const long long tile = ((long long)b * gridDim.x + blockIdx.x) * HKV + kvh;");
    emit!(
        w,
        "if (tile >= {}) __trap();  // more row ranges than the counters hold",
        fc.tiles
    );
    emit_last_arrival(w, "S");
    w.comment("the stages are free: f32 split weights [RB][S], then 1/l per row");
    w.line("float* wsp = reinterpret_cast<float*>(smem);");
    w.line("float* winv = wsp + RB * S;");
    w.for_block("int r = tid", "r < nrows", "r += NT", |w| {
        w.line("const int gr = r0 + r;");
        w.line("const float2* mlr = reinterpret_cast<const float2*>(ml) + ((long long)(b * c.t + gr / G) * HQ + kvh * G + gr % G) * S;");
        w.line("float mx = neg_inf();");
        w.line("#pragma unroll 8");
        w.line("for (int i = 0; i < S; ++i) mx = fmaxf(mx, __ldcg(mlr + i).x);");
        w.line("float l = 0.0f;");
        w.line("#pragma unroll 8");
        w.for_block("int i = 0", "i < S", "++i", |w| {
            w.line("const float2 mli = __ldcg(mlr + i);");
            w.line("const float wi = mli.x == neg_inf() ? 0.0f : exp2f(mli.x - mx);");
            w.line("wsp[r * S + i] = wi;");
            w.line("l = fmaf(wi, mli.y, l);");
        });
        w.line("winv[r] = l > 0.0f ? 1.0f / l : 0.0f;");
    });
    w.line("__syncthreads();");
    emit!(w, "{ot}* y = {};", p.out.loc.ptr(p.out.dtype, true));
    emit!(
        w,
        "constexpr int VW = {vw};  // outputs a thread folds at once"
    );
    let vt = if vw == 4 { "float4" } else { "float2" };
    w.for_block("int e = tid", "e < nrows * (DV / VW)", "e += NT", |w| {
        w.line("const int r = e / (DV / VW), d = (e % (DV / VW)) * VW, gr = r0 + r;");
        w.line("const long long m = (long long)b * c.t + gr / G;");
        w.line("const int hq = kvh * G + gr % G;");
        w.line("const float* pr = po + (m * HQ + hq) * S * DV + d;");
        w.line("float acc[VW] = {};");
        w.line("#pragma unroll 16");
        w.for_block("int i = 0", "i < S", "++i", |w| {
            w.line("const float wi = wsp[r * S + i];");
            emit!(
                w,
                "const {vt} v = __ldcg(reinterpret_cast<const {vt}*>(pr + (long long)i * DV));"
            );
            w.line("const float vv[VW] = {v.x, v.y" .to_string() + if vw == 4 { ", v.z, v.w};" } else { "};" });
            w.line("#pragma unroll");
            w.line("for (int j = 0; j < VW; ++j) acc[j] = wi != 0.0f ? fmaf(wi, vv[j], acc[j]) : acc[j];");
        });
        w.line("#pragma unroll");
        emit!(
            w,
            "for (int j = 0; j < VW; ++j) y[m * {} + hq * DV + d + j] = from_f32<{ot}>(acc[j] * winv[r]);",
            p.out.row_stride
        );
    });
}
