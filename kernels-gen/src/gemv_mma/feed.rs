//! How the operands reach the mma steps: the register feeds ([`Feed::Prefetch`],
//! [`Feed::XAtUse`]) and the shared-memory ring ([`Feed::Smem`]). Each emits the kernel's
//! unit loop and leaves `acc[AT][MT8][4]` holding the warp's partial sums over its units.

use super::{for_each_acc, Feed, MmaTiling};
use crate::gemv::{emit_row_inv_rms, weight_row, GemvParams};
use crate::writer::{emit, Writer};

/// The unit loop of the register feeds: each warp keeps `U` units of its weights (and of
/// x with [`Feed::Prefetch`]) in flight; slot `i` reloads with the next group's unit right
/// after the mma steps that consume it. The fused norm scales each x fragment at use.
pub(super) fn emit_register_main_loop(w: &mut Writer, p: &GemvParams, t: &MmaTiling, mma: &str) {
    let xt = p.x.dtype.c_type();
    let gt = p.norm.map(|nm| nm.dtype.c_type());
    emit!(
        w,
        "uint4 wa[U][AT][2];  // weight rows g, g + 8 of each tile"
    );
    if t.feed == Feed::Prefetch {
        w.line("uint4 xb[U][MT8];  // x rows 8 * mt + g");
    }
    if let Some(gt) = gt {
        emit!(w, "Raw8<{gt}> gn[U];  // norm weight");
    }
    w.comment("first group: units ub + wk + i * WK");
    w.for_unrolled("i", 0, "U", |w| emit_load(w, p, t, "ub + wk + i * WK"));
    if p.norm.is_some() {
        emit_row_inv_rms(w, p, Some(8));
        w.line("__syncthreads();");
        w.line("float rr[MT8];  // 1/rms of rows 8 * mt + g (0 past the tile)");
        w.for_unrolled("mt", 0, "MT8", |w| {
            w.line("rr[mt] = 8 * mt + g < mr ? inv_rms[8 * mt + g] : 0.0f;");
        });
    }
    // After the norm's barrier: the other warps of the block need not wait for it.
    if super::hoists_rope_cos_sin(p, t) {
        super::epilogue::emit_rope_cos_sin(w, p);
    }
    w.line("float acc[AT][MT8][4];");
    for_each_acc(w, |w| w.line("acc[a][mt][d] = 0.0f;"));
    // The rolling prefetch is the pipeline: unrolling this loop again only adds registers.
    w.line("#pragma unroll 1");
    w.for_block("int u0 = ub + wk", "u0 < ue", "u0 += WK * U", |w| {
        w.for_unrolled("i", 0, "U", |w| {
            w.comment("slot i holds unit u0 + i * WK (zeros past K)");
            let xsrc = if t.feed == Feed::XAtUse {
                w.line("uint4 xc[MT8];");
                w.scope(|w| {
                    w.line("const int u = u0 + i * WK;");
                    emit_unit_ok(w, p);
                    emit_x_load(w, p, "xc");
                });
                "xc[mt]"
            } else {
                "xb[i][mt]"
            };
            w.for_unrolled("mt", 0, "MT8", |w| {
                match gt {
                    Some(gt) => emit!(
                        w,
                        "const uint4 xf = rms_scale8<{xt}, {gt}>({xsrc}, gn[i], rr[mt]);"
                    ),
                    None => emit!(w, "const uint4 xf = {xsrc};"),
                }
                w.for_unrolled("a", 0, "AT", |w| {
                    emit!(w, "{mma}(acc[a][mt], wa[i][a][0], wa[i][a][1], xf);");
                });
            });
            emit_load(w, p, t, "u0 + WK * (U + i)");
        });
    });
}

