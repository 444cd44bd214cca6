//! `head_matmul`: `x[..., H, K]` times head `h`'s own matrix (`w[H, K, N]`, or `w[H, N, K]`
//! when `trans_w`), `y = R(Σ_k x·w)` with f32 accumulation — MLA's absorbed `q·W_UK` and
//! `o·W_UV`.
//!
//! The vector kernels ([`kn`], [`nk`]) load every weight 16 bytes at a time into registers
//! before anything else, so a block has all of its weights in flight at once and streams them
//! once for every row (passes of up to [`VEC_ROWS`] rows reuse the registers). A thread sums
//! its own run of `k` in order; the runs of one output are then added over the lanes of one
//! warp by a halving butterfly: each stage swaps half of the values with the lane across one
//! lane bit and adds, so every output is the same balanced tree over the runs whichever row
//! or row count it belongs to (a row's result does not depend on how many rows there are).
//! Shapes they do not take (weights not 16-byte vectors, long `K`) run the scalar kernel.

use super::{flat_launch, load, store, Kernel, TensorArg};
use crate::abi::{Extent, KernelSource, LaunchSpec};
use crate::writer::{emit, Writer};

/// Rows a vector kernel computes per pass over its registers of weights.
const VEC_ROWS: u64 = 8;
/// Runs of `k` per output in [`kn`]: lane bits 1..4 of a warp.
const KN_RUNS: u64 = 16;
/// `k` rows a thread of [`kn`] loads at most (registers of weights in flight).
const KN_MAX_LOADS: u64 = 16;
/// Columns per warp of [`nk`] and 16-byte loads a lane makes per column, at most.
const NK_COLS: u64 = 4;
const NK_MAX_LOADS: u64 = 4;

pub(super) fn head_matmul(
    trans_w: bool,
    x: &TensorArg,
    wt: &TensorArg,
    out: &TensorArg,
) -> KernelSource {
    let vec = if trans_w {
        nk(x, wt, out)
    } else {
        kn(x, wt, out)
    };
    vec.unwrap_or_else(|| scalar(trans_w, x, wt, out))
}

/// `(H, K, N, rows, elements per 16-byte vector)` when the weights are float 16-byte vectors
/// along their contiguous axis (`contiguous` elements per row).
fn vec_shape(
    x: &TensorArg,
    wt: &TensorArg,
    out: &TensorArg,
    trans_w: bool,
) -> Option<(u64, u64, u64, u64, u64)> {
    let r = x.dims.len();
    let (h, kd) = (x.dims[r - 2], x.dims[r - 1]);
    let n = if trans_w { wt.dims[1] } else { wt.dims[2] };
    let rows = x.numel() / (h * kd).max(1);
    let es = wt.elem_bytes();
    if !super::is_float(wt.dtype) || !super::is_float(x.dtype) || es == 0 || 16 % es != 0 {
        return None;
    }
    let vw = 16 / es;
    let contiguous = if trans_w { kd } else { n };
    let aligned = wt.loc.byte_offset().is_multiple_of(16) && contiguous.is_multiple_of(vw);
    (aligned && rows > 0 && h > 0 && out.numel() == rows * h * n).then_some((h, kd, n, rows, vw))
}

/// `u4_at(u, i)`: element `i` (a constant after unrolling) of 16 bytes holding `t` values, as
/// f32, read from the registers without taking their address (which would put the weights in
/// local memory).
fn emit_u4_at(items: &mut Writer, t: specc_ir::DType) {
    items.fn_block(
        "__device__ __forceinline__ float u4_at(const uint4& u, int i)",
        |w| match t {
            specc_ir::DType::F32 => {
                w.line("const unsigned word = i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;");
                w.line("return __uint_as_float(word);");
            }
            _ => {
                w.line("const int k = i >> 1;");
                w.line("const unsigned word = k == 0 ? u.x : k == 1 ? u.y : k == 2 ? u.z : u.w;");
                w.line("const unsigned half_bits = (i & 1) ? word >> 16 : word & 0xffffu;");
                if t == specc_ir::DType::F16 {
                    w.line("return __half2float(__ushort_as_half((unsigned short)half_bits));");
                } else {
                    w.line("return __uint_as_float(half_bits << 16);");
                }
            }
        },
    );
}

