//! `gemv`: small-M matmul `y[M, N] = x[M, K] · W[N, K]ᵀ` with f32 accumulation, for
//! M = B·T up to 64, streaming the weights once with 16-byte loads.
//!
//! Fusions: an RMSNorm prologue on `x` (the norm's weight and eps; the kernel computes each
//! row's RMS itself), a SwiGLU epilogue over two weight matrices (or two halves of one),
//! a residual add, a cast of the stored result, argmax partials (one `ArgmaxPair` per
//! row and block, reduced by [`crate::argmax`] in `Partials` mode), and the q|k|v
//! projection's RoPE + KV write ([`crate::qkv_rope`]: a warp's columns `2j, 2j + 1` are the
//! two features of a rotary pair, so `CW ≥ 2`).
//!
//! Numerics follow the interpreter: the matmul result is rounded to x's dtype; SwiGLU
//! rounds gate and up, then `R(R(silu(g))·u)`; the residual add rounds once; the store converts to the
//! output dtype; argmax sees the stored value. The fused RMSNorm is the IR op:
//! `round(round(x · r) · w)` with `r = 1/sqrt(mean(x²) + eps)`.
//!
//! Work split: a block of `warps` warps owns `warps · cols_per_warp` output columns and a
//! tile of up to `row_tile` rows. Each lane reads 16 bytes of a weight row per step and
//! multiplies it with the matching 16 bytes of every staged x row (x lives in shared memory,
//! in K chunks of at most 32 KiB), so every weight byte is read once per row tile. Partial
//! dot products are reduced across the warp with shuffles; lane `(m·cw + j) % 32` owns the
//! epilogue of `(row m, column j)`.
//!
//! Split-K inside the block ([`GemvTiling::k_warps`] > 1, where the columns are too few to
//! fill the GPU): the block has `warps · k_warps` warps, warp `kw · warps + w` taking column
//! group `w` and every `k_warps`-th group of `32 · VW` elements of K (group `k / (32·VW)`
//! belongs to split `(k / (32·VW)) % k_warps`, whatever the chunk). Each warp reduces its
//! sums with the same shuffles; the splits `kw ≥ 1` leave theirs in shared memory and the
//! `kw = 0` warp adds them in increasing `kw`, then runs the epilogue. The split depends on
//! N, K, the dtypes and SwiGLU only, so a row is summed in the same order at every row tile.
//!
//! The plan uses this kernel for single rows and non-16-bit operands; row tiles of 2+ rows
//! with bf16/f16 operands go to the tensor-core variant [`crate::gemv_mma`], which shares
//! the RMS prologue (`emit_row_inv_rms`) and the epilogue (`emit_epilogue_value`).
//!
//! Kernel family `gemv` (`gemv_rope` with the RoPE epilogue); name dtype: the weight dtype.

use crate::abi::{Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec, Loc, Rows, View};
use crate::qkv_rope::{self, QkvRope};
use crate::writer::{emit, f32_lit, Writer};
use crate::Error;

const FAMILY: &str = "gemv";
/// Largest row tile: accumulators live in registers.
pub const MAX_ROW_TILE: u32 = 64;
/// Shared memory budget for the staged x chunk.
pub(crate) const X_SMEM_BYTES: u64 = 32 * 1024;
/// Below this many blocks the tiling trades columns per block for more blocks.
pub(crate) const MIN_BLOCKS: u64 = 256;
/// Weight-streaming warps a launch should have (what [`MIN_BLOCKS`] blocks of 8 warps give):
/// below it, at one column per warp, the tiling splits K inside the block.
const TARGET_WARPS: u64 = MIN_BLOCKS * 8;
/// Most warps splitting one column group's K ([`GemvTiling::k_warps`]).
pub const MAX_K_WARPS: u32 = 8;
/// Most warps per block with K split; half of it where a lane holds over 32 accumulators
/// (row tiles past 32), so `__launch_bounds__` still allows 255 registers a thread.
const SPLIT_BLOCK_WARPS: u32 = 16;

/// The weight operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvWeights {
    /// `W[N, K]`.
    Single(Loc),
    /// SwiGLU: `y = silu(x·Gᵀ) · (x·Uᵀ)` with `G, U` both `[N, K]`.
    GateUp { gate: Loc, up: Loc },
}

impl GemvWeights {
    /// Gate and up as the two halves of one `[2N, K]` matrix (gate first).
    pub fn gate_up_concat(w: Loc, n: u32, k: u32, dtype: Dtype) -> GemvWeights {
        GemvWeights::GateUp {
            gate: w,
            up: w.offset_by(n as u64 * k as u64 * dtype.size()),
        }
    }
}

