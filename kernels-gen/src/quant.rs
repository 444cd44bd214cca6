//! Quantised weights as the kernels read them: the stored bytes of a `[N, K]` weight and its
//! scales (REFERENCE.md "Weight formats"), never expanded in device memory. The dequantised
//! value is the interpreter's (`WeightRows`, ir/src/interp/matmul.rs): `q · scale` in f32
//! (`cuda/quant.cuh` decodes q exactly), then the product with x in f32.
//!
//! - [`QuantFormat::Int4`] (compressed-tensors `pack-quantized`): a row is `K / 2` bytes,
//!   byte `c / 2` holds column `c` (low nibble for even `c`) as `u = q + 8`; scales
//!   `[N, K / group]` of any float dtype. The runtime uploads the checkpoint's i32 words
//!   unchanged: little-endian words make nibble `i` of word `j` column `8j + i`.
//! - [`QuantFormat::Fp8Block`]: one e4m3fn byte per element; f32 scales
//!   `[⌈N / 128⌉, ⌈K / 128⌉]`, partial edge blocks covering the rows / columns that exist.

use specc_ir::{DType, FP8_BLOCK};

use crate::abi::Dtype;
use crate::Error;

/// How a weight matrix is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    Int4 { group: u32 },
    Fp8Block,
}

impl QuantFormat {
    /// The format of IR weight dtype `d`, if it is quantised.
    pub fn of(d: DType) -> Option<QuantFormat> {
        match d {
            DType::Int4Group { group } => Some(QuantFormat::Int4 { group }),
            DType::Fp8E4M3 => Some(QuantFormat::Fp8Block),
            _ => None,
        }
    }

    /// The name in kernel names (`int4g32`, `fp8e4m3`).
    pub fn name(self) -> String {
        match self {
            QuantFormat::Int4 { group } => format!("int4g{group}"),
            QuantFormat::Fp8Block => "fp8e4m3".to_string(),
        }
    }

    /// Bytes of one stored row of `k` columns.
    pub fn row_bytes(self, k: u64) -> u64 {
        match self {
            QuantFormat::Int4 { .. } => k / 2,
            QuantFormat::Fp8Block => k,
        }
    }

    /// Stored bytes of the weight `[n, k]` (scales not included).
    pub fn weight_bytes(self, n: u64, k: u64) -> u64 {
        n * self.row_bytes(k)
    }

    /// Scale columns of a `[n, k]` weight (the scale's row stride).
    pub fn scale_cols(self, k: u64) -> u64 {
        match self {
            QuantFormat::Int4 { group } => k / group as u64,
            QuantFormat::Fp8Block => k.div_ceil(FP8_BLOCK),
        }
    }

    /// Scale rows of a `[n, k]` weight.
    pub fn scale_rows(self, n: u64) -> u64 {
        match self {
            QuantFormat::Int4 { .. } => n,
            QuantFormat::Fp8Block => n.div_ceil(FP8_BLOCK),
        }
    }

    /// Elements of one scale tensor of a `[n, k]` weight.
    pub fn scale_numel(self, n: u64, k: u64) -> u64 {
        self.scale_rows(n) * self.scale_cols(k)
    }

