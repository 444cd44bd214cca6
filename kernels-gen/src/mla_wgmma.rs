//! `mla_wgmma`: absorbed multi-head latent attention on sm_90a's warpgroup tensor cores, the
//! `mla_attention` op for bf16 q and caches with a latent of 128–512 (a multiple of 128)
//! and rope dims a multiple of 64 — DeepSeek-V3 and Kimi-K2's 512 + 64. Same launch
//! parameters ([`MlaTileParams`]), splits and partials as [`crate::mla_tile`], whose
//! `mla_combine` folds them.
//!
//! A block owns 64 consecutive query rows (`t·H + h`) of one sequence — at 64 heads one
//! token's — and one split of the context, so every cache tile leaves memory once for all
//! of them. Shared memory holds q (`KB` boxes of 64 rows × 64 features) and two stages of
//! 64-slot cache tiles (`KB` boxes of 64 slots × 64 features: `LB` of the latent `c`, then
//! the rope keys), each box 128-byte rows in the 128-byte swizzle that TMA writes and the
//! wgmma descriptors name. Thread 0 issues the tensor-map copies of q and the first two tiles;
//! tile `it + 2` goes into tile `it`'s stage from whichever warpgroup is the second to be done
//! with it (a count in shared memory), so the warpgroups never wait for each other.
//!
//! Both warpgroups (256 threads) compute the same scores of each tile, `S = [q | q_pe] ·
//! [c | pe]ᵀ` (`m64n64k16`, both operands in shared memory, `KB · 4` k16 steps in feature
//! order into one f32 accumulator), and the same online softmax; warpgroup `wg` then adds
//! `P · c` for latent columns `wg · L/2 ..` (`m64n{L/2}k16`, P from registers, `c` read in
//! place as the transposed, MN-major B operand). Computing the scores twice costs tensor time
//! (about half of a tile's at Kimi dims) but keeps each warpgroup's softmax in its own
//! registers: no exchange and no barrier between them.
//!
//! Invariance: a row's scores are one accumulator chain over the features; its softmax
//! walks the split's tiles in order; a masked slot contributes an exact zero and a tile
//! with no allowed slot for the row rescales by exactly 1; the splits are the capacity's.
//! So a row's result does not depend on the other rows of its block, the bucket or the
//! step. Slots at or past the split's end in the last tile are zeroed in shared memory
//! before use (they may be unwritten cache), so `0 · v` never meets a non-finite `v`.
//!
//! Numerics: f32 scores and sums, the softmax in base 2 (`p = 2^(s·scale·log2 e − m)` by
//! `ex2.approx`, relative error ~2⁻²²); `p` enters the output product as two bf16 values
//! `p_hi + p_lo` (two mma), so it keeps ~16 more bits than one bf16 value — the
//! interpreter's result up to summation order, the same in every bucket. The partial maxima
//! are stored in natural units, as `mla_combine` folds them.

use crate::abi::{
    assemble_with, Dtype, Extent, KernelAttrs, KernelSource, LaunchSpec, Loc, Rows, TensorMap,
};
use crate::gemm_wgmma::{emit_wgmma_function, WgmmaOperands};
use crate::mla_tile::{c_type, emit_dims, mask_setup, prelude, row_end, MlaMask, MlaTileParams};
use crate::writer::{emit, f32_lit, Writer};
use crate::Error;
use specc_ir::DType;

const FAMILY: &str = "mla_wgmma";
/// Query rows per block: one m64 warpgroup tile.
pub const BLOCK_ROWS: u64 = 64;
/// Cache slots per tile: the scores' n64 and four k16 steps of the output product.
pub const TILE_SLOTS: u64 = 64;
/// Bytes of one box: 64 rows of 128 bytes.
const BOX_BYTES: u64 = 64 * 128;
/// Threads: two warpgroups.
const THREADS: u32 = 256;
/// Splits one thread-block cluster folds, at most: the portable cluster size (eight blocks of
/// one SM each fit every GPC).
pub const MAX_CLUSTER: u64 = 8;
/// Row stride in f32 of the cluster's fold buffer (64 rows × latent): 8 more than the latent
/// puts a warp's eight accumulator rows on two bank phases.
const FOLD_PAD: u64 = 8;

/// The cluster of `splits`: the most consecutive splits, up to [`MAX_CLUSTER`], that divide
/// them (1 where there is one split). It depends on the splits alone, which depend on the
/// capacity alone, so a row's fold order is the same in every bucket.
pub fn cluster_for(splits: u64) -> u64 {
    [MAX_CLUSTER, 4, 2]
        .into_iter()
        .find(|&c| splits >= c && splits.is_multiple_of(c))
        .unwrap_or(1)
}

/// Score boxes a row spans (`L/64` latent, then `R/64` rope).
fn boxes(p: &MlaTileParams) -> u64 {
    (p.latent + p.rope) / 64
}

/// Bytes of q, and of one cache tile (the same `KB` boxes).
fn tile_bytes(p: &MlaTileParams) -> u64 {
    boxes(p) * BOX_BYTES
}

