//! The small MLA operations around the projections, fused so that a layer launches two
//! kernels for them instead of nine (codegen's `fuse_mla` groups):
//!
//! - [`mla_kv_write`]: the `kv_a_proj_with_mqa` row `[L + R]` split into the latent
//!   (RMSNorm with `kv_a_layernorm`) and the rope key (RoPE at the token's position), both
//!   written into the caches at the token's slot — `slice`, `rmsnorm`, `kv_write`, `slice`,
//!   `rope`, `kv_write`;
//! - [`mla_q_split`]: `q` `[.., H, DN + DR]` split into `q_nope` (copied) and `q_pe`
//!   (rotated) — `slice`, `slice`, `rope`.
//!
//! Each computes exactly what the unfused kernels compute: the latent's RMSNorm is
//! `crate::norm`'s warp form (the same vector width, lane order and warp sum), the
//! rotation is the standalone `rope` kernel's ([`RopeConsts`]), a cache row is written
//! under `kv_write`'s rule (the slot clamped to the cache, nothing for a negative slot, the
//! last token of a sequence writing a slot wins).

use super::mla::RopeConsts;
use super::{c_type, Kernel, TensorArg};
use crate::abi::{Extent, KernelSource, LaunchSpec};
use crate::writer::emit;
use crate::Error;
use specc_ir::Op;

const KV_FAMILY: &str = "mla_kv_write";
const Q_FAMILY: &str = "mla_q_split";

/// Rows (tokens) of one `mla_kv_write` block: a warp each.
const KV_ROWS_PER_BLOCK: u64 = 4;

/// Operands of [`mla_kv_write`].
pub struct MlaKvWrite<'a> {
    /// `[B, T, L + R]`: the latent then the rope key of each token, rows
    /// `kva_row_stride` elements apart (columns of a wider product, e.g. q_a|kv_a stacked).
    pub kva: &'a TensorArg,
    /// Elements between the starts of consecutive kva rows: `L + R` when contiguous.
    pub kva_row_stride: u64,
    /// `[L]`, the latent's RMSNorm weight.
    pub norm_weight: &'a TensorArg,
    pub eps: f32,
    /// The `rope` op rotating the key.
    pub rope: &'a Op,
    /// `[B, T]`: each token's rotary position.
    pub positions: &'a TensorArg,
    /// `[B, T]`: each token's cache slot (the positions, or a draft tree's node slots).
    pub slots: &'a TensorArg,
    /// `[B, Ctx, 1, L]` and `[B, Ctx, 1, R]`, written in place.
    pub c_cache: &'a TensorArg,
    pub pe_cache: &'a TensorArg,
}

/// The elements of `v` (float) that one 16-byte access or less covers, when `v`'s rows of
/// `stride` elements all start aligned to it.
fn vec_width(len: u64, rows: &[(&TensorArg, u64)]) -> u64 {
    [8u64, 4, 2, 1]
        .into_iter()
        .find(|&vw| {
            len.is_multiple_of(vw)
                && rows.iter().all(|(a, stride)| {
                    let unit = (vw * a.elem_bytes()).min(16);
                    a.loc.byte_offset() % unit == 0 && (stride * a.elem_bytes()) % unit == 0
                })
        })
        .unwrap_or(1)
}

