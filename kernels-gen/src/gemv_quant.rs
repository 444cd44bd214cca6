//! `gemv_q`: the CUDA-core GEMV ([`crate::gemv`]) over weights stored as int4 groups or
//! fp8 blocks ([`crate::quant`]), read as stored and dequantised in registers: each lane
//! loads 8–16 bytes of a weight row, decodes them to f32 (`cuda/quant.cuh`), multiplies by
//! their scale and feeds every staged x row of the tile, so each weight byte (and scale) is
//! read once per row tile of up to 64 rows (decode, verify and tree row counts alike).
//!
//! Numerics: the interpreter's (`matmul` with a scale operand): `w = q · scale` rounded
//! once to f32, products and sums in f32 (in the kernel's order), then the epilogue of
//! [`crate::gemv`] (norm prologue, SwiGLU, residual, cast, argmax partials). No RoPE
//! epilogue: the plan runs `rope_kv` after a quantised q|k|v projection.
//!
//! Kernel family `gemv_q`; name dtype: the storage format (`int4g32`, `fp8e4m3`).

use crate::abi::{Dtype, KernelBuilder, KernelSource, Loc};
use crate::gemv::{
    emit_argmax_partials, emit_lane_epilogues, emit_row_inv_rms, gemv_launch, GemvParams,
    GemvTiling, GemvWeights, MAX_ROW_TILE, MIN_BLOCKS, X_SMEM_BYTES,
};
use crate::quant::QuantFormat;
use crate::writer::emit;
use crate::Error;

const FAMILY: &str = "gemv_q";
/// Dequantised weight values a lane holds per step (`NA · VW`): more spills registers at
/// 64-row tiles, whose accumulators already take 64–128.
const MAX_WEIGHT_REGS: u32 = 32;

/// The quantised weights of a [`GemvParams`] (whose `w_dtype` is then not read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantWeights {
    pub format: QuantFormat,
    /// The scales of each weight matrix, in the shape of `GemvParams::weights`.
    pub scales: GemvWeights,
    pub scale_dtype: Dtype,
}

/// The default work split: as [`GemvParams::tiling`], with `vec` the format's elements per
/// load and at most [`MAX_WEIGHT_REGS`] weight values per lane.
pub fn quant_tiling(p: &GemvParams, q: &QuantWeights) -> GemvTiling {
    let g = if p.gate_up() { 2 } else { 1 };
    let mt = p.row_tile.clamp(1, MAX_ROW_TILE);
    let vec = q.format.vec(p.k as u64);
    // Above 8 rows one column per warp: the row tile's accumulators fill the registers
    // (two columns spilled at 16 f32 rows on sm_100a).
    let mut cw = [4u32, 2, 1]
        .into_iter()
        .find(|c| mt * c * g <= 32 && c * g * vec <= MAX_WEIGHT_REGS && (mt <= 8 || *c == 1))
        .unwrap_or(1);
    let blocks = |nw: u32, cw: u32| (p.n as u64).div_ceil((nw * cw) as u64);
    let mut nw = 8;
    while nw > 2 && blocks(nw, cw) < MIN_BLOCKS {
        nw /= 2;
    }
    while cw > 1 && blocks(nw, cw) < MIN_BLOCKS {
        cw /= 2;
    }
    let xs = p.x.dtype.size();
    let budget = X_SMEM_BYTES / (mt as u64 * xs);
    let k_chunk = if p.k as u64 <= budget {
        p.k
    } else if budget >= 32 * vec as u64 {
        (budget - budget % (32 * vec as u64)) as u32
    } else {
        (budget - budget % vec as u64).max(vec as u64) as u32
    };
    GemvTiling {
        warps: nw,
        cols_per_warp: cw,
        vec,
        k_chunk,
        k_warps: 1,
    }
}

