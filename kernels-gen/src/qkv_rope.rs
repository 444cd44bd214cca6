//! The RoPE + KV-write epilogue of the fused q|k|v GEMV ([`crate::gemv`] and
//! [`crate::gemv_mma`]): the projection's columns are rotated and stored where
//! [`crate::rope::rope_kv`] would store them (rotated q to `q_out`, rotated k and v into the
//! KV caches), in the same launch, with no round trip of q/k/v through the arena.
//!
//! Column permutation. Both features of a rotary pair must reach the thread that stores
//! them, so the GEMV computes its `N = (HQ + 2·HKV)·D` columns in *slot* order: slot `s`
//! computes the feature `qkv_feature``(s)` (it loads that weight row). Within the rotary
//! part (`i < rotary_dim`) of a q or k head, slots come in blocks of `2P` where slot
//! `base + g` and `base + P + g` (`g < P`) hold the two features of one pair; the pair
//! stride `P` is the kernel's: 1 for the CUDA-core GEMV (a warp owns consecutive columns,
//! every lane ends with every sum), 8 for the tensor-core one (a lane holds columns `g` and
//! `g + 8` of a 16-column tile). v heads and pass-through features (`i ≥ rotary_dim`) keep
//! slot = feature. The map is a bijection on `[0, N)` when `D` and `rotary_dim` are
//! multiples of `2P` ([`fusable`]); then no block of `2P` slots straddles heads or the
//! rotary boundary.
//!
//! Numerics are `rope_kv`'s on the GEMV's stored values: each accumulator is rounded to x's
//! dtype first (what the unfused GEMV stores), then rotated exactly as `rope_kv` does
//! (shared emitters in [`crate::rope`]). Qwen3's per-head q/k RMSNorm needs a whole head's
//! sum of squares, spread over warps (and blocks) of the GEMV: those layers keep the
//! two-kernel path (GEMV into scratch, then `rope_kv`), as does a head shape [`fusable`]
//! rejects.

use crate::abi::{Dtype, Loc, View};
use crate::rope::{
    cache_row, emit_cos_sin, emit_inv_freq, emit_position_and_slot, rotated, RopeStyle, RopeTable,
};
use crate::writer::{emit, Writer};
use crate::Error;

/// Where the rotated q and the k/v of a fused q|k|v projection go.
#[derive(Clone, Debug, PartialEq)]
pub struct QkvRope {
    pub q_heads: u32,
    pub kv_heads: u32,
    /// Of q, k and v heads alike.
    pub head_dim: u32,
    /// Rotated q, `[M, q_heads · head_dim]`.
    pub q_out: View,
    /// `[B, Ctx, kv_heads, head_dim]` each.
    pub k_cache: Loc,
    pub v_cache: Loc,
    pub cache_dtype: Dtype,
    /// `[M]` positions (i32 or i64).
    pub pos: Loc,
    pub pos_dtype: Dtype,
    /// `[M]` cache slots when they differ from `pos` (draft trees); `None`: `pos`.
    pub slots: Option<(Loc, Dtype)>,
    pub rope: RopeTable,
}

impl QkvRope {
    /// The projection's width: q heads, then k heads, then v heads.
    pub fn n(&self) -> u32 {
        (self.q_heads + 2 * self.kv_heads) * self.head_dim
    }