/// RMSNorm applied to each x row before the product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormPrologue {
    /// `[K]` norm weight.
    pub weight: Loc,
    pub dtype: Dtype,
    pub eps: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GemvParams {
    /// Rows at run time.
    pub rows: Rows,
    /// Static rows per block (1..=64): set it to the bucket's M for one pass over W.
    pub row_tile: u32,
    pub k: u32,
    pub n: u32,
    /// `[M, K]`.
    pub x: View,
    pub weights: GemvWeights,
    pub w_dtype: Dtype,
    pub norm: Option<RmsNormPrologue>,
    /// `[M, N]` added to the result (may be the same buffer as `out`).
    pub residual: Option<View>,
    /// `[M, N]` result; its dtype may differ from x's (a fused cast).
    pub out: Option<View>,
    /// `ArgmaxPair[M, partials_per_row]` in the arena.
    pub argmax_partials: Option<Loc>,
    /// The fused q|k|v projection's RoPE + KV write ([`crate::qkv_rope`]): the only
    /// epilogue then (no `out`, residual, SwiGLU or argmax).
    pub rope: Option<QkvRope>,
}

pub use specc_ir::engine::choice::GemvTiling;

impl GemvParams {
    /// Whether the weights are the gate/up pair of a SwiGLU MLP.
    pub fn gate_up(&self) -> bool {
        matches!(self.weights, GemvWeights::GateUp { .. })
    }

    pub fn tiling(&self) -> GemvTiling {
        let g = if self.gate_up() { 2 } else { 1 };
        let mt = self.row_tile.clamp(1, MAX_ROW_TILE);
        // The RoPE epilogue pairs a warp's columns 2j and 2j + 1: at least 2 per warp.
        let min_cw = if self.rope.is_some() { 2 } else { 1 };
        let mut cw = [4u32, 2, 1]
            .into_iter()
            .find(|c| mt * c * g <= 32)
            .unwrap_or(1)
            .max(min_cw);
        let blocks = |nw: u32, cw: u32| (self.n as u64).div_ceil((nw * cw) as u64);
        // Fewer columns per warp first, then fewer warps per block: the warps in flight are
        // what streams the weights (bench/NOTES.md, 2026-12-03: the GEMV tiling).
        let mut nw = 8;
        while cw > min_cw && blocks(nw, cw) < MIN_BLOCKS {
            cw /= 2;
        }
        while nw > 2 && blocks(nw, cw) < MIN_BLOCKS {
            nw /= 2;
        }
        let kw = self.k_warps();
        if kw > 1 {
            let cap = if mt * cw * g > 32 {
                SPLIT_BLOCK_WARPS / 2
            } else {
                SPLIT_BLOCK_WARPS
            };
            nw = nw.min(cap / kw).max(1);
        }
        let vec = (16 / self.w_dtype.size()) as u32;
        let xs = self.x.dtype.size();
        let budget = X_SMEM_BYTES / (mt as u64 * xs);
        // With K split, whole split rounds per chunk where they fit: every chunk then
        // starts at split 0 (shorter chunks rotate the first split, the same order).
        let round = 32 * vec as u64 * kw as u64;
        let k_chunk = if self.k as u64 <= budget {
            self.k
        } else if kw > 1 && budget >= round {
            (budget - budget % round) as u32
        } else if budget >= 32 * vec as u64 {
            (budget - budget % (32 * vec as u64)) as u32
        } else {
            (budget - budget % vec as u64).max(vec as u64) as u32
        };
        GemvTiling {
            warps: nw,
            cols_per_warp: cw,
            vec,
            k_chunk,
            k_warps: kw,
        }
    }

    /// The split of K inside the block ([`GemvTiling::k_warps`]): the smallest power of two
    /// that brings the launch's weight-streaming warps (one column per warp, gate and up
    /// counted apart) to [`TARGET_WARPS`], at most [`MAX_K_WARPS`], while each warp keeps
    /// at least two 16-byte loads per weight row. A function of N, K, the dtypes and
    /// [`Self::gate_up`] only: never of the row tile (a row is summed in the same order at
    /// every M) nor of the epilogue (the RoPE-fused q|k|v projection sums as the plain one
    /// that `rope_kv` follows at other row counts, bit for bit).
    ///
    /// No split where x is wider than the weights: a 64-row tile could then not stage a
    /// chunk of `32 · vec` elements, and the chunk must be a multiple of that for every
    /// (split, lane) to own the same k at every row tile.
    pub fn k_warps(&self) -> u32 {
        if self.x.dtype.size() > self.w_dtype.size() {
            return 1;
        }
        let g = if self.gate_up() { 2 } else { 1 };
        let group = 32 * 16 / self.w_dtype.size();
        let col_warps = self.n as u64 * g;
        let mut kw = 1u32;
        while kw < MAX_K_WARPS
            && col_warps * (kw as u64) < TARGET_WARPS
            && self.k as u64 >= 2 * group * 2 * kw as u64
        {
            kw *= 2;
        }
        kw
    }