/// The unit loop of [`Feed::Smem`]: the block stages chunks of `CH = WK · U` units of its
/// weight rows and x rows in a ring of `NS` stages, `NS − 1` chunks ahead. Stage `s` holds
/// `xs[s * STAGE + (j * ROWS + row) * 4 + tq]`: 16 bytes (8 k) of chunk unit `j`, staged row
/// `row` (the block's `G · RB` weight rows, then the `MTP` x rows); a warp's fragment of 8
/// rows is 512 contiguous bytes. One barrier per chunk: after it, every warp is done with
/// the stage consumed last iteration, which is refilled then.
pub(super) fn emit_smem_main_loop(w: &mut Writer, p: &GemvParams, stages: u32, mma: &str) {
    let (xt, stride) = (p.x.dtype.c_type(), p.x.row_stride);
    emit!(w, "constexpr int NS = {stages};  // ring stages");
    w.line("constexpr int CH = WK * U;  // units per chunk");
    w.line("constexpr int MTP = MT8 * 8;  // staged x rows");
    w.line("constexpr int RB = WN * 16 * TN;  // weight rows per matrix of the block");
    w.line("constexpr int ROWS = G * RB + MTP;  // staged rows per unit");
    w.line("constexpr int STAGE = CH * ROWS * 4;  // 16-byte pieces per stage");
    w.line("extern __shared__ __align__(16) unsigned char smem[];");
    w.line("uint4* xs = reinterpret_cast<uint4*>(smem);");
    w.line("const int cb = blockIdx.x * RB;  // the block's first column");
    emit!(
        w,
        "const {xt}* xg0 = x + (long long)m0 * {stride};  // the tile's first x row"
    );
    w.comment("chunks 0 .. NS - 2 (an empty group past the split keeps the count)");
    w.for_unrolled("s", 0, "NS - 1", |w| {
        w.if_block("ub + s * CH < ue", |w| emit_stage(w, p, "ub + s * CH", "s"));
        w.line("cp_async_commit();");
    });
    if p.norm.is_some() {
        emit_row_inv_rms(w, p, Some(8));
        w.line("__syncthreads();");
    }
    w.line("float acc[AT][MT8][4];");
    for_each_acc(w, |w| w.line("acc[a][mt][d] = 0.0f;"));
    w.line("#pragma unroll 1");
    w.for_block(
        "int c0 = ub, s = 0",
        "c0 < ue",
        "c0 += CH, s = s + 1 == NS ? 0 : s + 1",
        |w| {
            w.line("cp_async_wait<NS - 2>();  // this thread's copies of chunk c0 have landed");
            if let Some(nm) = &p.norm {
                let gt = nm.dtype.c_type();
                w.comment("fused RMSNorm on the x pieces this thread copied (no other thread reads them yet)");
                emit_stage_pieces(w, p, "c0", |w| {
                    w.if_block("row >= G * RB", |w| {
                        w.line("const int r = row - G * RB;");
                        w.line("uint4* e = xs + s * STAGE + q;");
                        emit!(
                            w,
                            "const Raw8<{gt}> gw = ld_raw8_if<{gt}>(nw + u * 32 + 8 * tq, kin);"
                        );
                        emit!(
                            w,
                            "*e = rms_scale8<{xt}, {gt}>(*e, gw, r < mr ? inv_rms[r] : 0.0f);"
                        );
                    });
                });
            }
            w.line("__syncthreads();");
            w.scope(|w| {
                w.comment("refill the stage every warp finished last iteration");
                w.line("const int cn = c0 + (NS - 1) * CH;");
                w.line("const int sn = s == 0 ? NS - 1 : s - 1;");
                w.if_block("cn < ue", |w| emit_stage(w, p, "cn", "sn"));
                w.line("cp_async_commit();");
            });
            w.line("const uint4* st = xs + s * STAGE;");
            w.for_unrolled("i", 0, "U", |w| {
                w.line("const int j = wk + i * WK;  // this warp's chunk unit (zeros past K)");
                w.line("uint4 wa[AT][2];");
                w.for_unrolled("tn", 0, "TN", |w| {
                    w.for_unrolled("gm", 0, "G", |w| {
                        w.for_unrolled("h", 0, 2, |w| {
                            w.line("wa[tn * G + gm][h] = st[(j * ROWS + gm * RB + wn * 16 * TN + 16 * tn + 8 * h + g) * 4 + t];");
                        });
                    });
                });
                w.for_unrolled("mt", 0, "MT8", |w| {
                    w.line("const uint4 xf = st[(j * ROWS + G * RB + 8 * mt + g) * 4 + t];");
                    w.for_unrolled("a", 0, "AT", |w| {
                        emit!(w, "{mma}(acc[a][mt], wa[a][0], wa[a][1], xf);");
                    });
                });
            });
        },
    );
}

