//! The kernel ABI's data: how a launch names its operands ([`Loc`], [`TensorMap`]), the
//! bucket it runs at ([`Bucket`]) and its geometry ([`LaunchSpec`], [`LaunchGeometry`]).
//! The build writes these values into an engine; the runtime resolves them against device
//! addresses. The calling convention itself (`ops`, `StepConsts`) is documented in
//! `specc_kernels_gen::abi`.

use serde::{Deserialize, Serialize};

/// Element types a kernel reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dtype {
    BF16,
    F16,
    F32,
    I32,
    I64,
}

impl Dtype {
    pub fn size(self) -> u64 {
        match self {
            Dtype::BF16 | Dtype::F16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::I64 => 8,
        }
    }

    /// The C++ type in the prelude.
    pub fn c_type(self) -> &'static str {
        match self {
            Dtype::BF16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F32 => "float",
            Dtype::I32 => "int",
            Dtype::I64 => "long long",
        }
    }

    /// The name used in kernel names and reports.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BF16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::BF16 | Dtype::F16 | Dtype::F32)
    }

    pub fn is_int(self) -> bool {
        matches!(self, Dtype::I32 | Dtype::I64)
    }
}

/// Where a tensor starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Loc {
    /// `arena + offset` (bytes).
    Arena { offset: u64 },
    /// `(char*)bufs[slot] + offset` (bytes).
    Table { slot: u32, offset: u64 },
    /// The 128-byte TMA descriptor of a tensor at an arena or table location
    /// ([`TensorMap`]): the host encodes it per launch and the table entry points at it.
    TensorMap(TensorMap),
}

impl Loc {
    pub fn arena(offset: u64) -> Loc {
        Loc::Arena { offset }
    }

    pub fn table(slot: u32) -> Loc {
        Loc::Table { slot, offset: 0 }
    }

    /// The same location moved by `bytes`.
    pub fn offset_by(self, bytes: u64) -> Loc {
        match self {
            Loc::Arena { offset } => Loc::Arena {
                offset: offset + bytes,
            },
            Loc::Table { slot, offset } => Loc::Table {
                slot,
                offset: offset + bytes,
            },
            Loc::TensorMap(m) => Loc::TensorMap(TensorMap {
                offset: m.offset + bytes,
                ..m
            }),
        }
    }

    /// Byte offset from a base that is itself at least 16-byte aligned (a descriptor is
    /// 128-byte aligned: 0).
    pub fn byte_offset(self) -> u64 {
        match self {
            Loc::Arena { offset } | Loc::Table { offset, .. } => offset,
            Loc::TensorMap(_) => 0,
        }
    }

    /// A C++ expression of type `const T*` / `T*` for this location.
    pub fn ptr(self, dtype: Dtype, mutable: bool) -> String {
        self.ptr_as(dtype.c_type(), mutable)
    }

    /// The same with any C++ element type (e.g. `ArgmaxPair`). Generators write an operand
    /// placeholder; `KernelBuilder::finish` numbers the distinct locations and turns each
    /// into `ops[i]`.
    pub fn ptr_as(self, c_type: &str, mutable: bool) -> String {
        let cv = if mutable { "" } else { "const " };
        format!("reinterpret_cast<{cv}{c_type}*>({})", self.placeholder())
    }

    pub fn placeholder(self) -> String {
        match self {
            Loc::Arena { offset } => format!("{OPERAND_MARK}a,{offset})"),
            Loc::Table { slot, offset } => format!("{OPERAND_MARK}t,{slot},{offset})"),
            Loc::TensorMap(m) => format!("{OPERAND_MARK}{})", m.placeholder_args()),
        }
    }

    pub fn parse_placeholder(args: &str) -> Option<Loc> {
        let mut it = args.split(',');
        let loc = match it.next()? {
            "a" => Loc::Arena {
                offset: it.next()?.parse().ok()?,
            },
            "t" => Loc::Table {
                slot: it.next()?.parse().ok()?,
                offset: it.next()?.parse().ok()?,
            },
            "m" => return TensorMap::parse_args(it).map(Loc::TensorMap),
            _ => return None,
        };
        it.next().is_none().then_some(loc)
    }
}

/// Opens an operand placeholder in generated text: `@operand(a,OFFSET)` or
/// `@operand(t,SLOT,OFFSET)`. Never valid C++, so a leftover one fails compilation loudly.
pub const OPERAND_MARK: &str = "@operand(";

/// How many rows a row-wise kernel processes, as a function of the bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rows {
    /// One row per token: `M = B·T` (`c.m`).
    Tokens,
    /// One row per sequence: `B` (`c.b`).
    Seqs,
    /// A fixed count.
    Fixed(u32),
}