    /// Argmax partials each row gets (the grid's x extent).
    pub fn partials_per_row(&self) -> u32 {
        partials_per_row(self, &self.tiling())
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        let err = |field, reason: &str| Err(Error::param(FAMILY, field, reason));
        if !(1..=MAX_ROW_TILE).contains(&self.row_tile) {
            return err("row_tile", "must be in 1..=64");
        }
        if self.k == 0 || self.n == 0 {
            return err("k/n", "must be positive");
        }
        for (field, dt) in [("x.dtype", self.x.dtype), ("w_dtype", self.w_dtype)] {
            if !dt.is_float() {
                return Err(Error::param(
                    FAMILY,
                    field,
                    format!("must be a float type, got {}", dt.name()),
                ));
            }
        }
        let vec = 16 / self.w_dtype.size();
        if !(self.k as u64).is_multiple_of(vec) {
            return err(
                "k",
                &format!("must be a multiple of {vec} (16-byte weight loads)"),
            );
        }
        let w_locs = match self.weights {
            GemvWeights::Single(w) => vec![w],
            GemvWeights::GateUp { gate, up } => vec![gate, up],
        };
        if w_locs.iter().any(|l| l.byte_offset() % 16 != 0) {
            return err("weights", "must start 16-byte aligned");
        }
        let x_align = (vec * self.x.dtype.size()).min(16);
        if !self.x.aligned(x_align) {
            return err("x", &format!("rows must be {x_align}-byte aligned"));
        }
        if let Some(nm) = &self.norm {
            if !nm.dtype.is_float() || !nm.eps.is_finite() || nm.eps < 0.0 {
                return err("norm", "needs a float weight and a finite eps >= 0");
            }
            if nm.weight.byte_offset() % (vec * nm.dtype.size()).min(16) != 0 {
                return err("norm.weight", "misaligned for vector loads");
            }
        }
        for (field, v) in [("residual", self.residual), ("out", self.out)] {
            if v.is_some_and(|v| !v.dtype.is_float()) {
                return err(field, "must be a float type");
            }
        }
        if let Some(r) = &self.rope {
            if self.gate_up() || self.residual.is_some() || self.out.is_some() {
                return err(
                    "rope",
                    "the RoPE epilogue stores alone (no out, residual or SwiGLU)",
                );
            }
            if self.argmax_partials.is_some() {
                return err("rope", "no argmax with the RoPE epilogue");
            }
            r.validate(FAMILY, self.n, 1)?;
        } else if self.out.is_none() && self.argmax_partials.is_none() {
            return err("out", "a gemv must store its result or argmax partials");
        }
        if self
            .argmax_partials
            .is_some_and(|l| l.byte_offset() % 8 != 0)
        {
            return err("argmax_partials", "must be 8-byte aligned");
        }
        Ok(())
    }
}

/// Argmax partials each row gets under work split `t` (the grid's x extent).
pub fn partials_per_row(p: &GemvParams, t: &GemvTiling) -> u32 {
    p.n.div_ceil(t.warps * t.cols_per_warp)
}

/// Static shared memory of the kernel for `p` under `t`: the staged x chunk, the split-K
/// partials, the argmax candidates and the row RMS.
fn smem_bytes(p: &GemvParams, t: &GemvTiling) -> u64 {
    let g = if p.gate_up() { 2 } else { 1 };
    let mt = p.row_tile as u64;
    let x = t.k_chunk as u64 * mt * p.x.dtype.size();
    let red = (t.k_warps as u64).saturating_sub(1)
        * t.warps as u64
        * mt
        * (g * t.cols_per_warp) as u64
        * 4;
    let cand = match p.argmax_partials {
        Some(_) => t.warps as u64 * mt * t.cols_per_warp as u64 * 8,
        None => 0,
    };
    let rms = if p.norm.is_some() { mt * 4 } else { 0 };
    x + red + cand + rms
}

/// Static shared memory a kernel may declare.
const STATIC_SMEM_BYTES: u64 = 48 * 1024;

/// Whether `t` is a work split the kernel can run for `p`.
fn check_tiling(p: &GemvParams, t: &GemvTiling) -> Result<(), Error> {
    let min_cw = if p.rope.is_some() { 2 } else { 1 };
    let vec = (16 / p.w_dtype.size()) as u32;
    let x_bytes = t.k_chunk as u64 * p.row_tile as u64 * p.x.dtype.size();
    if !(1..=32).contains(&t.warps)
        || t.cols_per_warp < min_cw
        || t.vec != vec
        || t.k_chunk == 0
        || !t.k_chunk.is_multiple_of(vec)
        || x_bytes > X_SMEM_BYTES
    {
        return Err(Error::param(
            FAMILY,
            "tiling",
            format!("invalid work split {t:?} for this matmul"),
        ));
    }
    if t.k_warps == 0 || t.warps * t.k_warps > 32 {
        return Err(Error::param(
            FAMILY,
            "tiling.k_warps",
            format!("needs 1 <= k_warps and warps * k_warps <= 32 (1024 threads), got {t:?}"),
        ));
    }
    if t.k_warps > 1 && t.k_chunk < p.k && !t.k_chunk.is_multiple_of(32 * vec) {
        return Err(Error::param(
            FAMILY,
            "tiling.k_chunk",
            format!(
                "with k_warps > 1 a chunk short of K must be a multiple of 32 * vec = {} \
                 (each (split, lane) owns whole 16-byte steps), got {t:?}",
                32 * vec
            ),
        ));
    }
    let smem = smem_bytes(p, t);
    if smem > STATIC_SMEM_BYTES {
        return Err(Error::param(
            FAMILY,
            "tiling",
            format!("{smem} bytes of shared memory (max {STATIC_SMEM_BYTES}) under {t:?}"),
        ));
    }
    Ok(())
}

