//! `moe_gate_up` / `moe_down` over int4 group-32 stacks with bf16 activations on tensor
//! cores (W4A16, f32 accumulation): `mma.m16n8k16` bf16 with 16 weight rows as M and 8 of
//! the expert's tokens as N (zero-padded; more tokens take more n-tiles that reuse the same
//! unpacked weight fragments, so each weight byte is read once per pass of up to
//! [`MAX_TILES`]` · 8` tokens).
//!
//! Each warp owns 32 rows (gate/up: 16 rows of `Wg` and the same 16 of `Wu`, so its
//! fragments hold gate and up of the same outputs for the SwiGLU epilogue; down: 32 rows of
//! `Wd`) and streams them through its own ring of [`Int4MmaTiling::stages`] stages in
//! dynamic shared memory with `cp.async` (16-byte copies, a row's `16 · groups` bytes per
//! stage contiguous; warps run independently, or, with [`Int4MmaTiling::interleave`], the
//! block's warps share 32 rows, take every `warps`-th stage and add their partial sums in
//! warp order at the end of each pass). A stage is
//! [`Int4MmaTiling::groups`] groups of 32 columns: `ldmatrix` hands each lane word t (8
//! nibbles) of its rows g and g + 8, unpacked to bf16 `u − 8` exactly
//! (`cuda/moe_int4_mma.cuh`: one LOP3 and one packed subtract per two weights). Each
//! group's two k16 steps give its unscaled sums, which its scale then multiplies:
//! `acc += s[row, group] · Σ_group (u − 8)·x` — exact products and f32 sums, the
//! interpreter's dequantise-then-matmul up to the order of the sums.
//!
//! The tiling sets the bytes a warp keeps in flight, `(stages − 1) · stage bytes`, and how
//! long a run of each row one copy instruction covers; it never changes a result: every
//! tiling sums the groups of a row in increasing order, each group's two mma from zero.
//!
//! Batch invariance: a token is one column of the mma (no column reads another), its
//! column is its position among the expert's tokens, and the group and stage order is
//! fixed, so its result does not depend on the other tokens of its expert.

use super::{
    grouped_launch, meta_ptrs, per_pass, scratch_arg, MoeGroupedShape, MoeScratch, Stacks, NAMES,
};
use crate::abi::{KernelSource, LaunchSpec};
use crate::generic::{store, Kernel, TensorArg};
use crate::writer::{emit, Writer};

/// Weight rows of a warp: two m16 tiles.
const ROWS_PER_WARP: u64 = 32;
/// n-tiles (8 tokens each) of a pass at most: an expert with up to 8 tokens runs one,
/// more run passes of 16.
const MAX_TILES: u64 = 2;
/// Activation registers of a lane per n-tile and sub-step: 16 bytes for each of up to 4
/// groups (a stage of more groups loads its activations in sub-steps of 4 groups).
const X_GROUPS: u64 = 4;
/// Shared memory of an SM that blocks may share (sm_90 / sm_100: 228 KiB), and what the
/// driver reserves per block; for the residency the launch bounds ask for.
const SMEM_PER_SM: u64 = 228 * 1024;
const SMEM_RESERVED_PER_BLOCK: u64 = 1024;
/// Threads of an SM (sm_90 / sm_100).
const THREADS_PER_SM: u64 = 2048;

const HELPERS: &str = include_str!("../../../cuda/moe_int4_mma.cuh");

pub use specc_ir::engine::choice::Int4MmaTiling;

/// The kernels' geometry of an [`Int4MmaTiling`] (the choice value lives in `specc_ir`).
pub trait Int4MmaGeometry {
    /// Columns of a stage: the in-features must be a multiple.
    fn stage_cols(&self) -> u64;
    /// Bytes of one stage: the weights (32 rows × `groups` granules of 16 bytes,
    /// group-major so that `ldmatrix`'s eight rows are consecutive granules) and the bf16
    /// scales (32 rows × `groups`, row-major).
    fn stage_bytes(&self) -> u64;
    /// Dynamic shared memory of a block: every warp's ring.
    fn smem_bytes(&self) -> u64;
    /// Bytes of weights and scales a warp has in flight while it consumes a stage.
    fn bytes_in_flight_per_warp(&self) -> u64;
    /// Blocks an SM of sm_90 / sm_100 holds by shared memory and threads, at most 4 (the
    /// launch bounds ask for this many: 128 registers a thread at 4 blocks of 4 warps).
    fn blocks_per_sm(&self) -> u32;
}

