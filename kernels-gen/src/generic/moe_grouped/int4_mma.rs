//! `moe_gate_up` / `moe_down` over int4 group-32 stacks with bf16 activations on tensor
//! cores (W4A16, f32 accumulation): `mma.m16n8k16` bf16 with 16 weight rows as M and 8 of
//! the expert's tokens as N (zero-padded; more tokens take more n-tiles that reuse the same
//! unpacked weight fragments, so each weight byte is read once per pass of up to
//! [`MAX_TILES`]` · 8` tokens).
//!
//! Each warp owns 32 rows (gate/up: 16 rows of `Wg` and the same 16 of `Wu`, so its
//! fragments hold gate and up of the same outputs for the SwiGLU epilogue; down: 32 rows of
//! `Wd`) and streams them through its own ring of [`STAGES`] shared-memory stages with
//! `cp.async` (16-byte copies, a row's 64 bytes per stage contiguous; no block barrier,
//! warps run independently). A stage is [`GROUPS`] groups of 32 columns: `ldmatrix` hands
//! each lane word t (8 nibbles) of its rows g and g + 8, unpacked to bf16 `u − 8` exactly
//! (`cuda/moe_int4_mma.cuh`: one LOP3 and one packed subtract per two weights). Each
//! group's two k16 steps give its unscaled sums, which its scale then multiplies:
//! `acc += s[row, group] · Σ_group (u − 8)·x` — exact products and f32 sums, the
//! interpreter's dequantise-then-matmul up to the order of the sums.
//!
//! Batch invariance: a token is one column of the mma (no column reads another), its
//! column is its position among the expert's tokens, and the group and stage order is
//! fixed, so its result does not depend on the other tokens of its expert.

use super::{
    grouped_launch, meta_ptrs, per_pass, scratch_arg, MoeGroupedShape, MoeScratch, Stacks, NAMES,
    WARPS,
};
use crate::abi::KernelSource;
use crate::generic::{store, Kernel, TensorArg};
use crate::writer::{emit, Writer};

/// Weight rows of a warp: two m16 tiles.
const ROWS_PER_WARP: u64 = 32;
/// Groups of 32 columns per ring stage: 64 contiguous bytes of each row.
pub(super) const GROUPS: u64 = 4;
/// Ring stages per warp: `STAGES − 1` stages (6 KiB of weights) in flight while one is
/// consumed.
const STAGES: u64 = 4;
/// n-tiles (8 tokens each) of a pass at most: an expert with up to 8 tokens runs one,
/// more run passes of 16.
const MAX_TILES: u64 = 2;
/// Resident blocks per SM the launch bounds ask for (128 registers; 36 KiB of shared
/// memory a block).
const MIN_BLOCKS: u32 = 4;
/// Columns of a stage.
pub(super) const STAGE_COLS: u64 = 32 * GROUPS;

const HELPERS: &str = include_str!("../../../cuda/moe_int4_mma.cuh");

/// Shared-memory bytes of one stage: the weights (32 rows × `GROUPS` granules of 16 bytes,
/// group-major so that `ldmatrix`'s eight rows are consecutive granules) and the bf16
/// scales (32 rows × `GROUPS`).
fn stage_bytes() -> u64 {
    ROWS_PER_WARP * GROUPS * 16 + ROWS_PER_WARP * GROUPS * 2
}