/// Generates the kernel with its default work split ([`GemvParams::tiling`]).
pub fn gemv(p: &GemvParams) -> Result<KernelSource, Error> {
    gemv_tiled(p, &p.tiling())
}

/// Generates the kernel with work split `t`.
pub fn gemv_tiled(p: &GemvParams, t: &GemvTiling) -> Result<KernelSource, Error> {
    p.validate()?;
    check_tiling(p, t)?;
    let t = *t;
    let mt = p.row_tile;
    let split = t.k_warps > 1;
    let xt = p.x.dtype.c_type();
    let family = if p.rope.is_some() {
        "gemv_rope"
    } else {
        FAMILY
    };
    let mut kb = KernelBuilder::new(family, p.w_dtype);
    let (w0, w1) = match p.weights {
        GemvWeights::Single(l) => (l, None),
        GemvWeights::GateUp { gate, up } => (gate, Some(up)),
    };
    if let Some(r) = &p.rope {
        qkv_rope::emit_items(&mut kb.items, r, 1);
    }
    weight_prefetch_prologue(&mut kb.prologue, p, t, w0, w1);
    let w = &mut kb.body;
    emit!(w, "__shared__ __align__(16) {xt} xs[MT * KC];");
    if p.norm.is_some() {
        w.line("__shared__ float inv_rms[MT];");
    }
    if p.argmax_partials.is_some() {
        w.line("__shared__ ArgmaxPair cand[NW * MT * CW];");
    }
    if split {
        w.line("__shared__ float red[(KW - 1) * NW * MT * NA];  // sums of the splits kw >= 1");
    }
    w.line("const int m0 = blockIdx.y * MT;");
    emit!(w, "const int mr = min(MT, {} - m0);", p.rows.expr());
    emit!(w, "const {xt}* x = {};", p.x.loc.ptr(p.x.dtype, false));

    if let Some(nm) = &p.norm {
        emit!(
            w,
            "const {}* nw = {};",
            nm.dtype.c_type(),
            nm.weight.ptr(nm.dtype, false)
        );
        if split {
            emit_row_inv_rms_by(w, p, None, "(threadIdx.x >> 5)", "NW * KW");
        } else {
            emit_row_inv_rms(w, p, None);
        }
    }

    w.line("float acc[MT][NA];");
    w.for_unrolled("m", 0, "MT", |w| {
        w.for_unrolled("j", 0, "NA", |w| w.line("acc[m][j] = 0.0f;"));
    });
    let ahead = weights_ahead(p, &t);
    w.for_block("int k0 = 0", "k0 < K", "k0 += KC", |w| {
        let rotated = split && t.k_chunk < p.k && !t.k_chunk.is_multiple_of(32 * t.vec * t.k_warps);
        let (first, step) = if !split {
            ("int kk = lane * VW", "kk += 32 * VW")
        } else if rotated {
            ("int kk = (kg * 32 + lane) * VW", "kk += 32 * VW * KW")
        } else {
            ("int kk = (kw * 32 + lane) * VW", "kk += 32 * VW * KW")
        };
        // The chunk's extent and, where chunks are not whole rounds of the splits, this
        // split's first group in it.
        let extent = |w: &mut Writer| {
            w.line("const int kn = min(KC, K - k0);");
            if rotated {
                w.comment("groups of 32 * VW elements of K go to split (k / (32 * VW)) % KW: this chunk's first group belongs to split (k0 / (32 * VW)) % KW");
                w.line("const int kg = (kw - (k0 / (32 * VW)) % KW + KW) % KW;");
            }
        };
        let load = |w: &mut Writer, wv: &str| {
            w.for_unrolled("j", 0, "CW", |w| {
                emit!(
                    w,
                    "const long long row = (long long){} * K + k0 + kk;",
                    weight_row(p, "min(n0 + j, N - 1)")
                );
                emit!(w, "ld_stream_vec<VW>(w0 + row, {wv}[j]);");
                if w1.is_some() {
                    emit!(w, "ld_stream_vec<VW>(w1 + row, {wv}[CW + j]);");
                }
            });
        };
        let fma = |w: &mut Writer, wv: &str| {
            w.for_unrolled("m", 0, "MT", |w| {
                w.if_block("m < mr", |w| {
                    w.line("float xv[VW];");
                    w.line("ld_vec<VW>(xs + m * KC + kk, xv);");
                    w.for_unrolled("j", 0, "NA", |w| {
                        w.for_unrolled("e", 0, "VW", |w| {
                            emit!(w, "acc[m][j] = fmaf({wv}[j][e], xv[e], acc[m][j]);");
                        });
                    });
                });
            });
        };
        let stage = |w: &mut Writer| {
            w.comment("stage x[m0 .. m0 + MT, k0 .. k0 + KC] (normalised when fused)");
            w.line("__syncthreads();");
            stage_x_by(w, p, "g", if split { "NW * KW * 32" } else { "NW * 32" });
            w.line("__syncthreads();");
        };
        match ahead {
            Some(steps) => {
                extent(w);
                emit!(
                    w,
                    "constexpr int IT = {steps};  // a lane's 16-byte steps per chunk, loaded before x is staged"
                );
                w.line("float wa[IT][NA][VW];");
                // `body` for each of this lane's steps `it` of the chunk, at its `kk`.
                let steps = |w: &mut Writer, body: &dyn Fn(&mut Writer, &str)| {
                    w.scope(|w| {
                        w.line("int it = 0;");
                        w.line("#pragma unroll");
                        w.for_block(first, "it < IT", format!("{step}, ++it"), |w| {
                            w.if_block("kk < kn", |w| body(w, "wa[it]"));
                        });
                    });
                };
                steps(w, &load);
                stage(w);
                steps(w, &fma);
            }
            None => {
                stage(w);
                extent(w);
                w.line("#pragma unroll 4");
                w.for_block(first, "kk < kn", step, |w| {
                    w.line("float wv[NA][VW];");
                    load(w, "wv");
                    fma(w, "wv");
                });
            }
        }
    });

    w.comment("reduce across the warp: every lane ends with every sum");
    w.for_unrolled("m", 0, "MT", |w| {
        w.if_block("m < mr", |w| {
            w.for_unrolled("j", 0, "NA", |w| w.line("acc[m][j] = warp_sum(acc[m][j]);"));
        });
    });
    let epilogues = |w: &mut Writer| {
        if let Some(r) = &p.rope {
            w.comment("RoPE epilogue: lane (m * CW + j) % 32 owns (row m0 + m, slots n0 + j, n0 + j + 1), j even");
            w.for_unrolled("m", 0, "MT", |w| {
                w.line("#pragma unroll");
                w.for_block("int j = 0", "j < CW", "j += 2", |w| {
                    w.if_block("lane == (m * CW + j) % 32", |w| {
                        w.line("const int col = n0 + j;");
                        w.line("const long long row = m0 + m;");
                        w.line("const bool live = m < mr && col < N;");
                        qkv_rope::emit_pair_epilogue(
                            w,
                            r,
                            xt,
                            ("acc[m][j]", "acc[m][j + 1]"),
                            1,
                            None,
                        );
                    });
                });
            });
        } else {
            emit_lane_epilogues(w, p);
        }
    };
    if split {
        let sums = (t.k_warps - 1) * mt * t.cols_per_warp * if p.gate_up() { 2 } else { 1 };
        emit_split_sum(w, sums <= 64);
        w.comment("the epilogue runs in the kw = 0 warps, which hold the block's sums");
        w.if_block("kw == 0", epilogues);
    } else {
        epilogues(w);
    }
    emit_argmax_partials(w, p);

    let launch = gemv_launch(p, &t, mt);
    Ok(kb.finish(launch))
}

