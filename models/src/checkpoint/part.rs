//! Reading part of a tensor (a tensor-parallel rank's rows or columns) and streaming many
//! tensors shard by shard with at most one shard's pages resident.

use std::ops::Range;

use specc_ir::interp::Tensor;
use specc_ir::{DType, FP8_BLOCK};

use super::{first_non_finite, Backing, Checkpoint, TensorEntry};
use crate::error::ModelError;

impl Checkpoint {
    /// Rows `rows` × columns `cols` of the 2-D tensor `name`, as [`Checkpoint::load_f32`]
    /// would give them after loading the whole tensor, reading only those bytes. For an int4
    /// `weight_packed`, `cols` count unpacked columns and must start and end on a multiple
    /// of 8 (whole i32 words); the matching part of its scale is [`scale_part`]'s.
    pub fn load_f32_part(
        &self,
        name: &str,
        rows: Range<usize>,
        cols: Range<usize>,
    ) -> Result<Tensor, ModelError> {
        let e = self.tensors.get(name).ok_or_else(|| ModelError::Tensor {
            file: self.root.clone(),
            tensor: name.into(),
            expected: "a tensor".into(),
            found: "no such tensor".into(),
        })?;
        let int4 = self.int4_dtype(name)?.is_some();
        let per_word = if int4 { 8 } else { 1 };
        let bad = |expected: String| ModelError::Tensor {
            file: self.file_of(e).to_path_buf(),
            tensor: name.into(),
            expected,
            found: format!("{:?} {}", e.shape, super::dtype_name(e.dtype)),
        };
        let [n, stored_cols] = *e.shape.as_slice() else {
            return Err(bad(format!(
                "a 2-D tensor to read rows {rows:?} × columns {cols:?} of"
            )));
        };
        let k = stored_cols * per_word;
        if rows.start > rows.end || rows.end > n || cols.start > cols.end || cols.end > k {
            return Err(bad(format!(
                "rows {rows:?} and columns {cols:?} inside [{n}, {k}]"
            )));
        }
        if int4 && (!cols.start.is_multiple_of(8) || !cols.end.is_multiple_of(8)) {
            return Err(bad(format!(
                "columns {cols:?} on whole i32 words (multiples of 8) of an int4 tensor"
            )));
        }
        let size = e.dtype.size();
        let (c0, c1) = (cols.start / per_word, cols.end / per_word);
        let all = &self.files[e.file].mmap[e.range.clone()];
        let mut bytes = Vec::with_capacity(rows.len() * (c1 - c0) * size);
        for r in rows.clone() {
            let at = (r * stored_cols + c0) * size;
            bytes.extend_from_slice(&all[at..at + (c1 - c0) * size]);
        }
        if let Backing::Mapped(_) = self.files[e.file].mmap {
            if let Some((i, v)) = first_non_finite(e.dtype, &bytes) {
                return Err(bad(format!(
                    "finite values (found {v} at part element {i})"
                )));
            }
        }
        self.decode(name, e, vec![rows.len(), c1 - c0], &bytes)
    }

    /// Visits the tensors `names` shard by shard in file order (each shard's tensors by
    /// offset), giving each one's entry and stored bytes to `visit`, then `progress(done,
    /// total)` in bytes. After a shard's last tensor its pages are released, so at most one
    /// shard's bytes are resident through the mapping at a time. Names not in the checkpoint
    /// are an error before anything is visited.
    pub fn stream<E: From<ModelError>>(
        &self,
        names: &[&str],
        mut visit: impl FnMut(&str, &TensorEntry, &[u8]) -> Result<(), E>,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<(), E> {
        let mut order = Vec::with_capacity(names.len());
        for &n in names {
            let e = self.tensors.get(n).ok_or_else(|| ModelError::Tensor {
                file: self.root.clone(),
                tensor: n.into(),
                expected: "a tensor".into(),
                found: "no such tensor".into(),
            })?;
            order.push((n, e));
        }
        order.sort_by_key(|(_, e)| (e.file, e.range.start));
        let total: u64 = order.iter().map(|(_, e)| e.range.len() as u64).sum();
        let mut done = 0u64;
        progress(0, total);
        for (i, &(n, e)) in order.iter().enumerate() {
            visit(n, e, &self.files[e.file].mmap[e.range.clone()])?;
            done += e.range.len() as u64;
            progress(done, total);
            if order.get(i + 1).is_none_or(|(_, next)| next.file != e.file) {
                self.release(e.file);
            }
        }
        Ok(())
    }

    /// Drops the resident pages of file `file` (they are read again from disk on the next
    /// access). Synthesised files are left as they are.
    fn release(&self, file: usize) {
        if let Backing::Mapped(m) = &self.files[file].mmap {
            // SAFETY: the mapping is read-only and private, and nothing writes through it:
            // MADV_DONTNEED only drops its pages, and later reads fault them in from the
            // file with the same contents. Failure is harmless (the pages stay).
            let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }
}

/// The part of a quantised Linear's scale that goes with rows `rows` × columns `cols` of
/// its weight `[out, in]`, or an error text when the part does not fall on whole scale
/// blocks: int4 columns on group boundaries; fp8 rows and columns on 128 boundaries (or the
/// tensor's end).
pub fn scale_part(
    dtype: DType,
    shape: [usize; 2],
    rows: Range<usize>,
    cols: Range<usize>,
) -> Result<(Range<usize>, Range<usize>), String> {
    let on = |x: usize, b: usize, end: usize| x.is_multiple_of(b) || x == end;
    match dtype {
        DType::Int4Group { group } => {
            let g = group as usize;
            if !on(cols.start, g, shape[1]) || !on(cols.end, g, shape[1]) {
                return Err(format!(
                    "columns {cols:?} on whole groups of {g} (int4 scale per group)"
                ));
            }
            Ok((rows, cols.start / g..cols.end.div_ceil(g)))
        }
        DType::Fp8E4M3 => {
            let b = FP8_BLOCK as usize;
            let ok = on(rows.start, b, shape[0])
                && on(rows.end, b, shape[0])
                && on(cols.start, b, shape[1])
                && on(cols.end, b, shape[1]);
            if !ok {
                return Err(format!(
                    "rows {rows:?} and columns {cols:?} on whole {b}×{b} blocks (fp8 scale per block)"
                ));
            }
            Ok((
                rows.start / b..rows.end.div_ceil(b),
                cols.start / b..cols.end.div_ceil(b),
            ))
        }
        other => Err(format!("{other} weights have no scale")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_parts_follow_blocks() {
        let i4 = DType::Int4Group { group: 32 };
        assert_eq!(scale_part(i4, [8, 128], 2..4, 32..96), Ok((2..4, 1..3)));
        assert!(scale_part(i4, [8, 128], 0..8, 8..64).is_err());
        // fp8 [300, 200]: the last row block is partial (256..300) and may be taken whole.
        assert_eq!(
            scale_part(DType::Fp8E4M3, [300, 200], 128..300, 0..200),
            Ok((1..3, 0..2))
        );
        assert!(scale_part(DType::Fp8E4M3, [300, 200], 0..100, 0..200).is_err());
    }
}