/// The module items and the common prologue: ring, lane roles, expert, the warp's first
/// output row `j0` (warps cover `out_rows` each); warps past `rows` and blocks past the used
/// count return (no block barrier follows).
fn prologue(k: &mut Kernel, s: &MoeScratch, e: u64, rows: u64, kdim: u64, out_rows: u64) {
    k.items.line(crate::CP_ASYNC_ITEMS.trim_end());
    k.items.line(HELPERS.trim_end());
    meta_ptrs(k, s, e, false);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int K = {kdim}, NSTG = K / {STAGE_COLS}, NS = {STAGES}, SG = {GROUPS}, ROWS = {rows};"
    );
    emit!(
        w,
        "constexpr int W_BYTES = {}, STAGE = {};",
        ROWS_PER_WARP * GROUPS * 16,
        stage_bytes()
    );
    emit!(
        w,
        "__shared__ __align__(128) unsigned char ring_all[{} * NS * STAGE];",
        WARPS
    );
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    w.line("const int g = lane >> 2, t = lane & 3;");
    w.comment("Uniform across the block: the used count is one value.");
    w.line("if ((int)blockIdx.y >= meta[0]) return;");
    w.line("const int ex = used[blockIdx.y];");
    w.line("const int p0 = first[ex], n = count[ex];");
    emit!(
        w,
        "const int j0 = (blockIdx.x * {WARPS} + warp) * {out_rows};"
    );
    w.line("if (j0 >= ROWS) return;");
    w.line("unsigned char* ring = ring_all + warp * NS * STAGE;");
}

/// This lane's copy sources at stage 0: granule `q = i·32 + lane` is row `q / 4` of the
/// warp's 32, group `q % 4` of the stage, stored at `(group · 32 + row) · 16`; the scales
/// of row `lane` (`GROUPS` bf16, 8 bytes) at `W_BYTES + lane · 8`. `row_ptr(mt, r)` is the
/// byte pointer of row `r` (an expression) of m-tile `mt`, `scale_ptr` the same for scales.
fn sources(
    w: &mut Writer,
    row_ptr: &dyn Fn(u64, &str) -> String,
    scale_ptr: &dyn Fn(u64, &str) -> String,
) {
    w.line("const unsigned char* wsrc[4];");
    w.line("int wdst[4];");
    w.for_unrolled("i", 0, 4, |w| {
        w.line("const int q = i * 32 + lane, r = q >> 2, gq = q & 3;");
        emit!(
            w,
            "wsrc[i] = (r < 16 ? {} : {}) + gq * 16;",
            row_ptr(0, "r"),
            row_ptr(1, "r - 16")
        );
        w.line("wdst[i] = (gq * 32 + r) * 16;");
    });
    emit!(
        w,
        "const unsigned short* ssrc = lane < 16 ? {} : {};",
        scale_ptr(0, "lane"),
        scale_ptr(1, "lane - 16")
    );
}

/// Copies stage `s` (an expression) into its ring slot and commits the group; past the last
/// stage the copies zero-fill without reading (the group stays, so the wait counts hold).
fn issue(w: &mut Writer, s: &str) {
    w.scope(|w| {
        emit!(w, "const int si = {s};");
        w.line("unsigned char* dst = ring + (si % NS) * STAGE;");
        w.line("const bool ok = si < NSTG;");
        w.line("const int so = ok ? si : 0;");
        w.for_unrolled("i", 0, 4, |w| {
            emit!(
                w,
                "cp_async16(dst + wdst[i], wsrc[i] + so * {}, ok);",
                GROUPS * 16
            );
        });
        w.line("cp_async8(dst + W_BYTES + lane * 8, ssrc + so * SG, ok);");
        w.line("cp_async_commit();");
    });
}