/// Most 16-byte weight steps per lane and chunk that split-K kernels load into registers
/// before staging the chunk's x ([`weights_ahead`]).
const AHEAD_MAX_STEPS: u32 = 4;

/// Split-K kernels over few columns (the f32 router: one 16-byte step per lane and chunk)
/// issue a chunk's weight loads before its x is staged, so the HBM round trip overlaps the
/// staging's barriers and L2 reads instead of following them: `Some(steps per lane)` where
/// those fit [`AHEAD_MAX_STEPS`]. Without a split (every 8B-shape kernel) the loop is
/// unchanged. The same products are added in the same order either way.
fn weights_ahead(p: &GemvParams, t: &GemvTiling) -> Option<u32> {
    if t.k_warps <= 1 {
        return None;
    }
    let per_step = 32 * t.vec * t.k_warps;
    let steps = t.k_chunk.min(p.k).div_ceil(per_step);
    (steps * if p.gate_up() { 2 } else { 1 } * t.cols_per_warp <= AHEAD_MAX_STEPS).then_some(steps)
}

/// The code before the PDL wait: the tiling constants, this warp's columns and weight
/// pointers, and an L2 prefetch of the first 128-byte lines of each of its weight rows (what
/// the warp's first iterations read). Weights are never written by a kernel, so this may
/// overlap the previous kernel; everything touching activations comes after the wait.
fn weight_prefetch_prologue(
    w: &mut Writer,
    p: &GemvParams,
    t: GemvTiling,
    w0: Loc,
    w1: Option<Loc>,
) {
    let g = if p.gate_up() { 2 } else { 1 };
    let wt = p.w_dtype.c_type();
    emit!(w, "constexpr int K = {};", p.k);
    emit!(w, "constexpr int N = {};", p.n);
    emit!(w, "constexpr int MT = {};  // row tile", p.row_tile);
    emit!(
        w,
        "constexpr int CW = {};  // output columns per warp",
        t.cols_per_warp
    );
    let nw_doc = if t.k_warps > 1 {
        "column warps per block, KW warps each"
    } else {
        "warps per block"
    };
    emit!(w, "constexpr int NW = {};  // {nw_doc}", t.warps);
    emit!(
        w,
        "constexpr int VW = {};  // elements per 16-byte weight load",
        t.vec
    );
    emit!(
        w,
        "constexpr int KC = {};  // K chunk staged in shared memory",
        t.k_chunk
    );
    emit!(
        w,
        "constexpr int NA = {};  // accumulators per row: CW, or gate and up",
        g * t.cols_per_warp
    );
    let split = t.k_warps > 1;
    if split {
        emit!(
            w,
            "constexpr int KW = {};  // warps splitting each column group's K",
            t.k_warps
        );
    }
    w.line("const int lane = threadIdx.x & 31;");
    if split {
        w.line("const int warp = (threadIdx.x >> 5) % NW;  // column warp");
        w.line("const int kw = (threadIdx.x >> 5) / NW;  // K split");
    } else {
        w.line("const int warp = threadIdx.x >> 5;");
    }
    w.line("const int n0 = (blockIdx.x * NW + warp) * CW;");
    emit!(w, "const {wt}* w0 = {};", w0.ptr(p.w_dtype, false));
    if let Some(up) = w1 {
        emit!(w, "const {wt}* w1 = {};", up.ptr(p.w_dtype, false));
    }
    w.comment("before the PDL wait: warm L2 with the start of this warp's NA weight rows");
    w.scope(|w| {
        w.line("constexpr int LINES = 32 / NA;  // 128-byte lines per row, one per lane");
        w.line("const int j = lane / LINES;");
        if split {
            w.comment("split kw starts 32 * VW elements (512 bytes) per split further in");
            w.line("const long long off = (long long)kw * 512 + (long long)(lane % LINES) * 128;");
        } else {
            w.line("const long long off = (long long)(lane % LINES) * 128;");
        }
        let row_bytes = format!("off < (long long)K * {}", p.w_dtype.size());
        w.if_block(row_bytes, |w| {
            emit!(
                w,
                "const long long row = (long long){} * K;",
                weight_row(p, "min(n0 + j % CW, N - 1)")
            );
            let rows = if w1.is_some() {
                "(j < CW ? w0 : w1)"
            } else {
                "w0"
            };
            emit!(
                w,
                "prefetch_l2(reinterpret_cast<const char*>({rows} + row) + off);"
            );
        });
    });
}

