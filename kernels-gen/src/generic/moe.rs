//! Mixture-of-experts ops: `moe_route` (one warp per token) and `moe_experts` (one block per
//! token, warps over output features). Correct first: each token's block reads the weights
//! of the experts it selected and nothing of the others, but tokens that share an expert
//! each read it (no grouping across tokens yet).

use super::quant::QuantRows;
use super::{c_type, f32_expr, load, row_launch, store, Kernel, TensorArg};
use crate::abi::{Extent, KernelSource, LaunchSpec};
use crate::writer::emit;
use crate::Error;
use specc_ir::op::MoeScoring;

/// Static shared memory a block may use (CUDA's cap on static `__shared__` arrays).
const SMEM_LIMIT: u64 = 48 * 1024;
/// The C++ f32 expression of element (row, col) of an expert's matrix.
type ElemExpr<'a> = Box<dyn Fn(&str, &str) -> String + 'a>;

/// Warps of a `moe_experts` block.
const EXPERT_WARPS: u32 = 8;

/// Router parameters (the fields of `Op::MoeRoute`).
pub(super) struct Route {
    pub top_k: u64,
    pub scoring: MoeScoring,
    pub n_group: u64,
    pub topk_group: u64,
    pub norm_topk_prob: bool,
    pub scaling: f64,
}

/// Warps (tokens) of a `moe_route` block at most.
const ROUTE_WARPS: u64 = 4;

/// Module-scope helpers of `moe_route`: the selection key and its warp-wide maximum.
const ROUTE_ITEMS: &str = r#"// The rank of expert (or group) `i` as one integer: kept bit 62, then the order-preserving
// bits of rank_key(v) (NaN as -inf, -0 as +0), then 0xFFFFF - i, so that a larger key ranks
// first and equal values rank the lower index first. Never 0 for i < 2^20: 0 marks a slot
// that holds no candidate.
__device__ __forceinline__ unsigned long long route_key(bool kept, float v, int i) {
  float r = rank_key(v);
  if (r == 0.0f) r = 0.0f;
  unsigned u = __float_as_uint(r);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)kept << 62) | ((unsigned long long)u << 20) |
         (unsigned long long)(0xFFFFF - i);
}
__device__ __forceinline__ int route_index(unsigned long long key) {
  return 0xFFFFF - (int)(key & 0xFFFFFull);
}
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}"#;