fn validate(p: &GemvParams, q: &QuantWeights, t: &GemvTiling) -> Result<(), Error> {
    let err = |field, reason: String| Err(Error::param(FAMILY, field, reason));
    if !(1..=MAX_ROW_TILE).contains(&p.row_tile) {
        return err("row_tile", "must be in 1..=64".into());
    }
    if p.k == 0 || p.n == 0 {
        return err("k/n", "must be positive".into());
    }
    if !p.x.dtype.is_float() {
        return err(
            "x.dtype",
            format!("must be a float type, got {}", p.x.dtype.name()),
        );
    }
    q.format.check(FAMILY, p.k as u64, q.scale_dtype)?;
    if p.rope.is_some() {
        return err("rope", "no RoPE epilogue over quantised weights".into());
    }
    let vec = q.format.vec(p.k as u64);
    let load = q.format.load_bytes(vec);
    let pairs: Vec<(Loc, Loc)> = match (p.weights, q.scales) {
        (GemvWeights::Single(w), GemvWeights::Single(s)) => vec![(w, s)],
        (GemvWeights::GateUp { gate, up }, GemvWeights::GateUp { gate: sg, up: su }) => {
            vec![(gate, sg), (up, su)]
        }
        _ => return err("scales", "must have the shape of the weights".into()),
    };
    for (w, s) in pairs {
        if w.byte_offset() % load != 0 {
            return err("weights", format!("must start {load}-byte aligned"));
        }
        if s.byte_offset() % q.scale_dtype.size() != 0 {
            return err("scales", "must be aligned to their dtype".into());
        }
    }
    let x_align = (vec as u64 * p.x.dtype.size()).min(16);
    if !p.x.aligned(x_align) {
        return err("x", format!("rows must be {x_align}-byte aligned"));
    }
    if let Some(nm) = &p.norm {
        if !nm.dtype.is_float() || !nm.eps.is_finite() || nm.eps < 0.0 {
            return err("norm", "needs a float weight and a finite eps >= 0".into());
        }
        if nm.weight.byte_offset() % (vec as u64 * nm.dtype.size()).min(16) != 0 {
            return err("norm.weight", "misaligned for vector loads".into());
        }
    }
    for (field, v) in [("residual", p.residual), ("out", p.out)] {
        if v.is_some_and(|v| !v.dtype.is_float()) {
            return err(field, "must be a float type".into());
        }
    }
    if p.out.is_none() && p.argmax_partials.is_none() {
        return err(
            "out",
            "a gemv must store its result or argmax partials".into(),
        );
    }
    if p.argmax_partials.is_some_and(|l| l.byte_offset() % 8 != 0) {
        return err("argmax_partials", "must be 8-byte aligned".into());
    }
    let x_bytes = t.k_chunk as u64 * p.row_tile as u64 * p.x.dtype.size();
    let g = if p.gate_up() { 2 } else { 1 };
    if !(1..=32).contains(&t.warps)
        || t.cols_per_warp == 0
        || t.vec != vec
        || t.k_chunk == 0
        || !t.k_chunk.is_multiple_of(vec)
        || x_bytes > X_SMEM_BYTES
        || t.cols_per_warp * g * vec > MAX_WEIGHT_REGS.max(g * vec)
    {
        return err(
            "tiling",
            format!("invalid work split {t:?} for this matmul"),
        );
    }
    if t.k_warps != 1 {
        return err(
            "tiling.k_warps",
            format!("gemv_q splits no K inside the block: k_warps must be 1, got {t:?}"),
        );
    }
    Ok(())
}

/// Generates the kernel with its default work split ([`quant_tiling`]).
pub fn gemv_quant(p: &GemvParams, q: &QuantWeights) -> Result<KernelSource, Error> {
    gemv_quant_tiled(p, q, &quant_tiling(p, q))
}

