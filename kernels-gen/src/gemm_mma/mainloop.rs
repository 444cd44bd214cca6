//! The staging ring and the mma steps of `gemm_mma`: leaves `acc[G][MI][NI][4]` holding
//! each warp's sums over all of K (the m16n8 C layout: lane `(g, t)` holds rows `g`,
//! `g + 8` of fragment `mi` and columns `2t`, `2t + 1` of fragment `ni`).

use crate::gemv::GemvParams;
use crate::writer::{emit, Writer};

/// The L2 prefetch of the weight rows of the first `NS − 1` k steps, before the PDL wait
/// (weights are only written by the host, so this may overlap the previous kernel).
pub(super) fn emit_weight_prefetch(w: &mut Writer, p: &GemvParams) {
    w.comment("weight lines of the first NS - 1 k steps into L2 while the previous kernel ends");
    w.for_block(
        "int q = threadIdx.x",
        "q < G * BN * (NS - 1)",
        "q += NT",
        |w| {
            w.line("const int r = q % (G * BN), s = q / (G * BN);");
            w.line("const int n = n0 + r % BN;");
            w.if_block("n < N && s * BK < K", |w| {
                if p.gate_up() {
                    w.line("prefetch_l2((r < BN ? w0 : w1) + (long long)n * K + s * BK);");
                } else {
                    w.line("prefetch_l2(w0 + (long long)n * K + s * BK);");
                }
            });
        },
    );
}

/// The ring and the k loop. Stage `s`, staged row `r`, chunk `c` (8 k) lives at
/// `ring[(s * ROWS + r) * CPR + (c ^ (r & 7))]`; step `kt` lives in stage `kt % NS`.
/// One barrier per step: after it every thread's copies of step `kt` have landed and every
/// warp is done with the stage of step `kt − 1`, which is then refilled with step
/// `kt + NS − 1`.
pub(super) fn emit(w: &mut Writer, p: &GemvParams, k16: &str) {
    w.line("extern __shared__ __align__(128) unsigned char smem[];");
    w.line("uint4* ring = reinterpret_cast<uint4*>(smem);");
    w.comment("steps 0 .. NS - 2 (an empty group past K keeps the count)");
    w.for_unrolled("s", 0, "NS - 1", |w| {
        w.if_block("s < KT", |w| emit_stage(w, p, "s", "s"));
        w.line("cp_async_commit();");
    });
    w.line("float acc[G][MI][NI][4];");
    w.for_unrolled("gm", 0, "G", |w| {
        w.for_unrolled("mi", 0, "MI", |w| {
            w.for_unrolled("ni", 0, "NI", |w| {
                w.for_unrolled("d", 0, 4, |w| w.line("acc[gm][mi][ni][d] = 0.0f;"));
            });
        });
    });
    w.line("int s = 0;  // the stage of step kt");
    w.line("#pragma unroll 1");
    w.for_block("int kt = 0", "kt < KT", "++kt", |w| {
        w.line("cp_async_wait<NS - 2>();  // this thread's copies of step kt have landed");
        w.line("__syncthreads();");
        w.scope(|w| {
            w.comment("refill the stage every warp finished last step");
            w.line("const int kn = kt + NS - 1;");
            w.line("const int sn = s == 0 ? NS - 1 : s - 1;");
            w.if_block("kn < KT", |w| emit_stage(w, p, "sn", "kn"));
            w.line("cp_async_commit();");
        });
        w.line("const uint4* st = ring + s * ROWS * CPR;");
        w.for_unrolled("kk", 0, "BK / 16", |w| emit_k16(w, k16));
        w.line("s = s + 1 == NS ? 0 : s + 1;");
    });
}

/// One k16 step of the stage `st`: the A fragments of the warp's rows, then per pair of
/// n8 fragments (and matrix) one `ldmatrix.x4` of weight rows and its mma steps.
fn emit_k16(w: &mut Writer, k16: &str) {
    w.line("unsigned a[MI][4];");
    w.for_unrolled("mi", 0, "MI", |w| {
        w.comment("lanes 0-15: rows 0-15 at k 0-7, lanes 16-31: the same rows at k 8-15");
        w.line("const int r = wm0 + 16 * mi + (lane & 15);");
        w.line("const int c = 2 * kk + (lane >> 4);");
        w.line("ldmatrix_x4(a[mi], st + r * CPR + (c ^ (r & 7)));");
    });
    w.for_unrolled("gm", 0, "G", |w| {
        w.for_unrolled("j", 0, "NI / 2", |w| {
            w.comment("b0, b1 of columns 16j .. 16j + 7, then of 16j + 8 .. 16j + 15");
            w.line("unsigned b[4];");
            w.line("const int r = BM + gm * BN + wn0 + 16 * j + (lane & 7) + ((lane >> 4) << 3);");
            w.line("const int c = 2 * kk + ((lane >> 3) & 1);");
            w.line("ldmatrix_x4(b, st + r * CPR + (c ^ (r & 7)));");
            w.for_unrolled("mi", 0, "MI", |w| {
                emit!(w, "{k16}(acc[gm][mi][2 * j], a[mi], b[0], b[1]);");
                emit!(w, "{k16}(acc[gm][mi][2 * j + 1], a[mi], b[2], b[3]);");
            });
        });
    });
}

/// Issues the copies of k step `kt` into stage `s`: the x rows of the tile, then the
/// weight rows of the block's columns (gate rows, then up rows); zeros past M, N and K.
fn emit_stage(w: &mut Writer, p: &GemvParams, s: &str, kt: &str) {
    let stride = p.x.row_stride;
    emit!(w, "uint4* dst = ring + ({s}) * ROWS * CPR;");
    emit!(w, "const int kb = ({kt}) * BK;");
    w.for_unrolled("i", 0, "(BM * CPR + NT - 1) / NT", |w| {
        w.line("const int q = threadIdx.x + i * NT;");
        w.if_block("(BM * CPR) % NT == 0 || q < BM * CPR", |w| {
            w.line("const int r = q / CPR, c = q % CPR;");
            w.line("const bool ok = m0 + r < M && kb + 8 * c < K;");
            emit!(
                w,
                "const void* src = x + (long long)(m0 + r) * {stride} + kb + 8 * c;"
            );
            w.line("cp_async16(dst + r * CPR + (c ^ (r & 7)), ok ? src : (const void*)w0, ok);");
        });
    });
    w.for_unrolled("i", 0, "(G * BN * CPR + NT - 1) / NT", |w| {
        w.line("const int q = threadIdx.x + i * NT;");
        w.if_block("(G * BN * CPR) % NT == 0 || q < G * BN * CPR", |w| {
            w.line("const int r = q / CPR, c = q % CPR;");
            w.line("const int n = n0 + r % BN;");
            w.line("const bool ok = n < N && kb + 8 * c < K;");
            let base = if p.gate_up() {
                "(r < BN ? w0 : w1)"
            } else {
                "w0"
            };
            emit!(
                w,
                "const void* src = {base} + (long long)n * K + kb + 8 * c;"
            );
            w.line("const int rs = BM + r;");
            w.line("cp_async16(dst + rs * CPR + (c ^ (rs & 7)), ok ? src : (const void*)w0, ok);");
        });
    });
}