/// Dynamic shared memory: q, two stages, and the slack that aligns them to 1024 bytes.
pub fn smem_bytes(p: &MlaTileParams) -> u64 {
    3 * tile_bytes(p) + 1024
}

/// Shared memory one block uses: the dynamic part, its three mbarriers, two release counts
/// and row ends, in a cluster the four per-row fold arrays, and 1 KiB of slack for the
/// compiler's own.
pub fn block_smem_bytes(p: &MlaTileParams) -> u64 {
    let fold = if p.cluster > 1 { 4 * BLOCK_ROWS * 4 } else { 0 };
    smem_bytes(p) + 3 * 8 + 2 * 4 + BLOCK_ROWS * 8 + fold + 1024
}

/// Bytes of a cluster's fold buffer, `[64][latent + FOLD_PAD]` f32, which reuses the two
/// stages once the main loop is done: never more than they hold (the rope dims are at least
/// 64, the padding 8).
fn fold_bytes(p: &MlaTileParams) -> u64 {
    BLOCK_ROWS * (p.latent + FOLD_PAD) * 4
}

/// Row blocks of one sequence (`T·H` rows).
pub fn row_blocks(p: &MlaTileParams) -> u64 {
    (p.tokens * p.heads).div_ceil(BLOCK_ROWS)
}

/// Whether the kernel takes these shapes within `smem_limit` bytes a block: bf16 q and
/// caches, a latent of 128–512 in multiples of 128 (each warpgroup's half of the output
/// one `m64nN` of at most 256 columns, whole boxes), rope dims a positive multiple of 64
/// (whole boxes), row indices of q and the caches in 32-bit tensor-map coordinates, and a
/// cluster of 1, 2, 4 or 8 splits that divides them. That the target is sm_90a is the
/// selection's question.
pub fn supported(p: &MlaTileParams, smem_limit: u64) -> bool {
    matches!(p.cluster, 1 | 2 | 4 | 8)
        && p.splits.is_multiple_of(p.cluster)
        && fold_bytes(p) <= 2 * tile_bytes(p)
        && p.dtype == DType::BF16
        && p.latent.is_multiple_of(128)
        && (128..=512).contains(&p.latent)
        && p.rope.is_multiple_of(64)
        && p.rope > 0
        && p.tokens * p.heads > 0
        && p.batch * p.ctx < 1 << 31
        && p.batch * p.tokens * p.heads < 1 << 31
        && block_smem_bytes(p) <= smem_limit
}

/// The four tensor maps: q_lat, q_pe (rows `B·T·H`), c, pe (rows `B·ctx`), boxes of 64 rows.
fn maps(p: &MlaTileParams) -> [Loc; 4] {
    let q_rows = Rows::Fixed((p.batch * p.tokens * p.heads) as u32);
    let c_rows = Rows::Fixed((p.batch * p.ctx) as u32);
    let map = |loc, cols: u64, rows| {
        TensorMap::of(loc, Dtype::BF16, cols as u32, rows, cols, BLOCK_ROWS as u32)
    };
    [
        map(p.q_lat, p.latent, q_rows),
        map(p.q_pe, p.rope, q_rows),
        map(p.c_cache, p.latent, c_rows),
        map(p.pe_cache, p.rope, c_rows),
    ]
}

/// Emits `mla_s(float (&d)[32], da, db, accumulate)`: the scores' `m64n64k16`, both operands
/// K-major in shared memory.
fn emit_score_mma(w: &mut Writer) {
    emit_wgmma_function(w, "mla_s", Dtype::BF16, 64, WgmmaOperands::SharedKMajor);
}

/// Emits `mla_pv(float (&d)[N / 2], a0..a3, db, accumulate)`: the output's `m64n{N}k16` with
/// A (P) from registers and B transposed (MN-major: `c` as stored).
fn emit_pv_mma(w: &mut Writer, n: u64) {
    emit_wgmma_function(
        w,
        "mla_pv",
        Dtype::BF16,
        n as u32,
        WgmmaOperands::RegistersAndMnMajorB,
    );
}

/// Module items: the softmax's fast `2^x`, and the MN-major 128-byte-swizzle descriptor of
/// the output product's B operand (64-column groups `lbo` bytes apart, one box each; 8-slot
/// groups 1024 bytes apart, the SBO).
const HELPERS: &str = r#"__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned long long wgmma_desc_mn128(const void* tile, unsigned lbo) {
  const unsigned long long addr = (smem_addr(tile) & 0x3FFFF) >> 4;
  return addr | ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}"#;

/// Cluster-wide barrier (every thread of every block of the cluster, release / acquire), and
/// loads from a cluster peer's shared memory at this block's address `local` of the same
/// array.
const CLUSTER_HELPERS: &str = r#"__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned dsmem_addr(unsigned local, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ float dsmem_f32(unsigned local, unsigned rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(dsmem_addr(local, rank)) : "memory");
  return v;
}
__device__ __forceinline__ float4 dsmem_f32x4(unsigned local, unsigned rank) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(dsmem_addr(local, rank)) : "memory");
  return v;
}"#;

