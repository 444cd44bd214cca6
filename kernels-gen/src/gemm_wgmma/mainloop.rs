//! The ring, the producer warp's tensor-map copies and the consumer warpgroups' wgmma
//! batches of `gemm_wgmma`: leaves `acc[G][NA]` of every consumer thread holding its sums
//! over all of K (the layout in the module docs); the producer warp returns.

use crate::abi::Dtype;
use crate::writer::{emit, Writer};

use super::{maps, GemvParams, WgmmaTiling};

/// Whether the consumers issue one wgmma over all `G` weight boxes per k16 step (they are
/// contiguous in a stage: `G · BN` rows at the same 128-byte row pitch and 1024-byte group
/// stride) rather than one per matrix: the gate/up pair unless `t.split_mats`.
pub(crate) fn one_mma(p: &GemvParams, t: &WgmmaTiling) -> bool {
    super::mats(p) > 1 && !t.split_mats
}

/// The wgmma n of a consumer's mma: `G · BN` over all weight boxes, or `BN` per matrix.
pub(super) fn mma_n(p: &GemvParams, t: &WgmmaTiling) -> u32 {
    if one_mma(p, t) {
        super::mats(p) * t.bn
    } else {
        t.bn
    }
}

/// The name of the generated `m64n{n}k16` mma function.
fn mma_name(n: u32) -> String {
    format!("wgmma_m64n{n}k16")
}

/// Emits `wgmma_m64n{n}k16(float (&d)[n / 2], desc_a, desc_b, accumulate)`:
/// `d = A · Bᵀ (+ d when accumulate ≠ 0)` for the 64 × 16 A tile and the n × 16 B tile the
/// descriptors name (both K-major, no transpose, f32 accumulation).
pub(super) fn emit_mma_function(w: &mut Writer, dtype: Dtype, n: u32) {
    emit_wgmma_function(w, &mma_name(n), dtype, n, WgmmaOperands::SharedKMajor);
}

/// Where a generated wgmma function takes its operands from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WgmmaOperands {
    /// A and B by descriptor, both K-major: `name(d, da, db, accumulate)`.
    SharedKMajor,
    /// A from four registers per thread (the m16n8k16 A fragment of each warp's 16 rows), B
    /// by descriptor, MN-major (transposed): `name(d, a0, a1, a2, a3, db, accumulate)`.
    RegistersAndMnMajorB,
}

/// Emits the `m64n{n}k16` wgmma function `name` over 16-bit `dtype` operands with f32
/// accumulators: `d = A · B (+ d when accumulate ≠ 0)`. The accumulators are `"+f"`
/// operands, so the compiler keeps them in registers across the asynchronous batch; only a
/// `wgmma_wait` makes them readable.
pub(crate) fn emit_wgmma_function(
    w: &mut Writer,
    name: &str,
    dtype: Dtype,
    n: u32,
    operands: WgmmaOperands,
) {
    let ab = match dtype {
        Dtype::F16 => "f16",
        _ => "bf16",
    };
    let regs = n / 2;
    let d_list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    // After scale-d: the immediates scale-a, scale-b, then trans-a (descriptor A only), trans-b.
    let (a_param, a_operand, b_index, tail, inputs) = match operands {
        WgmmaOperands::SharedKMajor => (
            "unsigned long long da",
            format!("%{regs}"),
            regs + 1,
            "1, 1, 0, 0",
            "\"l\"(da), \"l\"(db), \"r\"(accumulate)",
        ),
        WgmmaOperands::RegistersAndMnMajorB => (
            "unsigned a0, unsigned a1, unsigned a2, unsigned a3",
            format!("{{%{}, %{}, %{}, %{}}}", regs, regs + 1, regs + 2, regs + 3),
            regs + 4,
            "1, 1, 1",
            "\"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"l\"(db), \"r\"(accumulate)",
        ),
    };
    w.fn_block(
        format_args!(
            "__device__ __forceinline__ void {name}(float (&d)[{regs}], {a_param}, unsigned long long db, int accumulate)"
        ),
        |w| {
            w.line("asm volatile(");
            emit!(
                w,
                "    \"{{\\n .reg .pred p;\\n setp.ne.b32 p, %{}, 0;\\n\"",
                b_index + 1
            );
            emit!(
                w,
                "    \" wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} {{{}}}, {a_operand}, %{b_index}, p, {tail};\\n}}\\n\"",
                d_list.join(", ")
            );
            for chunk in outs.chunks(8) {
                let first = std::ptr::eq(chunk.as_ptr(), outs.as_ptr());
                emit!(w, "    {} {}", if first { ":" } else { "," }, chunk.join(", "));
            }
            emit!(w, "    : {inputs});");
        },
    );
}