/// `body` once per 16-byte piece `q` of chunk `c0` this thread stages, with its chunk
/// unit `j`, staged `row`, quarter `tq`, unit `u` and `kin` (the piece lies inside the
/// split and K) in scope.
fn emit_stage_pieces(w: &mut Writer, p: &GemvParams, c0: &str, body: impl Fn(&mut Writer)) {
    w.line("#pragma unroll 2");
    w.for_block("int q = threadIdx.x", "q < STAGE", "q += NW * 32", |w| {
        w.line("const int j = q / (ROWS * 4), row = (q >> 2) % ROWS, tq = q & 3;");
        emit!(w, "const int u = {c0} + j;");
        if p.k.is_multiple_of(32) {
            w.line("const bool kin = u < ue;");
        } else {
            w.line("const bool kin = u < ue && u * 32 + 8 * tq < K;");
        }
        body(w);
    });
}

/// Issues the copies of chunk `c0` into stage `s`: weight rows of the block's columns
/// (permuted for the RoPE epilogue), then x rows of the tile; zeros past N, the tile, the
/// split and K.
fn emit_stage(w: &mut Writer, p: &GemvParams, c0: &str, s: &str) {
    let stride = p.x.row_stride;
    let wrow = weight_row(p, "min(col, N - 1)");
    emit_stage_pieces(w, p, c0, |w| {
        w.line("const void* src;");
        w.line("bool ok;");
        w.if_else(
            "row < G * RB",
            |w| {
                w.line("const int col = cb + row % RB;");
                w.line("ok = kin && col < N;");
                emit!(
                    w,
                    "const long long off = (long long){wrow} * K + u * 32 + 8 * tq;"
                );
                if p.gate_up() {
                    w.line("src = (row < RB ? w0 : w1) + off;");
                } else {
                    w.line("src = w0 + off;");
                }
            },
            |w| {
                w.line("const int r = row - G * RB;");
                w.line("ok = kin && r < mr;");
                emit!(w, "src = xg0 + (long long)r * {stride} + u * 32 + 8 * tq;");
            },
        );
        emit!(
            w,
            "cp_async16(xs + ({s}) * STAGE + q, ok ? src : (const void*)w0, ok);"
        );
    });
}

/// `ok`: whether this lane's 8 k of unit `u` lie inside K.
fn emit_unit_ok(w: &mut Writer, p: &GemvParams) {
    if p.k.is_multiple_of(32) {
        w.line("const bool ok = u < ue;");
    } else {
        w.line("const bool ok = u < ue && u * 32 + 8 * t < K;");
    }
}

/// `dst[mt]` = this lane's 8 k of unit `u` of x row `8·mt + g` (zeros outside the tile/K).
fn emit_x_load(w: &mut Writer, p: &GemvParams, dst: &str) {
    w.for_unrolled("mt", 0, "MT8", |w| {
        emit!(
            w,
            "{dst}[mt] = ld_nc_u4_if(xg + (long long)mt * {} + u * 32, ok && 8 * mt + g < mr);",
            8 * p.x.row_stride
        );
    });
}

/// Loads unit `unit` (an expression; `i` is the slot) into `wa[i]` (`xb[i]` when x is
/// prefetched, `gn[i]` with the fused norm).
pub(super) fn emit_load(w: &mut Writer, p: &GemvParams, t: &MmaTiling, unit: &str) {
    w.scope(|w| {
        emit!(w, "const int u = {unit};");
        emit_unit_ok(w, p);
        w.for_unrolled("tn", 0, "TN", |w| {
            w.for_unrolled("h", 0, 2, |w| {
                w.line("const bool live = ok && nb + 16 * tn + 8 * h + g < N;");
                if p.rope.is_some() {
                    w.line("const long long off = wrow[tn][h] + u * 32;");
                } else {
                    w.line(
                        "const long long off = wrow + (long long)(16 * tn + 8 * h) * K + u * 32;",
                    );
                }
                w.line("wa[i][tn * G][h] = ld_stream_u4_if(w0 + off, live);");
                if p.gate_up() {
                    w.line("wa[i][tn * G + 1][h] = ld_stream_u4_if(w1 + off, live);");
                }
            });
        });
        if t.feed == Feed::Prefetch {
            emit_x_load(w, p, "xb[i]");
        }
        if let (Some(nm), Feed::Prefetch | Feed::XAtUse) = (&p.norm, t.feed) {
            let gt = nm.dtype.c_type();
            emit!(w, "gn[i] = ld_raw8_if<{gt}>(nw + u * 32 + 8 * t, ok);");
        }
    });
}
