//! Interpreter tensors and the rounding of f32 values to narrower float types.

use std::fmt;

use crate::{DType, IrError};

/// Element storage. Float types (`bf16`, `f16`, `f32`, `fp8e4m3`) hold f32 values that are
/// exactly representable in the tensor's dtype; `i32`, `i64` and `bool` (0/1) hold i64, and so
/// do `int4g` weights (one unpacked value `q` in `-8..=7` per element, shape `[N, K]`; the
/// group scales are a separate tensor).
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dense row-major tensor.
///
/// Invariants: `data.len() == shape.iter().product()`; the `Data` variant matches `dtype`
/// (see [`Data`]); float values are already rounded to `dtype`; `i32` values fit in i32 and
/// `bool` values are 0 or 1.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Data,
}

/// Whether a dtype is stored as [`Data::F32`].
pub(crate) fn stored_as_f32(dtype: DType) -> bool {
    dtype.is_float()
}

impl Tensor {
    /// Little-endian bytes of the values as kernels read this dtype (bf16/f16 as 2 bytes,
    /// i32 as 4, bool as 1): the layout of a value in the arena or a derived weight.
    pub fn le_bytes(&self) -> Vec<u8> {
        match &self.data {
            Data::F32(v) => match self.dtype {
                DType::BF16 => v
                    .iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                    .collect(),
                DType::F16 => v
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect(),
                _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            },
            Data::I64(v) => match self.dtype {
                DType::I64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                DType::Bool => v.iter().map(|&x| u8::from(x != 0)).collect(),
                _ => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
            },
        }
    }

    /// A float tensor; every value is rounded to `dtype` (round-to-nearest-even, fp8
    /// saturating).
    ///
    /// # Panics
    /// If `dtype` is not a float type or `data` does not have `shape`'s element count.
    pub fn from_f32(dtype: DType, shape: Vec<usize>, mut data: Vec<f32>) -> Tensor {
        assert!(
            stored_as_f32(dtype),
            "Tensor::from_f32 with non-float dtype {dtype}"
        );
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "Tensor::from_f32: {} values for shape {shape:?}",
            data.len()
        );
        round_slice(dtype, &mut data);
        Tensor {
            dtype,
            shape,
            data: Data::F32(data),
        }
    }

    /// An integer, bool or `int4g` tensor. `i32` values wrap to 32 bits and `bool` values
    /// become 0/1.
    ///
    /// # Panics
    /// If `dtype` is a float type, `data` does not have `shape`'s element count, or an
    /// `int4g` value lies outside `-8..=7`.
    pub fn from_i64(dtype: DType, shape: Vec<usize>, mut data: Vec<i64>) -> Tensor {
        assert!(
            !stored_as_f32(dtype),
            "Tensor::from_i64 with float dtype {dtype}"
        );
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "Tensor::from_i64: {} values for shape {shape:?}",
            data.len()
        );
        if let DType::Int4Group { .. } = dtype {
            if let Some(v) = data.iter().find(|v| !(-8..=7).contains(*v)) {
                panic!("Tensor::from_i64: int4 value {v} outside -8..=7");
            }
        }
        for v in &mut data {
            *v = wrap_int(dtype, *v);
        }
        Tensor {
            dtype,
            shape,
            data: Data::I64(data),
        }
    }

    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        let data = if stored_as_f32(dtype) {
            Data::F32(vec![0.0; n])
        } else {
            Data::I64(vec![0; n])
        };
        Tensor { dtype, shape, data }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn as_f32(&self) -> Result<&[f32], IrError> {
        match &self.data {
            Data::F32(v) => Ok(v),
            Data::I64(_) => Err(self.wrong_storage("f32")),
        }
    }

    pub fn as_i64(&self) -> Result<&[i64], IrError> {
        match &self.data {
            Data::I64(v) => Ok(v),
            Data::F32(_) => Err(self.wrong_storage("i64")),
        }
    }

    pub fn as_f32_mut(&mut self) -> Result<&mut [f32], IrError> {
        if !matches!(self.data, Data::F32(_)) {
            return Err(self.wrong_storage("f32"));
        }
        match &mut self.data {
            Data::F32(v) => Ok(v),
            Data::I64(_) => unreachable!("checked above"),
        }
    }

    pub fn as_i64_mut(&mut self) -> Result<&mut [i64], IrError> {
        if !matches!(self.data, Data::I64(_)) {
            return Err(self.wrong_storage("i64"));
        }
        match &mut self.data {
            Data::I64(v) => Ok(v),
            Data::F32(_) => unreachable!("checked above"),
        }
    }

    /// Every element as f32 (integers converted), for tests and printing.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            Data::F32(v) => v.clone(),
            Data::I64(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    fn wrong_storage(&self, want: &str) -> IrError {
        IrError::Interp(format!("tensor {self} is not stored as {want}"))
    }

    /// Checks the invariants of [`Tensor`] other than value rounding.
    pub(crate) fn check_storage(&self) -> Result<(), String> {
        if self.data.len() != self.numel() {
            return Err(format!(
                "{} values for shape {:?}",
                self.data.len(),
                self.shape
            ));
        }
        let ok = matches!(
            (&self.data, stored_as_f32(self.dtype)),
            (Data::F32(_), true) | (Data::I64(_), false)
        );
        if !ok {
            let got = match self.data {
                Data::F32(_) => "f32",
                Data::I64(_) => "i64",
            };
            return Err(format!("{} values stored as {got}", self.dtype));
        }
        Ok(())
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.shape)
    }
}