/// The K loop of one pass of `NT` n-tiles: `acc[2][NT][4]` += the warp's two m-tiles times
/// the tokens whose activation rows are `xr[nt]` (this lane's token `nt · 8 + g`, at its
/// columns `8t ..`; zeros where `xok[nt]` is false).
fn k_loop(w: &mut Writer) {
    w.line("float acc[2][NT][4] = {};");
    w.for_block("int s = 0", "s < NS - 1", "++s", |w| issue(w, "s"));
    w.line("#pragma unroll 1");
    w.for_block("int s = 0", "s < NSTG", "++s", |w| {
        w.comment("This stage's activations first: their latency overlaps the wait.");
        w.line("uint4 xv[NT][SG];");
        w.for_unrolled("nt", 0, "NT", |w| {
            w.for_unrolled("gi", 0, "SG", |w| {
                emit!(
                    w,
                    "xv[nt][gi] = ld_x16_if(xr[nt] + s * {STAGE_COLS} + gi * 32, xok[nt]);"
                );
            });
        });
        w.line("cp_async_wait<NS - 2>();");
        w.comment("Every lane's copies of stage s landed, and every lane is done with s - 1.");
        w.line("__syncwarp();");
        issue(w, "s + NS - 1");
        w.line("const unsigned char* cur = ring + (s % NS) * STAGE;");
        w.line("uint2 s_lo[2], s_hi[2];");
        w.for_unrolled("mt", 0, 2, |w| {
            w.line(
                "s_lo[mt] = *reinterpret_cast<const uint2*>(cur + W_BYTES + (mt * 16 + g) * 8);",
            );
            w.line(
                "s_hi[mt] = *reinterpret_cast<const uint2*>(cur + W_BYTES + (mt * 16 + g + 8) * 8);",
            );
        });
        w.for_unrolled("h", 0, "SG / 2", |w| {
            w.line("unsigned wq[2][4];");
            w.for_unrolled("mt", 0, 2, |w| {
                w.line(
                    "ldmatrix_x4(wq[mt], cur + ((2 * h + (lane >> 4)) * 32 + mt * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * 16);",
                );
            });
            w.for_unrolled("e", 0, 2, |w| {
                w.line("Int4B b[NT];");
                w.for_unrolled("nt", 0, "NT", |w| {
                    w.line("b[nt] = int4_b(xv[nt][2 * h + e]);");
                });
                w.for_unrolled("mt", 0, 2, |w| {
                    w.line("const Int4A a = int4_a(wq[mt][2 * e], wq[mt][2 * e + 1]);");
                    w.line("const float sl = bf16x4_at(s_lo[mt], 2 * h + e);");
                    w.line("const float sh = bf16x4_at(s_hi[mt], 2 * h + e);");
                    w.for_unrolled("nt", 0, "NT", |w| {
                        w.line("float d[4];");
                        w.line("int4_group_mma(d, a, b[nt]);");
                        w.line("acc[mt][nt][0] = fmaf(sl, d[0], acc[mt][nt][0]);");
                        w.line("acc[mt][nt][1] = fmaf(sl, d[1], acc[mt][nt][1]);");
                        w.line("acc[mt][nt][2] = fmaf(sh, d[2], acc[mt][nt][2]);");
                        w.line("acc[mt][nt][3] = fmaf(sh, d[3], acc[mt][nt][3]);");
                    });
                });
            });
        });
    });
    w.comment("The ring is free again before the next pass refills it.");
    w.line("cp_async_wait<0>();");
    w.line("__syncwarp();");
}

/// The pass loop around [`k_loop`]: per pass of `NT` n-tiles, this lane's activation rows
/// (`xrow(b)`: the row of the pass's token `b`, valid for `b < nb`), the K loop, then
/// `epilogue` (which reads `acc`, `nb`, `c0`).
fn passes(w: &mut Writer, xrow: &dyn Fn(&str) -> String, epilogue: &dyn Fn(&mut Writer)) {
    let sizes: Vec<u64> = (1..=MAX_TILES).map(|nt| 8 * nt).collect();
    per_pass(w, &sizes, &|w| {
        w.line("constexpr int NT = TB / 8;");
        w.for_block("int c0 = 0", "c0 < n", "c0 += TB", |w| {
            w.line("const int nb = n - c0 < TB ? n - c0 : TB;");
            w.line("const bf16* xr[NT];");
            w.line("bool xok[NT];");
            w.for_unrolled("nt", 0, "NT", |w| {
                w.line("const int b = nt * 8 + g;");
                w.line("xok[nt] = b < nb;");
                emit!(w, "xr[nt] = {} + 8 * t;", xrow("(xok[nt] ? b : 0)"));
            });
            k_loop(w);
            epilogue(w);
        });
    });
}

