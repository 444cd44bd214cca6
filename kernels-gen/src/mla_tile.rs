//! Absorbed multi-head latent attention on tensor cores (`mla_tile`, and `mla_combine` for
//! context splits): the `mla_attention` op for 16-bit q and caches.
//!
//! A block owns 16 query rows of one sequence — rows are (token, head) pairs, `t·H + h`, so
//! every head and token of a sequence shares the latent cache — and one split of the
//! context. Per tile of [`TILE_SLOTS`] slots the block stages `[c | pe]` once in shared
//! memory (cp.async, zero-filled past the range), then
//! 1. scores: warp `w` computes slots `16w .. 16w+16` of `q·[c | pe]ᵀ` for all 16 rows
//!    (mma m16n8k16, f32 accumulation), scaled, masked (causal `s ≤ pos`, or the tree:
//!    `s < prefix` or an ancestor bit) into shared memory;
//! 2. online softmax per row (8 threads a row): the running max, `p = exp(s − m)` split into
//!    two 16-bit values `p_hi + p_lo` (written over the row's scores) for the next product,
//!    the running sum of the f32 `p`;
//! 3. output: warp `w` owns latent columns `w·L/4 ..` and adds `p_hi · c + p_lo · c` (two
//!    mma) to its accumulators after rescaling them.
//!
//! The splits cut the context at fixed slots (they depend on the context capacity only), so a
//! row's result is the same whatever else its block, bucket or step computes: the greedy
//! tokens of a verify equal those of decoding one token at a time.
//!
//! Without splits the block writes `R(acc / l)` (0 for a row with no allowed slot); with
//! splits it writes `acc`, `m`, `l` per split in f32 and `mla_combine` merges them. The
//! numerics are the interpreter's up to the summation order and `p`'s split (relative error
//! ~2⁻¹⁷ for bf16).

use crate::abi::{assemble, Extent, KernelSource, LaunchSpec, Loc, PRELUDE};
use crate::generic::GENERIC_PRELUDE;
use crate::writer::{emit, f32_lit, Writer};
use crate::Error;
use specc_ir::DType;

/// Cache slots per tile: four warps of 16 slots each in the score phase.
pub const TILE_SLOTS: u64 = 64;
/// Query rows per block (one mma row tile).
pub const TILE_ROWS: u64 = 16;
/// Shared-memory row padding in elements (16 bytes: `ldmatrix` rows on distinct banks).
const PAD: u64 = 8;
const HELPERS: &str = include_str!("../cuda/attn_mma.cuh");

/// The mask of one launch: causal against `pos[b, t]`, or the tree (`prefix_len[b]` and
/// `ancestors[b, t, words]`).
#[derive(Clone, Copy, Debug)]
pub enum MlaMask {
    Causal,
    Tree {
        prefix_len: Loc,
        prefix_dtype: DType,
        ancestors: Loc,
        words: u64,
    },
}

/// One `mla_attention` launch on tensor cores.
#[derive(Clone, Copy, Debug)]
pub struct MlaTileParams {
    pub batch: u64,
    pub tokens: u64,
    pub heads: u64,
    /// `kv_lora_rank` (latent features).
    pub latent: u64,
    /// `qk_rope_head_dim`.
    pub rope: u64,
    /// Cache slots per sequence.
    pub ctx: u64,
    pub scale: f32,
    /// q, caches and output (bf16 or f16).
    pub dtype: DType,
    pub q_lat: Loc,
    pub q_pe: Loc,
    pub c_cache: Loc,
    pub pe_cache: Loc,
    /// Positions `[B, T]` (causal; unused by the tree mask).
    pub pos: Loc,
    pub pos_dtype: DType,
    pub mask: MlaMask,
    pub out: Loc,
    /// Context splits (1: no partials).
    pub splits: u64,
    /// f32 `[B, T·H, splits, latent]` and `[B, T·H, splits, 2]` (splits > 1).
    pub partial_acc: Loc,
    pub partial_ml: Loc,
}