/// Generates the kernel with work split `t`.
pub fn gemv_quant_tiled(
    p: &GemvParams,
    q: &QuantWeights,
    t: &GemvTiling,
) -> Result<KernelSource, Error> {
    validate(p, q, t)?;
    let (mt, cw, nw) = (p.row_tile, t.cols_per_warp, t.warps);
    let g = if p.gate_up() { 2 } else { 1 };
    let xt = p.x.dtype.c_type();
    let st = q.scale_dtype.c_type();
    let fmt = q.format;
    let row_bytes = fmt.row_bytes(p.k as u64);
    let mut kb = KernelBuilder::new(FAMILY, q.scale_dtype);
    let (w0, w1, s0, s1) = match (p.weights, q.scales) {
        (GemvWeights::GateUp { gate, up }, GemvWeights::GateUp { gate: sg, up: su }) => {
            (gate, Some(up), sg, Some(su))
        }
        (GemvWeights::Single(w), GemvWeights::Single(s)) => (w, None, s, None),
        _ => unreachable!("validated: scales have the shape of the weights"),
    };
    let pw = &mut kb.prologue;
    emit!(pw, "constexpr int K = {};", p.k);
    emit!(pw, "constexpr int N = {};", p.n);
    emit!(pw, "constexpr int MT = {mt};  // row tile");
    emit!(pw, "constexpr int CW = {cw};  // output columns per warp");
    emit!(pw, "constexpr int NW = {nw};  // warps per block");
    emit!(
        pw,
        "constexpr int VW = {};  // elements per weight load",
        t.vec
    );
    emit!(
        pw,
        "constexpr int KC = {};  // K chunk staged in shared memory",
        t.k_chunk
    );
    emit!(
        pw,
        "constexpr int NA = {};  // accumulators per row: CW, or gate and up",
        g * cw
    );
    emit!(
        pw,
        "constexpr long long RB = {row_bytes};  // stored bytes per weight row"
    );
    pw.line("const int lane = threadIdx.x & 31;");
    pw.line("const int warp = threadIdx.x >> 5;");
    pw.line("const int n0 = (blockIdx.x * NW + warp) * CW;");
    let byte = |l: Loc| l.ptr_as("unsigned char", false);
    emit!(pw, "const unsigned char* w0 = {};", byte(w0));
    emit!(pw, "const {st}* s0 = {};", s0.ptr(q.scale_dtype, false));
    if let (Some(w1), Some(s1)) = (w1, s1) {
        emit!(pw, "const unsigned char* w1 = {};", byte(w1));
        emit!(pw, "const {st}* s1 = {};", s1.ptr(q.scale_dtype, false));
    }
    let w = &mut kb.body;
    emit!(w, "__shared__ __align__(16) {xt} xs[MT * KC];");
    if p.norm.is_some() {
        w.line("__shared__ float inv_rms[MT];");
    }
    if p.argmax_partials.is_some() {
        w.line("__shared__ ArgmaxPair cand[NW * MT * CW];");
    }
    w.line("const int m0 = blockIdx.y * MT;");
    emit!(w, "const int mr = min(MT, {} - m0);", p.rows.expr());
    emit!(w, "const {xt}* x = {};", p.x.loc.ptr(p.x.dtype, false));
    if let Some(nm) = &p.norm {
        emit!(
            w,
            "const {}* nw = {};",
            nm.dtype.c_type(),
            nm.weight.ptr(nm.dtype, false)
        );
        emit_row_inv_rms(w, p, None);
    }
    w.line("float acc[MT][NA];");
    w.for_unrolled("m", 0, "MT", |w| {
        w.for_unrolled("j", 0, "NA", |w| w.line("acc[m][j] = 0.0f;"));
    });
    let elem_off = match fmt {
        QuantFormat::Int4 { .. } => "k / 2",
        QuantFormat::Fp8Block => "k",
    };
    let one_scale = fmt.one_scale_per_load(t.vec);
    let dequant = |w: &mut crate::writer::Writer, wp: &str, sp: &str, dst: &str| {
        let ptr = format!("{wp} + r * RB + {elem_off}");
        w.line(fmt.load_stmt("VW", &ptr, dst));
        if one_scale {
            emit!(
                w,
                "const float sc_{wp} = {};",
                fmt.scale_expr(sp, "r", "k", p.k as u64)
            );
            w.for_unrolled("e", 0, "VW", |w| emit!(w, "{dst}[e] *= sc_{wp};"));
        } else {
            w.for_unrolled("e", 0, "VW", |w| {
                let s = fmt.scale_expr(sp, "r", "k + e", p.k as u64);
                emit!(w, "{dst}[e] *= {s};");
            });
        }
    };
    w.for_block("int k0 = 0", "k0 < K", "k0 += KC", |w| {
        w.comment("stage x[m0 .. m0 + MT, k0 .. k0 + KC] (normalised when fused)");
        w.line("__syncthreads();");
        crate::gemv::stage_x(w, p, "gn");
        w.line("__syncthreads();");
        w.line("const int kn = min(KC, K - k0);");
        // Two loads in flight per lane up to 8 rows; above, the accumulators take the
        // registers (unrolling spilled at 16 and 64 f32 rows on sm_100a).
        emit!(w, "#pragma unroll {}", if mt > 8 { 1 } else { 2 });
        w.for_block("int kk = lane * VW", "kk < kn", "kk += 32 * VW", |w| {
            w.line("const int k = k0 + kk;");
            w.line("float wv[NA][VW];");
            w.for_unrolled("j", 0, "CW", |w| {
                w.line("const long long r = min(n0 + j, N - 1);");
                dequant(w, "w0", "s0", "wv[j]");
                if w1.is_some() {
                    dequant(w, "w1", "s1", "wv[CW + j]");
                }
            });
            w.for_unrolled("m", 0, "MT", |w| {
                w.if_block("m < mr", |w| {
                    w.line("float xv[VW];");
                    w.line("ld_vec<VW>(xs + m * KC + kk, xv);");
                    w.for_unrolled("j", 0, "NA", |w| {
                        w.for_unrolled("e", 0, "VW", |w| {
                            w.line("acc[m][j] = fmaf(wv[j][e], xv[e], acc[m][j]);");
                        });
                    });
                });
            });
        });
    });
    w.comment("reduce across the warp: every lane ends with every sum");
    w.for_unrolled("m", 0, "MT", |w| {
        w.if_block("m < mr", |w| {
            w.for_unrolled("j", 0, "NA", |w| w.line("acc[m][j] = warp_sum(acc[m][j]);"));
        });
    });
    emit_lane_epilogues(w, p);
    emit_argmax_partials(w, p);
    let launch = gemv_launch(p, t, mt);
    Ok(kb.finish_as(&fmt.name(), launch))
}

/// Argmax partials each row gets (the grid's x extent) under work split `t`.
pub fn partials_per_row(p: &GemvParams, t: &GemvTiling) -> u32 {
    p.n.div_ceil(t.warps * t.cols_per_warp)
}
