//! TMA tensor-map operands: a kernel that loads 2-D boxes of a row-major tensor with
//! `cp.async.bulk.tensor.2d` names the tensor as a [`Loc::TensorMap`]; its operand-table
//! entry then points at a 128-byte descriptor (`CUtensorMap`) that the host encodes at load
//! time from the tensor's address and the launch's bucket, instead of at the tensor.
//!
//! Every map here uses the 128-byte swizzle (boxes of exactly 128 bytes per row: 64 16-bit
//! elements) so that a box lands in shared memory bank-conflict free for `ldmatrix`: the
//! 16-byte piece `c` of box row `r` is stored at piece `c ^ (r % 8)` of that row, the
//! destination being 1024-byte aligned. Boxes reaching past the tensor's rows or columns
//! read zeros and touch no memory outside it, so no launch indexes past its tensor whatever
//! the bucket: the descriptor carries the tensor's extent at that bucket.

use crate::abi::{Bucket, Dtype, Loc, Rows};

/// Bytes of one encoded descriptor (`CUtensorMap`); descriptors must be 64-byte aligned
/// (128 here).
pub const DESCRIPTOR_BYTES: u64 = 128;
/// Bytes per box row: the 128-byte swizzle span.
pub const BOX_ROW_BYTES: u32 = 128;
/// Shared-memory alignment of a swizzled box destination.
pub const BOX_SMEM_ALIGN: u32 = 1024;

/// A row-major `[rows, cols]` tensor of 16-bit floats read in boxes of `box_rows` rows by
/// 128 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorMap {
    /// The table slot holding the tensor, or `None` for the arena.
    pub slot: Option<u32>,
    /// Byte offset of element `(0, 0)` in the slot or arena (16-byte aligned).
    pub offset: u64,
    pub dtype: Dtype,
    /// Elements per row.
    pub cols: u32,
    /// Rows at the launch's bucket.
    pub rows: Rows,
    /// Elements between row starts (a multiple of 8: 16-byte strides).
    pub row_stride: u64,
    /// Rows per box (1..=256).
    pub box_rows: u32,
}

impl TensorMap {
    /// The map of the tensor at `loc` (an arena or table location).
    pub fn of(
        loc: Loc,
        dtype: Dtype,
        cols: u32,
        rows: Rows,
        row_stride: u64,
        box_rows: u32,
    ) -> Loc {
        let (slot, offset) = match loc {
            Loc::Arena { offset } => (None, offset),
            Loc::Table { slot, offset } => (Some(slot), offset),
            Loc::TensorMap(_) => panic!("a tensor map of a tensor map"),
        };
        Loc::TensorMap(TensorMap {
            slot,
            offset,
            dtype,
            cols,
            rows,
            row_stride,
            box_rows,
        })
    }

    /// Where the tensor itself starts.
    pub fn tensor(&self) -> Loc {
        match self.slot {
            Some(slot) => Loc::Table {
                slot,
                offset: self.offset,
            },
            None => Loc::Arena {
                offset: self.offset,
            },
        }
    }

    /// Elements per box row.
    pub fn box_cols(&self) -> u32 {
        BOX_ROW_BYTES / self.dtype.size() as u32
    }

    /// Bytes of one box in shared memory.
    pub fn box_bytes(&self) -> u32 {
        self.box_rows * BOX_ROW_BYTES
    }

    /// Why the map cannot be encoded, checked by generators before they emit it.
    pub fn check(&self) -> Result<(), String> {
        if !matches!(self.dtype, Dtype::BF16 | Dtype::F16) {
            return Err(format!(
                "{} tensor maps are not supported (bf16, f16)",
                self.dtype.name()
            ));
        }
        if !self.offset.is_multiple_of(16)
            || !(self.row_stride * self.dtype.size()).is_multiple_of(16)
        {
            return Err("tensor start and row stride must be 16-byte aligned".into());
        }
        if self.cols == 0 || (self.row_stride as u128) < self.cols as u128 {
            return Err("rows must hold at least one element and not overlap".into());
        }
        if self.box_rows == 0 || self.box_rows > 256 {
            return Err(format!("{} rows per box (1..=256)", self.box_rows));
        }
        Ok(())
    }

    /// Rows of the tensor at `bucket` (at least 1: an empty extent cannot be encoded; the
    /// kernels launch no block over rows that do not exist).
    pub fn rows_at(&self, bucket: &Bucket) -> u32 {
        self.rows.eval(bucket).max(1)
    }

    /// Bytes from the tensor's start to the end of its last row at `bucket`: the range the
    /// copies may read, which the host checks lies inside the buffer before encoding.
    pub fn span_bytes(&self, bucket: &Bucket) -> u64 {
        ((self.rows_at(bucket) as u64 - 1) * self.row_stride + self.cols as u64) * self.dtype.size()
    }

