//! `attention`: decode / verify attention over a KV cache, flash-decoding style.
//!
//! `attn_split` grid `(row blocks, kv_heads · splits, B)`: a block owns one KV head, one
//! slice of the context and up to `rows_per_block` query rows `(t, g)` of one sequence
//! (`g` = query head within the GQA group), so every T query of a sequence (and every head
//! of the group) shares each K/V tile read from the cache. Tiles of `tile_slots` slots are
//! staged in shared memory; scores use an online softmax in the log2 domain. Each block
//! writes an unnormalised partial `(o, m, l)` per row; `attn_combine` (grid `(Hq, M)`)
//! merges the splits and writes `o / l` rounded to the output dtype.
//!
//! The context slice adapts to the sequence: a block attends slots `0..len` where `len` is
//! `max(pos over its rows) + 1` (causal) or `prefix_len + min(T, 64·W)` (tree), split into
//! `splits` equal tile-aligned ranges; ranges past `len` do no work.
//!
//! Masks (IR `AttnMask`): causal: query `(b, t)` attends slots `0..=min(pos[b, t], Ctx−1)`;
//! tree: slots `< prefix_len[b]` and slot `prefix_len[b] + u` for each bit `u < min(T, 64·W)`
//! of `ancestors[b, t]` (W words per row; bit `u` in word `u / 64`). A row that attends nothing (`pos < 0`, a padding lane) outputs 0.
//!
//! Scratch (`scratch_bytes`): `float2 ml[M, Hq, S]` then `float o[M, Hq, S, Dv]`, at
//! `scratch` in the arena, sized for the bucket. Kernel name dtype: the cache dtype.

use crate::abi::{Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec, Loc, Rows, Unit, View};
use crate::writer::{emit, f32_lit, Writer};
use crate::Error;

