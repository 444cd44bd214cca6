//! Host images of quantised weights for the device tests: random int4 / fp8 bytes as a
//! checkpoint stores them, with the interpreter's tensor of the same values.

use super::Rng;
use specc_ir::interp::Tensor;
use specc_ir::DType;
use specc_kernels_gen::abi::Dtype;
use specc_kernels_gen::quant::QuantFormat;

/// The e4m3fn value of byte `b` (not NaN).
pub fn fp8_value(b: u8) -> f64 {
    let (e, m) = (((b >> 3) & 15) as i32, (b & 7) as f64);
    let mag = if e == 0 {
        m / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    if b & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// A random `[n, k]` weight stored as `f`: its bytes and the interpreter's tensor.
pub fn weight(f: QuantFormat, n: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Tensor) {
    match f {
        QuantFormat::Int4 { group } => {
            let q: Vec<i64> = (0..n * k)
                .map(|_| (rng.next(8.0).floor() as i64).clamp(-8, 7))
                .collect();
            let mut bytes = vec![0u8; n * k / 2];
            for (i, &v) in q.iter().enumerate() {
                bytes[i / 2] |= ((v + 8) as u8) << (4 * (i % 2));
            }
            (
                bytes,
                Tensor::from_i64(DType::Int4Group { group }, vec![n, k], q),
            )
        }
        QuantFormat::Fp8Block => {
            // Any byte but the NaNs (S.1111.111), magnitudes up to 448.
            let bytes: Vec<u8> = (0..n * k)
                .map(|_| {
                    let b = (rng.next(128.0) + 128.0) as u8;
                    if b & 0x7f == 0x7f {
                        b - 1
                    } else {
                        b
                    }
                })
                .collect();
            let vals = bytes.iter().map(|&b| fp8_value(b) as f32).collect();
            (bytes, Tensor::from_f32(DType::Fp8E4M3, vec![n, k], vals))
        }
    }
}

/// The scale dtype of `f`: bf16 for int4 (as Kimi ships it), f32 for fp8.
pub fn scale_dtype(f: QuantFormat) -> Dtype {
    match f {
        QuantFormat::Int4 { .. } => Dtype::BF16,
        QuantFormat::Fp8Block => Dtype::F32,
    }
}

/// Scales of a `[n, k]` weight as `f` wants them: bf16 per int4 group, f32 per fp8 block.
pub fn scales(f: QuantFormat, n: usize, k: usize, rng: &mut Rng) -> (Dtype, Vec<usize>, Vec<f64>) {
    let shape = vec![
        f.scale_rows(n as u64) as usize,
        f.scale_cols(k as u64) as usize,
    ];
    let vals = (0..shape[0] * shape[1])
        .map(|_| (1.0 + rng.next(0.5)) * 0.02)
        .collect();
    (scale_dtype(f), shape, vals)
}