    /// Checks `k` and the scale dtype against the format's rules (int4: `k` a multiple of 8
    /// and of the group; fp8: f32 scales).
    pub fn check(self, family: &'static str, k: u64, scale: Dtype) -> Result<(), Error> {
        match self {
            QuantFormat::Int4 { group } => {
                if group == 0 || !k.is_multiple_of(8) || !k.is_multiple_of(group as u64) {
                    return Err(Error::param(
                        family,
                        "k",
                        format!(
                            "{k} in-features must be a multiple of 8 and of the int4 group {group}"
                        ),
                    ));
                }
                if !scale.is_float() {
                    return Err(Error::param(family, "scale", "int4 scales must be floats"));
                }
            }
            QuantFormat::Fp8Block => {
                if !k.is_multiple_of(4) {
                    return Err(Error::param(
                        family,
                        "k",
                        format!("{k} fp8 in-features must be a multiple of 4 (word loads)"),
                    ));
                }
                if scale != Dtype::F32 {
                    return Err(Error::param(
                        family,
                        "scale",
                        "fp8 block scales must be f32",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Elements per weight load for rows of `k` columns (16 where the rows allow it: int4
    /// 8-byte, fp8 16-byte loads; else 8, or fp8 4).
    pub fn vec(self, k: u64) -> u32 {
        let widths: &[u32] = match self {
            QuantFormat::Int4 { .. } => &[16, 8],
            QuantFormat::Fp8Block => &[16, 8, 4],
        };
        widths
            .iter()
            .copied()
            .find(|&v| k.is_multiple_of(v as u64))
            .unwrap_or(4)
    }

    /// Bytes of one weight load of `vec` elements.
    pub fn load_bytes(self, vec: u32) -> u64 {
        self.row_bytes(vec as u64)
    }

    /// C++ statement loading `vec` unscaled elements at byte pointer `ptr` into `dst`.
    pub fn load_stmt(self, vec: &str, ptr: &str, dst: &str) -> String {
        match self {
            QuantFormat::Int4 { .. } => format!("ld_stream_int4<{vec}>({ptr}, {dst});"),
            QuantFormat::Fp8Block => format!("ld_stream_fp8<{vec}>({ptr}, {dst});"),
        }
    }

    /// C++ expression: the unscaled element at column `col` of the row at byte pointer `row`.
    pub fn elem_expr(self, row: &str, col: &str) -> String {
        match self {
            QuantFormat::Int4 { .. } => format!("ld_int4({row}, {col})"),
            QuantFormat::Fp8Block => format!("ld_fp8({row}, {col})"),
        }
    }

    /// C++ expression: the scale (as f32) of element `(row, col)` from the scale pointer
    /// `sc` (typed as the scale dtype), for rows of `k` columns.
    pub fn scale_expr(self, sc: &str, row: &str, col: &str, k: u64) -> String {
        let at = self.scale_at(sc, row, col, k);
        match self {
            QuantFormat::Int4 { .. } => format!("to_f32({at})"),
            QuantFormat::Fp8Block => at,
        }
    }

    /// C++ expression: the stored scale of element `(row, col)` (in the scale dtype), as
    /// [`QuantFormat::scale_expr`] reads it.
    pub fn scale_at(self, sc: &str, row: &str, col: &str, k: u64) -> String {
        let cols = self.scale_cols(k);
        match self {
            QuantFormat::Int4 { group } => {
                format!("{sc}[(long long)({row}) * {cols} + ({col}) / {group}]")
            }
            QuantFormat::Fp8Block => {
                format!("{sc}[(long long)(({row}) / {FP8_BLOCK}) * {cols} + ({col}) / {FP8_BLOCK}]")
            }
        }
    }

    /// Whether one scale covers every load of `vec` elements (loads start at multiples of
    /// `vec`).
    pub fn one_scale_per_load(self, vec: u32) -> bool {
        match self {
            QuantFormat::Int4 { group } => group.is_multiple_of(vec),
            QuantFormat::Fp8Block => (FP8_BLOCK as u32).is_multiple_of(vec),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_the_stored_ones() {
        let i4 = QuantFormat::Int4 { group: 32 };
        assert_eq!(i4.weight_bytes(4, 64), 128);
        assert_eq!(i4.scale_numel(4, 64), 8);
        let f8 = QuantFormat::Fp8Block;
        assert_eq!(f8.weight_bytes(144, 160), 144 * 160);
        assert_eq!(f8.scale_numel(144, 160), 4);
        assert_eq!(f8.vec(136), 8);
        assert_eq!(i4.vec(40), 8);
        assert!(f8.check("t", 160, Dtype::BF16).is_err());
        assert!(i4.check("t", 48, Dtype::BF16).is_err());
    }
}