const FAMILY: &str = "attn_split";
/// Threads of an `attn_split` block.
pub const THREADS: u32 = 128;
/// Static shared memory of a block: CUDA caps static `__shared__` arrays at 48 KiB on every
/// arch.
const SMEM_LIMIT: u64 = 48 * 1024;
/// Upper bound on query rows per block.
const MAX_ROWS: u32 = 32;
/// Index of the partial of block row `gr` (= t · G + g) for this split.
pub(crate) const PARTIAL_ROW: &str =
    "const long long pr = ((long long)(b * c.t + gr / G) * HQ + kvh * G + gr % G) * S + split;";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnMask {
    Causal,
    Tree {
        /// `i32[B]`.
        prefix_len: Loc,
        /// `i64[M, words]` ancestor bitmasks (bit `u` of a row in word `u / 64`).
        ancestors: Loc,
        /// Words per row, ≥ 1: trees of up to `64 · words` nodes.
        words: u32,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttentionParams {
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub head_dim_v: u32,
    /// `[M, q_heads · head_dim]`, row `m = b·T + t`.
    pub q: View,
    /// `[B, Ctx, kv_heads, head_dim]` / `[.., head_dim_v]`.
    pub k_cache: Loc,
    pub v_cache: Loc,
    pub cache_dtype: Dtype,
    /// `[M]` (i32 or i64).
    pub pos: Loc,
    pub pos_dtype: Dtype,
    pub mask: AttnMask,
    /// `[M, q_heads · head_dim_v]`.
    pub out: View,
    /// Multiplies `q·k`.
    pub scale: f32,
    /// Largest T this kernel is launched with (sizes the row tile; any T is correct).
    pub max_t: u32,
    /// Context splits per (sequence, kv head).
    pub splits: u32,
    /// Arena scratch for the partials.
    pub scratch: Loc,
}

/// The split kernel and the combine kernel, launched in that order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionKernels {
    pub split: KernelSource,
    pub combine: KernelSource,
}

pub use specc_ir::engine::choice::AttnTiling;

impl AttentionParams {
    pub(crate) fn group(&self) -> u32 {
        self.q_heads / self.kv_heads
    }

    /// Scratch bytes for a bucket with `m = B·T` rows.
    pub fn scratch_bytes(&self, m: u32) -> u64 {
        let per = m as u64 * self.q_heads as u64 * self.splits as u64;
        per * 8 + per * self.head_dim_v as u64 * 4
    }

    /// Ancestor words per row (0 for a causal mask).
    fn words(&self) -> u64 {
        match self.mask {
            AttnMask::Causal => 0,
            AttnMask::Tree { words, .. } => words as u64,
        }
    }

    fn smem(&self, rb: u32, ts: u32) -> u64 {
        let (qs, cs) = (self.q.dtype.size(), self.cache_dtype.size());
        let extra_words = self.words().saturating_sub(1) * 8 * rb as u64;
        let (d, dv) = (self.head_dim as u64, self.head_dim_v as u64);
        let (rb, ts) = (rb as u64, ts as u64);
        rb * (d + 16 / qs) * qs
            + ts * (d + 16 / cs) * cs
            + ts * (dv + 16 / cs) * cs
            + rb * ts * 4
            + rb * 24
            + 16
            + extra_words
    }

    /// Static shared memory of one `attn_split` block at its [`AttentionParams::tiling`].
    pub fn block_smem_bytes(&self) -> Option<u64> {
        self.tiling()
            .map(|t| self.smem(t.rows_per_block, t.tile_slots))
    }

    /// Rows per block and slots per tile: the largest tile that fits 48 KiB of static shared
    /// memory with a row tile covering `max_t · group` rows (at most 32).
    pub fn tiling(&self) -> Option<AttnTiling> {
        let want = (self.max_t * self.group()).clamp(1, MAX_ROWS);
        [64u32, 32, 16].into_iter().find_map(|ts| {
            let pv_groups = if self.head_dim_v >= THREADS {
                1
            } else {
                THREADS / self.head_dim_v
            };
            // Both the score step's row groups and the PV step's must tile the block's rows.
            let unit = lcm(THREADS / ts, pv_groups);
            let rb = want.next_multiple_of(unit);
            (self.smem(rb, ts) <= SMEM_LIMIT).then_some(AttnTiling {
                rows_per_block: rb,
                tile_slots: ts,
            })
        })
    }

    fn validate(&self) -> Result<AttnTiling, Error> {
        let err = |field, reason: String| Err(Error::param(FAMILY, field, reason));
        let (d, dv) = (self.head_dim, self.head_dim_v);
        if self.kv_heads == 0 || self.q_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return err("q_heads", "must be a positive multiple of kv_heads".into());
        }
        if d == 0 || d % 8 != 0 {
            return err("head_dim", "must be a positive multiple of 8".into());
        }
        if dv == 0 || dv % 8 != 0 {
            return err("head_dim_v", "must be a positive multiple of 8".into());
        }
        if !(self.q.dtype.is_float() && self.out.dtype.is_float() && self.cache_dtype.is_float()) {
            return err("dtype", "q, out and cache must be float types".into());
        }
        if !self.pos_dtype.is_int() {
            return err("pos_dtype", "must be i32 or i64".into());
        }
        if !self.q.aligned(16)
            || !self.k_cache.byte_offset().is_multiple_of(16)
            || !self.v_cache.byte_offset().is_multiple_of(16)
        {
            return err("q/k_cache/v_cache", "must be 16-byte aligned".into());
        }
        if !self.scratch.byte_offset().is_multiple_of(16) {
            return err("scratch", "must be 16-byte aligned".into());
        }
        if let AttnMask::Tree { words: 0, .. } = self.mask {
            return err(
                "mask",
                "a tree mask needs at least one ancestor word".into(),
            );
        }
        if !self.scale.is_finite() || self.max_t == 0 || self.splits == 0 {
            return err(
                "scale/max_t/splits",
                "scale must be finite, max_t and splits positive".into(),
            );
        }
        match self.tiling() {
            Some(t) => Ok(t),
            None => err("head_dim", "no tile fits in 48 KiB of shared memory".into()),
        }
    }
}