/// The sum of `v[0..n]` (`n` a power of two) over the lanes that differ in `bits`, stage by
/// stage in the order of `bits`: while a lane holds more than one value, the stage halves them
/// (each lane keeps one half and adds its partner's copy of it), then it adds the partner's
/// one value. Every sum is the same tree over `bits` whatever `n` is. Declares `base` and
/// `owner`: afterwards `v[j]`, `j < n >> h` (`h` halving stages), holds the sum of the
/// values at `base + j`, and the lanes holding the same sums after the last stages are told
/// apart by `owner` (one of them). Returns `n >> h`.
fn emit_butterfly(w: &mut Writer, bits: &[u32], n: u64) -> u64 {
    let mut count = n;
    let mut base = Vec::new();
    let mut shared = Vec::new();
    for &bit in bits {
        let mask = 1u32 << bit;
        if count > 1 {
            let half = count / 2;
            w.scope(|w| {
                emit!(w, "const bool hi = (lane >> {bit}) & 1;");
                w.for_unrolled("i", 0, half, |w| {
                    emit!(w, "const float send = hi ? v[i] : v[i + {half}];");
                    emit!(w, "const float keep = hi ? v[i + {half}] : v[i];");
                    emit!(
                        w,
                        "v[i] = keep + __shfl_xor_sync(0xffffffffu, send, {mask});"
                    );
                });
            });
            base.push(format!("((lane >> {bit}) & 1) * {half}"));
            count = half;
        } else {
            emit!(w, "v[0] += __shfl_xor_sync(0xffffffffu, v[0], {mask});");
            shared.push(mask);
        }
    }
    let base = if base.is_empty() {
        "0".to_string()
    } else {
        base.join(" + ")
    };
    emit!(w, "const int base = {base};");
    emit!(
        w,
        "const bool owner = (lane & {}) == 0;",
        shared.iter().sum::<u32>()
    );
    count
}

/// `w[H, K, N]`: a warp holds 2 column vectors × [`KN_RUNS`] runs of `k` (lane bits 0 and
/// 1..4), a block 4 warps (8 column vectors); each lane loads its run's rows of its vector.
fn kn(x: &TensorArg, wt: &TensorArg, out: &TensorArg) -> Option<KernelSource> {
    let (h, kd, n, rows, vw) = vec_shape(x, wt, out, false)?;
    let kpt = kd.div_ceil(KN_RUNS);
    if kpt > KN_MAX_LOADS {
        return None;
    }
    let rb = VEC_ROWS.min(rows);
    let npad = (rb * vw).next_power_of_two();
    let tiles = n.div_ceil(8 * vw);
    let mut k = Kernel::new("head_matmul", wt.dtype);
    emit_u4_at(&mut k.items, wt.dtype);
    k.ptr("x", x, false);
    k.ptr("w", wt, false);
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr long long H = {h}, K = {kd}, N = {n}, ROWS = {rows}, TILES = {tiles};"
    );
    emit!(
        w,
        "constexpr int RB = {rb}, VW = {vw}, KPT = {kpt}, RUNS = {KN_RUNS};"
    );
    w.line("__shared__ float xs[RB][KPT][RUNS];  // x[r][run · KPT + i] at [r][i][run]");
    w.line("const int lane = threadIdx.x & 31, run = lane >> 1;");
    w.line("const long long head = blockIdx.x / TILES;");
    w.line("const long long col0 = ((blockIdx.x % TILES) * 8 + (threadIdx.x >> 5) * 2 + (lane & 1)) * VW;");
    w.line("uint4 wr[KPT];");
    w.for_unrolled("i", 0, "KPT", |w| {
        w.line("const long long kk = run * KPT + i;");
        w.if_else(
            "col0 < N && kk < K",
            |w| w.line("wr[i] = ld_stream_u4(w + (head * K + kk) * N + col0);"),
            |w| w.line("wr[i] = make_uint4(0u, 0u, 0u, 0u);"),
        );
    });
    let pass = Pass {
        staged: "RB * KPT * RUNS",
        decode: &[
            "const int r = e / (KPT * RUNS), i = (e / RUNS) % KPT, g = e % RUNS;",
            "const long long kk = g * KPT + i;",
        ],
        slot: "xs[r][i][g]",
        bits: &[1, 2, 3, 4],
        npad,
        per_row: "VW",
        col: "col0 + c",
    };
    emit_passes(w, x, out, &pass, |w| {
        w.for_unrolled("i", 0, "KPT", |w| {
            w.for_unrolled("r", 0, "RB", |w| {
                w.line("const float xv = xs[r][i][run];");
                w.for_unrolled("j", 0, "VW", |w| {
                    w.line("v[r * VW + j] = fmaf(xv, u4_at(wr[i], j), v[r * VW + j]);");
                });
            });
        });
    });
    Some(k.finish(launch(h * tiles)))
}