/// The `mla_wgmma` kernel of `p` (`p.wgmma`; `mla_combine` comes from [`crate::mla_tile`]).
pub fn tile(p: &MlaTileParams) -> Result<KernelSource, Error> {
    if !supported(p, u64::MAX) {
        return Err(Error::param(
            FAMILY,
            "dims",
            format!(
                "{} latent {} + rope {}, {} splits in clusters of {}: needs bf16, a latent of 128..=512 in steps of 128, rope dims a positive multiple of 64 and a cluster of 1, 2, 4 or 8 dividing the splits",
                p.dtype, p.latent, p.rope, p.splits, p.cluster
            ),
        ));
    }
    let maps = maps(p);
    for m in &maps {
        if let Loc::TensorMap(t) = m {
            t.check()
                .map_err(|e| Error::param(FAMILY, "tensor map", &e))?;
        }
    }
    let ct = c_type(p.dtype);
    let half = p.latent / 2;
    let mut items = Writer::new();
    for h in [
        crate::CP_ASYNC_ITEMS,
        include_str!("../cuda/bulk_copy.cuh"),
        include_str!("../cuda/tma.cuh"),
        include_str!("../cuda/wgmma.cuh"),
        HELPERS,
    ] {
        items.line(h.trim_end());
    }
    let clustered = p.cluster > 1;
    if clustered {
        items.line(CLUSTER_HELPERS);
    }
    emit_score_mma(&mut items);
    emit_pv_mma(&mut items, half);
    let mut w = Writer::at_depth(1);
    emit_dims(&mut w, p);
    emit!(
        w,
        "constexpr int LB = {}, KB = {};  // latent boxes, score boxes",
        p.latent / 64,
        boxes(p)
    );
    emit!(
        w,
        "constexpr int HALF = {half}, NO = HALF / 2;  // a warpgroup's output columns, accumulators"
    );
    w.line("constexpr unsigned BOX = 8192, TILE = KB * BOX;  // bytes: a box, q or a cache tile");
    emit!(w, "constexpr int S = {};", p.splits);
    emit!(w, "constexpr long long CHUNK = {};", p.chunk());
    emit!(
        w,
        "const float scale2 = {};  // scale · log2 e",
        f32_lit((p.scale as f64 * std::f64::consts::LOG2_E) as f32)
    );
    w.line("extern __shared__ unsigned char smem_raw[];");
    w.line("unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // swizzled boxes: 1024-aligned");
    w.line("unsigned char* qs = smem;  // q: KB boxes; stage st at smem + (1 + st) · TILE");
    w.line("__shared__ __align__(8) unsigned long long full[2], qbar;");
    w.line("__shared__ unsigned released[2];  // warpgroups done with a stage, over all its uses");
    w.line("__shared__ long long end_r[64];");
    let names = ["qlmap", "qpmap", "cmap", "pemap"];
    for (n, m) in names.iter().zip(&maps) {
        emit!(w, "const void* {n} = {};", m.ptr_as("void", false));
    }
    emit!(w, "{ct}* y = {};", p.out.ptr_as(ct, true));
    w.line("const long long split = blockIdx.y, bi = blockIdx.z;");
    w.line("const long long row0 = (long long)blockIdx.x * 64;  // the block's first row");
    w.line("const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;");
    w.line("const int wg = warp >> 2, wq = warp & 3, g = lane >> 2, tq = lane & 3;");
    mask_setup(&mut w, p);
    w.comment("Per row: the end of its allowed slots (the block's range is their maximum).");
    w.if_block("tid < 64", |w| {
        w.line("const long long gr = row0 + tid;");
        w.line("long long e = 0;");
        w.if_block("gr < ROWS", |w| row_end(w, p));
        w.line("end_r[tid] = e;");
    });
    w.if_block("tid == 0", |w| {
        w.line("mbar_init(&full[0], 1);");
        w.line("mbar_init(&full[1], 1);");
        w.line("released[0] = released[1] = 0;");
        w.line("mbar_init(&qbar, 1);");
    });
    w.line("__syncthreads();");
    w.line("long long len = 0;");
    w.line("for (int r = 0; r < 64; ++r) len = end_r[r] > len ? end_r[r] : len;");
    w.comment("(32-bit slot arithmetic: `supported` keeps B · ctx below 2³¹.)");
    w.line("const int s_begin = (int)(split * CHUNK);");
    if clustered {
        emit!(
            w,
            "constexpr int C = {}, P = S / C;  // splits a cluster folds, partials a row",
            p.cluster
        );
        w.line("const long long part = split / C;");
        w.line("const unsigned rank = (unsigned)(split % C);  // %cluster_ctarank: clusters are 1 × C × 1");
        w.comment(
            "No row of the block reaches this cluster (the same for all its blocks): neither",
        );
        w.comment(
            "its fold nor `mla_combine` reads any of it. A block of a live cluster whose own",
        );
        w.comment("split no row reaches runs no tile and joins the fold with zeros.");
        w.line("if (part * C * CHUNK >= len) return;");
    } else if p.splits > 1 {
        w.comment("No row of the block reaches this split: `mla_combine` reads none of it.");
        w.line("if (s_begin >= len) return;");
    }
    w.line("const int s_end = (int)(s_begin + CHUNK < len ? s_begin + CHUNK : len);");
    w.line("const int ntiles = s_end > s_begin ? (s_end - s_begin + 63) / 64 : 0;");
    w.comment("Tile `it` of the split into stage it & 1 (rows past the cache read as zeros).");
    w.block_semi("auto load_tile = [&](int it)", |w| {
        w.line("const int st = it & 1;");
        w.line("unsigned char* dst = smem + (1 + st) * TILE;");
        w.line("const int row = (int)(bi * CTX) + s_begin + it * 64;");
        w.line("mbar_arrive_expect_tx(&full[st], TILE);");
        w.for_unrolled("kb", 0, "LB", |w| {
            w.line("tma_load_2d(dst + kb * BOX, cmap, kb * 64, row, &full[st]);");
        });
        w.for_unrolled("kb", 0, "KB - LB", |w| {
            w.line("tma_load_2d(dst + (LB + kb) * BOX, pemap, kb * 64, row, &full[st]);");
        });
    });
    let q_cond = if clustered {
        "tid == 0 && ntiles > 0"
    } else {
        "tid == 0"
    };
    w.if_block(q_cond, |w| {
        w.line("const int qrow = (int)(bi * ROWS + row0);");
        w.line("mbar_arrive_expect_tx(&qbar, TILE);");
        w.for_unrolled("kb", 0, "LB", |w| {
            w.line("tma_load_2d(qs + kb * BOX, qlmap, kb * 64, qrow, &qbar);");
        });
        w.for_unrolled("kb", 0, "KB - LB", |w| {
            w.line("tma_load_2d(qs + (LB + kb) * BOX, qpmap, kb * 64, qrow, &qbar);");
        });
        w.line("if (ntiles > 0) load_tile(0);");
        w.line("if (ntiles > 1) load_tile(1);");
    });
    w.comment("This thread's rows of the block: r0 (accumulator elements d < 2) and r0 + 8.");
    w.line("const int r0 = wq * 16 + g;");
    w.comment("The rows' allowed slots of this split end below lim0 / lim1 (32-bit: slots < 2³¹).");
    w.line("const int lim0 = (int)(end_r[r0] < s_end ? end_r[r0] : s_end);");
    w.line("const int lim1 = (int)(end_r[r0 + 8] < s_end ? end_r[r0 + 8] : s_end);");
    if let MlaMask::Tree { .. } = p.mask {
        w.comment(
            "Ancestor words of the rows' tokens (rows past ROWS read row ROWS − 1's: unused).",
        );
        w.line("const long long gc0 = row0 + r0 < ROWS ? row0 + r0 : ROWS - 1;");
        w.line("const long long gc1 = row0 + r0 + 8 < ROWS ? row0 + r0 + 8 : ROWS - 1;");
        w.line("const long long* aw0 = anc + (bi * T + gc0 / H) * W;");
        w.line("const long long* aw1 = anc + (bi * T + gc1 / H) * W;");
    }
    w.line("float o[NO];");
    w.for_unrolled("i", 0, "NO", |w| w.line("o[i] = 0.0f;"));
    w.line(
        "float m0 = neg_inf(), m1 = neg_inf(), l0 = 0.0f, l1 = 0.0f;  // l: this thread's columns",
    );
    w.line(if clustered {
        "if (ntiles > 0) mbar_wait(&qbar, 0);"
    } else {
        "mbar_wait(&qbar, 0);"
    });
    let pp = p.ping_pong;
    if pp {
        w.comment(
            "Ping-pong: warpgroup wg issues its products after bar.sync(1 + wg), then lets the",
        );
        w.comment("other go (bar.arrive on its barrier); warpgroup 0 goes first.");
        w.line("if (wg == 1) asm volatile(\"bar.arrive 1, 256;\" ::: \"memory\");");
    }
    let turn = |w: &mut Writer| {
        if pp {
            w.line("if (wg == 0) asm volatile(\"bar.sync 1, 256;\" ::: \"memory\"); else asm volatile(\"bar.sync 2, 256;\" ::: \"memory\");");
        }
    };
    let pass = |w: &mut Writer| {
        if pp {
            w.line("if (wg == 0) asm volatile(\"bar.arrive 2, 256;\" ::: \"memory\"); else asm volatile(\"bar.arrive 1, 256;\" ::: \"memory\");");
        }
    };
    w.line("#pragma unroll 1");
    w.for_block("int it = 0", "it < ntiles", "++it", |w| {
        w.line("const int st = it & 1;");
        w.line("unsigned char* kt = smem + (1 + st) * TILE;");
        w.line("const int s0 = s_begin + it * 64;");
        w.line("mbar_wait(&full[st], (it >> 1) & 1);");
        w.if_block("s0 + 64 > s_end", |w| {
            w.comment("The split's last tile: zero its slots from s_end on (whole 128-byte rows,");
            w.comment("so the swizzle does not matter), visible to the tensor cores' proxy.");
            w.line("const int keep = s_end - s0, rows = 64 - keep;");
            w.for_block("int i = tid", "i < rows * KB * 8", "i += 256", |w| {
                w.line("const int box = i / (rows * 8), rem = i % (rows * 8);");
                w.line("*reinterpret_cast<uint4*>(kt + box * BOX + (keep + rem / 8) * 128 + (rem % 8) * 16) = make_uint4(0, 0, 0, 0);");
            });
            w.line("asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");");
            w.line("__syncthreads();");
        });
        w.comment("Scores of the 64 rows × 64 slots, k16 steps in feature order.");
        w.line("float sc[32];");
        turn(w);
        w.line("wgmma_fence();");
        w.for_unrolled("kb", 0, "KB", |w| {
            w.for_unrolled("kk", 0, "4", |w| {
                w.line("mla_s(sc, wgmma_desc_k128(qs + kb * BOX + 32 * kk), wgmma_desc_k128(kt + kb * BOX + 32 * kk), kb > 0 || kk > 0);");
            });
        });
        w.line("wgmma_commit();");
        pass(w);
        w.line("wgmma_wait<0>();");
        w.for_unrolled("i", 0, "32", |w| w.line("wgmma_fence_operand(sc[i]);"));
        w.comment("Online softmax in base 2 (scores times scale · log2 e): element 4j + d is row");
        w.comment("r0 + 8 (d >> 1), slot s0 + 8j + 2 tq + (d & 1). A tile wholly inside both rows'");
        w.comment("allowed slots skips the mask.");
        let full = match p.mask {
            MlaMask::Causal => "s0 + 64 <= lim0 && s0 + 64 <= lim1",
            MlaMask::Tree { .. } => "s0 + 64 <= lim0 && s0 + 64 <= lim1 && s0 + 64 <= prefix",
        };
        w.if_else(
            full,
            |w| {
                w.for_unrolled("i", 0, "32", |w| w.line("sc[i] = __fmul_rn(sc[i], scale2);"));
            },
            |w| {
                w.for_unrolled("j", 0, "8", |w| {
                    w.for_unrolled("d", 0, "4", |w| {
                        w.line("const int s = s0 + 8 * j + 2 * tq + (d & 1);");
                        w.line("bool ok = s < (d < 2 ? lim0 : lim1);");
                        if let MlaMask::Tree { .. } = p.mask {
                            w.line("const long long u = s - prefix;");
                            w.if_block("ok && u >= 0", |w| {
                                w.line("const long long* aw = d < 2 ? aw0 : aw1;");
                                w.line(
                                    "ok = u < nodes && (((unsigned long long)aw[u >> 6] >> (u & 63)) & 1ull);",
                                );
                            });
                        }
                        w.line("sc[4 * j + d] = ok ? __fmul_rn(sc[4 * j + d], scale2) : neg_inf();");
                    });
                });
            },
        );
        w.line("float mx0 = neg_inf(), mx1 = neg_inf();");
        w.for_unrolled("j", 0, "8", |w| {
            w.line("mx0 = fmaxf(mx0, fmaxf(sc[4 * j], sc[4 * j + 1]));");
            w.line("mx1 = fmaxf(mx1, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));");
        });
        w.line("mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));");
        w.line("mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));");
        w.line("mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));");
        w.line("mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));");
        w.line("const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);");
        w.comment("Exponents against a finite base (0 while a row has no allowed slot yet), so -inf");
        w.comment("scores give exact zeros; a row whose maximum did not move rescales by exactly 1.");
        w.line("const float b0 = n0 == neg_inf() ? 0.0f : n0, b1 = n1 == neg_inf() ? 0.0f : n1;");
        w.line("const float a0 = m0 == n0 ? 1.0f : ex2_approx(m0 - b0);");
        w.line("const float a1 = m1 == n1 ? 1.0f : ex2_approx(m1 - b1);");
        w.line("m0 = n0;");
        w.line("m1 = n1;");
        w.line("float sum0 = 0.0f, sum1 = 0.0f;");
        w.comment("P as the A fragments of the four k16 steps (the m16n8k16 A layout per warp), split");
        w.comment("into bf16 p_hi + p_lo so the output product keeps p to ~16 more bits.");
        w.line("unsigned ph[4][4], pl[4][4];");
        w.for_unrolled("kk", 0, "4", |w| {
            w.for_unrolled("q", 0, "4", |w| {
                w.line("const float p0 = ex2_approx(sc[8 * kk + 2 * q] - (q & 1 ? b1 : b0));");
                w.line("const float p1 = ex2_approx(sc[8 * kk + 2 * q + 1] - (q & 1 ? b1 : b0));");
                w.line("if (q & 1) sum1 += p0 + p1; else sum0 += p0 + p1;");
                w.line("const __nv_bfloat162 hi = __floats2bfloat162_rn(p0, p1);");
                w.line("const float2 hf = __bfloat1622float2(hi);");
                w.line("const __nv_bfloat162 lo = __floats2bfloat162_rn(p0 - hf.x, p1 - hf.y);");
                w.line("ph[kk][q] = *reinterpret_cast<const unsigned*>(&hi);");
                w.line("pl[kk][q] = *reinterpret_cast<const unsigned*>(&lo);");
            });
        });
        w.line("l0 = __fmaf_rn(l0, a0, sum0);");
        w.line("l1 = __fmaf_rn(l1, a1, sum1);");
        w.comment("Rescale (multiplying by exactly 1 is skipped: the same bits).");
        w.if_block("__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)", |w| {
            w.for_unrolled("j", 0, "NO / 4", |w| {
                w.line("o[4 * j] *= a0; o[4 * j + 1] *= a0; o[4 * j + 2] *= a1; o[4 * j + 3] *= a1;");
            });
        });
        w.comment("o += P · c[:, wg · HALF ..]: the latent boxes read as the MN-major B operand.");
        turn(w);
        w.line("wgmma_fence();");
        w.for_unrolled("kk", 0, "4", |w| {
            w.line("const unsigned long long vb = wgmma_desc_mn128(kt + wg * (HALF / 64) * BOX + kk * 2048, BOX);");
            w.line("mla_pv(o, ph[kk][0], ph[kk][1], ph[kk][2], ph[kk][3], vb, 1);");
            if !p.p_single {
                w.line("mla_pv(o, pl[kk][0], pl[kk][1], pl[kk][2], pl[kk][3], vb, 1);");
            }
        });
        w.line("wgmma_commit();");
        pass(w);
        w.line("wgmma_wait<0>();");
        w.for_unrolled("i", 0, "NO", |w| w.line("wgmma_fence_operand(o[i]);"));
        w.comment("This warpgroup is done with the stage; the second to be (an odd count before its");
        w.comment("arrival) refills it with tile it + 2, so neither waits for the other.");
        w.if_block("(tid & 127) == 0", |w| {
            w.line("const unsigned before = atomicAdd(&released[st], 1u);");
            w.line("if ((before & 1) && it + 2 < ntiles) load_tile(it + 2);");
        });
    });
    if pp {
        w.comment("Warpgroup 1's last pass (or its first, with no tile) is waited for here.");
        w.line("if (wg == 0) asm volatile(\"bar.sync 1, 256;\" ::: \"memory\");");
    }
    w.line("l0 += __shfl_xor_sync(0xffffffffu, l0, 1);");
    w.line("l0 += __shfl_xor_sync(0xffffffffu, l0, 2);");
    w.line("l1 += __shfl_xor_sync(0xffffffffu, l1, 1);");
    w.line("l1 += __shfl_xor_sync(0xffffffffu, l1, 2);");
    if clustered {
        cluster_fold(&mut w, p);
    } else if p.splits == 1 {
        w.for_unrolled("hf", 0, "2", |w| {
            w.line("const long long gr = row0 + r0 + 8 * hf;");
            w.if_block("gr < ROWS", |w| {
                w.line("const float l = hf ? l1 : l0;");
                emit!(
                    w,
                    "{ct}* yr = y + (bi * ROWS + gr) * L + wg * HALF + 2 * tq;"
                );
                w.for_unrolled("j", 0, "NO / 4", |w| {
                    w.line("const float v0 = l > 0.0f ? o[4 * j + 2 * hf] / l : 0.0f;");
                    w.line("const float v1 = l > 0.0f ? o[4 * j + 2 * hf + 1] / l : 0.0f;");
                    w.line("const __nv_bfloat162 h2 = __floats2bfloat162_rn(v0, v1);");
                    w.line("*reinterpret_cast<__nv_bfloat162*>(yr + 8 * j) = h2;");
                });
            });
        });
    } else {
        emit!(w, "float* po = {};", p.partial_acc.ptr_as("float", true));
        emit!(w, "float* pml = {};", p.partial_ml.ptr_as("float", true));
        w.for_unrolled("hf", 0, "2", |w| {
            w.line("const long long gr = row0 + r0 + 8 * hf;");
            w.if_block("gr < ROWS", |w| {
                w.line("float* pr = po + ((bi * ROWS + gr) * S + split) * L + wg * HALF + 2 * tq;");
                w.for_unrolled("j", 0, "NO / 4", |w| {
                    w.line("*reinterpret_cast<float2*>(pr + 8 * j) = make_float2(o[4 * j + 2 * hf], o[4 * j + 2 * hf + 1]);");
                });
                w.if_block("wg == 0 && tq == 0", |w| {
                    w.line("float* q = pml + ((bi * ROWS + gr) * S + split) * 2;");
                    w.comment("m in natural units, as mla_combine folds it (scores times scale).");
                    w.line("q[0] = (hf ? m1 : m0) * 0.69314718f;");
                    w.line("q[1] = hf ? l1 : l0;");
                });
            });
        });
    }
    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(row_blocks(p) as u32),
            Extent::Fixed(p.splits as u32),
            Extent::Fixed(p.batch as u32),
        ],
        block: [THREADS, 1, 1],
        smem_bytes: smem_bytes(p) as u32,
    };
    let attrs = KernelAttrs {
        min_blocks: None,
        cluster: clustered.then_some([1, p.cluster as u32, 1]),
    };
    Ok(assemble_with(
        FAMILY,
        p.dtype.to_string().as_str(),
        &items.finish(),
        "",
        &w.finish(),
        launch,
        &prelude(),
        attrs,
    ))
}

