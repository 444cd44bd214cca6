//! Reductions and normalisation: reduce, argmax, topk, softmax, rmsnorm (matmul is in
//! `matmul.rs`).

use super::tensor::{round_bf16, round_to, wrap_int, Data, Tensor};
use super::util::{argmax_row, dot, f32s, last_dim, sum, topk_row, OpResult, Out};
use crate::op::ReduceOp;
use crate::DType;

pub(crate) fn reduce(op: ReduceOp, x: &Tensor, out: &Out) -> OpResult {
    let n = last_dim(x);
    Ok(match &x.data {
        Data::F32(v) => out.f32(
            rows_or_empty(v, n, out.numel())
                .map(|r| {
                    let s = match op {
                        ReduceOp::Sum => sum(r),
                        ReduceOp::Max => r.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)),
                    };
                    round_to(out.dtype, s)
                })
                .collect(),
        ),
        Data::I64(v) => out.i64(
            rows_or_empty(v, n, out.numel())
                .map(|r| {
                    let s = match op {
                        ReduceOp::Sum => r.iter().fold(0i64, |a, &b| a.wrapping_add(b)),
                        ReduceOp::Max => r.iter().copied().max().unwrap_or(i64::MIN),
                    };
                    wrap_int(out.dtype, s)
                })
                .collect(),
        ),
    })
}

/// The `count` rows of a `[..., n]` buffer (empty rows when `n == 0`).
fn rows_or_empty<T>(v: &[T], n: usize, count: usize) -> impl Iterator<Item = &[T]> {
    (0..count).map(move |i| {
        if n == 0 {
            &v[..0]
        } else {
            &v[i * n..(i + 1) * n]
        }
    })
}

pub(crate) fn argmax(x: &Tensor, out: &Out) -> OpResult {
    let n = last_dim(x);
    let count = out.numel();
    let v: Vec<i64> = match &x.data {
        Data::F32(v) => rows_or_empty(v, n, count)
            .map(|r| argmax_row(r) as i64)
            .collect(),
        Data::I64(v) => rows_or_empty(v, n, count)
            .map(|r| argmax_row(r) as i64)
            .collect(),
    };
    Ok(out.i64(v))
}

pub(crate) fn topk(x: &Tensor, k: usize, out: &Out) -> OpResult {
    let n = last_dim(x);
    if k > n {
        return Err(format!("topk k={k} > {n}"));
    }
    let mut idx = Vec::with_capacity(n);
    let mut res = Vec::with_capacity(out.numel());
    let count = out.numel() / k.max(1);
    match &x.data {
        Data::F32(v) => {
            for r in rows_or_empty(v, n, count) {
                topk_row(r, k, &mut idx);
                res.extend(idx.iter().map(|&i| i as i64));
            }
        }
        Data::I64(v) => {
            for r in rows_or_empty(v, n, count) {
                topk_row(r, k, &mut idx);
                res.extend(idx.iter().map(|&i| i as i64));
            }
        }
    }
    Ok(out.i64(res))
}

/// Softmax of one row into `dst` (f32): `exp(x - max) / Σ exp(x - max)`. A row with no
/// finite maximum (all `-inf`) gives zeros.
pub(crate) fn softmax_row(src: &[f32], dst: &mut [f32]) {
    let m = src.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if m == f32::NEG_INFINITY {
        dst.fill(0.0);
        return;
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = (s - m).exp();
    }
    let z = sum(dst);
    for d in dst.iter_mut() {
        *d /= z;
    }
}

pub(crate) fn softmax(x: &Tensor, out: &Out) -> OpResult {
    let v = f32s(x, "softmax input")?;
    let n = last_dim(x);
    let mut res = vec![0.0f32; v.len()];
    if n > 0 {
        for (s, d) in v.chunks(n).zip(res.chunks_mut(n)) {
            softmax_row(s, d);
        }
    }
    Ok(out.f32(res))
}