/// The tensor-core `moe_gate_up`: `act[pair, j] = R(R(silu(R(g)))·R(u))` (as the CUDA-core
/// kernel), `g`, `u` the rows `j` of `Wg`, `Wu` times the pair's token.
pub(super) fn gate_up(
    sh: MoeGroupedShape,
    x: &TensorArg,
    st: &Stacks,
    out: &TensorArg,
    s: &MoeScratch,
) -> KernelSource {
    use specc_ir::DType::I32;
    let (e, f, h, p) = (sh.experts, sh.ffn, sh.hidden, sh.pairs());
    let r = |v: &str| format!("to_f32({})", store(out.dtype, v));
    let mut k = Kernel::new("moe_gate_up", st.dtype());
    k.ptr("x", x, false);
    st.ptrs(&mut k, &[0, 1]);
    k.ptr("pair_token", &scratch_arg(s.pair_token, I32, p), false);
    k.ptr("act", &TensorArg::new(s.act, out.dtype, &[p, f]), true);
    prologue(&mut k, s, e, f, h, 16);
    let w = &mut k.body;
    st.expert_ptrs(w, 0);
    st.expert_ptrs(w, 1);
    let rb = h / 2;
    let sc = h / 32;
    sources(
        w,
        &|mt, r| format!("w{}e + (long long)(j0 + {r}) * {rb}", NAMES[mt as usize]),
        &|mt, r| {
            format!(
                "reinterpret_cast<const unsigned short*>(s{}e) + (long long)(j0 + {r}) * {sc}",
                NAMES[mt as usize]
            )
        },
    );
    passes(
        w,
        &|b| format!("x + (long long)pair_token[p0 + c0 + {b}] * K"),
        &|w| {
            w.for_unrolled("nt", 0, "NT", |w| {
                w.for_unrolled("i", 0, 4, |w| {
                    w.line("const int b = nt * 8 + 2 * t + (i & 1);");
                    w.if_block("b < nb", |w| {
                        emit!(w, "const float gv = {};", r("acc[0][nt][i]"));
                        emit!(w, "const float uv = {};", r("acc[1][nt][i]"));
                        emit!(w, "const float sl = {};", r("silu_f32(gv)"));
                        emit!(
                            w,
                            "act[(long long)(p0 + c0 + b) * {f} + j0 + g + 8 * (i >> 1)] = {};",
                            store(out.dtype, "__fmul_rn(sl, uv)")
                        );
                    });
                });
            });
        },
    );
    k.finish_bounded(grouped_launch(f, 16, sh), Some(MIN_BLOCKS))
}

/// The tensor-core `moe_down`: `y[pair, i] = R(act[pair] · Wd[i])`.
pub(super) fn down(
    sh: MoeGroupedShape,
    st: &Stacks,
    out: &TensorArg,
    s: &MoeScratch,
) -> KernelSource {
    let (e, f, h, p) = (sh.experts, sh.ffn, sh.hidden, sh.pairs());
    let mut k = Kernel::new("moe_down", st.dtype());
    st.ptrs(&mut k, &[2]);
    k.ptr("act", &TensorArg::new(s.act, out.dtype, &[p, f]), false);
    k.ptr("y", &TensorArg::new(s.y, out.dtype, &[p, h]), true);
    prologue(&mut k, s, e, h, f, 32);
    let w = &mut k.body;
    st.expert_ptrs(w, 2);
    let rb = f / 2;
    let sc = f / 32;
    sources(
        w,
        &|mt, r| format!("wde + (long long)(j0 + {} + {r}) * {rb}", 16 * mt),
        &|mt, r| {
            format!(
                "reinterpret_cast<const unsigned short*>(sde) + (long long)(j0 + {} + {r}) * {sc}",
                16 * mt
            )
        },
    );
    passes(
        w,
        &|b| format!("act + (long long)(p0 + c0 + {b}) * K"),
        &|w| {
            w.for_unrolled("mt", 0, 2, |w| {
                w.for_unrolled("nt", 0, "NT", |w| {
                    w.for_unrolled("i", 0, 4, |w| {
                        w.line("const int b = nt * 8 + 2 * t + (i & 1);");
                        w.if_block("b < nb", |w| {
                            emit!(
                                w,
                                "y[(long long)(p0 + c0 + b) * {h} + j0 + mt * 16 + g + 8 * (i >> 1)] = {};",
                                store(out.dtype, "acc[mt][nt][i]")
                            );
                        });
                    });
                });
            });
        },
    );
    k.finish_bounded(grouped_launch(h, 32, sh), Some(MIN_BLOCKS))
}
