//! Multi-head latent attention ops (DeepSeek-V3 / Kimi-K2): the generic `mla_attention` in the
//! absorbed form (one block per query row and head, each reading the latent cache of its
//! sequence on its own; `crate::mla_tile` is the fast form) and the standalone `rope`.

use super::{c_type, f32_expr, load, row_launch, store, Kernel, TensorArg};
use crate::abi::KernelSource;
use crate::writer::{emit, Writer};
use crate::Error;
use specc_ir::op::AttnMask;
use specc_ir::DType;

/// Threads of an `mla_attention` block: one cache slot each per tile; latent features are
/// spread over them for the `p · c` sum.
const MLA_THREADS: u64 = 128;

/// Absorbed MLA per query row `(b, t)` and head: `score(s) = scale·(q_lat·c[s] + q_pe·pe[s])`
/// over the slots the mask allows (causal: `0..=pos`, clamped to the cache; tree: slots below
/// `prefix_len` and the ancestor bits of the next `min(T, 64·W)` slots), softmax with the
/// maximum subtracted, output `R(Σ p·c[s] / Σ p)` (f32 sums in slot order per feature); a
/// row with no allowed slot outputs zeros. Two passes over the allowed slots: the maximum,
/// then tiles of 128 slots whose weights are staged in shared memory.
pub(super) fn mla_attention(
    scale: f64,
    mask: AttnMask,
    args: &[TensorArg],
    out: &TensorArg,
) -> Result<KernelSource, Error> {
    let (ql, qp, c, pe, pos) = (&args[0], &args[1], &args[2], &args[3], &args[4]);
    let (b, t, h, l) = (ql.dims[0], ql.dims[1], ql.dims[2], ql.dims[3]);
    let (ctx, r) = (c.dims[1], qp.dims[3]);
    let words = match mask {
        AttnMask::Tree if args[6].dims.len() == 3 => args[6].dims[2],
        _ => 1,
    };
    if l + r > 4096 {
        return Err(Error::param(
            "mla_attention",
            "dims",
            format!("latent {l} + rope {r} exceed the 4096 staged features"),
        ));
    }
    let nt = MLA_THREADS;
    let mut k = Kernel::new("mla_attention", c.dtype);
    k.ptr("ql", ql, false);
    k.ptr("qp", qp, false);
    k.ptr("kvc", c, false);
    k.ptr("pe", pe, false);
    k.ptr("pos", pos, false);
    if mask == AttnMask::Tree {
        k.ptr("pl", &args[5], false);
        k.ptr("anc", &args[6], false);
    }
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr long long T = {t}, H = {h}, L = {l}, R = {r}, CTX = {ctx}, W = {words};"
    );
    emit!(w, "constexpr int NT = {nt};");
    emit!(w, "const float scale = {};", f32_expr(scale as f32));
    w.line("__shared__ float q[L + R], p[NT], red[NT / 32];");
    w.line("const long long row = blockIdx.x;  // (b, t, h)");
    w.line("const long long bt = row / H, bi = bt / T;");
    w.line("for (int i = threadIdx.x; i < L; i += NT) q[i] = to_f32(ql[row * L + i]);");
    w.line("for (int i = threadIdx.x; i < R; i += NT) q[L + i] = to_f32(qp[row * R + i]);");
    match mask {
        AttnMask::Causal => {
            emit!(w, "const long long pv = {};", load(pos.dtype, "pos[bt]"));
            w.line("const long long end = pv < 0 ? 0 : (pv + 1 < CTX ? pv + 1 : CTX);");
            w.line("auto allowed = [&](long long s) { return s < end; };");
            w.line("const long long len = end;");
        }
        AttnMask::Tree => {
            emit!(
                w,
                "const long long prefix = {};",
                load(args[5].dtype, "pl[bi]")
            );
            w.line("const long long nodes = T < 64 * W ? T : 64 * W;");
            w.line("const long long* aw = anc + bt * W;");
            w.line("auto allowed = [&](long long s) {");
            w.line("  const long long u = s - prefix;");
            w.line("  return u < 0 || (u < nodes && ((unsigned long long)aw[u >> 6] >> (u & 63)) & 1ull);");
            w.line("};");
            w.line("const long long reach = (prefix > 0 ? prefix : 0) + nodes;");
            w.line("const long long len = reach < CTX ? reach : CTX;");
        }
    }
    w.line("__syncthreads();");
    emit!(w, "const {}* cb = kvc + bi * CTX * L;", c_type(c.dtype));
    emit!(w, "const {}* pb = pe + bi * CTX * R;", c_type(pe.dtype));
    w.line("auto score = [&](long long s) {");
    w.line("  float lat = 0.0f, rot = 0.0f;");
    emit!(
        w,
        "  for (int i = 0; i < L; ++i) lat = fmaf(q[i], {}, lat);",
        load(c.dtype, "cb[s * L + i]")
    );
    emit!(
        w,
        "  for (int i = 0; i < R; ++i) rot = fmaf(q[L + i], {}, rot);",
        load(pe.dtype, "pb[s * R + i]")
    );
    w.line("  return __fmul_rn(__fadd_rn(lat, rot), scale);");
    w.line("};");
    w.line("float m = neg_inf();");
    w.for_block("long long s = threadIdx.x", "s < len", "s += NT", |w| {
        w.line("if (allowed(s)) m = fmaxf(m, score(s));");
    });
    w.line("m = block_reduce(m, MaxF32(), red);");
    emit!(w, "{}* yr = y + row * L;", c_type(out.dtype));
    w.comment("Uniform across the block: every thread holds the same maximum.");
    w.if_block("m == neg_inf()", |w| {
        w.line("for (int i = threadIdx.x; i < L; i += NT) yr[i] = 0.0f;");
        w.line("return;");
    });
    w.comment("Each thread owns latent features i = tid + NT·j; the weights of a tile are shared.");
    emit!(w, "constexpr int FPT = {};", l.div_ceil(nt));
    w.line("float acc[FPT];");
    w.for_unrolled("f", 0, "FPT", |w| w.line("acc[f] = 0.0f;"));
    w.line("float z = 0.0f;");
    w.for_block("long long s0 = 0", "s0 < len", "s0 += NT", |w| {
        w.line("const long long s = s0 + threadIdx.x;");
        w.line("__syncthreads();  // the previous tile's weights are read");
        w.line("p[threadIdx.x] = s < len && allowed(s) ? expf(score(s) - m) : 0.0f;");
        w.line("__syncthreads();");
        w.line("const int n = len - s0 < NT ? (int)(len - s0) : NT;");
        w.for_block("int j = 0", "j < n", "++j", |w| {
            w.line("const float pj = p[j];");
            w.line("if (pj == 0.0f) continue;");
            w.line("z = __fadd_rn(z, pj);");
            w.for_unrolled("f", 0, "FPT", |w| {
                w.line("const int i = threadIdx.x + NT * f;");
                emit!(
                    w,
                    "if (i < L) acc[f] = __fadd_rn(acc[f], __fmul_rn(pj, {}));",
                    load(c.dtype, "cb[(s0 + j) * L + i]")
                );
            });
        });
    });
    w.for_unrolled("f", 0, "FPT", |w| {
        w.line("const int i = threadIdx.x + NT * f;");
        emit!(
            w,
            "if (i < L) yr[i] = {};",
            store(out.dtype, "z > 0.0f ? acc[f] / z : 0.0f")
        );
    });
    let rows = b * t * h;
    Ok(k.finish(row_launch(rows, nt as u32)))
}

