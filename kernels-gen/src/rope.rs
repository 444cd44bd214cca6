//! `rope_kv`: rotary embedding of q and k (with an optional per-head RMSNorm before it,
//! Qwen3's q_norm/k_norm), then k and v written into the KV cache; the fused
//! `rmsnorm → rope → kv_write` of one attention layer.
//!
//! One warp per `(token, head)` unit: q heads, then k heads, then v heads. A unit is read
//! once into shared memory (normalised when fused) so rotation pairs can cross lanes.
//!
//! - Rotation, step for step as the interpreter (and HF in the activation dtype `R`):
//!   `angle = f32(pos) · inv_freq[i]` in f32; cos and sin in f64, to f32, times
//!   `cos_sin_scale` (YaRN's mscale; 1 otherwise), then `c = R(cos)`, `s = R(sin)`; a pair
//!   `(a, b)` becomes `(R(R(a·c) + R(−b·s)), R(R(b·c) + R(a·s)))`, with `_rn` intrinsics so
//!   no product is contracted into an FMA. `Half` pairs `(i, i + rd/2)`, `Interleaved`
//!   pairs `(2i, 2i + 1)`, both at frequency `i`; features past `rotary_dim` pass through.
//! - KV write: token `m = b·T + t` goes to slot `min(pos, Ctx − 1)` of sequence `b` (or
//!   `min(slots[m], Ctx − 1)` when separate slots are given: draft trees); a negative slot
//!   (a padding lane) writes nothing. Rotated q is always written.
//!
//! The plan runs this kernel after the q|k|v GEMV only where the GEMV cannot do it in its
//! epilogue ([`crate::qkv_rope`]): with the per-head norm (a whole head's sum of squares) or a
//! head shape the GEMV's pair stride does not divide. The position / slot, cos / sin and
//! rotation emitters below are shared with that epilogue, so both compute the same bits.
//!
//! `inv_freq` comes from the caller (codegen resolves default / llama3 / yarn scaling once
//! for the interpreter and the kernels alike). Kernel name dtype: q's dtype.

use crate::abi::{Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec, Loc, Rows, View};
use crate::qkv_rope::QkvRope;
use crate::writer::{emit, f32_lit, Writer};
use crate::Error;

const FAMILY: &str = "rope_kv";
const WARPS: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-NeoX / HF Llama rotate-half.
    Half,
    /// GPT-J / DeepSeek MLA.
    Interleaved,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeTable {
    pub style: RopeStyle,
    /// Rotated features per head (even, ≤ head_dim).
    pub rotary_dim: u32,
    /// `rotary_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin.
    pub cos_sin_scale: f32,
}

impl RopeTable {
    /// The table's own invariants for heads of `head_dim` (errors name `family`).
    pub(crate) fn validate(&self, family: &'static str, head_dim: u32) -> Result<(), Error> {
        let err = |field, reason: &str| Err(Error::param(family, field, reason));
        if !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > head_dim {
            return err("rope.rotary_dim", "must be even and at most head_dim");
        }
        if self.inv_freq.len() != self.rotary_dim as usize / 2 {
            return err("rope.inv_freq", "must hold rotary_dim / 2 values");
        }
        if !self
            .inv_freq
            .iter()
            .chain([&self.cos_sin_scale])
            .all(|x| x.is_finite())
        {
            return err("rope", "inv_freq and cos_sin_scale must be finite");
        }
        Ok(())
    }
}

/// Per-head RMSNorm of q and k before rotation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkNorm {
    pub q_weight: Loc,
    pub k_weight: Loc,
    pub dtype: Dtype,
    pub eps: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeKvParams {
    /// Heads, where rotated q and k/v go, positions and slots, the rotation: the same
    /// description the fused q|k|v GEMV epilogue takes (v rows here are `head_dim_v` wide).
    pub out: QkvRope,
    pub head_dim_v: u32,
    /// `[M, q_heads · head_dim]` (a view into the fused QKV output); k has q's dtype.
    pub q: View,
    pub k: View,
    pub v: View,
    pub qk_norm: Option<QkNorm>,
}

impl RopeKvParams {
    fn validate(&self) -> Result<(), Error> {
        let err = |field, reason: &str| Err(Error::param(FAMILY, field, reason));
        if self.out.q_heads == 0
            || self.out.kv_heads == 0
            || self.out.head_dim == 0
            || self.head_dim_v == 0
        {
            return err("heads/head_dim", "must be positive");
        }
        if self.k.dtype != self.q.dtype || !self.q.dtype.is_float() {
            return err("k", "must have q's float dtype");
        }
        if ![self.v.dtype, self.out.q_out.dtype, self.out.cache_dtype]
            .iter()
            .all(|d| d.is_float())
        {
            return err("dtype", "v, q_out and the cache must be float types");
        }
        if !self.out.pos_dtype.is_int() || self.out.slots.is_some_and(|(_, d)| !d.is_int()) {
            return err("pos_dtype", "positions and slots must be i32 or i64");
        }
        self.out.rope.validate(FAMILY, self.out.head_dim)?;
        if let Some(n) = &self.qk_norm {
            if !n.dtype.is_float() || !n.eps.is_finite() || n.eps < 0.0 {
                return err("qk_norm", "needs a float weight and a finite eps >= 0");
            }
        }
        Ok(())
    }
}