    /// Checks the epilogue for a GEMV of `n` columns whose pairs sit `pair_stride` apart.
    pub(crate) fn validate(
        &self,
        family: &'static str,
        n: u32,
        pair_stride: u32,
    ) -> Result<(), Error> {
        let err = |field, reason: &str| Err(Error::param(family, field, reason));
        if self.q_heads == 0 || self.kv_heads == 0 || self.head_dim == 0 {
            return err("rope.heads", "heads and head_dim must be positive");
        }
        if n != self.n() {
            return err("n", "must be (q_heads + 2 kv_heads) * head_dim");
        }
        self.rope.validate(family, self.head_dim)?;
        if !fusable(self.head_dim, self.rope.rotary_dim, pair_stride) {
            return err(
                "rope.head_dim",
                "head_dim and rotary_dim must be multiples of twice the pair stride",
            );
        }
        if !self.q_out.dtype.is_float() || !self.cache_dtype.is_float() {
            return err("rope.q_out", "q_out and the caches must be float types");
        }
        if !self.pos_dtype.is_int() || self.slots.is_some_and(|(_, d)| !d.is_int()) {
            return err("rope.pos_dtype", "positions and slots must be i32 or i64");
        }
        Ok(())
    }
}

/// Whether heads of `head_dim` with `rotary_dim` rotated features can be stored by a GEMV
/// whose pair stride is `pair_stride` (see the module docs).
pub fn fusable(head_dim: u32, rotary_dim: u32, pair_stride: u32) -> bool {
    head_dim.is_multiple_of(2 * pair_stride) && rotary_dim.is_multiple_of(2 * pair_stride)
}

/// Module items: the inverse frequencies and `qkv_feature`, the slot → feature map.
pub(crate) fn emit_items(items: &mut Writer, e: &QkvRope, pair_stride: u32) {
    emit_inv_freq(items, &e.rope);
    let (d, rd, p) = (e.head_dim, e.rope.rotary_dim, pair_stride);
    items.comment(format_args!(
        "the q|k|v feature (weight row, output column) computed by GEMV column slot s: \
         the two features of a rotary pair sit {p} slot(s) apart"
    ));
    items.fn_block("__device__ __forceinline__ int qkv_feature(int s)", |w| {
        emit!(w, "const int h = s / {d};");
        emit!(w, "const int i = s - h * {d};");
        emit!(
            w,
            "if (h >= {} || i >= {rd}) return s;  // v heads, pass-through features",
            e.q_heads + e.kv_heads
        );
        emit!(
            w,
            "const int blk = i / {}, g = i % {p}, hi = (i / {p}) & 1;",
            2 * p
        );
        match e.rope.style {
            RopeStyle::Half => emit!(w, "return h * {d} + {p} * blk + g + hi * {};", rd / 2),
            RopeStyle::Interleaved => emit!(w, "return h * {d} + {} * blk + 2 * g + hi;", 2 * p),
        }
    });
}

/// The rotary frequency index of feature `f0` (the pair's first) of a rotated head.
fn frequency(e: &QkvRope) -> &'static str {
    match e.rope.style {
        RopeStyle::Half => "f0",
        RopeStyle::Interleaved => "f0 >> 1",
    }
}

/// Assigns to the lvalues `cs_out` and `sn_out` the rounded cosine and sine
/// ([`emit_cos_sin`]) with which the pair of slots `col` and `col + pair_stride` of token
/// row `row` is rotated; 1 and 0 where it is not rotated (v heads, pass-through features,
/// a row or column that does not exist). Needs `col`, `row` and `live` as
/// [`emit_pair_epilogue`] does. Kernels emit this where its f64 `sincos` overlaps their
/// weight loads instead of sitting on the epilogue's critical path.
pub(crate) fn emit_pair_cos_sin(w: &mut Writer, e: &QkvRope, xt: &str, cs_out: &str, sn_out: &str) {
    let d = e.head_dim;
    emit!(w, "{cs_out} = 1.0f;");
    emit!(w, "{sn_out} = 0.0f;");
    if e.rope.rotary_dim == 0 {
        return;
    }
    w.if_block("live", |w| {
        emit!(w, "const int hu = col / {d};");
        emit!(w, "const int f0 = qkv_feature(col) - hu * {d};");
        let rotates = format!(
            "hu < {} && f0 < {}",
            e.q_heads + e.kv_heads,
            e.rope.rotary_dim
        );
        w.if_block(rotates, |w| {
            emit!(
                w,
                "const float fp = (float)(long long)({})[row];",
                e.pos.ptr(e.pos_dtype, false)
            );
            emit_cos_sin(w, &e.rope, xt, frequency(e));
            emit!(w, "{cs_out} = cs;");
            emit!(w, "{sn_out} = sn;");
        });
    });
}