/// A standalone rotary embedding (MLA rotates `q_pe` and `k_pe` apart from the attention
/// inputs), exactly as the interpreter: per token the angle `f32(pos) · inv_freq[i]` in f32,
/// cos and sin in f64, to f32, times the YaRN mscale, rounded; each feature of a pair
/// `R(R(a·cos) + R(partner·sin))`; features past `rotary_dim` pass through. One thread per
/// feature.
pub(super) fn rope(
    op: &specc_ir::Op,
    x: &TensorArg,
    pos: &TensorArg,
    out: &TensorArg,
) -> Result<KernelSource, Error> {
    let (h, d) = (x.dims[2], x.dims[3]);
    let rc = RopeConsts::of(op, d)?;
    let n = x.numel();
    let mut k = Kernel::new("rope", x.dtype);
    k.ptr("x", x, false);
    k.ptr("pos", pos, false);
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(w, "constexpr long long H = {h}, D = {d};");
    rc.emit_consts(w);
    k.grid_stride(n, |w| {
        w.line("const long long f = e % D, tok = e / (H * D);");
        rc.emit_rotate(w, x.dtype, pos.dtype, out.dtype, "e", "e", "tok");
    });
    Ok(k.finish_flat(n))
}

/// The constants of one `rope` op over heads of `d` features: the rotated features, the
/// pairs' inverse frequencies as the interpreter computes them, the YaRN mscale, the pairing.
pub(super) struct RopeConsts {
    rot: u64,
    inv: Vec<f32>,
    mscale: f32,
    interleaved: bool,
}