/// `w[H, N, K]`: a warp holds [`NK_COLS`] columns, lane `l` the 16-byte vectors `l, l + 32, …`
/// of each; a block 4 warps (16 columns).
fn nk(x: &TensorArg, wt: &TensorArg, out: &TensorArg) -> Option<KernelSource> {
    let (h, kd, n, rows, vw) = vec_shape(x, wt, out, true)?;
    let kv = kd / vw;
    let kpt = kv.div_ceil(32);
    if kpt > NK_MAX_LOADS {
        return None;
    }
    let rb = VEC_ROWS.min(rows);
    let npad = (rb * NK_COLS).next_power_of_two();
    let cols = 4 * NK_COLS;
    let tiles = n.div_ceil(cols);
    let mut k = Kernel::new("head_matmul", wt.dtype);
    emit_u4_at(&mut k.items, wt.dtype);
    k.ptr("x", x, false);
    k.ptr("w", wt, false);
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr long long H = {h}, K = {kd}, N = {n}, ROWS = {rows}, TILES = {tiles};"
    );
    emit!(
        w,
        "constexpr int RB = {rb}, VW = {vw}, KV = {kv}, KPT = {kpt}, CW = {NK_COLS};"
    );
    w.line("__shared__ float xs[RB][VW][KPT * 32];  // x[r][v · VW + j] at [r][j][v]");
    w.line("const int lane = threadIdx.x & 31;");
    w.line("const long long head = blockIdx.x / TILES;");
    emit!(
        w,
        "const long long c0 = (blockIdx.x % TILES) * {cols} + (threadIdx.x >> 5) * CW;"
    );
    w.line("uint4 wr[CW][KPT];");
    w.for_unrolled("c", 0, "CW", |w| {
        w.for_unrolled("i", 0, "KPT", |w| {
            w.line("const long long kv = i * 32 + lane;");
            w.if_else(
                "c0 + c < N && kv < KV",
                |w| w.line("wr[c][i] = ld_stream_u4(w + (head * N + c0 + c) * K + kv * VW);"),
                |w| w.line("wr[c][i] = make_uint4(0u, 0u, 0u, 0u);"),
            );
        });
    });
    let pass = Pass {
        staged: "RB * VW * KPT * 32",
        decode: &[
            "const int r = e / (VW * KPT * 32), j = (e / (KPT * 32)) % VW, vi = e % (KPT * 32);",
            "const long long kk = (long long)vi * VW + j;",
        ],
        slot: "xs[r][j][vi]",
        bits: &[0, 1, 2, 3, 4],
        npad,
        per_row: "CW",
        col: "c0 + c",
    };
    emit_passes(w, x, out, &pass, |w| {
        w.for_unrolled("c", 0, "CW", |w| {
            w.for_unrolled("i", 0, "KPT", |w| {
                w.for_unrolled("r", 0, "RB", |w| {
                    w.for_unrolled("j", 0, "VW", |w| {
                        w.line(
                            "v[r * CW + c] = fmaf(xs[r][j][i * 32 + lane], u4_at(wr[c][i], j), v[r * CW + c]);",
                        );
                    });
                });
            });
        });
    });
    Some(k.finish(launch(h * tiles)))
}

/// What the two vector layouts' row passes differ in.
struct Pass<'a> {
    /// Elements of `xs` staged a pass, the line decoding `e` into `r` and `kk`, and `xs`'s
    /// element for them.
    staged: &'a str,
    decode: &'a [&'a str],
    slot: &'a str,
    /// The butterfly's lane bits and values a lane (`v[npad]`).
    bits: &'a [u32],
    npad: u64,
    /// Values a row (`v[r · per_row + c]`) and the output column of value `c`.
    per_row: &'a str,
    col: &'a str,
}