pub fn rope_kv(p: &RopeKvParams) -> Result<KernelSource, Error> {
    p.validate()?;
    let (d, dv, hq, hkv) = (p.out.head_dim, p.head_dim_v, p.out.q_heads, p.out.kv_heads);
    let half = p.out.rope.rotary_dim / 2;
    let xt = p.q.dtype.c_type();
    let ct = p.out.cache_dtype.c_type();
    let mut kb = KernelBuilder::new(FAMILY, p.q.dtype);

    emit_inv_freq(&mut kb.items, &p.out.rope);

    let w = &mut kb.body;
    emit!(w, "constexpr int D = {d};");
    emit!(w, "constexpr int DV = {dv};");
    emit!(w, "constexpr int HQ = {hq};");
    emit!(w, "constexpr int HKV = {hkv};");
    emit!(
        w,
        "constexpr int RD = {};  // rotary dims",
        p.out.rope.rotary_dim
    );
    emit!(w, "__shared__ float hb[{WARPS}][{}];", d.max(dv));
    w.line("const int lane = threadIdx.x & 31;");
    w.line("const int warp = threadIdx.x >> 5;");
    emit!(w, "const int u = blockIdx.x * {WARPS} + warp;");
    w.line("if (u >= HQ + 2 * HKV) return;");
    w.line("const int m = blockIdx.y;");
    w.line("const int b = m / c.t;");
    emit_position_and_slot(w, p.out.pos, p.out.pos_dtype, p.out.slots, "m");
    let slot_base = cache_row("b", "h", "HKV");

    w.comment("v heads: copy into the cache");
    w.if_block("u >= HQ + HKV", |w| {
        w.line("const int h = u - HQ - HKV;");
        w.line("if (slot < 0) return;");
        emit!(
            w,
            "const {}* src = {} + (long long)m * {} + h * DV;",
            p.v.dtype.c_type(),
            p.v.loc.ptr(p.v.dtype, false),
            p.v.row_stride
        );
        emit!(
            w,
            "{ct}* dst = {} + {slot_base} * DV;",
            p.out.v_cache.ptr(p.out.cache_dtype, true)
        );
        w.for_block("int i = lane", "i < DV", "i += 32", |w| {
            emit!(w, "dst[i] = from_f32<{ct}>(to_f32(src[i]));");
        });
        w.line("return;");
    });

    w.line("const bool is_q = u < HQ;");
    w.line("const int h = is_q ? u : u - HQ;");
    emit!(
        w,
        "const {xt}* src = is_q ? {} + (long long)m * {} + h * D : {} + (long long)m * {} + h * D;",
        p.q.loc.ptr(p.q.dtype, false),
        p.q.row_stride,
        p.k.loc.ptr(p.k.dtype, false),
        p.k.row_stride
    );
    w.line("float* hv = hb[warp];");
    match &p.qk_norm {
        Some(n) => {
            w.comment("per-head RMSNorm");
            w.line("float ss = 0.0f;");
            w.for_block("int i = lane", "i < D", "i += 32", |w| {
                w.line("const float x = to_f32(src[i]);");
                w.line("hv[i] = x;");
                w.line("ss = fmaf(x, x, ss);");
            });
            w.line("ss = warp_sum(ss);");
            emit!(
                w,
                "const float inv = 1.0f / sqrtf(ss / float(D) + {});",
                f32_lit(n.eps)
            );
            let nt = n.dtype.c_type();
            emit!(
                w,
                "const {nt}* nw = is_q ? {} : {};",
                n.q_weight.ptr(n.dtype, false),
                n.k_weight.ptr(n.dtype, false)
            );
            w.for_block("int i = lane", "i < D", "i += 32", |w| {
                emit!(
                    w,
                    "hv[i] = round_to<{xt}>(round_to<{xt}>(hv[i] * inv) * to_f32(nw[i]));"
                );
            });
        }
        None => {
            w.for_block("int i = lane", "i < D", "i += 32", |w| {
                w.line("hv[i] = to_f32(src[i]);")
            });
        }
    }
    w.line("__syncwarp();");
    w.line("const float fp = (float)pl;");
    emit!(
        w,
        "{}* qo = {} + (long long)m * {} + h * D;",
        p.out.q_out.dtype.c_type(),
        p.out.q_out.loc.ptr(p.out.q_out.dtype, true),
        p.out.q_out.row_stride
    );
    emit!(
        w,
        "{ct}* ko = {} + {slot_base} * D;",
        p.out.k_cache.ptr(p.out.cache_dtype, true)
    );
    w.for_block("int i = lane", "i < D", "i += 32", |w| {
        w.line("float o = hv[i];");
        if half > 0 {
            w.if_block("i < RD", |w| {
                match p.out.rope.style {
                    RopeStyle::Half => {
                        w.line("const int f = i < RD / 2 ? i : i - RD / 2;");
                        w.line(
                            "const float partner = i < RD / 2 ? -hv[i + RD / 2] : hv[i - RD / 2];",
                        );
                    }
                    RopeStyle::Interleaved => {
                        w.line("const int f = i >> 1;");
                        w.line("const float partner = (i & 1) ? hv[i - 1] : -hv[i + 1];");
                    }
                }
                emit_cos_sin(w, &p.out.rope, xt, "f");
                emit!(w, "o = {};", rotated(xt, "hv[i]", "partner"));
            });
        }
        emit!(w, "o = round_to<{xt}>(o);");
        w.if_else(
            "is_q",
            |w| emit!(w, "qo[i] = from_f32<{}>(o);", p.out.q_out.dtype.c_type()),
            |w| w.if_block("slot >= 0", |w| emit!(w, "ko[i] = from_f32<{ct}>(o);")),
        );
    });

    let launch = LaunchSpec {
        grid: [
            Extent::Fixed((hq + 2 * hkv).div_ceil(WARPS)),
            Rows::Tokens.extent(1, 1),
            Extent::Fixed(1),
        ],
        block: [WARPS * 32, 1, 1],
        smem_bytes: 0,
    };
    Ok(kb.finish(launch))
}