/// `x` rounded to the nearest value of a float `dtype` (ties to even). bf16 and f16 go
/// through `half` (overflow gives ±inf); fp8e4m3 saturates to ±448. Non-float dtypes return
/// `x` unchanged.
#[inline]
pub fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::BF16 => round_bf16(x),
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::Fp8E4M3 => round_fp8e4m3(x),
        _ => x,
    }
}

/// `half::bf16::from_f32(x).to_f32()` without branches: round to nearest even by adding
/// `0x7fff` plus the lowest kept bit and truncating (a carry into the exponent gives ±inf
/// past the largest bf16); a NaN keeps its top payload bits with the quiet bit set.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    let quiet = (b | 0x0040_0000) & 0xffff_0000;
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    f32::from_bits(if nan { quiet } else { rounded })
}

/// `dst[i] = round_to(dtype, src[i])`, the dtype matched once for the whole slice.
#[inline]
pub(crate) fn round_into(dtype: DType, src: &[f32], dst: &mut [f32]) {
    match dtype {
        DType::BF16 => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = round_bf16(s);
            }
        }
        DType::F32 => dst.copy_from_slice(src),
        _ => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = round_to(dtype, s);
            }
        }
    }
}

/// Rounds every value in place (see [`round_to`]).
pub fn round_slice(dtype: DType, xs: &mut [f32]) {
    if matches!(dtype, DType::BF16 | DType::F16 | DType::Fp8E4M3) {
        for x in xs {
            *x = round_to(dtype, *x);
        }
    }
}

/// Largest finite fp8e4m3 (`e4m3fn`: no infinities, exponent bias 7, 3 mantissa bits).
pub const FP8E4M3_MAX: f32 = 448.0;

/// `x` rounded to fp8e4m3 (ties to even), saturating to ±448; NaN stays NaN.
pub fn round_fp8e4m3(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a >= FP8E4M3_MAX {
        return FP8E4M3_MAX.copysign(x);
    }
    if a == 0.0 {
        return x;
    }
    // Spacing of representable values near `a`: 2^(e - 3) for normal exponents e >= -6,
    // 2^-9 for subnormals. Dividing by a power of two is exact, so one round-to-even does it.
    let e = (a.to_bits() >> 23) as i32 - 127;
    let quantum = f32::powi(2.0, e.max(-6) - 3);
    let r = (a / quantum).round_ties_even() * quantum;
    r.min(FP8E4M3_MAX).copysign(x)
}