/// The CUDA-core kernels (`attn_split` + `attn_combine`): up to 32 rows per block.
pub fn attention(p: &AttentionParams) -> Result<AttentionKernels, Error> {
    let t = p.validate()?;
    Ok(AttentionKernels {
        split: split_kernel(p, t),
        combine: combine_kernel(p),
    })
}

/// The tensor-core kernels (`attn_tile` + `attn_combine`, [`crate::attention_mma`]) with block shape `t`: up to 256 rows per block.
pub fn attention_tiles_tiled(
    p: &AttentionParams,
    t: crate::attention_mma::TileTiling,
) -> Result<AttentionKernels, Error> {
    Ok(AttentionKernels {
        split: crate::attention_mma::split_kernel_tiled(p, t)?,
        combine: combine_kernel(p),
    })
}

/// The tensor-core split kernel with the combine folded in ([`crate::attention_mma::FusedCombine`]):
/// one launch, the bits of [`attention_tiles_tiled`]'s two.
pub fn attention_tiles_fused(
    p: &AttentionParams,
    t: crate::attention_mma::TileTiling,
    fc: crate::attention_mma::FusedCombine,
) -> Result<KernelSource, Error> {
    crate::attention_mma::split_kernel_fused(p, t, fc)
}

pub(crate) fn scratch_ptrs(w: &mut Writer, p: &AttentionParams, mutable: bool) {
    let cv = if mutable { "" } else { "const " };
    emit!(w, "{cv}float* ml = {};", p.scratch.ptr(Dtype::F32, mutable));
    w.line("// partial outputs follow the (m, l) pairs of every row of the bucket");
    emit!(w, "{cv}float* po = ml + (long long)c.m * HQ * S * 2;");
}

/// The split kernels' block coordinates (sequence, KV head, split, first row) and operand
/// pointers, and for a tree mask the sequence's prefix and ancestor words; `one_word` writes
/// the node count for a single ancestor word.
pub(crate) fn emit_block_operands(w: &mut Writer, p: &AttentionParams, one_word: bool) {
    let (qt, ct) = (p.q.dtype.c_type(), p.cache_dtype.c_type());
    w.line("const int b = blockIdx.z;");
    w.line("const int kvh = blockIdx.y % HKV;");
    w.line("const int split = blockIdx.y / HKV;");
    w.line("const int r0 = blockIdx.x * RB;  // first row t * G + g of the block");
    w.line("const int nrows = min(RB, c.t * G - r0);");
    emit!(w, "const {qt}* q = {};", p.q.loc.ptr(p.q.dtype, false));
    emit!(
        w,
        "const {ct}* kc = {};",
        p.k_cache.ptr(p.cache_dtype, false)
    );
    emit!(
        w,
        "const {ct}* vc = {};",
        p.v_cache.ptr(p.cache_dtype, false)
    );
    emit!(
        w,
        "const {}* pos = {};",
        p.pos_dtype.c_type(),
        p.pos.ptr(p.pos_dtype, false)
    );
    scratch_ptrs(w, p, true);
    if let AttnMask::Tree {
        prefix_len,
        ancestors,
        ..
    } = p.mask
    {
        emit!(
            w,
            "const int pl0 = ({})[b];",
            prefix_len.ptr(Dtype::I32, false)
        );
        w.line("const int prefix = pl0 < 0 ? 0 : min(pl0, c.ctx);");
        if one_word {
            w.line("const int tree_n = min(c.t, 64);");
        } else {
            w.line("const int tree_n = min(c.t, 64 * AW);");
        }
        emit!(
            w,
            "const long long* anc = {};",
            ancestors.ptr(Dtype::I64, false)
        );
    }
}

