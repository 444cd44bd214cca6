//! Quantised kernels at the shapes that matter: Kimi-K2's routed-expert and attention
//! projections (K = 7168 / 2048, int4 group 32 and fp8 blocks) and the quantised fixtures'
//! odd in-features (fp8 136 and 200: 8-element loads; int4 group 8 with 40: one-word
//! loads, and with 48: two scales per load), at the row
//! counts of decode (1), verify (2, 6, 16) and trees (64).

#![allow(dead_code)]

pub mod grouped;

use specc_ir::DType;
use specc_ir::Op;
use specc_kernels_gen::abi::{Dtype, KernelSource, Loc, Rows, View};
use specc_kernels_gen::gemv::{GemvParams, GemvWeights, RmsNormPrologue};
use specc_kernels_gen::gemv_quant::{gemv_quant, QuantWeights};
use specc_kernels_gen::generic::{single, TensorArg};
use specc_kernels_gen::quant::QuantFormat;

pub const ROWS: [u32; 5] = [1, 2, 6, 16, 64];

pub fn int4() -> QuantFormat {
    QuantFormat::Int4 { group: 32 }
}

/// The scale dtype of `f`: bf16 for int4 (as Kimi ships it), f32 for fp8.
pub fn scale_dtype(f: QuantFormat) -> Dtype {
    match f {
        QuantFormat::Int4 { .. } => Dtype::BF16,
        QuantFormat::Fp8Block => Dtype::F32,
    }
}

/// What the epilogue does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Store,
    Residual,
    GateUp,
    NormedArgmax,
}

/// A quantised GEMV over `rows` rows of `x` (`act`) with weights `[n, k]` stored as `f`.
/// Weights in table slots 0 / 1, scales in 2 / 3, the norm weight in 4; activations in
/// the arena.
pub fn params(
    f: QuantFormat,
    act: Dtype,
    rows: u32,
    k: u32,
    n: u32,
    kind: Kind,
) -> (GemvParams, QuantWeights) {
    let gate_up = kind == Kind::GateUp;
    let (weights, scales) = if gate_up {
        (
            GemvWeights::GateUp {
                gate: Loc::table(0),
                up: Loc::table(1),
            },
            GemvWeights::GateUp {
                gate: Loc::table(2),
                up: Loc::table(3),
            },
        )
    } else {
        (
            GemvWeights::Single(Loc::table(0)),
            GemvWeights::Single(Loc::table(2)),
        )
    };
    let out_at = (rows as u64 * k as u64 * act.size()).next_multiple_of(256);
    let res_at = out_at + (rows as u64 * n as u64 * act.size()).next_multiple_of(256);
    let part_at = res_at + (rows as u64 * n as u64 * act.size()).next_multiple_of(256);
    let p = GemvParams {
        rows: Rows::Fixed(rows),
        row_tile: rows.min(64),
        k,
        n,
        x: View::new(Loc::arena(0), act, k as u64),
        weights,
        w_dtype: act,
        norm: (kind == Kind::NormedArgmax).then_some(RmsNormPrologue {
            weight: Loc::table(4),
            dtype: act,
            eps: 1e-6,
        }),
        residual: (kind == Kind::Residual).then_some(View::new(Loc::arena(res_at), act, n as u64)),
        out: Some(View::new(Loc::arena(out_at), act, n as u64)),
        argmax_partials: (kind == Kind::NormedArgmax).then_some(Loc::arena(part_at)),
        rope: None,
    };
    let q = QuantWeights {
        format: f,
        scales,
        scale_dtype: scale_dtype(f),
    };
    (p, q)
}

/// Every quantised kernel of the matrix, labelled.
pub fn all() -> Vec<(String, KernelSource)> {
    let mut out = Vec::new();
    let g8 = QuantFormat::Int4 { group: 8 };
    let shapes: [(QuantFormat, u32, u32, Kind); 9] = [
        (int4(), 7168, 2048, Kind::GateUp),
        (int4(), 2048, 7168, Kind::Residual),
        (g8, 40, 24, Kind::Store),
        (g8, 48, 24, Kind::GateUp),
        (QuantFormat::Fp8Block, 7168, 1536, Kind::Store),
        (QuantFormat::Fp8Block, 7168, 2048, Kind::GateUp),
        (QuantFormat::Fp8Block, 200, 160, Kind::Residual),
        (QuantFormat::Fp8Block, 136, 128, Kind::Store),
        (QuantFormat::Fp8Block, 7168, 1000, Kind::NormedArgmax),
    ];
    for (f, k, n, kind) in shapes {
        for act in [Dtype::BF16, Dtype::F32] {
            for rows in ROWS {
                let (p, q) = params(f, act, rows, k, n, kind);
                let k_src = gemv_quant(&p, &q).unwrap_or_else(|e| panic!("{e}"));
                out.push((
                    format!(
                        "gemv_q {} {kind:?} K={k} N={n} {} M={rows}",
                        f.name(),
                        act.name()
                    ),
                    k_src,
                ));
            }
        }
    }
    for (w, s, e, f, h) in [
        (
            DType::Int4Group { group: 32 },
            DType::BF16,
            8u64,
            32u64,
            64u64,
        ),
        (DType::Fp8E4M3, DType::F32, 8, 48, 160),
    ] {
        let arg = |at: u64, dt, dims: &[u64]| TensorArg::new(Loc::arena(at << 20), dt, dims);
        let fmt = QuantFormat::of(w).unwrap();
        let ops = [
            arg(0, DType::F32, &[3, h]),
            arg(1, DType::F32, &[3, e]),
            arg(2, w, &[e, f, h]),
            arg(3, w, &[e, f, h]),
            arg(4, w, &[e, h, f]),
            arg(5, s, &[e, fmt.scale_rows(f), fmt.scale_cols(h)]),
            arg(6, s, &[e, fmt.scale_rows(f), fmt.scale_cols(h)]),
            arg(7, s, &[e, fmt.scale_rows(h), fmt.scale_cols(f)]),
        ];
        let y = arg(8, DType::F32, &[3, h]);
        for k in single(&Op::MoeExperts, &ops, &y).unwrap_or_else(|e| panic!("{e}")) {
            out.push((format!("moe_experts {w}"), k));
        }
        let deq = arg(9, DType::F32, &[f, h]);
        let wk = arg(2, w, &[f, h]);
        let sk = arg(5, s, &[fmt.scale_rows(f), fmt.scale_cols(h)]);
        for k in single(&Op::Dequantize { to: DType::F32 }, &[wk, sk], &deq)
            .unwrap_or_else(|e| panic!("{e}"))
        {
            out.push((format!("dequantize {w}"), k));
        }
    }
    out.extend(grouped::all());
    out
}