/// Dense gates per token, as the interpreter computes them (`ir/src/interp/moe.rs`): scores
/// `s` (softmax or sigmoid, f32), `sb = s + bias`; with groups, each group scores the sum of
/// its two best `sb` (best first, from 0) and the `topk_group` best groups stay; the `top_k`
/// best experts by (kept, `sb`, lower index) get `s` (over the sum of the chosen `s` in rank
/// order when normalised) times `scaling`; all other gates are 0. NaN ranks as -inf.
///
/// One warp per token, up to [`ROUTE_WARPS`] tokens a block, no block-wide barrier. Lane `l`
/// owns experts `q·32 + l`; the softmax denominator adds in the interpreter's order (8
/// interleaved partial sums of the first `8·⌊E/8⌋` scores by lanes 0–7, combined by
/// xor-shuffles 1, 2, 4, which is its pairwise tree, then the tail in order). Each candidate
/// is one 64-bit key ordered as the ranking (`route_key`), unique by its index, so every
/// selection is a warp max: lane `g` scores groups `g, g + 32, …` (top-2 over its group's
/// `sb`), `topk_group` maxima over the group keys mark the kept groups, and `top_k` maxima
/// over the expert keys pick the experts in rank order, each lane holding its keys in
/// registers with their maximum cached (only the owner of a pick rescans); the denominator
/// adds each pick's `s` as it is picked, and a picked key becomes 0.
pub(super) fn moe_route(
    r: &Route,
    logits: &TensorArg,
    bias: Option<&TensorArg>,
    out: &TensorArg,
) -> Result<KernelSource, Error> {
    let e = logits.last();
    let rows = logits.numel() / e;
    if r.n_group == 0 || !e.is_multiple_of(r.n_group) || r.top_k > e || r.topk_group > r.n_group {
        return Err(Error::param(
            "moe_route",
            "top_k/n_group/topk_group",
            format!(
                "top_k {}, n_group {}, topk_group {} invalid for {e} experts",
                r.top_k, r.n_group, r.topk_group
            ),
        ));
    }
    let grouped = r.n_group > 1;
    // Per warp: s[E], and with groups sb[E] and kept[NG].
    let warp_smem = if grouped { e * 8 + r.n_group } else { e * 4 };
    let warps = (SMEM_LIMIT / warp_smem.max(1))
        .min(ROUTE_WARPS)
        .min(rows.max(1));
    if warps == 0 {
        return Err(Error::param(
            "moe_route",
            "experts",
            format!("{e} experts need {warp_smem} bytes of shared memory"),
        ));
    }
    let gsize = e / r.n_group;
    let mut k = Kernel::new("moe_route", logits.dtype);
    k.items.line(ROUTE_ITEMS);
    k.ptr("x", logits, false);
    if let Some(b) = bias {
        k.ptr("bias", b, false);
    }
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int E = {e}, NG = {}, GS = {gsize}, TOPK = {}, TOPKG = {};",
        r.n_group,
        r.top_k,
        r.topk_group
    );
    emit!(
        w,
        "constexpr int W = {warps}, C = (E + 31) / 32, CG = (NG + 31) / 32;"
    );
    emit!(w, "constexpr long long ROWS = {rows};");
    w.line("static_assert(E < (1 << 20), \"route_key holds 20 index bits\");");
    w.line("__shared__ float s_w[W][E];");
    if grouped {
        w.line("__shared__ float sb_w[W][E];");
        w.line("__shared__ bool kept_w[W][NG];");
    }
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    w.line("const long long row = (long long)blockIdx.x * W + warp;");
    w.comment("Whole warps leave: nothing below synchronises more than one warp.");
    w.line("if (row >= ROWS) return;");
    w.line("float* s = s_w[warp];");
    emit!(w, "const {}* xr = x + row * E;", c_type(logits.dtype));
    emit!(w, "{}* yr = y + row * E;", c_type(out.dtype));
    w.line("float sv[C];");
    match r.scoring {
        MoeScoring::Sigmoid => {
            w.for_unrolled("q", 0, "C", |w| {
                w.line("const int i = q * 32 + lane;");
                emit!(
                    w,
                    "sv[q] = i < E ? 1.0f / (1.0f + expf(-{})) : 0.0f;",
                    load(logits.dtype, "xr[i]")
                );
            });
        }
        MoeScoring::Softmax => {
            w.line("float m = neg_inf();");
            w.for_unrolled("q", 0, "C", |w| {
                w.line("const int i = q * 32 + lane;");
                emit!(
                    w,
                    "sv[q] = i < E ? {} : neg_inf();",
                    load(logits.dtype, "xr[i]")
                );
                w.line("m = fmaxf(m, sv[q]);");
            });
            w.line("m = warp_max(m);");
            w.for_unrolled("q", 0, "C", |w| {
                w.line("const int i = q * 32 + lane;");
                w.line("sv[q] = m == neg_inf() ? 0.0f : expf(sv[q] - m);");
                w.line("if (i < E) s[i] = sv[q];");
            });
            w.line("__syncwarp();");
            w.comment("z in the interpreter's order (`sum` in ir/src/interp/util.rs).");
            w.line("constexpr int E8 = E - E % 8;");
            w.line("float z = 0.0f;");
            w.line("if (lane < 8) for (int c = lane; c < E8; c += 8) z = __fadd_rn(z, s[c]);");
            w.line("z = __fadd_rn(z, __shfl_xor_sync(0xffffffffu, z, 1));");
            w.line("z = __fadd_rn(z, __shfl_xor_sync(0xffffffffu, z, 2));");
            w.line("z = __fadd_rn(z, __shfl_xor_sync(0xffffffffu, z, 4));");
            w.line("z = __shfl_sync(0xffffffffu, z, 0);");
            w.line("for (int c = E8; c < E; ++c) z = __fadd_rn(z, s[c]);");
            w.line("__syncwarp();  // every lane has read s before it is overwritten");
            w.comment("A row of -inf and NaN only has max -inf: all scores 0, as the interpreter.");
            w.if_block("m != neg_inf()", |w| {
                w.for_unrolled("q", 0, "C", |w| w.line("sv[q] = __fdiv_rn(sv[q], z);"));
            });
        }
    }
    w.line("unsigned long long key[C];");
    w.for_unrolled("q", 0, "C", |w| {
        w.line("const int i = q * 32 + lane;");
        w.line("key[q] = 0;");
        w.if_block("i < E", |w| {
            w.line("s[i] = sv[q];");
            let sb = match bias {
                Some(b) => format!("__fadd_rn(sv[q], {})", load(b.dtype, "bias[i]")),
                None => "sv[q]".into(),
            };
            if grouped {
                emit!(w, "sb_w[warp][i] = {sb};");
            } else {
                emit!(w, "key[q] = route_key(true, {sb}, i);");
            }
        });
    });
    if grouped {
        w.line("const float* sb = sb_w[warp];");
        w.line("bool* kept = kept_w[warp];");
        w.line("for (int g = lane; g < NG; g += 32) kept[g] = false;");
        w.line("__syncwarp();");
        w.comment("Group g scores the sum of its two best sb (lane g % 32).");
        w.line("unsigned long long gkey[CG];");
        w.for_unrolled("p", 0, "CG", |w| {
            w.line("const int g = p * 32 + lane;");
            w.line("gkey[p] = 0;");
            w.if_block("g < NG", |w| {
                w.line("int b1 = -1, b2 = -1;");
                w.for_block("int i = g * GS", "i < (g + 1) * GS", "++i", |w| {
                    w.line("const float v = rank_key(sb[i]);");
                    w.if_else(
                        "b1 < 0 || v > rank_key(sb[b1])",
                        |w| {
                            w.line("b2 = b1;");
                            w.line("b1 = i;");
                        },
                        |w| {
                            w.if_block("b2 < 0 || v > rank_key(sb[b2])", |w| w.line("b2 = i;"));
                        },
                    );
                });
                w.line("float gs = __fadd_rn(0.0f, sb[b1]);");
                w.line("if (GS > 1) gs = __fadd_rn(gs, sb[b2]);");
                w.line("gkey[p] = route_key(false, gs, g);");
            });
        });
        w.comment("The TOPKG best groups, one warp max each; the owner marks its group kept.");
        w.line("unsigned long long gbest = 0;");
        w.for_unrolled("p", 0, "CG", |w| {
            w.line("gbest = gkey[p] > gbest ? gkey[p] : gbest;")
        });
        w.for_block("int j = 0", "j < TOPKG", "++j", |w| {
            w.line("const unsigned long long b = warp_max_u64(gbest);");
            w.if_block("gbest == b", |w| {
                w.line("kept[route_index(b)] = true;");
                w.line("gbest = 0;");
                w.for_unrolled("p", 0, "CG", |w| {
                    w.line("if (gkey[p] == b) gkey[p] = 0;");
                    w.line("gbest = gkey[p] > gbest ? gkey[p] : gbest;");
                });
            });
        });
        w.line("__syncwarp();");
        w.for_unrolled("q", 0, "C", |w| {
            w.line("const int i = q * 32 + lane;");
            w.line("if (i < E) key[q] = route_key(kept[i / GS], sb[i], i);");
        });
    }
    w.line("__syncwarp();  // s is complete");
    w.comment("The TOPK best experts in rank order, one warp max each; a picked key becomes 0.");
    w.line("unsigned long long best = 0;");
    w.for_unrolled("q", 0, "C", |w| {
        w.line("best = key[q] > best ? key[q] : best;")
    });
    if r.norm_topk_prob {
        w.line("float denom = 0.0f;");
    }
    w.for_block("int j = 0", "j < TOPK", "++j", |w| {
        w.line("const unsigned long long b = warp_max_u64(best);");
        w.if_block("best == b", |w| {
            w.line("best = 0;");
            w.for_unrolled("q", 0, "C", |w| {
                w.line("if (key[q] == b) key[q] = 0;");
                w.line("best = key[q] > best ? key[q] : best;");
            });
        });
        if r.norm_topk_prob {
            w.line("denom = __fadd_rn(denom, s[route_index(b)]);");
        }
    });
    emit!(w, "const float scaling = {};", f32_expr(r.scaling as f32));
    w.for_unrolled("q", 0, "C", |w| {
        w.line("const int i = q * 32 + lane;");
        w.if_block("i < E", |w| {
            w.line("float gate = 0.0f;");
            w.if_block("key[q] == 0", |w| {
                if r.norm_topk_prob {
                    w.line("const float g = denom > 0.0f ? __fdiv_rn(s[i], denom) : s[i];");
                } else {
                    w.line("const float g = s[i];");
                }
                w.line("gate = __fmul_rn(g, scaling);");
            });
            emit!(w, "yr[i] = {};", store(out.dtype, "gate"));
        });
    });
    Ok(k.finish(LaunchSpec {
        grid: [
            Extent::Fixed(rows.div_ceil(warps).max(1) as u32),
            Extent::Fixed(1),
            Extent::Fixed(1),
        ],
        block: [(32 * warps) as u32, 1, 1],
        smem_bytes: 0,
    }))
}