impl MlaTileParams {
    fn k_padded(&self) -> u64 {
        (self.latent + self.rope).next_multiple_of(16)
    }

    /// Slots of each split: the context in `splits` equal ranges of whole tiles.
    pub fn chunk(&self) -> u64 {
        self.ctx
            .div_ceil(self.splits.max(1))
            .next_multiple_of(TILE_SLOTS)
    }

    pub fn row_tiles(&self) -> u64 {
        (self.tokens * self.heads).div_ceil(TILE_ROWS)
    }

    /// Bytes of the partials (`partial_acc`, `partial_ml`) at `splits`.
    pub fn partial_bytes(&self, splits: u64) -> (u64, u64) {
        let rows = self.batch * self.tokens * self.heads * splits;
        (4 * rows * self.latent, 8 * rows)
    }

    /// Dynamic shared memory of one block.
    pub fn smem_bytes(&self) -> u64 {
        let st = self.k_padded() + PAD;
        let e = 2;
        TILE_ROWS * st * e
            + TILE_SLOTS * st * e
            + TILE_ROWS * (TILE_SLOTS + 4) * 4
            + 3 * TILE_ROWS * 4
            + TILE_ROWS * 8
    }
}

/// Whether the kernel takes these shapes: 16-bit q and caches of one type, the latent dims a
/// multiple of 32 (four warps of whole 8-column mma tiles), the rope dims of 8 (16-byte
/// loads), and a block within `smem_limit` bytes of shared memory.
pub fn supported(p: &MlaTileParams, smem_limit: u64) -> bool {
    matches!(p.dtype, DType::BF16 | DType::F16)
        && p.latent.is_multiple_of(32)
        && p.latent > 0
        && p.rope.is_multiple_of(8)
        && p.smem_bytes() <= smem_limit
        && p.tokens * p.heads > 0
}

fn c_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        _ => "bf16",
    }
}

/// The kernels of `p`: `mla_tile`, then `mla_combine` when `p.splits > 1`.
pub fn mla_tile(p: &MlaTileParams) -> Result<Vec<KernelSource>, Error> {
    if !supported(p, u64::MAX) {
        return Err(Error::param(
            "mla_tile",
            "dims",
            format!(
                "{} latent {} + rope {} is not a tensor-core shape",
                p.dtype, p.latent, p.rope
            ),
        ));
    }
    let mut out = vec![tile(p)];
    if p.splits > 1 {
        out.push(combine(p));
    }
    Ok(out)
}

fn prelude() -> String {
    format!("{PRELUDE}\n{GENERIC_PRELUDE}")
}