impl RopeConsts {
    pub(super) fn of(op: &specc_ir::Op, d: u64) -> Result<RopeConsts, Error> {
        let specc_ir::Op::Rope {
            theta,
            scaling,
            style,
            rotary_dim,
        } = op
        else {
            return Err(Error::param("rope", "op", "not a rope op"));
        };
        let rot = *rotary_dim;
        if rot > d || !rot.is_multiple_of(2) {
            return Err(Error::param(
                "rope",
                "rotary_dim",
                format!("{rot} invalid for head dim {d}"),
            ));
        }
        Ok(RopeConsts {
            rot,
            inv: specc_ir::interp::rope_inv_freq(*theta, scaling, rot as usize),
            mscale: match scaling {
                specc_ir::op::RopeScaling::Yarn { mscale, .. } => *mscale as f32,
                _ => 1.0,
            },
            interleaved: *style == specc_ir::op::RopeStyle::Interleaved,
        })
    }

    /// `ROT`, `HALF` and the `INV_FREQ` table.
    pub(super) fn emit_consts(&self, w: &mut Writer) {
        emit!(
            w,
            "constexpr long long ROT = {}, HALF = {};",
            self.rot,
            self.rot / 2
        );
        let table: Vec<String> = self.inv.iter().map(|&f| f32_expr(f)).collect();
        emit!(
            w,
            "const float INV_FREQ[{}] = {{{}}};",
            (self.rot / 2).max(1),
            if table.is_empty() {
                "0.0f".to_string()
            } else {
                table.join(", ")
            }
        );
    }

    /// Rotates feature `f` (`long long`) of one head, inside a loop: a feature past `ROT` is
    /// copied and the loop continues; else reads `x[xi]` and its partner (`xi ± 1` interleaved, else `xi ± HALF`) and the angle's position
    /// `pos[tok]`, stores `y[yi]`, rounding to `out` as the interpreter does.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn emit_rotate(
        &self,
        w: &mut Writer,
        x: DType,
        pos: DType,
        out: DType,
        xi: &str,
        yi: &str,
        tok: &str,
    ) {
        let xt = c_type(out);
        w.if_block("f >= ROT", |w| {
            emit!(
                w,
                "y[{yi}] = {};",
                store(out, &load(x, &format!("x[{xi}]")))
            );
            w.line("continue;");
        });
        if self.interleaved {
            w.line("const long long i = f / 2;");
            w.line("const bool first = (f & 1) == 0;");
            emit!(w, "const long long mate = first ? {xi} + 1 : {xi} - 1;");
        } else {
            w.line("const long long i = f % HALF;");
            w.line("const bool first = f < HALF;");
            emit!(
                w,
                "const long long mate = first ? {xi} + HALF : {xi} - HALF;"
            );
        }
        emit!(
            w,
            "const float fp = (float){};",
            load(pos, &format!("pos[{tok}]"))
        );
        w.line("double sd, cd;");
        w.line("sincos((double)__fmul_rn(fp, INV_FREQ[i]), &sd, &cd);");
        let ms = f32_expr(self.mscale);
        emit!(
            w,
            "const float cs = round_to<{xt}>(__fmul_rn((float)cd, {ms}));"
        );
        emit!(
            w,
            "const float sn = round_to<{xt}>(__fmul_rn((float)sd, {ms}));"
        );
        emit!(w, "const float a = {};", load(x, &format!("x[{xi}]")));
        emit!(w, "const float m = {};", load(x, "x[mate]"));
        w.line("const float partner = first ? -m : m;");
        emit!(
            w,
            "y[{yi}] = {};",
            store(
                out,
                &format!("__fadd_rn(round_to<{xt}>(__fmul_rn(a, cs)), round_to<{xt}>(__fmul_rn(partner, sn)))")
            )
        );
    }
}