impl Int4MmaGeometry for Int4MmaTiling {
    fn stage_cols(&self) -> u64 {
        32 * self.groups as u64
    }

    fn stage_bytes(&self) -> u64 {
        ROWS_PER_WARP * self.groups as u64 * 16 + ROWS_PER_WARP * self.groups as u64 * 2
    }

    fn smem_bytes(&self) -> u64 {
        self.warps as u64 * self.stages as u64 * self.stage_bytes()
    }

    fn bytes_in_flight_per_warp(&self) -> u64 {
        (self.stages as u64 - 1) * self.stage_bytes()
    }

    fn blocks_per_sm(&self) -> u32 {
        let by_smem = SMEM_PER_SM / (self.smem_bytes() + SMEM_RESERVED_PER_BLOCK);
        let by_threads = THREADS_PER_SM / (32 * self.warps as u64);
        by_smem.min(by_threads).clamp(1, 16 / self.warps as u64) as u32
    }
}

/// The module items and the common prologue: ring, lane roles, expert, the warp's first
/// output row `j0` (warps cover `out_rows` each); warps past `rows` and blocks past the used
/// count return (no block barrier follows).
#[allow(clippy::too_many_arguments)]
fn prologue(
    k: &mut Kernel,
    s: &MoeScratch,
    e: u64,
    rows: u64,
    kdim: u64,
    out_rows: u64,
    tl: Int4MmaTiling,
) {
    k.items.line(crate::CP_ASYNC_ITEMS.trim_end());
    k.items.line(HELPERS.trim_end());
    meta_ptrs(k, s, e, false);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int K = {kdim}, NSTG = K / {}, NS = {}, SG = {}, XG = {}, ROWS = {rows};",
        tl.stage_cols(),
        tl.stages,
        tl.groups,
        X_GROUPS.min(tl.groups as u64)
    );
    emit!(
        w,
        "constexpr int W_BYTES = {}, STAGE = {};",
        ROWS_PER_WARP * tl.groups as u64 * 16,
        tl.stage_bytes()
    );
    w.comment("Each warp's ring of NS stages (dynamic: the launch's shared memory).");
    w.line("extern __shared__ __align__(128) unsigned char ring_all[];");
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    w.line("const int g = lane >> 2, t = lane & 3;");
    w.comment("Uniform across the block: the used count is one value.");
    w.line("if ((int)blockIdx.y >= meta[0]) return;");
    w.line("const int ex = used[blockIdx.y];");
    w.line("const int p0 = first[ex], n = count[ex];");
    if tl.interleave {
        w.comment("The block's warps share one row tile and take every KW-th stage of it.");
        emit!(w, "const int j0 = blockIdx.x * {out_rows};");
        w.line("const int wk = warp;");
    } else {
        emit!(
            w,
            "const int j0 = (blockIdx.x * {} + warp) * {out_rows};",
            tl.warps
        );
        w.line("const int wk = 0;");
    }
    emit!(w, "constexpr int KW = {};", tl.k_warps());
    if tl.interleave {
        w.comment("Uniform across the block (one row tile), so no warp misses the barriers.");
    }
    w.line("if (j0 >= ROWS) return;");
    w.line("const int nloc = (NSTG - wk + KW - 1) / KW;");
    w.line("unsigned char* ring = ring_all + warp * NS * STAGE;");
}