/// The weight row of output column (slot) `col`: itself, or its q|k|v feature under the
/// RoPE epilogue's permutation ([`crate::qkv_rope`]).
pub(crate) fn weight_row(p: &GemvParams, col: &str) -> String {
    if p.rope.is_some() {
        format!("qkv_feature({col})")
    } else {
        col.to_string()
    }
}

/// The epilogue of one `(row m0 + m, column n0 + j)`, run by its owning lane.
pub(crate) fn epilogue(w: &mut Writer, p: &GemvParams) {
    w.line("const int n = n0 + j;");
    w.line("const long long row = m0 + m;");
    w.line("const bool live = m < mr && n < N;");
    let up = p.gate_up().then_some("acc[m][CW + j]");
    emit_epilogue_value(w, p, "acc[m][j]", up, None);
    if p.argmax_partials.is_some() {
        w.line("const ArgmaxPair a = {live ? v : neg_inf(), live ? n : 0x7fffffff};");
        w.line("cand[(warp * MT + m) * CW + j] = a;");
    }
}

/// Fills `inv_rms[m]` for the rows `m < mr` of the tile, one warp per row. Needs `K`, `NW`, `VW`, `x`, `m0`, `mr`, `lane`, `warp` and a
/// `__shared__ float inv_rms[]` of at least `mr` entries; the caller synchronises after.
/// `unroll` adds a pragma to the K loop (loads in flight per lane).
pub(crate) fn emit_row_inv_rms(w: &mut Writer, p: &GemvParams, unroll: Option<u32>) {
    emit_row_inv_rms_by(w, p, unroll, "warp", "NW");
}