/// Module items of a rotation: the `INV_FREQ[rotary_dim / 2]` table (nothing when no
/// feature rotates).
pub(crate) fn emit_inv_freq(items: &mut Writer, rope: &RopeTable) {
    let half = rope.rotary_dim / 2;
    if half == 0 {
        return;
    }
    items.comment("inverse frequencies of the rotary pairs");
    let vals: Vec<String> = rope.inv_freq.iter().map(|&x| f32_lit(x)).collect();
    items.block_semi(
        format_args!("static __device__ const float INV_FREQ[{half}] ="),
        |w| {
            for chunk in vals.chunks(4) {
                emit!(w, "{},", chunk.join(", "));
            }
        },
    );
}

/// Declares `pl` (the position of token row `row`, as `long long`) and `slot` (its KV cache
/// slot: `min(pos, Ctx − 1)`, or `min(slots[row], Ctx − 1)` when separate slots are given;
/// −1 for a negative one, which writes nothing). Needs the bucket constants `c`.
pub(crate) fn emit_position_and_slot(
    w: &mut Writer,
    pos: Loc,
    pos_dtype: Dtype,
    slots: Option<(Loc, Dtype)>,
    row: &str,
) {
    emit!(
        w,
        "const long long pl = (long long)({})[{row}];",
        pos.ptr(pos_dtype, false)
    );
    match slots {
        None => {
            w.line("const int slot = cache_slot(pl, c.ctx);  // -1: padding lane, nothing written")
        }
        Some((loc, dt)) => {
            emit!(
                w,
                "const int slot = cache_slot((long long)({})[{row}], c.ctx);  // -1: nothing written",
                loc.ptr(dt, false)
            );
        }
    }
}

/// The row of sequence `seq`, head `head` at `slot` in a `[B, Ctx, kv_heads, D]` cache (an
/// expression; a negative slot reads row 0, callers write only when `slot >= 0`).
pub(crate) fn cache_row(seq: &str, head: &str, kv_heads: &str) -> String {
    format!("((long long)({seq} * c.ctx + max(slot, 0)) * {kv_heads} + {head})")
}

/// Declares `cs` and `sn`, the rounded cosine and sine of frequency `f` (an expression) at
/// the f32 position `fp`: the angle in f32, cos and sin in f64, to f32, times
/// `cos_sin_scale`, rounded to `xt`.
pub(crate) fn emit_cos_sin(w: &mut Writer, rope: &RopeTable, xt: &str, f: &str) {
    w.line("double sd, cd;");
    emit!(w, "sincos((double)(fp * INV_FREQ[{f}]), &sd, &cd);");
    let ms = f32_lit(rope.cos_sin_scale);
    emit!(
        w,
        "const float cs = round_to<{xt}>(__fmul_rn((float)cd, {ms}));"
    );
    emit!(
        w,
        "const float sn = round_to<{xt}>(__fmul_rn((float)sd, {ms}));"
    );
}

/// One rotated feature before its final rounding: `R(x·cs) + R(partner·sn)` with no FMA
/// contraction, where `partner` is `−b` for the first feature of a pair `(a, b)` and `a`
/// for the second. Needs `cs` and `sn` ([`emit_cos_sin`]).
pub(crate) fn rotated(xt: &str, x: &str, partner: &str) -> String {
    format!(
        "__fadd_rn(round_to<{xt}>(__fmul_rn({x}, cs)), round_to<{xt}>(__fmul_rn({partner}, sn)))"
    )
}