/// This lane's copy sources at the warp's first stage (`wk`). Copy `i` (0 .. SG) of a stage moves granule
/// `q = i·32 + lane`: row `q / SG` of the warp's 32 (rows `i · 32/SG ..` of one m-tile),
/// group `q % SG` (the same for every copy of a lane), stored at `(group · 32 + row) · 16`;
/// so one copy instruction covers `32 / SG` whole row runs of `16 · SG` bytes. The scales of
/// row `lane` (`SG` bf16) go to `W_BYTES + lane · 2·SG`. `row_ptr(mt, r)` is the byte
/// pointer of row `r` (an expression) of m-tile `mt`, `scale_ptr` the same for scales.
fn sources(
    w: &mut Writer,
    row_ptr: &dyn Fn(u64, &str) -> String,
    scale_ptr: &dyn Fn(u64, &str) -> String,
) {
    w.line("const int gq = lane % SG, r0 = lane / SG;");
    emit!(
        w,
        "const unsigned char* wsrc0 = {} + gq * 16 + wk * (SG * 16);",
        row_ptr(0, "r0")
    );
    emit!(
        w,
        "const unsigned char* wsrc1 = {} + gq * 16 + wk * (SG * 16);",
        row_ptr(1, "r0")
    );
    w.line("const int wdst0 = (gq * 32 + r0) * 16;");
    emit!(
        w,
        "const unsigned short* ssrc = (lane < 16 ? {} : {}) + wk * SG;",
        scale_ptr(0, "lane"),
        scale_ptr(1, "lane - 16")
    );
}

/// Copies the warp's local stage `s` (an expression; the row's stage `s · KW + wk`, the
/// sources already offset by `wk` stages) into its
/// ring slot and commits the group; past the last stage the copies zero-fill without reading
/// (the group stays, so the wait counts hold).
/// `rb`: bytes of a stored row. Each copy's row offset is an immediate of the instruction
/// (`cp_async16_at`), added to one pointer per m-tile and stage, so no per-copy address
/// stays live across the K loop.
fn issue(w: &mut Writer, s: &str, rb: u64, tl: Int4MmaTiling) {
    let sg = tl.groups as u64;
    let rs = 32 / sg;
    w.scope(|w| {
        emit!(w, "const int si = {s};");
        w.line("unsigned char* dst = ring + (si % NS) * STAGE;");
        w.line("const bool ok = si < nloc;");
        w.line("const long long so = ok ? (long long)si * (KW * SG * 16) : 0;");
        w.line("const unsigned char* src0 = wsrc0 + so;");
        w.line("const unsigned char* src1 = wsrc1 + so;");
        w.comment("Copies 0 .. SG/2 from m-tile 0's rows, the rest from m-tile 1's.");
        for i in 0..sg {
            let (src, ri) = if i < sg / 2 {
                ("src0", i * rs)
            } else {
                ("src1", (i - sg / 2) * rs)
            };
            emit!(
                w,
                "cp_async16_at<{}>(dst + wdst0 + {}, {src}, ok);",
                ri * rb,
                i * rs * 16
            );
        }
        w.line("const unsigned short* sp = ssrc + (ok ? si * (KW * SG) : 0);");
        w.line("unsigned char* sd = dst + W_BYTES + lane * (2 * SG);");
        if tl.groups == 4 {
            w.line("cp_async8(sd, sp, ok);");
        } else {
            w.for_unrolled("c", 0, "SG / 8", |w| {
                w.line("cp_async16(sd + c * 16, sp + c * 8, ok);");
            });
        }
        w.line("cp_async_commit();");
    });
}