/// The L2 prefetch of the weight boxes of the first `NS` chunks, by the producer's lane 0
/// before the PDL wait (weights are only written by the host, so this may overlap the
/// previous kernel; the descriptors in the operand table are the host's too). In a row
/// cluster each block prefetches the slice it loads.
pub(super) fn emit_weight_prefetch(w: &mut Writer, p: &GemvParams, t: &WgmmaTiling) {
    let (_, w0, w1) = maps(p, t);
    let row = if t.cluster_m > 1 {
        "n0 + (blockIdx.x % CM) * (BN / CM)"
    } else {
        "n0"
    };
    w.if_block("threadIdx.x == 4 * NC * 32", |w| {
        w.for_block("int n = 0", "n < NS && n < KN", "++n", |w| {
            emit!(
                w,
                "tma_prefetch_l2_2d({}, (KB + n) * 64, {row});",
                w0.ptr_as("void", false)
            );
            if let Some(up) = w1 {
                emit!(
                    w,
                    "tma_prefetch_l2_2d({}, (KB + n) * 64, {row});",
                    up.ptr_as("void", false)
                );
            }
        });
    });
}

/// The main loop: ring setup, then the producer warp's copies and the consumer warpgroups'
/// mma batches followed by `epilogue` (consumers only), once per tile of the block.
///
/// Unclustered, the producer warp returns after its copies. In a cluster of `C` blocks
/// (`CM` along the rows or `CN` along the columns) block `r` (its rank: `blockIdx.x % CM`
/// or `blockIdx.y % CN`) loads slice `r` of the shared box (the weights' `BN / CM` rows, or
/// x's `BM / CN` rows) into the same stage of every block of the cluster, so a stage's
/// `empty` barrier counts the releases of all `C · NC` consumer warpgroups of the cluster:
/// a producer overwrites stage `s` in its peers only once all of them are done with it.
/// Every thread of the cluster meets at a cluster barrier before exiting, so no block leaves
/// while a peer's copies or arrivals may still target its shared memory.
///
/// One block per tile, `m0`, `n0` and `ct` come from the prologue and the releases of the
/// last `NS` chunks are not sent (no copy waits for them). Persistent
/// (`t.persistent_blocks > 0`), cluster `b = blockIdx.x / CM` takes cluster tiles `b, b +
/// gridDim.x / CM, ..` (`CM` consecutive row tiles of one column tile, row tiles fastest as
/// in the one-block grid), block rank `r` row tile `CM · u + r` of them; the ring's chunk
/// counter `it` runs on across tiles (chunk `it` in stage `it % NS`, phase `(it / NS) & 1`),
/// every chunk but the block's last `NS` is released, and the producer fills the next
/// tile's stages while the consumers run the epilogue. Every block of a cluster runs the
/// same tiles.
pub(super) fn emit(
    w: &mut Writer,
    p: &GemvParams,
    t: &WgmmaTiling,
    epilogue: impl FnOnce(&mut Writer),
) {
    let (x, w0, w1) = maps(p, t);
    let multicast = t.cluster() > 1;
    let split = t.split_k > 1;
    w.line("extern __shared__ unsigned char smem_raw[];");
    w.line("unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // swizzled boxes: 1024-aligned");
    w.line("__shared__ __align__(8) unsigned long long full[NS], empty[NS];");
    if multicast {
        w.line("constexpr int C = CM * CN;  // blocks per cluster (one of CM, CN is 1)");
        w.line("const unsigned rank = CM > 1 ? blockIdx.x % CM : blockIdx.y % CN;  // %cluster_ctarank");
    }
    let empty_count = if multicast { "NC * C" } else { "NC" };
    w.if_block("threadIdx.x == 0", |w| {
        w.for_unrolled("s", 0, "NS", |w| {
            w.line("mbar_init(&full[s], 1);");
            emit!(w, "mbar_init(&empty[s], {empty_count});");
        });
    });
    w.line(if multicast {
        "cluster_sync();  // every block's barriers exist before a peer's copy or arrival"
    } else {
        "__syncthreads();"
    });
    let persistent = t.persistent_blocks > 0;
    // The ring's chunk counter: the tile's chunk `n` itself, or `it` across a block's tiles.
    let it = if persistent { "it" } else { "n" };
    if persistent {
        w.comment("cluster tiles: PCM consecutive row tiles (of RTC, whole clusters) of one column tile of CT");
        w.line("const int RTC = (M + BM * PCM - 1) / (BM * PCM) * PCM;");
        w.line("const int UNITS = RTC / PCM * CT;");
        w.comment("chunks this block (and every block of its cluster) runs: releases of the last NS are not sent");
        w.line("const int TOTAL = (int(blockIdx.x) / PCM < UNITS ? (UNITS - 1 - int(blockIdx.x) / PCM) / (int(gridDim.x) / PCM) + 1 : 0) * KT;");
    }
    let producer = |w: &mut Writer| {
        w.comment(format_args!(
            "producer: chunk {it} into stage {it} % NS once its previous chunk was released"
        ));
        w.if_block("lane == 0", |w| {
            emit!(w, "const void* xmap = {};", x.ptr_as("void", false));
            emit!(w, "const void* wmap0 = {};", w0.ptr_as("void", false));
            if let Some(up) = w1 {
                emit!(w, "const void* wmap1 = {};", up.ptr_as("void", false));
            }
            if multicast {
                w.line("const unsigned short peers = (1u << C) - 1;");
            }
            tile_loop(w, persistent, |w| {
                w.line("#pragma unroll 1");
                w.for_block("int n = 0", "n < KN", "++n", |w| {
                    emit!(w, "const int s = {it} % NS;");
                    emit!(w, "if ({it} >= NS) mbar_wait(&empty[s], ({it} / NS - 1) & 1);");
                    w.line("mbar_arrive_expect_tx(&full[s], STAGE);");
                    w.line("unsigned char* st = smem + s * STAGE;");
                    w.line("const int kx = (KB + n) * 64;");
                    let mats: Vec<(&str, &str)> = std::iter::once(("wmap0", "XBOX"))
                        .chain(w1.map(|_| ("wmap1", "XBOX + WBOX")))
                        .collect();
                    if t.cluster_n > 1 {
                        w.line("tma_load_2d_multicast(st + rank * (XBOX / CN), xmap, kx, m0 + rank * (BM / CN), &full[s], peers);");
                    } else {
                        w.line("tma_load_2d(st, xmap, kx, m0, &full[s]);");
                    }
                    for (map, at) in mats {
                        if t.cluster_m > 1 {
                            emit!(w, "tma_load_2d_multicast(st + {at} + rank * (WBOX / CM), {map}, kx, n0 + rank * (BN / CM), &full[s], peers);");
                        } else {
                            emit!(w, "tma_load_2d(st + {at}, {map}, kx, n0, &full[s]);");
                        }
                    }
                    if persistent {
                        w.line("++it;");
                    }
                });
            });
        });
        if split {
            w.comment("the two barriers of the consumers' partial sums");
            w.line("cluster_sync_publish();");
            w.line("cluster_sync_publish();");
        }
    };
    let hoisted = t.hoisted_descriptors;
    // Releases chunk `chunk`'s stage (`prev`, the stage of the chunk before the current one,
    // in the hoisted loop): to every block of the cluster, or this one.
    let release = |w: &mut Writer, cond: &str, chunk: &str| {
        let stage = if hoisted {
            "prev".to_string()
        } else {
            format!("({chunk}) % NS")
        };
        if multicast {
            w.if_block(format_args!("{cond}(threadIdx.x & 127) == 0"), |w| {
                w.for_unrolled("r", 0, "C", |w| {
                    emit!(w, "mbar_arrive_cluster(&empty[{stage}], r);");
                });
            });
        } else {
            emit!(
                w,
                "if ({cond}(threadIdx.x & 127) == 0) mbar_arrive(&empty[{stage}]);"
            );
        }
    };
    let consumers = |w: &mut Writer| {
        w.comment("consumers: warpgroup wg multiplies tile rows 64 wg .. 64 wg + 63");
        if hoisted {
            w.comment("wg from lane 0: the compiler then knows it is warp-uniform, so what derives from it can live in uniform registers");
            w.line("const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0);");
            w.comment("stage 0's descriptors; stage s and k16 step kk add s · STAGE / 16 + 2 kk to the address field (in 16-byte units, below 2^14: no carry out of it)");
            w.line("const unsigned long long da0 = wgmma_desc_k128(smem + wg * 64 * 128);");
            w.line("const unsigned long long db0 = wgmma_desc_k128(smem + XBOX);");
            w.comment("the ring's stage and phase of the chunk this warpgroup waits for next, and the stage before it");
            w.line("int cs = 0, prev = NS - 1;");
            w.line("unsigned cph = 0;");
        } else {
            w.line("const int wg = warp >> 2;");
        }
        w.comment("no initial zeros: the first k16 step writes the accumulators (scale-d = 0), so no other instruction touches them before the last wait");
        w.line("float acc[G][NA];");
        let one_mma = one_mma(p, t);
        if one_mma {
            w.comment("the weight boxes lie one after the other, so one m64n(G·BN) wgmma covers them; its accumulators are acc[G][NA] in order");
            w.line("float (&acc_all)[G * NA] = reinterpret_cast<float (&)[G * NA]>(acc);");
        }
        let mma = mma_name(mma_n(p, t));
        tile_loop(w, persistent, |w| {
            w.line("#pragma unroll 1");
            w.for_block("int n = 0", "n < KN", "++n", |w| {
                if hoisted {
                    w.line("mbar_wait(&full[cs], cph);");
                    w.line("const unsigned long long so = unsigned(cs) * (STAGE / 16);");
                    w.line("wgmma_fence();");
                    w.for_unrolled("kk", 0, 4, |w| {
                        w.line("const unsigned long long da = da0 + so + 2 * kk;");
                        if one_mma {
                            emit!(w, "{mma}(acc_all, da, db0 + so + 2 * kk, n > 0 || kk > 0);");
                        } else {
                            w.for_unrolled("gm", 0, "G", |w| {
                                emit!(
                                    w,
                                    "{mma}(acc[gm], da, db0 + gm * (WBOX / 16) + so + 2 * kk, n > 0 || kk > 0);"
                                );
                            });
                        }
                    });
                } else {
                    emit!(w, "const int s = {it} % NS;");
                    emit!(w, "mbar_wait(&full[s], ({it} / NS) & 1);");
                    w.line("const unsigned char* st = smem + s * STAGE;");
                    w.line("wgmma_fence();");
                    w.for_unrolled("kk", 0, 4, |w| {
                        w.comment("k16 step kk: 32 bytes into each 128-byte row");
                        w.line("const unsigned long long da = wgmma_desc_k128(st + wg * 64 * 128 + 32 * kk);");
                        if one_mma {
                            emit!(
                                w,
                                "{mma}(acc_all, da, wgmma_desc_k128(st + XBOX + 32 * kk), n > 0 || kk > 0);"
                            );
                        } else {
                            w.for_unrolled("gm", 0, "G", |w| {
                                emit!(
                                    w,
                                    "{mma}(acc[gm], da, wgmma_desc_k128(st + XBOX + gm * WBOX + 32 * kk), n > 0 || kk > 0);"
                                );
                            });
                        }
                    });
                }
                w.line("wgmma_commit();");
                w.comment("chunk n - 1's batch has completed: its stage goes back to the producer");
                w.line("wgmma_wait<1>();");
                if persistent {
                    release(w, "n > 0 && it - 1 + NS < TOTAL && ", "it - 1");
                    w.line("++it;");
                } else if multicast {
                    release(w, "n > 0 && n - 1 + NS < KN && ", "n - 1");
                } else {
                    release(w, "n > 0 && ", "n - 1");
                }
                if hoisted {
                    w.line("prev = cs;");
                    w.line("if (++cs == NS) {");
                    w.line("  cs = 0;");
                    w.line("  cph ^= 1;");
                    w.line("}");
                }
            });
            w.line("wgmma_wait<0>();");
            if persistent {
                w.comment("the tile's last chunk is done: the producer may refill its stage for the next tile");
                release(w, "it - 1 + NS < TOTAL && ", "it - 1");
            }
            w.for_unrolled("gm", 0, "G", |w| {
                w.for_unrolled("i", 0, "NA", |w| w.line("wgmma_fence_operand(acc[gm][i]);"));
            });
            if split {
                emit_split_sum(w);
                w.if_block("owner == me", epilogue);
            } else {
                epilogue(w);
            }
        });
    };
    if multicast {
        w.if_else("warp == 4 * NC", producer, consumers);
        w.line(
            "cluster_sync();  // no block exits while its peers' copies or arrivals may target it",
        );
    } else if split {
        w.if_else("warp == 4 * NC", producer, consumers);
    } else {
        w.if_block("warp == 4 * NC", |w| {
            producer(w);
            w.line("return;");
        });
        consumers(w);
    }
}