fn tile(p: &MlaTileParams) -> KernelSource {
    let ct = c_type(p.dtype);
    let mma = if p.dtype == DType::F16 {
        "mma16816_f16"
    } else {
        "mma16816_bf16"
    };
    let kp = p.k_padded();
    let ncolw = p.latent / 4;
    let mut items = Writer::new();
    items.line(crate::CP_ASYNC_ITEMS.trim_end());
    items.line(HELPERS.trim_end());
    let mut w = Writer::at_depth(1);
    emit!(
        w,
        "constexpr long long T = {}, H = {}, L = {}, R = {}, CTX = {}, ROWS = T * H;",
        p.tokens,
        p.heads,
        p.latent,
        p.rope,
        p.ctx
    );
    emit!(
        w,
        "constexpr int TS = {TILE_SLOTS}, KP = {kp}, ST = KP + {PAD}, SST = TS + 4, S = {};",
        p.splits
    );
    emit!(
        w,
        "constexpr int NCOLW = {ncolw}, NTP = NCOLW / 8;  // latent columns / mma tiles per warp"
    );
    emit!(w, "const float scale = {};", f32_lit(p.scale));
    w.line("extern __shared__ __align__(16) unsigned char smem[];");
    emit!(w, "{ct}* qs = reinterpret_cast<{ct}*>(smem);  // [16][ST]");
    emit!(w, "{ct}* cs = qs + 16 * ST;  // [TS][ST]: c | pe | 0");
    w.comment("[16][SST] f32 scores; after the softmax each row holds p_hi[TS] | p_lo[TS].");
    w.line("float* ss = reinterpret_cast<float*>(cs + TS * ST);");
    emit!(w, "{ct}* ps = reinterpret_cast<{ct}*>(ss);");
    w.line("constexpr int PST = 2 * SST;  // a row of ps, in 16-bit elements");
    w.line("float* m_r = ss + 16 * SST;");
    w.line("float* l_r = m_r + 16;");
    w.line("float* a_r = l_r + 16;");
    w.line("long long* end_r = reinterpret_cast<long long*>(a_r + 16);");
    emit!(w, "const {ct}* ql = {};", p.q_lat.ptr_as(ct, false));
    emit!(w, "const {ct}* qp = {};", p.q_pe.ptr_as(ct, false));
    emit!(w, "const {ct}* kc = {};", p.c_cache.ptr_as(ct, false));
    emit!(w, "const {ct}* kp = {};", p.pe_cache.ptr_as(ct, false));
    emit!(w, "{ct}* y = {};", p.out.ptr_as(ct, true));
    w.line("const long long tile = blockIdx.x, split = blockIdx.y, bi = blockIdx.z;");
    w.line("const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;");
    w.line("const int g = lane >> 2, tq = lane & 3;");
    match p.mask {
        MlaMask::Causal => {
            let pt = crate::generic::c_type(p.pos_dtype);
            emit!(w, "const {pt}* pos = {};", p.pos.ptr_as(pt, false));
        }
        MlaMask::Tree {
            prefix_len,
            prefix_dtype,
            ancestors,
            words,
        } => {
            let pt = crate::generic::c_type(prefix_dtype);
            emit!(w, "const {pt}* pl = {};", prefix_len.ptr_as(pt, false));
            emit!(
                w,
                "const long long* anc = {};",
                ancestors.ptr_as("long long", false)
            );
            emit!(w, "constexpr long long W = {words};");
            w.line("const long long prefix = to_i64(pl[bi]);");
            w.line("const long long nodes = T < 64 * W ? T : 64 * W;");
        }
    }
    w.comment("Per row: the end of its allowed slots (the block's range is their maximum).");
    w.if_block("tid < 16", |w| {
        w.line("const long long gr = tile * 16 + tid;");
        w.line("long long e = 0;");
        w.if_block("gr < ROWS", |w| match p.mask {
            MlaMask::Causal => {
                w.line("const long long pv = to_i64(pos[bi * T + gr / H]);");
                w.line("e = pv < 0 ? 0 : (pv + 1 < CTX ? pv + 1 : CTX);");
            }
            MlaMask::Tree { .. } => {
                w.line("const long long reach = (prefix > 0 ? prefix : 0) + nodes;");
                w.line("e = reach < CTX ? reach : CTX;");
            }
        });
        w.line("end_r[tid] = e;");
        w.line("m_r[tid] = neg_inf();");
        w.line("l_r[tid] = 0.0f;");
    });
    w.comment("q rows: q_lat | q_pe | 0, 16-byte copies.");
    w.for_block("int i = tid", "i < 16 * (KP / 8)", "i += blockDim.x", |w| {
        w.line("const int row = i / (KP / 8), kv = (i % (KP / 8)) * 8;");
        w.line("const long long gr = tile * 16 + row;");
        w.line("const bool in = gr < ROWS;");
        emit!(w, "const {ct}* src = ql;");
        w.line("bool ok = false;");
        w.if_else(
            "kv < L",
            |w| {
                w.line("src = ql + (bi * ROWS + gr) * L + kv;");
                w.line("ok = in;");
            },
            |w| {
                w.if_block("kv < L + R", |w| {
                    w.line("src = qp + (bi * ROWS + gr) * R + (kv - L);");
                    w.line("ok = in;");
                });
            },
        );
        w.line("cp_async16(qs + row * ST + kv, ok ? src : ql, ok);");
    });
    w.line("cp_async_commit();");
    w.line("cp_async_wait<0>();");
    w.line("__syncthreads();");
    w.line("long long len = 0;");
    w.line("for (int r = 0; r < 16; ++r) len = end_r[r] > len ? end_r[r] : len;");
    w.comment("This split's slots: a fixed range of whole tiles (so a row's sums never depend on");
    w.comment("the other rows of its block or bucket), cut at the block's longest row.");
    emit!(w, "constexpr long long CHUNK = {};", p.chunk());
    w.line("const long long s_begin = split * CHUNK;");
    w.line("const long long s_end = s_begin + CHUNK < len ? s_begin + CHUNK : len;");
    w.line("float acc[NTP + 1][4];");
    w.for_unrolled("n", 0, "NTP + 1", |w| {
        w.line("acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;");
    });
    w.for_block("long long s0 = s_begin", "s0 < s_end", "s0 += TS", |w| {
        w.for_block("int i = tid", "i < TS * (KP / 8)", "i += blockDim.x", |w| {
            w.line("const int j = i / (KP / 8), kv = (i % (KP / 8)) * 8;");
            w.line("const long long s = s0 + j;");
            w.line("const bool in = s < s_end;");
            emit!(w, "const {ct}* src = kc;");
            w.line("bool ok = false;");
            w.if_else(
                "kv < L",
                |w| {
                    w.line("src = kc + (bi * CTX + s) * L + kv;");
                    w.line("ok = in;");
                },
                |w| {
                    w.if_block("kv < L + R", |w| {
                        w.line("src = kp + (bi * CTX + s) * R + (kv - L);");
                        w.line("ok = in;");
                    });
                },
            );
            w.line("cp_async16(cs + j * ST + kv, ok ? src : kc, ok);");
        });
        w.line("cp_async_commit();");
        w.line("cp_async_wait<0>();");
        w.line("__syncthreads();");
        w.comment("Scores of slots 16·warp .. +16 for the 16 rows.");
        w.line("float sc[2][4] = {};");
        w.for_block("int kd = 0", "kd < KP / 16", "++kd", |w| {
            w.line("unsigned a[4], kb[4];");
            w.line(
                "ldmatrix_x4(a, qs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * ST + kd * 16 + 8 * (lane >> 4));",
            );
            w.line(
                "ldmatrix_x4(kb, cs + (16 * warp + (lane & 7) + 8 * (lane >> 4)) * ST + kd * 16 + 8 * ((lane >> 3) & 1));",
            );
            emit!(w, "{mma}(sc[0], a, kb[0], kb[1]);");
            emit!(w, "{mma}(sc[1], a, kb[2], kb[3]);");
        });
        w.for_unrolled("nt", 0, "2", |w| {
            w.for_unrolled("i", 0, "4", |w| {
                w.line("const int row = g + (i >= 2 ? 8 : 0);");
                w.line("const int col = 16 * warp + nt * 8 + 2 * tq + (i & 1);");
                w.line("const long long s = s0 + col;");
                w.line("bool ok = s < s_end && s < end_r[row];");
                if let MlaMask::Tree { .. } = p.mask {
                    w.line("const long long u = s - prefix;");
                    w.if_block("ok && u >= 0", |w| {
                        w.line("const long long gr = tile * 16 + row;");
                        w.line("const long long* aw = anc + (bi * T + gr / H) * W;");
                        w.line(
                            "ok = u < nodes && (((unsigned long long)aw[u >> 6] >> (u & 63)) & 1ull);",
                        );
                    });
                }
                w.line("ss[row * SST + col] = ok ? __fmul_rn(sc[nt][i], scale) : neg_inf();");
            });
        });
        w.line("__syncthreads();");
        w.comment("Online softmax: 8 consecutive threads per row, 8 slots each.");
        w.scope(|w| {
            w.line("const int row = tid >> 3, part = tid & 7;");
            w.line("float v[8], mx = neg_inf();");
            w.for_unrolled("c", 0, "8", |w| {
                w.line("v[c] = ss[row * SST + part * 8 + c];");
                w.line("mx = fmaxf(mx, v[c]);");
            });
            w.line("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));");
            w.line("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));");
            w.line("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));");
            w.line("const float m_old = m_r[row], m_new = fmaxf(m_old, mx);");
            w.line("float sum = 0.0f;");
            w.comment("The row's 8 threads are one warp's lanes: all scores are read before any");
            w.comment("thread overwrites the row with p = p_hi + p_lo (two 16-bit halves, so the");
            w.comment("product with the cache keeps p to ~16 bits more than one 16-bit value).");
            w.line("__syncwarp();");
            w.for_unrolled("c", 0, "8", |w| {
                w.line("const float pv = v[c] == neg_inf() ? 0.0f : expf(v[c] - m_new);");
                emit!(w, "const {ct} hi = from_f32<{ct}>(pv);");
                emit!(w, "ps[row * PST + part * 8 + c] = hi;");
                emit!(
                    w,
                    "ps[row * PST + TS + part * 8 + c] = from_f32<{ct}>(pv - to_f32(hi));"
                );
                w.line("sum += pv;");
            });
            w.line("sum += __shfl_xor_sync(0xffffffffu, sum, 1);");
            w.line("sum += __shfl_xor_sync(0xffffffffu, sum, 2);");
            w.line("sum += __shfl_xor_sync(0xffffffffu, sum, 4);");
            w.line("__syncwarp();");
            w.if_block("part == 0", |w| {
                w.line("const float alpha = m_old == neg_inf() ? 0.0f : expf(m_old - m_new);");
                w.line("a_r[row] = alpha;");
                w.line("l_r[row] = l_r[row] * alpha + sum;");
                w.line("m_r[row] = m_new;");
            });
        });
        w.line("__syncthreads();");
        w.comment("acc = alpha·acc + p·c over this warp's latent columns.");
        w.line("const float a0 = a_r[g], a1 = a_r[g + 8];");
        w.for_unrolled("n", 0, "NTP", |w| {
            w.line("acc[n][0] *= a0; acc[n][1] *= a0; acc[n][2] *= a1; acc[n][3] *= a1;");
        });
        w.for_unrolled("k2", 0, "TS / 16", |w| {
            w.line("unsigned pa[4], pl[4];");
            w.line(
                "const int pr = ((lane & 7) + 8 * ((lane >> 3) & 1)) * PST + k2 * 16 + 8 * (lane >> 4);",
            );
            w.line("ldmatrix_x4(pa, ps + pr);");
            w.line("ldmatrix_x4(pl, ps + pr + TS);");
            w.for_unrolled("n2", 0, "(NTP + 1) / 2", |w| {
                w.line("unsigned vb[4];");
                w.line(
                    "ldmatrix_x4_trans(vb, cs + (k2 * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * ST + warp * NCOLW + n2 * 16 + 8 * (lane >> 4));",
                );
                emit!(w, "{mma}(acc[2 * n2], pa, vb[0], vb[1]);");
                emit!(w, "{mma}(acc[2 * n2], pl, vb[0], vb[1]);");
                w.if_block("2 * n2 + 1 < NTP", |w| {
                    emit!(w, "{mma}(acc[2 * n2 + 1], pa, vb[2], vb[3]);");
                    emit!(w, "{mma}(acc[2 * n2 + 1], pl, vb[2], vb[3]);");
                });
            });
        });
        w.line("__syncthreads();  // the tile, scores and probabilities are read");
    });
    if p.splits == 1 {
        w.for_unrolled("hf", 0, "2", |w| {
            w.line("const int row = g + 8 * hf;");
            w.line("const long long gr = tile * 16 + row;");
            w.if_block("gr < ROWS", |w| {
                w.line("const float l = l_r[row];");
                w.for_unrolled("n", 0, "NTP", |w| {
                    w.line("const long long col = warp * NCOLW + n * 8 + 2 * tq;");
                    w.line("const float v0 = l > 0.0f ? acc[n][2 * hf] / l : 0.0f;");
                    w.line("const float v1 = l > 0.0f ? acc[n][2 * hf + 1] / l : 0.0f;");
                    emit!(w, "y[(bi * ROWS + gr) * L + col] = from_f32<{ct}>(v0);");
                    emit!(w, "y[(bi * ROWS + gr) * L + col + 1] = from_f32<{ct}>(v1);");
                });
            });
        });
    } else {
        emit!(w, "float* po = {};", p.partial_acc.ptr_as("float", true));
        emit!(w, "float* pml = {};", p.partial_ml.ptr_as("float", true));
        w.for_unrolled("hf", 0, "2", |w| {
            w.line("const int row = g + 8 * hf;");
            w.line("const long long gr = tile * 16 + row;");
            w.if_block("gr < ROWS", |w| {
                w.line("float* pr = po + ((bi * ROWS + gr) * S + split) * L;");
                w.for_unrolled("n", 0, "NTP", |w| {
                    w.line("const long long col = warp * NCOLW + n * 8 + 2 * tq;");
                    w.line("pr[col] = acc[n][2 * hf];");
                    w.line("pr[col + 1] = acc[n][2 * hf + 1];");
                });
            });
        });
        w.if_block("tid < 16 && tile * 16 + tid < ROWS", |w| {
            w.line("float* q = pml + ((bi * ROWS + tile * 16 + tid) * S + split) * 2;");
            w.line("q[0] = m_r[tid];");
            w.line("q[1] = l_r[tid];");
        });
    }
    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(p.row_tiles() as u32),
            Extent::Fixed(p.splits as u32),
            Extent::Fixed(p.batch as u32),
        ],
        block: [128, 1, 1],
        smem_bytes: p.smem_bytes() as u32,
    };
    assemble(
        "mla_tile",
        p.dtype.to_string().as_str(),
        &items.finish(),
        "",
        &w.finish(),
        launch,
        &prelude(),
    )
}