/// Rotates and stores the pair of slots `col` and `col + pair_stride` of token row `row`,
/// from the accumulator expressions `acc0` and `acc1`. Needs `col` (int), `row` (long
/// long, the token row `b·T + t`), `live` (whether the row and the column exist) and the
/// bucket constants `c`; x's dtype `xt` is the GEMV's rounding type. `cos_sin`: the pair's
/// rounded cosine and sine computed earlier ([`emit_pair_cos_sin`]); `None` computes them
/// here.
pub(crate) fn emit_pair_epilogue(
    w: &mut Writer,
    e: &QkvRope,
    xt: &str,
    (acc0, acc1): (&str, &str),
    pair_stride: u32,
    cos_sin: Option<(&str, &str)>,
) {
    let (d, hq, hkv) = (e.head_dim, e.q_heads, e.kv_heads);
    w.if_block("live", |w| {
        emit!(w, "const int hu = col / {d};  // q heads, k heads, v heads");
        emit!(w, "const int f0 = qkv_feature(col) - hu * {d};");
        emit!(
            w,
            "const int f1 = qkv_feature(col + {pair_stride}) - hu * {d};"
        );
        emit!(w, "float x0 = round_to<{xt}>({acc0});");
        emit!(w, "float x1 = round_to<{xt}>({acc1});");
        emit_position_and_slot(w, e.pos, e.pos_dtype, e.slots, "row");
        if e.rope.rotary_dim > 0 {
            let rotates = format!("hu < {} && f0 < {}", hq + hkv, e.rope.rotary_dim);
            w.if_block(rotates, |w| {
                match cos_sin {
                    Some((cs, sn)) => {
                        emit!(w, "const float cs = {cs};");
                        emit!(w, "const float sn = {sn};");
                    }
                    None => {
                        w.line("const float fp = (float)pl;");
                        emit_cos_sin(w, &e.rope, xt, frequency(e));
                    }
                }
                emit!(
                    w,
                    "const float r0 = round_to<{xt}>({});",
                    rotated(xt, "x0", "-x1")
                );
                emit!(
                    w,
                    "const float r1 = round_to<{xt}>({});",
                    rotated(xt, "x1", "x0")
                );
                w.line("x0 = r0;");
                w.line("x1 = r1;");
            });
        }
        let qt = e.q_out.dtype.c_type();
        let ct = e.cache_dtype.c_type();
        w.if_else(
            format_args!("hu < {hq}"),
            |w| {
                emit!(
                    w,
                    "{qt}* qo = {} + row * {} + hu * {d};",
                    e.q_out.loc.ptr(e.q_out.dtype, true),
                    e.q_out.row_stride
                );
                emit!(w, "qo[f0] = from_f32<{qt}>(x0);");
                emit!(w, "qo[f1] = from_f32<{qt}>(x1);");
            },
            |w| {
                w.if_block("slot >= 0", |w| {
                    emit!(w, "const bool is_k = hu < {};", hq + hkv);
                    emit!(w, "const int h = is_k ? hu - {hq} : hu - {};", hq + hkv);
                    w.line("const int seq = (int)(row / c.t);");
                    emit!(
                        w,
                        "{ct}* dst = (is_k ? {} : {}) + {} * {d};",
                        e.k_cache.ptr(e.cache_dtype, true),
                        e.v_cache.ptr(e.cache_dtype, true),
                        cache_row("seq", "h", &hkv.to_string())
                    );
                    emit!(w, "dst[f0] = from_f32<{ct}>(x0);");
                    emit!(w, "dst[f1] = from_f32<{ct}>(x1);");
                });
            },
        );
    });
}