/// HF Llama order: `y = round(x · rsqrt(Σx²/N + eps))`, then `round(y · w)`, rounding to
/// the input dtype; `Σx²/N` and the rsqrt (`1 / sqrt`) in f32.
pub(crate) fn rmsnorm(x: &Tensor, w: &Tensor, eps: f64, out: &Out) -> OpResult {
    let xv = f32s(x, "rmsnorm input")?;
    let wv = f32s(w, "rmsnorm weight")?;
    let n = wv.len();
    let d = out.dtype;
    let eps = eps as f32;
    let mut res = Vec::with_capacity(xv.len());
    if n > 0 {
        for r in xv.chunks(n) {
            let ms = dot(r, r) / n as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            // The dtype chosen once per row, so the bf16 pass is a plain loop.
            match d {
                DType::BF16 => res.extend(
                    r.iter()
                        .zip(wv)
                        .map(|(&x, &w)| round_bf16(round_bf16(x * inv) * w)),
                ),
                _ => res.extend(
                    r.iter()
                        .zip(wv)
                        .map(|(&x, &w)| round_to(d, round_to(d, x * inv) * w)),
                ),
            }
        }
    }
    Ok(out.f32(res))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::op::{Op, ReduceOp};
    use crate::DType;

    #[test]
    fn reduce_sum_max() {
        let x = tf(DType::F32, &[2, 3], &[1.0, 2.0, 3.0, -1.0, -5.0, -2.0]);
        let r = run_op(Op::Reduce(ReduceOp::Sum), vec![x.clone()]);
        assert_eq!(r.as_f32().unwrap(), &[6.0, -8.0]);
        let r = run_op(Op::Reduce(ReduceOp::Max), vec![x]);
        assert_eq!(r.as_f32().unwrap(), &[3.0, -1.0]);
        let x = ti(DType::I32, &[3], &[4, -9, 2]);
        let r = run_op(Op::Reduce(ReduceOp::Max), vec![x.clone()]);
        assert_eq!(r.as_i64().unwrap(), &[4]);
        let r = run_op(Op::Reduce(ReduceOp::Sum), vec![x]);
        assert_eq!(r.as_i64().unwrap(), &[-3]);
        // bf16 result: 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly (f32 sum, one rounding).
        let x = tf(DType::F32, &[3], &[1.0, 0.00390625, 0.00390625]);
        let x = run_op(Op::Cast { to: DType::BF16 }, vec![x]);
        let r = run_op(Op::Reduce(ReduceOp::Sum), vec![x]);
        assert_eq!(r.as_f32().unwrap(), &[1.0078125]);
    }

    #[test]
    fn argmax_lowest_index_wins() {
        let x = tf(
            DType::BF16,
            &[2, 4],
            &[1.0, 5.0, 5.0, 2.0, -3.0, -1.0, -2.0, -1.0],
        );
        let r = run_op(Op::Argmax, vec![x]);
        assert_eq!(r.dtype, DType::I32);
        assert_eq!(r.as_i64().unwrap(), &[1, 1]);
    }

    #[test]
    fn topk_ties_by_lower_index() {
        let x = tf(
            DType::F32,
            &[2, 5],
            &[0.1, 0.7, 0.3, 0.7, 0.0, 2.0, 2.0, 2.0, 2.0, 2.0],
        );
        let r = run_op(Op::TopK { k: 3 }, vec![x]);
        assert_eq!(r.shape, vec![2, 3]);
        assert_eq!(r.as_i64().unwrap(), &[1, 3, 2, 0, 1, 2]);
        let x = ti(DType::I64, &[4], &[3, 9, 3, 9]);
        let r = run_op(Op::TopK { k: 4 }, vec![x]);
        assert_eq!(r.as_i64().unwrap(), &[1, 3, 0, 2]);
    }

    #[test]
    fn softmax_rows() {
        let l2 = 2f32.ln();
        let x = tf(
            DType::F32,
            &[2, 3],
            &[0.0, l2, 2.0 * l2, 5.0, f32::NEG_INFINITY, 5.0],
        );
        let r = run_op(Op::Softmax, vec![x]);
        // e^0 : e^ln2 : e^2ln2 = 1 : 2 : 4.
        assert_close(
            r.as_f32().unwrap(),
            &[1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0, 0.5, 0.0, 0.5],
            1e-6,
        );
        let x = tf(DType::BF16, &[2], &[f32::NEG_INFINITY; 2]);
        let r = run_op(Op::Softmax, vec![x]);
        assert_eq!(r.dtype, DType::F32);
        assert_eq!(r.as_f32().unwrap(), &[0.0, 0.0]);
    }

    #[test]
    fn rmsnorm_f32() {
        // x = [3, 4]: mean(x²) = 12.5, rsqrt(12.5 + 0.5) = 1/sqrt(13).
        let x = tf(DType::F32, &[1, 2], &[3.0, 4.0]);
        let w = tf(DType::F32, &[2], &[1.0, 2.0]);
        let r = run_op(Op::RmsNorm { eps: 0.5 }, vec![x, w]);
        let s = 13f32.sqrt();
        assert_close(r.as_f32().unwrap(), &[3.0 / s, 8.0 / s], 1e-6);
    }

    #[test]
    fn rmsnorm_bf16_rounds_before_weight() {
        // x = [2, 3], eps 0: mean(x²) = 6.5, y = x / sqrt(6.5) = [0.78446454, 1.1766968]
        // -> bf16 [0.78515625, 1.1796875]; × w 1.25 = [0.98144531, 1.4746094]
        // -> bf16 [0.98046875, 1.4765625] (HF order). Rounding once instead would give
        // 1.1766968 × 1.25 = 1.4708710 -> 1.46875 for the second element.
        let x = tf(DType::BF16, &[1, 2], &[2.0, 3.0]);
        let w = tf(DType::BF16, &[2], &[1.25, 1.25]);
        let r = run_op(Op::RmsNorm { eps: 0.0 }, vec![x, w]);
        assert_eq!(r.as_f32().unwrap(), &[0.98046875, 1.4765625]);
    }

    #[test]
    fn matmul_plain_bf16() {
        // x [2, 3], w [2, 3]: out = x · wᵀ.
        let x = tf(DType::BF16, &[2, 3], &[1.0, 2.0, 3.0, 0.5, -1.0, 0.25]);
        let w = tf(DType::BF16, &[2, 3], &[1.0, 0.0, 1.0, 2.0, 2.0, 2.0]);
        let r = run_op(Op::MatMul, vec![x, w]);
        assert_eq!(r.shape, vec![2, 2]);
        assert_eq!(r.as_f32().unwrap(), &[4.0, 12.0, 0.75, -0.5]);
        // One rounding at the end: 1 + 3·2^-9 = 1.005859375 -> bf16 1.0078125, whereas
        // rounding each partial sum to bf16 would stay at 1.0.
        let x = tf(
            DType::BF16,
            &[1, 4],
            &[1.0, 0.001953125, 0.001953125, 0.001953125],
        );
        let w = tf(DType::BF16, &[1, 4], &[1.0; 4]);
        let r = run_op(Op::MatMul, vec![x, w]);
        assert_eq!(r.as_f32().unwrap(), &[1.0078125]);
    }

    #[test]
    fn matmul_int4_groups() {
        // w [2, 4] with group 2: scale [2, 2]. Row 0: q = [1, -2, 3, -8], scales [0.5, 2].
        // dequant = [0.5, -1, 6, -16]; x = [1, 1, 1, 0.5] -> 0.5 - 1 + 6 - 8 = -2.5.
        // Row 1: q = [7, 0, 0, 1], scales [1, -1] -> [7, 0, 0, -1]; x· = 7 - 0.5 = 6.5.
        let x = tf(DType::F32, &[1, 4], &[1.0, 1.0, 1.0, 0.5]);
        let w = ti(
            DType::Int4Group { group: 2 },
            &[2, 4],
            &[1, -2, 3, -8, 7, 0, 0, 1],
        );
        let s = tf(DType::BF16, &[2, 2], &[0.5, 2.0, 1.0, -1.0]);
        let r = run_op(Op::MatMul, vec![x, w, s]);
        assert_eq!(r.as_f32().unwrap(), &[-2.5, 6.5]);
    }

    #[test]
    fn matmul_fp8_blocks() {
        // w [130, 1] -> scale [2, 1]: rows 0..128 use scale 2, rows 128..130 use scale 0.5.
        let x = tf(DType::F32, &[1, 1], &[3.0]);
        let w = tf(DType::Fp8E4M3, &[130, 1], &[1.5; 130]);
        let s = tf(DType::F32, &[2, 1], &[2.0, 0.5]);
        let r = run_op(Op::MatMul, vec![x, w, s]);
        let r = r.as_f32().unwrap();
        assert_eq!((r[0], r[127], r[128], r[129]), (9.0, 9.0, 2.25, 2.25));
        // A wrong scale shape is an error naming the expected shape.
        let x = tf(DType::F32, &[1, 1], &[3.0]);
        let w = tf(DType::Fp8E4M3, &[130, 1], &[1.5; 130]);
        let s = tf(DType::F32, &[1, 1], &[2.0]);
        let e = try_run_op(Op::MatMul, vec![x, w, s]).unwrap_err();
        assert!(e.to_string().contains("[2, 1]"), "{e}");
    }

    #[test]
    fn dequantize_fp8_partial_blocks_on_both_axes() {
        // w [130, 129]: scale [2, 2]; block (0,0) ×2, (0,1) ×3, (1,0) ×5, (1,1) ×7. The
        // partial blocks (row 128.., column 128) take their block's scale.
        let w = tf(DType::Fp8E4M3, &[130, 129], &[-1.5; 130 * 129]);
        let s = tf(DType::F32, &[2, 2], &[2.0, 3.0, 5.0, 7.0]);
        let r = run_op(Op::Dequantize { to: DType::F32 }, vec![w, s]);
        assert_eq!(r.dtype, DType::F32);
        let v = r.as_f32().unwrap();
        let at = |i: usize, j: usize| v[i * 129 + j];
        assert_eq!(
            (at(0, 0), at(127, 127), at(0, 128), at(129, 0), at(129, 128)),
            (-3.0, -3.0, -4.5, -7.5, -10.5)
        );
        // A matmul against a one-hot x reads the same column.
        let mut x = vec![0.0f32; 129];
        x[128] = 1.0;
        let x = tf(DType::F32, &[1, 129], &x);
        let w = tf(DType::Fp8E4M3, &[130, 129], &[-1.5; 130 * 129]);
        let s = tf(DType::F32, &[2, 2], &[2.0, 3.0, 5.0, 7.0]);
        let m = run_op(Op::MatMul, vec![x, w, s]);
        let m = m.as_f32().unwrap();
        assert_eq!((m[0], m[129]), (-4.5, -10.5));
    }

    #[test]
    fn dequantize_int4_rounds_to_the_target() {
        // q [1, 4] group 2, scales [0.3, 1.0]: [3·0.3, -8·0.3, 7, -1] in f32, then bf16.
        let w = ti(DType::Int4Group { group: 2 }, &[1, 4], &[3, -8, 7, -1]);
        let s = tf(DType::F32, &[1, 2], &[0.3, 1.0]);
        let r = run_op(
            Op::Dequantize { to: DType::F32 },
            vec![w.clone(), s.clone()],
        );
        assert_eq!(
            r.as_f32().unwrap(),
            &[3.0 * 0.3f32, -8.0 * 0.3f32, 7.0, -1.0]
        );
        let r = run_op(Op::Dequantize { to: DType::BF16 }, vec![w, s]);
        let want: Vec<f32> = [3.0 * 0.3f32, -8.0 * 0.3f32, 7.0, -1.0]
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        assert_eq!(r.as_f32().unwrap(), want.as_slice());
    }

    #[test]
    fn quantised_weight_without_scale_is_refused() {
        let x = tf(DType::F32, &[1, 4], &[1.0; 4]);
        let w = ti(DType::Int4Group { group: 2 }, &[1, 4], &[0; 4]);
        let e = try_run_op(Op::MatMul, vec![x, w]).unwrap_err();
        assert!(e.to_string().contains("needs a scale"), "{e}");
        // An int4 scale with the wrong group count names the shape it wants.
        let x = tf(DType::F32, &[1, 4], &[1.0; 4]);
        let w = ti(DType::Int4Group { group: 2 }, &[1, 4], &[0; 4]);
        let s = tf(DType::BF16, &[1, 4], &[1.0; 4]);
        let e = try_run_op(Op::MatMul, vec![x, w, s]).unwrap_err();
        assert!(e.to_string().contains("[1, 2]"), "{e}");
    }
}