/// The split of K over a cluster's blocks (consumers, after their last mma completed), as a
/// reduce-scatter: block `o` owns the rows of the consumer warps `cw ≡ o (mod SK)` (16 rows
/// each), every block stores the accumulators of the warps it does not own into their
/// owner's ring, and each owner adds the `SK` partial sums in rank order, its own in its
/// place (`((a₀ + a₁) + a₂) + a₃`), so each output element is the same sum in the same
/// order whatever the rows, and each SM receives `(SK − 1) / SK²` of a tile. Slot layout in
/// the owner: float4 `i` of lane `l` of local warp `cw / SK` from source `q` at
/// `((j · WPB + cw / SK) · G·NA/4 + i) · 32 + l`, `j` = `q` without the owner (`q − (q > o)`),
/// `WPB` = the warps a block owns (a warp's stores are 512 contiguous bytes). The first
/// barrier (the producer warps meet it too) frees every ring: every copy into it landed and
/// every mma that read it completed; the second publishes the slots. Only owned warps then
/// run the epilogue.
fn emit_split_sum(w: &mut Writer) {
    w.line("float (&af)[G * NA] = reinterpret_cast<float (&)[G * NA]>(acc);");
    w.line("float4* slots = reinterpret_cast<float4*>(smem);");
    w.line("constexpr int WPB = 4 * NC / SK;  // consumer warps each block owns");
    w.line("const int cw = threadIdx.x >> 5;  // consumer warp");
    w.line("const int owner = cw % SK;");
    w.line("const int me = int(rank);");
    w.line("cluster_sync_publish();  // every block's ring is idle");
    w.if_block("owner != me", |w| {
        w.line("const int j = me - (me > owner);  // this block's slot in the owner");
        w.for_unrolled("i", 0, "G * NA / 4", |w| {
            w.line("const float4 v = make_float4(af[4 * i], af[4 * i + 1], af[4 * i + 2], af[4 * i + 3]);");
            w.line("st_cluster_f32x4(slots + ((j * WPB + cw / SK) * (G * NA / 4) + i) * 32 + lane, owner, v);");
        });
    });
    w.line("cluster_sync_publish();  // every owner's partial sums are in its slots");
    w.if_block("owner == me", |w| {
        w.comment("per float4: rank 0's partial, then ranks 1 .. SK - 1 added in order (this block's own in its place)");
        w.for_unrolled("i", 0, "G * NA / 4", |w| {
            w.line("const float4 mine = make_float4(af[4 * i], af[4 * i + 1], af[4 * i + 2], af[4 * i + 3]);");
            w.line("float4 v = me == 0 ? mine : slots[((cw / SK) * (G * NA / 4) + i) * 32 + lane];");
            w.for_unrolled("q", 1, "SK", |w| {
                w.line("const float4 u = q == me ? mine : slots[(((q - (q > me)) * WPB + cw / SK) * (G * NA / 4) + i) * 32 + lane];");
                w.line("v.x += u.x;");
                w.line("v.y += u.y;");
                w.line("v.z += u.z;");
                w.line("v.w += u.w;");
            });
            w.line("af[4 * i] = v.x;");
            w.line("af[4 * i + 1] = v.y;");
            w.line("af[4 * i + 2] = v.z;");
            w.line("af[4 * i + 3] = v.w;");
        });
    });
}

/// `body` once per tile of the block: as is (one block per tile: `m0`, `n0` and `ct` from the
/// prologue), or in the persistent loop over cluster tiles, which declares them and keeps
/// the ring counter `it`.
fn tile_loop(w: &mut Writer, persistent: bool, body: impl FnOnce(&mut Writer)) {
    if !persistent {
        body(w);
        return;
    }
    w.line("int it = 0;");
    w.line("#pragma unroll 1");
    w.for_block(
        "int u = blockIdx.x / PCM",
        "u < UNITS",
        "u += gridDim.x / PCM",
        |w| {
            w.line("const int tt = u * PCM + blockIdx.x % PCM;");
            w.line("const int m0 = tt % RTC * BM;");
            w.line("const int ct = tt / RTC;");
            w.line("const int n0 = ct * BN;");
            body(w);
        },
    );
}