impl Rows {
    /// The C++ expression of the count inside a kernel.
    pub fn expr(self) -> String {
        match self {
            Rows::Tokens => "c.m".into(),
            Rows::Seqs => "c.b".into(),
            Rows::Fixed(n) => n.to_string(),
        }
    }

    pub fn eval(self, bucket: &Bucket) -> u32 {
        match self {
            Rows::Tokens => bucket.b * bucket.t,
            Rows::Seqs => bucket.b,
            Rows::Fixed(n) => n,
        }
    }

    /// `ceil(rows · mul / div)` as a grid extent.
    pub fn extent(self, mul: u32, div: u32) -> Extent {
        let unit = match self {
            Rows::Tokens => Unit::BT,
            Rows::Seqs => Unit::B,
            Rows::Fixed(n) => return Extent::Fixed((n * mul).div_ceil(div)),
        };
        Extent::Scaled { unit, mul, div }
    }

    /// `ceil(rows / div)` rounded up to a multiple of `multiple`, as a grid extent.
    pub fn extent_rounded(self, div: u32, multiple: u32) -> Extent {
        let unit = match self {
            Rows::Tokens => Unit::BT,
            Rows::Seqs => Unit::B,
            Rows::Fixed(n) => {
                return Extent::Fixed(n.div_ceil(div).next_multiple_of(multiple));
            }
        };
        Extent::RoundedUp {
            unit,
            div,
            multiple,
        }
    }
}

/// The bucket sizes of one captured graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Bucket {
    pub b: u32,
    pub t: u32,
    pub ctx: u32,
}

impl Bucket {
    /// The kernel's last parameter for this bucket, field by field: `StepConsts { b, t, ctx,
    /// m = b·t }`.
    pub fn consts(&self) -> [i32; 4] {
        [
            self.b as i32,
            self.t as i32,
            self.ctx as i32,
            (self.b * self.t) as i32,
        ]
    }
}

/// A bucket quantity a grid extent scales with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Unit {
    B,
    T,
    BT,
}

impl Unit {
    pub fn eval(self, bucket: &Bucket) -> u32 {
        match self {
            Unit::B => bucket.b,
            Unit::T => bucket.t,
            Unit::BT => bucket.b * bucket.t,
        }
    }
}

/// One grid dimension as a formula of the bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Extent {
    Fixed(u32),
    /// `ceil(unit · mul / div)`.
    Scaled {
        unit: Unit,
        mul: u32,
        div: u32,
    },
    /// `ceil(unit / div)` rounded up to a multiple of `multiple` (the grid of blocks that
    /// run as clusters of `multiple` along this dimension).
    RoundedUp {
        unit: Unit,
        div: u32,
        multiple: u32,
    },
}

impl Extent {
    pub fn eval(self, bucket: &Bucket) -> u32 {
        match self {
            Extent::Fixed(n) => n,
            Extent::Scaled { unit, mul, div } => {
                let u = unit.eval(bucket) as u64;
                (u * mul as u64).div_ceil(div as u64) as u32
            }
            Extent::RoundedUp {
                unit,
                div,
                multiple,
            } => {
                let tiles = (unit.eval(bucket) as u64).div_ceil(div as u64);
                tiles.next_multiple_of(multiple as u64) as u32
            }
        }
    }
}

/// Launch geometry as formulas of the bucket: the grid may scale with B, T or B·T; the
/// block and shared memory are fixed at generation time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub grid: [Extent; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory; generated kernels use static `__shared__` arrays (< 48 KiB),
    /// so this is 0 unless a family says otherwise.
    pub smem_bytes: u32,
}

/// Concrete launch geometry for one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LaunchGeometry {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub smem_bytes: u32,
}

impl LaunchSpec {
    pub fn resolve(&self, bucket: &Bucket) -> LaunchGeometry {
        LaunchGeometry {
            grid: self.grid.map(|e| e.eval(bucket)),
            block: self.block,
            smem_bytes: self.smem_bytes,
        }
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.block.iter().product()
    }
}

/// Bytes of one encoded descriptor (`CUtensorMap`); descriptors must be 64-byte aligned
/// (128 here).
pub const DESCRIPTOR_BYTES: u64 = 128;
/// Bytes per box row: the 128-byte swizzle span.
pub const BOX_ROW_BYTES: u32 = 128;
/// Shared-memory alignment of a swizzled box destination.
pub const BOX_SMEM_ALIGN: u32 = 1024;

/// A row-major `[rows, cols]` tensor of 16-bit floats read in boxes of `box_rows` rows by
/// 128 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
}

impl TensorMap {
    /// The placeholder arguments (see `abi::Loc::placeholder`).
    pub fn placeholder_args(&self) -> String {
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
    pub fn parse_args(mut it: std::str::Split<'_, char>) -> Option<TensorMap> {
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