/// The passes over `RB` rows at a time: x's rows staged in `xs` (zeros past the rows and
/// `K`), `fmas` accumulating the lane's values `v`, the butterfly, the stores.
fn emit_passes(
    w: &mut Writer,
    x: &TensorArg,
    out: &TensorArg,
    p: &Pass,
    fmas: impl FnOnce(&mut Writer),
) {
    w.for_block("long long r0 = 0", "r0 < ROWS", "r0 += RB", |w| {
        w.line("__syncthreads();  // the previous pass has read xs");
        w.for_block(
            "int e = threadIdx.x",
            format_args!("e < {}", p.staged),
            "e += blockDim.x",
            |w| {
                for line in p.decode {
                    w.line(line);
                }
                emit!(
                    w,
                    "{} = r0 + r < ROWS && kk < K ? {} : 0.0f;",
                    p.slot,
                    load(x.dtype, "x[((r0 + r) * H + head) * K + kk]")
                );
            },
        );
        w.line("__syncthreads();");
        emit!(w, "float v[{}];", p.npad);
        w.for_unrolled("j", 0, p.npad, |w| w.line("v[j] = 0.0f;"));
        fmas(w);
        let held = emit_butterfly(w, p.bits, p.npad);
        w.for_unrolled("j", 0, held, |w| {
            emit!(
                w,
                "const int idx = base + j, r = idx / {0}, c = idx % {0};",
                p.per_row
            );
            emit!(w, "const long long col = {};", p.col);
            w.if_block(
                format_args!(
                    "owner && idx < RB * {} && r0 + r < ROWS && col < N",
                    p.per_row
                ),
                |w| {
                    emit!(
                        w,
                        "y[((r0 + r) * H + head) * N + col] = {};",
                        store(out.dtype, "v[j]")
                    );
                },
            );
        });
    });
}

/// One block of 128 threads per `blocks`.
fn launch(blocks: u64) -> LaunchSpec {
    LaunchSpec {
        grid: [
            Extent::Fixed(blocks as u32),
            Extent::Fixed(1),
            Extent::Fixed(1),
        ],
        block: [128, 1, 1],
        smem_bytes: 0,
    }
}

/// Floats of `x` a scalar head-matmul block stages in shared memory: rows of one head, at most
/// [`HEAD_ROWS`] of them (a 40 KiB static array).
const HEAD_STAGE_FLOATS: u64 = 10 * 1024;
/// Rows (tokens) of one head a block computes per pass over that head's weights.
const HEAD_ROWS: u64 = 8;