/// [`emit_row_inv_rms`] with warp `first` of the block's `count` warps taking rows
/// `first, first + count, ..`.
fn emit_row_inv_rms_by(
    w: &mut Writer,
    p: &GemvParams,
    unroll: Option<u32>,
    first: &str,
    count: &str,
) {
    let Some(nm) = &p.norm else { return };
    let xt = p.x.dtype.c_type();
    let xs_row = p.x.row_stride;
    w.comment("RMS of each row of the tile, one warp per row");
    w.for_block(
        format!("int m = {first}"),
        "m < mr",
        format!("m += {count}"),
        |w| {
            emit!(w, "const {xt}* xr = x + (long long)(m0 + m) * {xs_row};");
            w.line("float ss = 0.0f;");
            if let Some(u) = unroll {
                emit!(w, "#pragma unroll {u}");
            }
            w.for_block("int k = lane * VW", "k < K", "k += 32 * VW", |w| {
                w.line("float v[VW];");
                w.line("ld_vec<VW>(xr + k, v);");
                w.for_unrolled("e", 0, "VW", |w| w.line("ss = fmaf(v[e], v[e], ss);"));
            });
            w.line("ss = warp_sum(ss);");
            emit!(
                w,
                "if (lane == 0) inv_rms[m] = 1.0f / sqrtf(ss / float(K) + {});",
                f32_lit(nm.eps)
            );
        },
    );
}

/// The fused epilogue of one output element, shared by the GEMV kernels: declares
/// `float v` from the accumulator expression `acc` (SwiGLU when `up` is the up
/// accumulator), then adds the residual and stores when `live`. Needs `n` (column),
/// `row` (the token row as `long long`) and `live` in scope; argmax candidates are the
/// caller's (they read `v` and `live`). `res_loaded`: an expression holding the element's
/// residual as f32, loaded earlier by the caller (else it is loaded here).
pub(crate) fn emit_epilogue_value(
    w: &mut Writer,
    p: &GemvParams,
    acc: &str,
    up: Option<&str>,
    res_loaded: Option<&str>,
) {
    let xt = p.x.dtype.c_type();
    match up {
        Some(up) => {
            emit!(w, "const float gate = round_to<{xt}>({acc});");
            emit!(w, "const float up = round_to<{xt}>({up});");
            emit!(
                w,
                "float v = round_to<{xt}>(round_to<{xt}>(silu_f32(gate)) * up);"
            );
        }
        None => emit!(w, "float v = round_to<{xt}>({acc});"),
    }
    if p.residual.is_some() || p.out.is_some() {
        w.if_block("live", |w| {
            if let Some(r) = p.residual {
                match res_loaded {
                    Some(res) => emit!(w, "const float res = {res};"),
                    None => emit!(
                        w,
                        "const float res = to_f32(({})[row * {} + n]);",
                        r.loc.ptr(r.dtype, false),
                        r.row_stride
                    ),
                }
                emit!(w, "v = round_to<{xt}>(v + res);");
            }
            if let Some(o) = p.out {
                let (ot, ptr) = (o.dtype.c_type(), o.loc.ptr(o.dtype, true));
                emit!(w, "v = round_to<{ot}>(v);");
                emit!(
                    w,
                    "({ptr})[row * {} + n] = from_f32<{ot}>(v);",
                    o.row_stride
                );
            }
        });
    }
}

/// Stages `x[m0 .. m0 + MT, k0 .. k0 + KC]` into the shared `xs` (zeros past the rows `mr`
/// and the columns `K`), normalised by `inv_rms[m]` and the norm weight (read into the
/// register array `norm_var`) when the matmul carries its input's RMSNorm: each value
/// rounded to x's dtype twice, as the interpreter's `rmsnorm` rounds.
pub(crate) fn stage_x(w: &mut Writer, p: &GemvParams, norm_var: &str) {
    stage_x_by(w, p, norm_var, "NW * 32");
}

/// [`stage_x`] by a block of `threads` threads.
fn stage_x_by(w: &mut Writer, p: &GemvParams, norm_var: &str, threads: &str) {
    let xt = p.x.dtype.c_type();
    let xs_row = p.x.row_stride;
    w.for_block(
        "int i = threadIdx.x",
        "i < MT * (KC / VW)",
        format!("i += {threads}"),
        |w| {
            w.line("const int m = i / (KC / VW);");
            w.line("const int kk = (i % (KC / VW)) * VW;");
            w.line("float v[VW];");
            w.if_else(
                "m < mr && k0 + kk < K",
                |w| {
                    emit!(
                        w,
                        "ld_vec<VW>(x + (long long)(m0 + m) * {xs_row} + k0 + kk, v);"
                    );
                    if p.norm.is_some() {
                        emit!(w, "float {norm_var}[VW];");
                        emit!(w, "ld_vec<VW>(nw + k0 + kk, {norm_var});");
                        w.for_unrolled("e", 0, "VW", |w| {
                            emit!(w, "const float nv = round_to<{xt}>(v[e] * inv_rms[m]);");
                            emit!(w, "v[e] = round_to<{xt}>(nv * {norm_var}[e]);");
                        });
                    }
                },
                |w| w.for_unrolled("e", 0, "VW", |w| w.line("v[e] = 0.0f;")),
            );
            w.line("st_vec<VW>(xs + m * KC + kk, v);");
        },
    );
}