/// `v` as stored for an integer or bool `dtype`: i32 wraps, bool is `v != 0`.
pub fn wrap_int(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I32 => v as i32 as i64,
        DType::Bool => (v != 0) as i64,
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // bf16 keeps 8 significant bits: near 1 the spacing is 2^-7.
        let t = Tensor::from_f32(
            DType::BF16,
            vec![4],
            vec![1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, 1.003, -2.5e-3],
        );
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa (1.0) wins; 1 + 3·2^-8 is a
        // tie between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(
            t.as_f32().unwrap(),
            &[1.0, 1.0 + 1.0 / 64.0, 1.0, -0.002502441_4]
        );
    }

    /// The branch-free bf16 rounding agrees with `half` on every sign, exponent and a
    /// spread of mantissas (including ties, overflow to inf, subnormals and NaNs).
    #[test]
    fn bf16_rounding_matches_half() {
        let check = |b: u32| {
            let x = f32::from_bits(b);
            let want = half::bf16::from_f32(x).to_f32().to_bits();
            assert_eq!(round_bf16(x).to_bits(), want, "{b:#010x}");
        };
        for hi in 0..=0x1ffu32 {
            for lo in [
                0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1_7fff, 0x1_8000, 0x7f_ffff,
            ] {
                check(hi << 23 | lo);
            }
            for step in 0..64u32 {
                check(hi << 23 | step.wrapping_mul(0x2_1357) & 0x7f_ffff);
            }
        }
    }

    #[test]
    fn f16_rounds() {
        assert_eq!(round_to(DType::F16, 1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(round_to(DType::F16, 70000.0), f32::INFINITY);
        assert_eq!(round_to(DType::F32, 1.0 + 1.0 / 4096.0), 1.0 + 1.0 / 4096.0);
    }

    #[test]
    fn fp8_rounds_and_saturates() {
        let cases = [
            (0.0, 0.0),
            (1.0, 1.0),
            (1.0625, 1.0),  // tie between 1 and 1.125: even (1.0)
            (1.1875, 1.25), // tie between 1.125 and 1.25: even (1.25)
            (1.1, 1.125),
            (-3.3, -3.25),
            (448.0, 448.0),
            (460.0, 448.0), // would round to 448 anyway
            (1000.0, 448.0),
            (f32::INFINITY, 448.0),
            (f32::NEG_INFINITY, -448.0),
            (0.001953125, 0.001953125), // 2^-9, smallest subnormal
            (0.0009765625, 0.0),        // 2^-10: tie between 0 and 2^-9, even is 0
            (0.0029296875, 0.00390625), // 1.5·2^-9: tie, even is 2·2^-9
            (0.015625, 0.015625),       // 2^-6, smallest normal
            (240.0, 240.0),
            (250.0, 256.0), // spacing 32 above 256, 16 in [128, 256): 250 -> 256
        ];
        for (x, want) in cases {
            assert_eq!(round_fp8e4m3(x), want, "fp8({x})");
        }
        assert!(round_fp8e4m3(f32::NAN).is_nan());
    }

    #[test]
    fn ints_wrap_and_bools_normalise() {
        let t = Tensor::from_i64(DType::I32, vec![2], vec![1 << 32, -1]);
        assert_eq!(t.as_i64().unwrap(), &[0, -1]);
        let b = Tensor::from_i64(DType::Bool, vec![3], vec![0, 5, -1]);
        assert_eq!(b.as_i64().unwrap(), &[0, 1, 1]);
        assert!(b.as_f32().is_err());
    }

    #[test]
    #[should_panic(expected = "int4 value 8")]
    fn int4_range_checked() {
        Tensor::from_i64(DType::Int4Group { group: 32 }, vec![1, 2], vec![-8, 8]);
    }

    #[test]
    fn zeros_use_the_right_storage() {
        assert_eq!(
            Tensor::zeros(DType::BF16, vec![2, 1]).data,
            Data::F32(vec![0.0; 2])
        );
        assert_eq!(Tensor::zeros(DType::Bool, vec![0]).data, Data::I64(vec![]));
    }
}