/// The epilogue of a cluster of `C` splits (`p.cluster > 1`): the blocks fold their
/// `(m, l, o)` in shared memory into one partial (or, where one cluster spans the context,
/// the output), so `mla_combine` reads `C` times fewer partials.
///
/// 1. Each block puts its rows' `m` (base 2) and `l` in shared memory; cluster barrier.
/// 2. Every thread reads its rows' `m` of all `C` blocks: `M = max_j m_j`, its own factor
///    `f = 2^(m − M)` (0 for a block that saw no allowed slot of the row), and one thread a
///    row `L = Σ_j 2^(m_j − M)·l_j` in rank order.
/// 3. After both warpgroups are done with the stages, each writes `f · o` over them as
///    `[64][L + 8]` f32; cluster barrier.
/// 4. Block `rank` folds columns `rank·L/C ..` of the 64 rows over the `C` blocks in rank
///    order (`ld.shared::cluster`, 16 bytes a load) and writes the partial (`M` in natural
///    units, `L`) or, with one partial, `R(o / L)`; a last cluster barrier keeps every
///    block's shared memory until its peers have read it.
///
/// The blocks, their order and the rows' sums depend on the capacity's splits alone, so the
/// result is the same in every bucket.
fn cluster_fold(w: &mut Writer, p: &MlaTileParams) {
    let ct = c_type(p.dtype);
    let one_part = p.parts() == 1;
    emit!(
        w,
        "constexpr int RS = L + {FOLD_PAD}, CW = L / C;  // fold row stride, columns a block folds"
    );
    w.line("__shared__ float fm[64], fl[64], fmx[64], fsum[64];  // per row: m, l; M, L");
    w.if_block("wg == 0 && tq == 0", |w| {
        w.line("fm[r0] = m0; fm[r0 + 8] = m1; fl[r0] = l0; fl[r0 + 8] = l1;");
    });
    w.line("cluster_sync_all();");
    w.comment("Each array's loads all issued before their uses (one round trip, not C).");
    w.line("float mj0[C], mj1[C], M0 = neg_inf(), M1 = neg_inf();");
    w.for_unrolled("j", 0, "C", |w| {
        w.line("mj0[j] = dsmem_f32(smem_addr(&fm[r0]), j);");
        w.line("mj1[j] = dsmem_f32(smem_addr(&fm[r0 + 8]), j);");
    });
    w.for_unrolled("j", 0, "C", |w| {
        w.line("M0 = fmaxf(M0, mj0[j]);");
        w.line("M1 = fmaxf(M1, mj1[j]);");
    });
    w.line("const float f0 = m0 == neg_inf() ? 0.0f : ex2_approx(m0 - M0);");
    w.line("const float f1 = m1 == neg_inf() ? 0.0f : ex2_approx(m1 - M1);");
    w.if_block("wg == 0 && tq == 0", |w| {
        w.line("float lj0[C], lj1[C], L0 = 0.0f, L1 = 0.0f;");
        w.for_unrolled("j", 0, "C", |w| {
            w.line("lj0[j] = dsmem_f32(smem_addr(&fl[r0]), j);");
            w.line("lj1[j] = dsmem_f32(smem_addr(&fl[r0 + 8]), j);");
        });
        w.for_unrolled("j", 0, "C", |w| {
            w.line("if (mj0[j] != neg_inf()) L0 = __fmaf_rn(ex2_approx(mj0[j] - M0), lj0[j], L0);");
            w.line("if (mj1[j] != neg_inf()) L1 = __fmaf_rn(ex2_approx(mj1[j] - M1), lj1[j], L1);");
        });
        w.line("fmx[r0] = M0; fmx[r0 + 8] = M1; fsum[r0] = L0; fsum[r0 + 8] = L1;");
    });
    w.comment("Both warpgroups are done reading the stages (the fold buffer reuses them).");
    w.line("__syncthreads();");
    w.line("float* fold = reinterpret_cast<float*>(smem + TILE);");
    w.for_unrolled("hf", 0, "2", |w| {
        w.line("const float f = hf ? f1 : f0;");
        w.line("float* fr = fold + (r0 + 8 * hf) * RS + wg * HALF + 2 * tq;");
        w.for_unrolled("j", 0, "NO / 4", |w| {
            w.line("*reinterpret_cast<float2*>(fr + 8 * j) = make_float2(f * o[4 * j + 2 * hf], f * o[4 * j + 2 * hf + 1]);");
        });
    });
    w.line("cluster_sync_all();");
    if !one_part {
        emit!(w, "float* po = {};", p.partial_acc.ptr_as("float", true));
        emit!(w, "float* pml = {};", p.partial_ml.ptr_as("float", true));
    }
    w.line("const unsigned fold0 = smem_addr(fold);");
    w.comment(
        "16 · CW float4 a block, a whole number of 256 (CW = L / C is 16 · 2^k or 48 · 2^k).",
    );
    w.for_unrolled("k", 0, "16 * CW / 256", |w| {
        w.line("const int i = tid + 256 * k;");
        w.line("const int r = i / (CW / 4), c = (int)rank * CW + 4 * (i % (CW / 4));");
        w.line("const unsigned at = fold0 + (unsigned)(r * RS + c) * 4u;");
        w.line("float4 v[C];");
        w.for_unrolled("j", 0, "C", |w| w.line("v[j] = dsmem_f32x4(at, j);"));
        w.line("float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);");
        w.for_unrolled("j", 0, "C", |w| {
            w.line("a.x += v[j].x; a.y += v[j].y; a.z += v[j].z; a.w += v[j].w;");
        });
        w.line("const long long gr = row0 + r;");
        w.if_block("gr < ROWS", |w| {
            if one_part {
                w.line("const float l = fsum[r];");
                emit!(w, "{ct}* yr = y + (bi * ROWS + gr) * L + c;");
                w.line("const __nv_bfloat162 lo = __floats2bfloat162_rn(l > 0.0f ? a.x / l : 0.0f, l > 0.0f ? a.y / l : 0.0f);");
                w.line("const __nv_bfloat162 hi = __floats2bfloat162_rn(l > 0.0f ? a.z / l : 0.0f, l > 0.0f ? a.w / l : 0.0f);");
                w.line("reinterpret_cast<__nv_bfloat162*>(yr)[0] = lo;");
                w.line("reinterpret_cast<__nv_bfloat162*>(yr)[1] = hi;");
            } else {
                w.line("*reinterpret_cast<float4*>(po + ((bi * ROWS + gr) * P + part) * L + c) = a;");
            }
        });
    });
    if !one_part {
        w.if_block("rank == 0 && tid < 64 && row0 + tid < ROWS", |w| {
            w.line("float* q = pml + ((bi * ROWS + row0 + tid) * P + part) * 2;");
            w.comment("M in natural units, as mla_combine folds it (scores times scale).");
            w.line("q[0] = fmx[tid] * 0.69314718f;");
            w.line("q[1] = fsum[tid];");
        });
    }
    w.comment("Every block's shared memory stays until its peers have read it.");
    w.line("cluster_sync_all();");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kimi(splits: u64, cluster: u64) -> MlaTileParams {
        MlaTileParams {
            batch: 8,
            tokens: 1,
            heads: 64,
            latent: 512,
            rope: 64,
            ctx: 8192,
            scale: 0.1,
            dtype: DType::BF16,
            q_lat: Loc::table(0),
            q_pe: Loc::table(1),
            c_cache: Loc::table(2),
            pe_cache: Loc::table(3),
            pos: Loc::table(4),
            pos_dtype: DType::I32,
            mask: crate::mla_tile::MlaMask::Causal,
            out: Loc::arena(0),
            splits,
            block_row_tiles: 4,
            stages: 2,
            wgmma: true,
            cluster,
            p_single: false,
            ping_pong: false,
            partial_acc: Loc::arena(1 << 20),
            partial_ml: Loc::arena(1 << 24),
        }
    }

    /// Clusters of 8 where the splits allow, else the largest power of two dividing them.
    #[test]
    fn clusters_follow_the_splits() {
        let got: Vec<u64> = [1, 2, 3, 4, 6, 8, 12, 16, 32, 128].map(cluster_for).into();
        assert_eq!(got, [1, 2, 1, 4, 2, 8, 4, 8, 8, 8]);
    }

    /// A cluster must divide the splits and be a portable size; the kernel of a cluster is
    /// launched with `__cluster_dims__` along the splits, folds `C` splits into one partial
    /// (none where one cluster spans the context), and its fold buffer fits the stages.
    #[test]
    fn a_cluster_divides_the_splits_and_names_itself() {
        let limit = 232_448;
        assert!(supported(&kimi(32, 8), limit));
        assert!(supported(&kimi(32, 1), limit));
        assert!(!supported(&kimi(32, 16), limit), "non-portable size");
        assert!(!supported(&kimi(12, 8), limit), "8 does not divide 12");
        assert!(!supported(&kimi(32, 3), limit));
        assert!(fold_bytes(&kimi(32, 8)) <= 2 * tile_bytes(&kimi(32, 8)));
        assert!(tile(&kimi(32, 16)).is_err());

        let k = tile(&kimi(32, 8)).unwrap();
        assert!(
            k.kernel.contains("__cluster_dims__(1, 8, 1)"),
            "{}",
            k.kernel
        );
        assert!(k.kernel.contains("constexpr int C = 8, P = S / C;"));
        assert_eq!(kimi(32, 8).parts(), 4);
        let kernels = crate::mla_tile::mla_tile(&kimi(32, 8)).unwrap();
        assert_eq!(
            kernels.len(),
            2,
            "four partials a row: mla_combine folds them"
        );
        let whole = crate::mla_tile::mla_tile(&kimi(8, 8)).unwrap();
        assert_eq!(
            whole.len(),
            1,
            "one cluster spans the context: no mla_combine"
        );
        assert!(
            !whole[0].kernel.contains("* P + part"),
            "no partials written"
        );

        let unfolded = tile(&kimi(32, 1)).unwrap();
        assert!(!unfolded.kernel.contains("__cluster_dims__"));
        assert!(!unfolded.kernel.contains("cluster_sync_all"));
    }
}
