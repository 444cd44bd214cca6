//! Mixture-of-experts ops: `moe_route` (one block per token) and `moe_experts` (one block per
//! token, warps over output features). Correct first: each token's block reads the weights
//! of the experts it selected and nothing of the others, but tokens that share an expert
//! each read it (no grouping across tokens yet).

use super::quant::QuantRows;
use super::{c_type, f32_expr, load, row_launch, store, Kernel, TensorArg};
use crate::abi::KernelSource;
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

/// Dense gates per token, as the interpreter computes them (`ir/src/interp/moe.rs`): scores
/// `s` (softmax or sigmoid, f32), `sb = s + bias`; with groups, each group scores the sum of
/// its two best `sb` (best first, from 0) and the `topk_group` best groups stay; the `top_k`
/// best experts by (kept, `sb`, lower index) get `s` (over the sum of the chosen `s` in rank
/// order when normalised) times `scaling`; all other gates are 0. NaN ranks as -inf. Group
/// scores run a thread per group, the top-k as `top_k` block-wide arg-best reductions.
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
    let smem = e * 4 * 2 + e + r.n_group * 5 + 64;
    if smem > SMEM_LIMIT {
        return Err(Error::param(
            "moe_route",
            "experts",
            format!("{e} experts need {smem} bytes of shared memory"),
        ));
    }
    let nt = (e.next_power_of_two()).clamp(32, 1024) as u32;
    let gsize = e / r.n_group;
    let mut k = Kernel::new("moe_route", logits.dtype);
    k.ptr("x", logits, false);
    if let Some(b) = bias {
        k.ptr("bias", b, false);
    }
    k.ptr("y", out, true);
    let w = &mut k.body;
    emit!(
        w,
        "constexpr int E = {e}, NT = {nt}, NG = {}, GS = {gsize};",
        r.n_group
    );
    emit!(
        w,
        "constexpr int TOPK = {}, TOPKG = {};",
        r.top_k,
        r.topk_group
    );
    w.line("__shared__ float s[E], sb[E], red[NT / 32];");
    w.line("__shared__ float gscore[NG];");
    w.line("__shared__ bool kept[NG], chosen[E];");
    w.line("__shared__ int pick[TOPK > 0 ? TOPK : 1];");
    w.line("const long long row = blockIdx.x;");
    emit!(w, "const {}* xr = x + row * E;", c_type(logits.dtype));
    emit!(w, "{}* yr = y + row * E;", c_type(out.dtype));
    match r.scoring {
        MoeScoring::Sigmoid => {
            w.for_block("int i = threadIdx.x", "i < E", "i += NT", |w| {
                emit!(
                    w,
                    "s[i] = 1.0f / (1.0f + expf(-{}));",
                    load(logits.dtype, "xr[i]")
                );
            });
        }
        MoeScoring::Softmax => {
            w.line("float m = neg_inf();");
            w.for_block("int i = threadIdx.x", "i < E", "i += NT", |w| {
                emit!(w, "m = fmaxf(m, {});", load(logits.dtype, "xr[i]"));
            });
            w.line("m = block_reduce(m, MaxF32(), red);");
            w.line("float z = 0.0f;");
            w.for_block("int i = threadIdx.x", "i < E", "i += NT", |w| {
                emit!(
                    w,
                    "const float v = m == neg_inf() ? 0.0f : expf({} - m);",
                    load(logits.dtype, "xr[i]")
                );
                w.line("s[i] = v;");
                w.line("z += v;");
            });
            w.line("z = block_reduce(z, SumF32(), red);");
            w.for_block("int i = threadIdx.x", "i < E", "i += NT", |w| {
                w.line("s[i] = z > 0.0f ? s[i] / z : 0.0f;");
            });
        }
    }
    w.for_block("int i = threadIdx.x", "i < E", "i += NT", |w| {
        match bias {
            Some(b) => emit!(w, "sb[i] = __fadd_rn(s[i], {});", load(b.dtype, "bias[i]")),
            None => w.line("sb[i] = s[i];"),
        }
        w.line("chosen[i] = false;");
        w.line("yr[i] = 0.0f;");
    });
    w.line("__syncthreads();");
    w.comment("Groups by their top-2 sum (a thread per group), the kept groups in thread 0.");
    if r.n_group > 1 {
        w.for_block("int g = threadIdx.x", "g < NG", "g += NT", |w| {
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
            w.line("gscore[g] = gs;");
            w.line("kept[g] = false;");
        });
        w.line("__syncthreads();");
        w.if_block("threadIdx.x == 0", |w| {
            w.for_block("int j = 0", "j < TOPKG", "++j", |w| {
                w.line("int best = -1;");
                w.for_block("int g = 0", "g < NG", "++g", |w| {
                    w.if_block(
                        "!kept[g] && (best < 0 || rank_key(gscore[g]) > rank_key(gscore[best]))",
                        |w| w.line("best = g;"),
                    );
                });
                w.line("kept[best] = true;");
            });
        });
    } else {
        w.line("if (threadIdx.x == 0) kept[0] = true;");
    }
    w.line("__syncthreads();");
    w.comment(
        "Expert i ranks before j: kept group first, then the larger sb, then the lower index.",
    );
    w.line("auto before = [&](int i, int j) {");
    w.line("  if (i < 0) return false;");
    w.line("  if (j < 0) return true;");
    w.line("  const bool ki = kept[i / GS], kj = kept[j / GS];");
    w.line("  if (ki != kj) return ki;");
    w.line("  const float vi = rank_key(sb[i]), vj = rank_key(sb[j]);");
    w.line("  return vi != vj ? vi > vj : i < j;");
    w.line("};");
    w.comment("top_k rounds of a block-wide arg-best over the experts not chosen yet (the same");
    w.comment("total order in any reduction shape, so the picks equal a sequential scan's).");
    w.line("__shared__ int wbest[NT / 32];");
    w.for_block("int j = 0", "j < TOPK", "++j", |w| {
        w.line("int best = -1;");
        w.for_block("int i = threadIdx.x", "i < E", "i += NT", |w| {
            w.line("if (!chosen[i] && before(i, best)) best = i;");
        });
        w.for_block("int off = 16", "off > 0", "off >>= 1", |w| {
            w.line("const int o = __shfl_xor_sync(0xffffffffu, best, off);");
            w.line("if (before(o, best)) best = o;");
        });
        w.line("if ((threadIdx.x & 31) == 0) wbest[threadIdx.x >> 5] = best;");
        w.line("__syncthreads();");
        w.if_block("threadIdx.x == 0", |w| {
            w.line("int b = -1;");
            w.line("for (int q = 0; q < NT / 32; ++q) if (before(wbest[q], b)) b = wbest[q];");
            w.line("chosen[b] = true;");
            w.line("pick[j] = b;");
        });
        w.line("__syncthreads();");
    });
    w.if_block("threadIdx.x == 0", |w| {
        w.line("float denom = 1.0f;");
        if r.norm_topk_prob {
            w.line("denom = 0.0f;");
            w.line("for (int j = 0; j < TOPK; ++j) denom = __fadd_rn(denom, s[pick[j]]);");
        }
        emit!(w, "const float scaling = {};", f32_expr(r.scaling as f32));
        w.for_block("int j = 0", "j < TOPK", "++j", |w| {
            w.line("const int i = pick[j];");
            if r.norm_topk_prob {
                w.line("const float g = denom > 0.0f ? __fdiv_rn(s[i], denom) : s[i];");
            } else {
                w.line("const float g = s[i];");
            }
            emit!(w, "yr[i] = {};", store(out.dtype, "__fmul_rn(g, scaling)"));
        });
    });
    Ok(k.finish(row_launch(rows, nt)))
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