/// The scalar kernel: a block owns one head and a tile of
/// output columns and streams that tile of the head's weights once per pass over up to
/// [`HEAD_ROWS`] rows, staged in shared memory: threads over columns, `k` in order
/// (`w[H, K, N]`, loads coalesced along `N`), or one warp per column with lanes over `k`
/// and a warp sum (`w[H, N, K]`, loads coalesced along `K`). A row's sum does not depend on
/// how many rows there are.
fn scalar(trans_w: bool, x: &TensorArg, wt: &TensorArg, out: &TensorArg) -> KernelSource {
    let r = x.dims.len();
    let (h, kd) = (x.dims[r - 2], x.dims[r - 1]);
    let n = if trans_w { wt.dims[1] } else { wt.dims[2] };
    let rows = x.numel() / (h * kd).max(1);
    let rb = HEAD_ROWS.min(HEAD_STAGE_FLOATS / kd.max(1)).max(1);
    if HEAD_STAGE_FLOATS < kd {
        return head_matmul_warps(trans_w, x, wt, out);
    }
    // Columns per block: 128 threads over columns, or 8 warps of one column each.
    let (cols, threads) = if trans_w { (8u64, 256u32) } else { (128, 128) };
    let tiles = n.div_ceil(cols);
    let mut k = Kernel::new("head_matmul", wt.dtype);
    k.ptr("x", x, false);
    k.ptr("w", wt, false);
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr long long H = {h}, K = {kd}, N = {n}, ROWS = {rows}, RB = {rb}, TILES = {tiles};"
    );
    w.line("__shared__ float xs[RB][K];");
    w.line("const long long head = blockIdx.x / TILES, tile = blockIdx.x % TILES;");
    if trans_w {
        w.line("const int lane = threadIdx.x & 31;");
        emit!(
            w,
            "const long long col = tile * {cols} + (threadIdx.x >> 5);"
        );
    } else {
        emit!(w, "const long long col = tile * {cols} + threadIdx.x;");
    }
    w.for_block("long long r0 = 0", "r0 < ROWS", "r0 += RB", |w| {
        w.line("const int nr = ROWS - r0 < RB ? (int)(ROWS - r0) : (int)RB;");
        w.line("__syncthreads();  // the previous pass has read xs");
        w.for_block(
            "int i = threadIdx.x",
            "i < nr * K",
            "i += blockDim.x",
            |w| {
                emit!(
                    w,
                    "xs[i / K][i % K] = {};",
                    load(x.dtype, "x[((r0 + i / K) * H + head) * K + i % K]")
                );
            },
        );
        w.line("__syncthreads();");
        w.line("float acc[RB];");
        w.for_unrolled("b", 0, "RB", |w| w.line("acc[b] = 0.0f;"));
        w.if_block("col < N", |w| {
            if trans_w {
                w.for_block("long long kk = lane", "kk < K", "kk += 32", |w| {
                    emit!(
                        w,
                        "const float wv = {};",
                        load(wt.dtype, "w[(head * N + col) * K + kk]")
                    );
                    w.for_unrolled("b", 0, "RB", |w| {
                        w.line("if (b < nr) acc[b] = fmaf(xs[b][kk], wv, acc[b]);");
                    });
                });
            } else {
                w.for_block("long long kk = 0", "kk < K", "++kk", |w| {
                    emit!(
                        w,
                        "const float wv = {};",
                        load(wt.dtype, "w[(head * K + kk) * N + col]")
                    );
                    w.for_unrolled("b", 0, "RB", |w| {
                        w.line("if (b < nr) acc[b] = fmaf(xs[b][kk], wv, acc[b]);");
                    });
                });
            }
        });
        w.for_unrolled("b", 0, "RB", |w| {
            if trans_w {
                w.comment("Whole warps: col is uniform per warp, so every lane reaches the sum.");
                w.line("const float v = warp_sum(acc[b]);");
                w.line("const bool writer = lane == 0;");
            } else {
                w.line("const float v = acc[b];");
                w.line("const bool writer = true;");
            }
            w.if_block("writer && b < nr && col < N", |w| {
                emit!(
                    w,
                    "y[((r0 + b) * H + head) * N + col] = {};",
                    store(out.dtype, "v")
                );
            });
        });
    });
    k.finish(LaunchSpec {
        grid: [
            Extent::Fixed((h * tiles) as u32),
            Extent::Fixed(1),
            Extent::Fixed(1),
        ],
        block: [threads, 1, 1],
        smem_bytes: 0,
    })
}

/// [`scalar`] for reductions too long to stage: one warp per output element (lanes
/// over `K`, then a warp sum).
fn head_matmul_warps(
    trans_w: bool,
    x: &TensorArg,
    wt: &TensorArg,
    out: &TensorArg,
) -> KernelSource {
    let r = x.dims.len();
    let (h, kd) = (x.dims[r - 2], x.dims[r - 1]);
    let n = if trans_w { wt.dims[1] } else { wt.dims[2] };
    let outputs = out.numel();
    let mut k = Kernel::new("head_matmul", wt.dtype);
    k.ptr("x", x, false);
    k.ptr("w", wt, false);
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr long long H = {h}, K = {kd}, N = {n}, OUT = {outputs};"
    );
    w.line("const int lane = threadIdx.x & 31;");
    w.line("const long long warps = (long long)gridDim.x * (blockDim.x >> 5);");
    w.comment("Whole warps iterate together, so the warp sum below sees every lane.");
    w.for_block(
        "long long o = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)",
        "o < OUT",
        "o += warps",
        |w| {
            w.line("const long long row = o / N, col = o % N, head = row % H;");
            w.line("float acc = 0.0f;");
            w.for_block("long long kk = lane", "kk < K", "kk += 32", |w| {
                let widx = if trans_w {
                    "(head * N + col) * K + kk"
                } else {
                    "(head * K + kk) * N + col"
                };
                emit!(
                    w,
                    "acc = fmaf({}, {}, acc);",
                    load(x.dtype, "x[row * K + kk]"),
                    load(wt.dtype, &format!("w[{widx}]"))
                );
            });
            w.line("acc = warp_sum(acc);");
            w.if_block("lane == 0", |w| {
                emit!(w, "y[o] = {};", store(out.dtype, "acc"));
            });
        },
    );
    let mut launch = flat_launch(outputs * 32);
    launch.block = [256, 1, 1];
    k.finish(launch)
}