/// Per token, for each expert with a non-zero gate in increasing index: `g = R(x·Wg_eᵀ)`,
/// `u = R(x·Wu_eᵀ)`, `a = R(R(silu(g))·u)` for every intermediate feature (warps over
/// features, lanes over `H`), then `y = R(a·Wd_eᵀ)` per output feature (warps over `H`,
/// lanes over `F`) and `acc += gate·y` in f32 (one multiply, one add, as the interpreter);
/// `out = R(acc)`. `R` rounds to the dtype of `x`. The activations `a` and the accumulator
/// live in shared memory.
///
/// `weights` is `wg, wu, wd` (float), or those stored int4 / fp8 followed by their stacked
/// scales `sg, su, sd`, dequantised per element as read ([`super::quant::QuantRows`]).
pub(super) fn moe_experts(
    x: &TensorArg,
    gates: &TensorArg,
    weights: &[TensorArg],
    out: &TensorArg,
) -> Result<KernelSource, Error> {
    let (wg, wu, wd) = (&weights[0], &weights[1], &weights[2]);
    let quant = match weights.get(3..6) {
        Some([sg, su, sd]) => Some([
            QuantRows::of("moe_experts", wg, sg)?,
            QuantRows::of("moe_experts", wu, su)?,
            QuantRows::of("moe_experts", wd, sd)?,
        ]),
        _ => None,
    };
    let (e, f, h) = (wg.dims[0], wg.dims[1], wg.dims[2]);
    let tokens = x.numel() / h;
    let smem = (f + h) * 4;
    if smem > SMEM_LIMIT {
        return Err(Error::param(
            "moe_experts",
            "dims",
            format!("hidden {h} + expert FFN {f} need {smem} bytes of shared memory"),
        ));
    }
    let r = |v: &str| format!("to_f32({})", store(x.dtype, v));
    let mut k = Kernel::new("moe_experts", wg.dtype);
    k.ptr("x", x, false);
    k.ptr("gates", gates, false);
    k.ptr("wg", wg, false);
    k.ptr("wu", wu, false);
    k.ptr("wd", wd, false);
    if quant.is_some() {
        k.ptr("scg", &weights[3], false);
        k.ptr("scu", &weights[4], false);
        k.ptr("scd", &weights[5], false);
    }
    k.ptr("y", out, true);
    // Expert `ex`'s matrices: pointers to their stored bytes (and scales), and the f32
    // value of element (row, col) of each.
    let (expert_ptrs, elem): (Vec<String>, [ElemExpr; 3]) = match &quant {
        None => (
            [("wg", wg, f * h), ("wu", wu, f * h), ("wd", wd, h * f)]
                .iter()
                .map(|(n, a, len)| {
                    format!(
                        "const {t}* {n}e = {n} + (long long)ex * {len};",
                        t = c_type(a.dtype)
                    )
                })
                .collect(),
            [
                Box::new(move |r: &str, c: &str| {
                    load(wg.dtype, &format!("wge[(long long)({r}) * H + {c}]"))
                }),
                Box::new(move |r: &str, c: &str| {
                    load(wu.dtype, &format!("wue[(long long)({r}) * H + {c}]"))
                }),
                Box::new(move |r: &str, c: &str| {
                    load(wd.dtype, &format!("wde[(long long)({r}) * F + {c}]"))
                }),
            ],
        ),
        Some(q) => {
            let ptrs = [
                ("wg", "scg", &q[0]),
                ("wu", "scu", &q[1]),
                ("wd", "scd", &q[2]),
            ]
            .iter()
            .flat_map(|(wn, sn, qr)| {
                [
                    format!(
                        "const unsigned char* {wn}e = {wn} + (long long)ex * {};",
                        qr.matrix_bytes()
                    ),
                    format!(
                        "const auto* {sn}e = {sn} + (long long)ex * {};",
                        qr.matrix_scales()
                    ),
                ]
            })
            .collect();
            let [qg, qu, qd] = q;
            (
                ptrs,
                [
                    Box::new(move |r: &str, c: &str| qg.value("wge", "scge", r, c)),
                    Box::new(move |r: &str, c: &str| qu.value("wue", "scue", r, c)),
                    Box::new(move |r: &str, c: &str| qd.value("wde", "scde", r, c)),
                ],
            )
        }
    };
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int E = {e}, F = {f}, H = {h}, NW = {EXPERT_WARPS};"
    );
    w.line("__shared__ float act[F], acc[H];");
    w.line("const long long t = blockIdx.x;");
    w.line("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    emit!(w, "const {}* xr = x + t * H;", c_type(x.dtype));
    emit!(w, "const {}* gr = gates + t * E;", c_type(gates.dtype));
    w.line("for (int i = threadIdx.x; i < H; i += blockDim.x) acc[i] = 0.0f;");
    w.for_block("int ex = 0", "ex < E", "++ex", |w| {
        emit!(w, "const float gate = {};", load(gates.dtype, "gr[ex]"));
        w.comment("Uniform across the block: every thread reads the same gate.");
        w.line("if (gate == 0.0f) continue;");
        w.line("__syncthreads();  // the previous expert's down projection has read act");
        for p in &expert_ptrs {
            w.line(p);
        }
        w.for_block("int j = warp", "j < F", "j += NW", |w| {
            w.line("float sg = 0.0f, su = 0.0f;");
            w.for_block("int i = lane", "i < H", "i += 32", |w| {
                emit!(w, "const float xv = {};", load(x.dtype, "xr[i]"));
                emit!(w, "sg = fmaf(xv, {}, sg);", elem[0]("j", "i"));
                emit!(w, "su = fmaf(xv, {}, su);", elem[1]("j", "i"));
            });
            w.line("sg = warp_sum(sg);");
            w.line("su = warp_sum(su);");
            w.if_block("lane == 0", |w| {
                emit!(w, "const float g = {};", r("sg"));
                emit!(w, "const float u = {};", r("su"));
                emit!(w, "const float sl = {};", r("silu_f32(g)"));
                emit!(w, "act[j] = {};", r("__fmul_rn(sl, u)"));
            });
        });
        w.line("__syncthreads();");
        w.for_block("int o = warp", "o < H", "o += NW", |w| {
            w.line("float sd = 0.0f;");
            w.for_block("int j = lane", "j < F", "j += 32", |w| {
                emit!(w, "sd = fmaf(act[j], {}, sd);", elem[2]("o", "j"));
            });
            w.line("sd = warp_sum(sd);");
            w.if_block("lane == 0", |w| {
                emit!(
                    w,
                    "acc[o] = __fadd_rn(acc[o], __fmul_rn(gate, {}));",
                    r("sd")
                );
            });
        });
    });
    w.line("__syncthreads();");
    emit!(w, "{}* yr = y + t * H;", c_type(out.dtype));
    w.for_block("int i = threadIdx.x", "i < H", "i += blockDim.x", |w| {
        emit!(w, "yr[i] = {};", store(out.dtype, "acc[i]"));
    });
    Ok(k.finish(row_launch(tokens, 32 * EXPERT_WARPS)))
}