    /// The descriptor of the tensor at device address `addr` for `bucket` (the driver's
    /// `cuTensorMapEncodeTiled`; needs the CUDA driver library, not a context).
    pub fn encode(
        &self,
        addr: u64,
        bucket: &Bucket,
    ) -> Result<[u8; DESCRIPTOR_BYTES as usize], String> {
        use cudarc::driver::sys;
        self.check()?;
        if !addr.is_multiple_of(16) {
            return Err(format!("tensor address {addr:#x} is not 16-byte aligned"));
        }
        let size = self.dtype.size();
        let dtype = match self.dtype {
            Dtype::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        };
        let dims = [self.cols as u64, self.rows_at(bucket) as u64];
        let strides = [self.row_stride * size];
        let boxes = [self.box_cols(), self.box_rows];
        let elem_strides = [1u32, 1];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: every pointer names a live local array of the rank the call reads (rank 2:
        // 2 dims, 1 stride, 2 box dims, 2 element strides); the map is written in place.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                2,
                addr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                elem_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuTensorMapEncodeTiled({self:?}) failed: {r:?}"));
        }
        let mut out = [0u8; DESCRIPTOR_BYTES as usize];
        for (i, w) in map.opaque.iter().enumerate() {
            out[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        Ok(out)
    }

    /// The placeholder arguments (see `abi::Loc::placeholder`).
    pub(crate) fn placeholder_args(&self) -> String {
        let slot = self.slot.map_or("-".to_string(), |s| s.to_string());
        let rows = match self.rows {
            Rows::Tokens => "T".to_string(),
            Rows::Seqs => "S".to_string(),
            Rows::Fixed(n) => n.to_string(),
        };
        let dtype = self.dtype.name();
        format!(
            "m,{slot},{},{dtype},{},{rows},{},{}",
            self.offset, self.cols, self.row_stride, self.box_rows
        )
    }

    /// Inverse of [`TensorMap::placeholder_args`] without its leading `m`.
    pub(crate) fn parse_args(mut it: std::str::Split<'_, char>) -> Option<TensorMap> {
        let slot = match it.next()? {
            "-" => None,
            s => Some(s.parse().ok()?),
        };
        let offset = it.next()?.parse().ok()?;
        let dtype = match it.next()? {
            "bf16" => Dtype::BF16,
            "f16" => Dtype::F16,
            _ => return None,
        };
        let cols = it.next()?.parse().ok()?;
        let rows = match it.next()? {
            "T" => Rows::Tokens,
            "S" => Rows::Seqs,
            n => Rows::Fixed(n.parse().ok()?),
        };
        let row_stride = it.next()?.parse().ok()?;
        let box_rows = it.next()?.parse().ok()?;
        it.next().is_none().then_some(TensorMap {
            slot,
            offset,
            dtype,
            cols,
            rows,
            row_stride,
            box_rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::relocate;

    #[test]
    fn placeholders_round_trip_and_share_an_operand_per_map() {
        let x = TensorMap::of(Loc::arena(4096), Dtype::BF16, 4096, Rows::Tokens, 4096, 64);
        let w = TensorMap::of(
            Loc::table(3),
            Dtype::F16,
            4096,
            Rows::Fixed(6144),
            4096,
            128,
        );
        let text = format!(
            "{} {} {}",
            x.ptr_as("void", false),
            w.ptr_as("void", false),
            x.ptr_as("void", false)
        );
        let (out, ops) = relocate(&[&text]);
        assert_eq!(ops, vec![x, w]);
        assert!(
            out[0].contains("ops[0]") && out[0].contains("ops[1]") && !out[0].contains("ops[2]")
        );
    }

    #[test]
    fn spans_follow_the_bucket_and_bad_maps_are_named() {
        let Loc::TensorMap(x) =
            TensorMap::of(Loc::arena(0), Dtype::BF16, 100, Rows::Tokens, 104, 64)
        else {
            unreachable!()
        };
        let bk = Bucket {
            b: 2,
            t: 8,
            ctx: 64,
        };
        assert_eq!(x.span_bytes(&bk), (15 * 104 + 100) * 2);
        assert!(x.check().is_ok());
        assert!(TensorMap {
            row_stride: 100,
            ..x
        }
        .check()
        .unwrap_err()
        .contains("16-byte"));
        assert!(TensorMap { box_rows: 300, ..x }
            .check()
            .unwrap_err()
            .contains("rows per box"));
        assert!(TensorMap {
            dtype: Dtype::F32,
            ..x
        }
        .check()
        .is_err());
        assert_eq!(x.tensor(), Loc::arena(0));
        assert_eq!(x.box_cols(), 64);
    }
}