/// The K loop of one pass of `NT` n-tiles: `acc[2][NT][4]` += the warp's two m-tiles times
/// the tokens whose activation rows are `xr[nt]` (this lane's token `nt · 8 + g`, at its
/// columns `8t ..`; zeros where `xok[nt]` is false). Each stage runs in sub-steps of `XG`
/// groups, each loading its activations first (the first sub-step's before the wait, so
/// their latency overlaps it).
fn k_loop(w: &mut Writer, rb: u64, tl: Int4MmaTiling) {
    w.line("float acc[2][NT][4] = {};");
    w.for_block("int s = 0", "s < NS - 1", "++s", |w| issue(w, "s", rb, tl));
    w.line("#pragma unroll 1");
    w.for_block("int s = 0", "s < nloc", "++s", |w| {
        w.line("const unsigned char* cur = ring + (s % NS) * STAGE;");
        w.for_unrolled("xs", 0, "SG / XG", |w| {
            w.line("uint4 xv[NT][XG];");
            w.for_unrolled("nt", 0, "NT", |w| {
                w.for_unrolled("gi", 0, "XG", |w| {
                    w.line(
                        "xv[nt][gi] = ld_x16_if(xr[nt] + s * (KW * SG * 32) + (xs * XG + gi) * 32, xok[nt]);",
                    );
                });
            });
            w.if_block("xs == 0", |w| {
                w.line("cp_async_wait<NS - 2>();");
                w.comment("Every lane's copies of stage s landed, and every lane is done with s - 1.");
                w.line("__syncwarp();");
                issue(w, "s + NS - 1", rb, tl);
            });
            w.for_unrolled("h", 0, "XG / 2", |w| {
                w.line("const int gp = xs * XG + 2 * h;");
                w.line("unsigned wq[2][4];");
                w.line("unsigned s_lo[2], s_hi[2];");
                w.for_unrolled("mt", 0, 2, |w| {
                    w.line(
                        "ldmatrix_x4(wq[mt], cur + ((gp + (lane >> 4)) * 32 + mt * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * 16);",
                    );
                    w.comment("The bf16 scales of groups gp, gp + 1 of rows g and g + 8.");
                    w.line(
                        "s_lo[mt] = *reinterpret_cast<const unsigned*>(cur + W_BYTES + (mt * 16 + g) * (2 * SG) + gp * 2);",
                    );
                    w.line(
                        "s_hi[mt] = *reinterpret_cast<const unsigned*>(cur + W_BYTES + (mt * 16 + g + 8) * (2 * SG) + gp * 2);",
                    );
                });
                w.for_unrolled("e", 0, 2, |w| {
                    w.line("Int4B b[NT];");
                    w.for_unrolled("nt", 0, "NT", |w| {
                        w.line("b[nt] = int4_b(xv[nt][2 * h + e]);");
                    });
                    w.for_unrolled("mt", 0, 2, |w| {
                        w.line("const Int4A a = int4_a(wq[mt][2 * e], wq[mt][2 * e + 1]);");
                        w.line("const float sl = bf16x2_at(s_lo[mt], e);");
                        w.line("const float sh = bf16x2_at(s_hi[mt], e);");
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
    });
    w.comment("The ring is free again before the next pass refills it.");
    w.line("cp_async_wait<0>();");
    w.line("__syncwarp();");
    if tl.interleave {
        w.comment(
            "The warps' partial sums meet in warp 0 through the (free) rings, added in warp order.",
        );
        w.line("float* red = reinterpret_cast<float*>(ring);");
        w.line("#pragma unroll");
        w.line("for (int q = 0; q < 2 * NT * 4; ++q) red[q * 32 + lane] = (&acc[0][0][0])[q];");
        w.line("__syncthreads();");
        w.if_block("warp == 0", |w| {
            w.line("#pragma unroll 1");
            w.for_block("int o = 1", "o < KW", "++o", |w| {
                w.line("const float* part = reinterpret_cast<const float*>(ring_all + o * NS * STAGE);");
                w.line("#pragma unroll");
                w.line("for (int q = 0; q < 2 * NT * 4; ++q) (&acc[0][0][0])[q] += part[q * 32 + lane];");
            });
        });
        w.comment("Every warp's partials read before any ring is refilled.");
        w.line("__syncthreads();");
    }
}

/// The pass loop around [`k_loop`]: per pass of `NT` n-tiles, this lane's activation rows
/// (`xrow(b)`: the row of the pass's token `b`, valid for `b < nb`), the K loop, then
/// `epilogue` (which reads `acc`, `nb`, `c0`). `rb`: bytes of a stored row.
fn passes(
    w: &mut Writer,
    rb: u64,
    tl: Int4MmaTiling,
    xrow: &dyn Fn(&str) -> String,
    epilogue: &dyn Fn(&mut Writer),
) {
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
                emit!(
                    w,
                    "xr[nt] = {} + 8 * t + wk * (SG * 32);",
                    xrow("(xok[nt] ? b : 0)")
                );
            });
            k_loop(w, rb, tl);
            if tl.interleave {
                w.if_block("warp == 0", epilogue);
            } else {
                epilogue(w);
            }
        });
    });
}

/// The tensor-core `moe_gate_up`: `act[pair, j] = R(R(silu(R(g)))·R(u))` (as the CUDA-core
/// kernel), `g`, `u` the rows `j` of `Wg`, `Wu` times the pair's token.
pub(super) fn gate_up(
    sh: MoeGroupedShape,
    tl: Int4MmaTiling,
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
    prologue(&mut k, s, e, f, h, 16, tl);
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
        rb,
        tl,
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
    k.finish_bounded(launch(f, 16, sh, tl), Some(tl.blocks_per_sm()))
}

/// The tensor-core `moe_down`: `y[pair, i] = R(act[pair] · Wd[i])`.
pub(super) fn down(
    sh: MoeGroupedShape,
    tl: Int4MmaTiling,
    st: &Stacks,
    out: &TensorArg,
    s: &MoeScratch,
) -> KernelSource {
    let (e, f, h, p) = (sh.experts, sh.ffn, sh.hidden, sh.pairs());
    let mut k = Kernel::new("moe_down", st.dtype());
    st.ptrs(&mut k, &[2]);
    k.ptr("act", &TensorArg::new(s.act, out.dtype, &[p, f]), false);
    k.ptr("y", &TensorArg::new(s.y, out.dtype, &[p, h]), true);
    prologue(&mut k, s, e, h, f, 32, tl);
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
        rb,
        tl,
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
    k.finish_bounded(launch(h, 32, sh, tl), Some(tl.blocks_per_sm()))
}

/// The grouped launch of `rows` output rows, `out_rows` a warp (a block when the warps
/// interleave the stages), `tl.warps` warps a block, with the rings in dynamic shared memory.
fn launch(rows: u64, out_rows: u64, sh: MoeGroupedShape, tl: Int4MmaTiling) -> LaunchSpec {
    let tile_warps = if tl.interleave { 1 } else { tl.warps as u64 };
    let g = grouped_launch(rows, out_rows, tile_warps, sh);
    LaunchSpec {
        smem_bytes: tl.smem_bytes() as u32,
        block: [32 * tl.warps, 1, 1],
        ..g
    }
}

#[cfg(test)]
mod tests {
    use super::{Int4MmaGeometry, Int4MmaTiling};

    /// The figures bench/NOTES.md's bytes-in-flight table is built from: each variant's
    /// block shared memory, bytes in flight a warp, and the blocks an sm_90 SM holds.
    #[test]
    fn tilings_figures() {
        let figures: Vec<(String, u64, u64, u32)> = Int4MmaTiling::VARIANTS
            .iter()
            .map(|t| {
                (
                    t.name(),
                    t.smem_bytes(),
                    t.bytes_in_flight_per_warp(),
                    t.blocks_per_sm(),
                )
            })
            .collect();
        let want = [("g4s4w4", 36864, 6912, 4), ("g4s4w4-i", 36864, 6912, 4)];
        let want: Vec<(String, u64, u64, u32)> = want
            .iter()
            .map(|&(n, s, f, b)| (n.to_string(), s, f, b))
            .collect();
        assert_eq!(figures, want);
        assert!(Int4MmaTiling::VARIANTS.iter().all(Int4MmaTiling::valid));
        assert!(!Int4MmaTiling::new(12, 4, 4).valid());
        assert!(!Int4MmaTiling::new(8, 1, 4).valid());
    }
}