fn lcm(a: u32, b: u32) -> u32 {
    let gcd = |mut a: u32, mut b: u32| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

/// Whether `dv` output columns split unevenly over the block's threads in the PV step.
fn pv_ragged(dv: u32) -> bool {
    if dv >= THREADS {
        !dv.is_multiple_of(THREADS)
    } else {
        !THREADS.is_multiple_of(dv)
    }
}

fn split_kernel(p: &AttentionParams, t: AttnTiling) -> KernelSource {
    let (d, dv, g) = (p.head_dim, p.head_dim_v, p.group());
    let (rb, ts) = (t.rows_per_block, t.tile_slots);
    let (qt, ct) = (p.q.dtype.c_type(), p.cache_dtype.c_type());
    let (qv, cv) = (16 / p.q.dtype.size(), 16 / p.cache_dtype.size());
    let tree = matches!(p.mask, AttnMask::Tree { .. });
    // One word keeps the single-`long long` form; more index a row of words.
    let words = p.words();
    let mut kb = KernelBuilder::new(FAMILY, p.cache_dtype);
    let w = &mut kb.body;
    emit!(w, "constexpr int D = {d};");
    emit!(w, "constexpr int DV = {dv};");
    emit!(w, "constexpr int HQ = {};", p.q_heads);
    emit!(w, "constexpr int HKV = {};", p.kv_heads);
    emit!(w, "constexpr int G = {g};  // query heads per kv head");
    emit!(w, "constexpr int S = {};  // context splits", p.splits);
    emit!(
        w,
        "constexpr int RB = {rb};  // query rows (t, g) per block"
    );
    emit!(w, "constexpr int TS = {ts};  // cache slots per tile");
    emit!(w, "constexpr int NT = {THREADS};");
    w.line("constexpr int RGS = NT / TS;  // row groups of the score step");
    // Ragged: DV neither divides nor is a multiple of NT; some threads idle in the PV step
    // (`pv_on`) or own columns past DV (guarded). Other shapes keep the unguarded form.
    let ragged = pv_ragged(dv);
    w.line("constexpr int PVG = DV >= NT ? 1 : NT / DV;  // row groups of the PV step");
    if ragged {
        w.line(
            "constexpr int PVC = DV >= NT ? (DV + NT - 1) / NT : 1;  // output columns per thread",
        );
    } else {
        w.line("constexpr int PVC = DV >= NT ? DV / NT : 1;  // output columns per thread");
    }
    w.line("constexpr int PR = RB / PVG;  // output rows per thread");
    emit!(
        w,
        "constexpr float SCALE_LOG2 = {};  // scale * log2(e)",
        f32_lit((p.scale as f64 * std::f64::consts::LOG2_E) as f32)
    );
    emit!(w, "__shared__ __align__(16) {qt} qs[RB][D + {qv}];");
    emit!(w, "__shared__ __align__(16) {ct} ks[TS][D + {cv}];");
    emit!(w, "__shared__ __align__(16) {ct} vs[TS][DV + {cv}];");
    w.line("__shared__ float ps[RB][TS];");
    w.line("__shared__ float row_m[RB], row_l[RB], row_a[RB];");
    w.line("__shared__ int row_pos[RB];");
    if words == 1 {
        w.line("__shared__ long long row_anc[RB];");
    } else if tree {
        emit!(w, "constexpr int AW = {words};  // ancestor words per row");
        w.line("__shared__ long long row_anc[RB][AW];");
    }
    w.line("__shared__ int s_len;");
    w.line("const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;");
    emit_block_operands(w, p, words == 1);

    w.comment("per-row state; row_pos = last attended slot (causal) or validity (tree), -1 = none");
    w.if_block("tid < RB", |w| {
        w.line("int rp = -1;");
        w.if_block("tid < nrows", |w| {
            w.line("const int m = b * c.t + (r0 + tid) / G;");
            if words == 1 {
                w.line("rp = 0;");
                w.line("row_anc[tid] = anc[m];");
            } else if tree {
                w.line("rp = 0;");
                w.line(
                    "for (int j = 0; j < AW; ++j) row_anc[tid][j] = anc[(long long)m * AW + j];",
                );
            } else {
                w.line("rp = cache_slot((long long)pos[m], c.ctx);");
            }
        });
        w.line("row_pos[tid] = rp;");
        w.line("row_m[tid] = neg_inf();");
        w.line("row_l[tid] = 0.0f;");
    });
    w.comment("q tile, zero rows past the end");
    emit!(w, "constexpr int QV = {qv};");
    w.for_block("int i = tid", "i < RB * (D / QV)", "i += NT", |w| {
        w.line("const int r = i / (D / QV), d = (i % (D / QV)) * QV;");
        w.if_else(
            "r < nrows",
            |w| {
                w.line("const int gr = r0 + r;");
                emit!(
                    w,
                    "const long long row = (long long)(b * c.t + gr / G) * {};",
                    p.q.row_stride
                );
                w.line("copy16(&qs[r][d], q + row + (kvh * G + gr % G) * D + d);");
            },
            |w| w.line("zero16(&qs[r][d]);"),
        );
    });
    if tree {
        w.line("const int len = min(prefix + tree_n, c.ctx);");
    } else {
        w.line("__syncthreads();");
        w.if_block("tid == 0", |w| {
            w.line("int mx = -1;");
            w.line("for (int r = 0; r < nrows; ++r) mx = max(mx, row_pos[r]);");
            w.line("s_len = mx + 1;");
        });
        w.line("__syncthreads();");
        w.line("const int len = s_len;");
    }
    w.line("const int per = ((len + S - 1) / S + TS - 1) / TS * TS;");
    w.line("const int s_begin = split * per;");
    w.line("const int s_end = min(len, s_begin + per);");
    w.line("const int pc = tid % (DV >= NT ? NT : DV);  // first output column of the thread");
    if ragged {
        w.line("const int prg_t = tid / (DV >= NT ? NT : DV);");
        w.line("const bool pv_on = prg_t < PVG;  // threads past PVG row groups only stage tiles");
        w.line("const int prg = pv_on ? prg_t : 0;  // output row group of the thread");
    } else {
        w.line("const int prg = tid / (DV >= NT ? NT : DV);  // output row group of the thread");
    }
    w.line("float o[PR][PVC];");
    w.for_unrolled("j", 0, "PR", |w| {
        w.for_unrolled("cc", 0, "PVC", |w| w.line("o[j][cc] = 0.0f;"))
    });

    w.for_block("int s0 = s_begin", "s0 < s_end", "s0 += TS", |w| {
        w.comment("K and V tiles; slots past the range are zero and masked");
        w.line("__syncthreads();");
        emit!(w, "constexpr int CV = {cv};");
        for (buf, src, dim) in [("ks", "kc", "D"), ("vs", "vc", "DV")] {
            w.for_block(
                "int i = tid",
                format_args!("i < TS * ({dim} / CV)"),
                "i += NT",
                |w| {
                    emit!(
                        w,
                        "const int s = i / ({dim} / CV), d = (i % ({dim} / CV)) * CV;"
                    );
                    w.line("const int slot = s0 + s;");
                    w.if_else(
                        "slot < s_end",
                        |w| {
                            w.line(
                                "const long long at = (long long)(b * c.ctx + slot) * HKV + kvh;",
                            );
                            emit!(w, "copy16(&{buf}[s][d], {src} + at * {dim} + d);");
                        },
                        |w| emit!(w, "zero16(&{buf}[s][d]);"),
                    );
                },
            );
        }
        w.line("__syncthreads();");
        w.comment("scores (log2 domain): thread owns slot tid % TS for rows tid / TS + RGS * j");
        w.scope(|w| {
            w.line("const int s = tid % TS, rg = tid / TS;");
            w.line("float acc[RB / RGS];");
            w.for_unrolled("j", 0, "RB / RGS", |w| w.line("acc[j] = 0.0f;"));
            w.line("#pragma unroll 4");
            w.for_block("int d = 0", "d < D", "d += 8", |w| {
                w.line("float kv[8];");
                w.line("ld_vec<8>(&ks[s][d], kv);");
                w.for_unrolled("j", 0, "RB / RGS", |w| {
                    w.line("float qv[8];");
                    w.line("ld_vec<8>(&qs[rg + RGS * j][d], qv);");
                    w.for_unrolled("e", 0, 8, |w| {
                        w.line("acc[j] = fmaf(qv[e], kv[e], acc[j]);")
                    });
                });
            });
            w.line("const int slot = s0 + s;");
            w.for_unrolled("j", 0, "RB / RGS", |w| {
                w.line("const int r = rg + RGS * j;");
                if words == 1 {
                    w.line("const int u = slot - prefix;");
                    w.line(
                        "const bool ok = slot < s_end && row_pos[r] >= 0 && (slot < prefix || \
                         (u < tree_n && ((row_anc[r] >> u) & 1)));",
                    );
                } else if tree {
                    w.line("const int u = slot - prefix;");
                    w.line(
                        "const bool ok = slot < s_end && row_pos[r] >= 0 && (slot < prefix || \
                         (u < tree_n && ((row_anc[r][u >> 6] >> (u & 63)) & 1)));",
                    );
                } else {
                    w.line("const bool ok = slot < s_end && slot <= row_pos[r];");
                }
                w.line("ps[r][s] = ok ? acc[j] * SCALE_LOG2 : neg_inf();");
            });
        });
        w.line("__syncthreads();");
        w.comment("online softmax, one warp per row");
        w.for_block("int r = warp", "r < RB", "r += NT / 32", |w| {
            w.line("float mx = neg_inf();");
            w.line("for (int s = lane; s < TS; s += 32) mx = fmaxf(mx, ps[r][s]);");
            w.line("mx = warp_max(mx);");
            w.line("const float m_old = row_m[r];");
            w.line("const float m_new = fmaxf(m_old, mx);");
            w.line("const bool none = m_new == neg_inf();");
            w.line("float sum = 0.0f;");
            w.for_block("int s = lane", "s < TS", "s += 32", |w| {
                w.line("const float e = none ? 0.0f : exp2f(ps[r][s] - m_new);");
                w.line("ps[r][s] = e;");
                w.line("sum += e;");
            });
            w.line("sum = warp_sum(sum);");
            w.line("const float l_old = row_l[r];");
            w.line("__syncwarp();  // every lane has read the row state before lane 0 updates it");
            w.if_block("lane == 0", |w| {
                w.line("const float a = none ? 1.0f : exp2f(m_old - m_new);");
                w.line("row_a[r] = a;");
                w.line("row_l[r] = l_old * a + sum;");
                w.line("row_m[r] = m_new;");
            });
        });
        w.line("__syncthreads();");
        w.comment("o = o * alpha + p · V");
        w.for_unrolled("j", 0, "PR", |w| {
            w.line("const float a = row_a[prg + PVG * j];");
            w.for_unrolled("cc", 0, "PVC", |w| w.line("o[j][cc] *= a;"));
        });
        w.line("#pragma unroll 4");
        w.for_block("int s = 0", "s < TS", "++s", |w| {
            w.line("float vv[PVC];");
            w.for_unrolled("cc", 0, "PVC", |w| {
                if ragged {
                    w.line("const int col = min(pc + cc * NT, DV - 1);");
                    w.line("vv[cc] = to_f32(vs[s][col]);");
                } else {
                    w.line("vv[cc] = to_f32(vs[s][pc + cc * NT]);");
                }
            });
            w.for_unrolled("j", 0, "PR", |w| {
                w.line("const float pj = ps[prg + PVG * j][s];");
                w.for_unrolled("cc", 0, "PVC", |w| {
                    w.line("o[j][cc] = fmaf(pj, vv[cc], o[j][cc]);");
                });
            });
        });
    });

    w.comment("partials of this split: (m, l) per row and the unnormalised o");
    w.line("__syncthreads();");
    w.for_unrolled("j", 0, "PR", |w| {
        w.line("const int r = prg + PVG * j;");
        let write_if = if ragged {
            "pv_on && r < nrows"
        } else {
            "r < nrows"
        };
        w.if_block(write_if, |w| {
            w.line("const int gr = r0 + r;");
            w.line(PARTIAL_ROW);
            w.for_unrolled("cc", 0, "PVC", |w| {
                if ragged {
                    w.line("const int col = pc + cc * NT;");
                    w.line("if (col < DV) po[pr * DV + col] = o[j][cc];");
                } else {
                    w.line("po[pr * DV + pc + cc * NT] = o[j][cc];");
                }
            });
        });
    });
    w.if_block("tid < nrows", |w| {
        w.line("const int gr = r0 + tid;");
        w.line(PARTIAL_ROW);
        w.line("ml[pr * 2] = row_m[tid];");
        w.line("ml[pr * 2 + 1] = row_l[tid];");
    });

    let launch = LaunchSpec {
        grid: [
            Extent::Scaled {
                unit: Unit::T,
                mul: g,
                div: rb,
            },
            Extent::Fixed(p.kv_heads * p.splits),
            Extent::Scaled {
                unit: Unit::B,
                mul: 1,
                div: 1,
            },
        ],
        block: [THREADS, 1, 1],
        smem_bytes: 0,
    };
    kb.finish(launch)
}

fn combine_kernel(p: &AttentionParams) -> KernelSource {
    let nt = p.head_dim_v.next_multiple_of(32).min(128);
    let ot = p.out.dtype.c_type();
    let mut kb = KernelBuilder::new("attn_combine", p.out.dtype);
    let w = &mut kb.body;
    emit!(w, "constexpr int HQ = {};", p.q_heads);
    emit!(w, "constexpr int DV = {};", p.head_dim_v);
    emit!(w, "constexpr int S = {};", p.splits);
    emit!(w, "constexpr int NT = {nt};");
    w.line("__shared__ float wsp[S];");
    w.line("const int hq = blockIdx.x, m = blockIdx.y, tid = threadIdx.x;");
    scratch_ptrs(w, p, false);
    w.line("const long long base = ((long long)m * HQ + hq) * S;");
    w.line("float mx = neg_inf();");
    w.line("for (int i = 0; i < S; ++i) mx = fmaxf(mx, ml[(base + i) * 2]);");
    w.for_block("int i = tid", "i < S", "i += NT", |w| {
        w.line("const float mi = ml[(base + i) * 2];");
        w.line("wsp[i] = mi == neg_inf() ? 0.0f : exp2f(mi - mx);");
    });
    w.line("__syncthreads();");
    w.line("float l = 0.0f;");
    w.line("for (int i = 0; i < S; ++i) l = fmaf(wsp[i], ml[(base + i) * 2 + 1], l);");
    w.line("const float inv = l > 0.0f ? 1.0f / l : 0.0f;");
    emit!(
        w,
        "{ot}* y = {} + (long long)m * {} + hq * DV;",
        p.out.loc.ptr(p.out.dtype, true),
        p.out.row_stride
    );
    w.for_block("int d = tid", "d < DV", "d += NT", |w| {
        w.line("float acc = 0.0f;");
        w.for_block("int i = 0", "i < S", "++i", |w| {
            w.line("if (wsp[i] != 0.0f) acc = fmaf(wsp[i], po[(base + i) * DV + d], acc);");
        });
        emit!(w, "y[d] = from_f32<{ot}>(acc * inv);");
    });
    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(p.q_heads),
            Rows::Tokens.extent(1, 1),
            Extent::Fixed(1),
        ],
        block: [nt, 1, 1],
        smem_bytes: 0,
    };
    kb.finish(launch)
}