/// One block per query row: `y = R(Σ_s e^(m_s − M)·acc_s / Σ_s e^(m_s − M)·l_s)`, 0 where no
/// split saw an allowed slot.
fn combine(p: &MlaTileParams) -> KernelSource {
    let ct = c_type(p.dtype);
    let mut w = Writer::at_depth(1);
    emit!(w, "constexpr long long L = {}, S = {};", p.latent, p.splits);
    emit!(
        w,
        "const float* po = {};",
        p.partial_acc.ptr_as("float", false)
    );
    emit!(
        w,
        "const float* pml = {};",
        p.partial_ml.ptr_as("float", false)
    );
    emit!(w, "{ct}* y = {};", p.out.ptr_as(ct, true));
    w.line("const long long row = blockIdx.x;");
    w.line("const float* ml = pml + row * S * 2;");
    w.line("float mx = neg_inf();");
    w.line("for (int s = 0; s < S; ++s) mx = fmaxf(mx, ml[2 * s]);");
    w.line("float den = 0.0f;");
    w.for_block("int s = 0", "s < S", "++s", |w| {
        w.line("if (ml[2 * s] != neg_inf()) den += expf(ml[2 * s] - mx) * ml[2 * s + 1];");
    });
    w.for_block("long long i = threadIdx.x", "i < L", "i += blockDim.x", |w| {
        w.line("float num = 0.0f;");
        w.for_block("int s = 0", "s < S", "++s", |w| {
            w.line(
                "if (ml[2 * s] != neg_inf()) num += expf(ml[2 * s] - mx) * po[(row * S + s) * L + i];",
            );
        });
        emit!(
            w,
            "y[row * L + i] = from_f32<{ct}>(den > 0.0f ? num / den : 0.0f);"
        );
    });
    let rows = p.batch * p.tokens * p.heads;
    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(rows as u32),
            Extent::Fixed(1),
            Extent::Fixed(1),
        ],
        block: [128, 1, 1],
        smem_bytes: 0,
    };
    assemble(
        "mla_combine",
        p.dtype.to_string().as_str(),
        "",
        "",
        &w.finish(),
        launch,
        &prelude(),
    )
}