/// One warp per token: the latent's RMSNorm and the key's rotation, each row stored at the
/// token's cache slot (module docs).
pub fn mla_kv_write(p: &MlaKvWrite) -> Result<KernelSource, Error> {
    let [b, t, w] = p.kva.dims[..] else {
        return Err(Error::param(KV_FAMILY, "kva", "must be [B, T, L + R]"));
    };
    let (ctx, l, r) = (p.c_cache.dims[1], p.c_cache.dims[3], p.pe_cache.dims[3]);
    let shapes_agree = p.c_cache.dims == [b, ctx, 1, l]
        && p.pe_cache.dims == [b, ctx, 1, r]
        && l + r == w
        && l > 0
        && p.norm_weight.dims == [l]
        && p.positions.dims == [b, t]
        && p.slots.dims == [b, t];
    if !shapes_agree {
        return Err(Error::param(
            KV_FAMILY,
            "shapes",
            format!(
                "kva {:?}, caches {:?} / {:?}, weight {:?}, positions {:?}, slots {:?} disagree",
                p.kva.dims,
                p.c_cache.dims,
                p.pe_cache.dims,
                p.norm_weight.dims,
                p.positions.dims,
                p.slots.dims
            ),
        ));
    }
    if p.kva_row_stride < w {
        return Err(Error::param(
            KV_FAMILY,
            "kva_row_stride",
            format!("{} is shorter than a row of {w}", p.kva_row_stride),
        ));
    }
    let floats = [p.kva, p.norm_weight, p.c_cache, p.pe_cache];
    if !floats.iter().all(|a| super::is_float(a.dtype)) {
        return Err(Error::param(
            KV_FAMILY,
            "dtype",
            "kva, weight and caches must be float",
        ));
    }
    let rc = RopeConsts::of(p.rope, r)?;
    let ks = p.kva_row_stride;
    let vw = vec_width(l, &[(p.kva, ks), (p.c_cache, l), (p.norm_weight, 0)]);
    let nc = l.div_ceil(32 * vw);
    let rows = b * t;
    let xt = c_type(p.kva.dtype);

    let mut k = Kernel::new(KV_FAMILY, p.kva.dtype);
    k.ptr("kva", p.kva, false);
    k.ptr("wt", p.norm_weight, false);
    k.ptr("pos", p.positions, false);
    k.ptr("slots", p.slots, false);
    k.ptr("c_cache", p.c_cache, true);
    k.ptr("pe_cache", p.pe_cache, true);
    let wr = &mut k.body;
    emit!(
        wr,
        "constexpr long long ROWS = {rows}, T = {t}, LAST = {}, L = {l}, R = {r}, W = {w};",
        ctx - 1
    );
    emit!(wr, "constexpr int VW = {vw}, NC = {nc};");
    // A contiguous kva keeps its rows W apart (the text of the unstacked kernel).
    let stride = if ks == w {
        "W".to_string()
    } else {
        emit!(wr, "constexpr long long KS = {ks};  // kva's row stride");
        "KS".to_string()
    };
    rc.emit_consts(wr);
    emit!(
        wr,
        "const long long row = (long long)blockIdx.x * {KV_ROWS_PER_BLOCK} + (threadIdx.x >> 5);"
    );
    wr.line("if (row >= ROWS) return;");
    wr.line("const int lane = threadIdx.x & 31;");
    wr.line("const long long bi = row / T, ti = row % T;");
    wr.line("const long long p = to_i64(slots[row]);");
    wr.line("if (p < 0) return;");
    wr.line("const long long slot = p < LAST ? p : LAST;");
    wr.comment("A later token of the sequence writing the same slot wins (kv_write's rule).");
    wr.for_block("long long t2 = ti + 1", "t2 < T", "++t2", |w| {
        w.line("const long long p2 = to_i64(slots[bi * T + t2]);");
        w.line("if (p2 >= 0 && (p2 < LAST ? p2 : LAST) == slot) return;");
    });
    wr.comment("The latent: crate::norm's warp RMSNorm, stored at the slot.");
    wr.line("constexpr int D = L, G = 32;");
    wr.line("const int tid = lane;");
    emit!(wr, "const {xt}* xr = kva + row * {stride};");
    emit!(
        wr,
        "{}* yr = c_cache + (bi * (LAST + 1) + slot) * L;",
        c_type(p.c_cache.dtype)
    );
    crate::norm::emit_unit(wr, xt, "ss = warp_sum(ss);", p.eps);
    wr.comment("The rope key: the standalone rope kernel's rotation, stored at the slot.");
    emit!(wr, "const {xt}* x = kva + row * {stride} + L;");
    emit!(
        wr,
        "{}* y = pe_cache + (bi * (LAST + 1) + slot) * R;",
        c_type(p.pe_cache.dtype)
    );
    wr.for_block("long long f = lane", "f < R", "f += 32", |w| {
        rc.emit_rotate(
            w,
            p.kva.dtype,
            p.positions.dtype,
            p.pe_cache.dtype,
            "f",
            "f",
            "row",
        );
    });
    Ok(k.finish(LaunchSpec {
        grid: [
            Extent::Fixed(rows.div_ceil(KV_ROWS_PER_BLOCK).max(1) as u32),
            Extent::Fixed(1),
            Extent::Fixed(1),
        ],
        block: [32 * KV_ROWS_PER_BLOCK as u32, 1, 1],
        smem_bytes: 0,
    }))
}

/// Operands of [`mla_q_split`].
pub struct MlaQSplit<'a> {
    /// `[B, T, H, DN + DR]`.
    pub q: &'a TensorArg,
    pub rope: &'a Op,
    /// `[B, T]`.
    pub positions: &'a TensorArg,
    /// `[B, T, H, DN]`, the copy of the first `DN` features of each head.
    pub q_nope: &'a TensorArg,
    /// `[B, T, H, DR]`, the last `DR` features of each head rotated.
    pub q_pe: &'a TensorArg,
}

/// One thread per element of `q`: the first `DN` features of a head copied to `q_nope`,
/// the rest rotated into `q_pe` (module docs).
pub fn mla_q_split(p: &MlaQSplit) -> Result<KernelSource, Error> {
    let [b, t, h, qk] = p.q.dims[..] else {
        return Err(Error::param(Q_FAMILY, "q", "must be [B, T, H, DN + DR]"));
    };
    let (dn, dr) = (p.q_nope.dims[3], p.q_pe.dims[3]);
    let shapes_agree = p.q_nope.dims == [b, t, h, dn]
        && p.q_pe.dims == [b, t, h, dr]
        && dn + dr == qk
        && p.positions.dims == [b, t];
    let dtypes_agree = p.q_nope.dtype == p.q.dtype && super::is_float(p.q.dtype);
    if !shapes_agree || !dtypes_agree {
        return Err(Error::param(
            Q_FAMILY,
            "shapes",
            format!(
                "q {:?} {}, q_nope {:?} {}, q_pe {:?}, positions {:?} disagree",
                p.q.dims, p.q.dtype, p.q_nope.dims, p.q_nope.dtype, p.q_pe.dims, p.positions.dims
            ),
        ));
    }
    let rc = RopeConsts::of(p.rope, dr)?;
    let n = p.q.numel();
    let mut k = Kernel::new(Q_FAMILY, p.q.dtype);
    k.ptr("x", p.q, false);
    k.ptr("pos", p.positions, false);
    k.ptr("yn", p.q_nope, true);
    k.ptr("y", p.q_pe, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr long long H = {h}, QK = {qk}, DN = {dn}, DR = {dr};"
    );
    rc.emit_consts(w);
    k.grid_stride(n, |w| {
        w.line("const long long f0 = e % QK, rh = e / QK, tok = rh / H;");
        w.if_block("f0 < DN", |w| {
            w.line("yn[rh * DN + f0] = x[e];");
            w.line("continue;");
        });
        w.line("const long long f = f0 - DN;");
        rc.emit_rotate(
            w,
            p.q.dtype,
            p.positions.dtype,
            p.q_pe.dtype,
            "e",
            "rh * DR + f",
            "tok",
        );
    });
    Ok(k.finish_flat(n))
}