/// Split-K: after each warp's own reduction, the warps `kw >= 1` leave their sums in
/// `red` (lane `(m · NA + j) % 32` writes `(m, j)`) and each `kw = 0` warp adds those of
/// its column group to its own in increasing `kw`: `((s0 + s1) + s2) + ..`, in every lane.
/// Ends with the block synchronised once; the caller runs the epilogue in `kw == 0`.
fn emit_split_sum(w: &mut Writer, unroll: bool) {
    w.comment("split-K: the sums of splits kw >= 1 meet the kw = 0 warp's in shared memory, added in increasing kw");
    w.if_block("kw > 0", |w| {
        w.for_unrolled("m", 0, "MT", |w| {
            w.for_unrolled("j", 0, "NA", |w| {
                w.if_block("lane == (m * NA + j) % 32", |w| {
                    w.line("red[(((kw - 1) * NW + warp) * MT + m) * NA + j] = acc[m][j];");
                });
            });
        });
    });
    w.line("__syncthreads();");
    w.if_block("kw == 0", |w| {
        w.for_unrolled("m", 0, "MT", |w| {
            w.for_unrolled("j", 0, "NA", |w| {
                w.line(if unroll {
                    "#pragma unroll"
                } else {
                    "#pragma unroll 1"
                });
                w.for_block("int s = 0", "s < KW - 1", "++s", |w| {
                    w.line("acc[m][j] += red[((s * NW + warp) * MT + m) * NA + j];");
                });
            });
        });
    });
}

/// The per-lane epilogue: after the warp reduction every lane holds every sum, and lane
/// `(m · CW + j) % 32` stores (row `m0 + m`, column `n0 + j`).
pub(crate) fn emit_lane_epilogues(w: &mut Writer, p: &GemvParams) {
    w.comment("epilogue: lane (m * CW + j) % 32 owns (row m0 + m, column n0 + j)");
    w.for_unrolled("m", 0, "MT", |w| {
        w.for_unrolled("j", 0, "CW", |w| {
            w.if_block("lane == (m * CW + j) % 32", |w| epilogue(w, p));
        });
    });
}

/// With argmax partials: each row's best (value, column) of this block's columns into the
/// partials slot `(row, blockIdx.x)`, columns ascending with (warp, j).
pub(crate) fn emit_argmax_partials(w: &mut Writer, p: &GemvParams) {
    if let Some(part) = p.argmax_partials {
        w.comment("argmax partial of this block for each row: columns ascend with (warp, j)");
        w.line("__syncthreads();");
        w.if_block("threadIdx.x < mr", |w| {
            w.line("ArgmaxPair best = {neg_inf(), 0x7fffffff};");
            w.for_block("int i = 0", "i < NW * CW", "++i", |w| {
                w.line("const ArgmaxPair a = cand[((i / CW) * MT + threadIdx.x) * CW + i % CW];");
                w.line("if (argmax_better(a.v, a.i, best.v, best.i)) best = a;");
            });
            emit!(
                w,
                "({})[(long long)(m0 + threadIdx.x) * gridDim.x + blockIdx.x] = best;",
                part.ptr_as("ArgmaxPair", true)
            );
        });
    }
}

/// The launch of the GEMV family: one block of `32 · warps · k_warps` threads per
/// `warps · cols_per_warp` columns, one per row tile of `mt`.
pub(crate) fn gemv_launch(p: &GemvParams, t: &GemvTiling, mt: u32) -> LaunchSpec {
    let (nw, cw) = (t.warps, t.cols_per_warp);
    LaunchSpec {
        grid: [
            Extent::Fixed(p.n.div_ceil(nw * cw)),
            p.rows.extent(1, mt),
            Extent::Fixed(1),
        ],
        block: [nw * t.k_warps * 32, 1, 1],
        smem_bytes: 0,
    }
}

/// A plain projection at fixed placements, for tests and single-kernel benchmarks (here and
/// in the selection module's tests): x (`k` wide) at arena 0, the weights (one matrix, or a
/// gate/up pair of `n` columns each) in table slot 0, the output at 1 MiB; no norm, residual,
/// argmax or RoPE epilogue.
pub fn test_projection(
    rows: Rows,
    row_tile: u32,
    k: u32,
    n: u32,
    gate_up: bool,
    dt: Dtype,
) -> GemvParams {
    GemvParams {
        rows,
        row_tile,
        k,
        n,
        x: View::new(Loc::arena(0), dt, k as u64),
        weights: if gate_up {
            GemvWeights::gate_up_concat(Loc::table(0), n, k, dt)
        } else {
            GemvWeights::Single(Loc::table(0))
        },
        w_dtype: dt,
        norm: None,
        residual: None,
        out: Some(View::new(Loc::arena(1 << 20), dt, n as u64)),
        argmax_partials: None,
        rope: None,
    }
}
