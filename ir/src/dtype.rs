//! Element types of IR values.

use std::fmt;

/// Rows and columns of one fp8 scale block (`weight_block_size` [128, 128]: DeepSeek-V3,
/// Kimi-K2-Instruct; the only block size the IR defines).
pub const FP8_BLOCK: u64 = 128;
use std::str::FromStr;

/// Element type of a tensor value.
///
/// `Int4Group` is a packed weight format: 8 signed 4-bit values per `i32` word, dequantised
/// by a separate scale weight with one value per `group` input columns (see REFERENCE.md,
/// compressed-tensors `pack-quantized`). It only appears on weights consumed (directly or
/// stacked) by `matmul`, `moe_experts` and `dequantize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    BF16,
    F16,
    F32,
    Fp8E4M3,
    I32,
    I64,
    Bool,
    Int4Group { group: u32 },
}

impl DType {
    /// Bytes per element; `None` for packed formats whose size is not per element.
    pub fn size_bytes(self) -> Option<usize> {
        match self {
            DType::BF16 | DType::F16 => Some(2),
            DType::F32 | DType::I32 => Some(4),
            DType::I64 => Some(8),
            DType::Fp8E4M3 | DType::Bool => Some(1),
            DType::Int4Group { .. } => None,
        }
    }

    /// Storage bytes for `numel` elements as stored: `int4g` packs two values per byte (its
    /// scales are a weight of their own, counted there).
    pub fn storage_bytes(self, numel: u64) -> u64 {
        match self {
            DType::Int4Group { .. } => numel.div_ceil(2),
            other => numel * other.size_bytes().unwrap_or(1) as u64,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32 | DType::Fp8E4M3)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// A type the CPU interpreter can hold as an activation (packed weights cannot).
    pub fn is_activation(self) -> bool {
        !matches!(self, DType::Int4Group { .. })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DType::BF16 => f.write_str("bf16"),
            DType::F16 => f.write_str("f16"),
            DType::F32 => f.write_str("f32"),
            DType::Fp8E4M3 => f.write_str("fp8e4m3"),
            DType::I32 => f.write_str("i32"),
            DType::I64 => f.write_str("i64"),
            DType::Bool => f.write_str("bool"),
            DType::Int4Group { group } => write!(f, "int4g{group}"),
        }
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "bf16" => DType::BF16,
            "f16" => DType::F16,
            "f32" => DType::F32,
            "fp8e4m3" => DType::Fp8E4M3,
            "i32" => DType::I32,
            "i64" => DType::I64,
            "bool" => DType::Bool,
            _ => {
                let group = s
                    .strip_prefix("int4g")
                    .and_then(|g| g.parse::<u32>().ok())
                    .filter(|g| *g > 0)
                    .ok_or_else(|| format!("unknown dtype `{s}`"))?;
                DType::Int4Group { group }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in [
            DType::BF16,
            DType::F16,
            DType::F32,
            DType::Fp8E4M3,
            DType::I32,
            DType::I64,
            DType::Bool,
            DType::Int4Group { group: 32 },
        ] {
            assert_eq!(d.to_string().parse::<DType>().unwrap(), d);
        }
        assert!("int4g0".parse::<DType>().is_err());
        assert!("f64".parse::<DType>().is_err());
    }

    #[test]
    fn int4_storage_is_nibbles() {
        // 2 rows of 64 columns: 64 bytes of nibbles (the scales are their own weight).
        assert_eq!(DType::Int4Group { group: 32 }.storage_bytes(128), 64);
        assert_eq!(DType::BF16.storage_bytes(10), 20);
    }
}
