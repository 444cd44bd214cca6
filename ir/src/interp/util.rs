//! Helpers shared by the op implementations.

use std::cmp::Ordering;

use super::tensor::{Data, Tensor};
use crate::DType;

/// Resolved result type of the node being evaluated.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Out {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Out {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// A tensor of this type holding `data` (already rounded / wrapped).
    pub fn tensor(&self, data: Data) -> Tensor {
        Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            data,
        }
    }

    pub fn f32(&self, data: Vec<f32>) -> Tensor {
        self.tensor(Data::F32(data))
    }

    pub fn i64(&self, data: Vec<i64>) -> Tensor {
        self.tensor(Data::I64(data))
    }
}

pub(crate) type OpResult = Result<Tensor, String>;

pub(crate) fn f32s<'t>(t: &'t Tensor, what: &str) -> Result<&'t [f32], String> {
    match &t.data {
        Data::F32(v) => Ok(v),
        Data::I64(_) => Err(format!("{what} must be a float tensor, got {t}")),
    }
}

pub(crate) fn i64s<'t>(t: &'t Tensor, what: &str) -> Result<&'t [i64], String> {
    match &t.data {
        Data::I64(v) => Ok(v),
        Data::F32(_) => Err(format!("{what} must be an integer tensor, got {t}")),
    }
}

/// `(prod(shape[..axis]), shape[axis], prod(shape[axis+1..]))`.
pub(crate) fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// Size of the last dim (1 for a scalar).
pub(crate) fn last_dim(t: &Tensor) -> usize {
    t.shape.last().copied().unwrap_or(1)
}

/// f32 dot product. Accumulation order: 8 interleaved partial sums (lane `j` takes the
/// elements `i ≡ j mod 8` of the first `8·⌊n/8⌋`), combined pairwise, then the tail in order.
/// All f32 reductions of the interpreter (matmul, rmsnorm, attention scores, sums) use it.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let (ca, ta) = a[..n].split_at(n - n % 8);
    let (cb, tb) = b[..n].split_at(n - n % 8);
    let mut acc = [0.0f32; 8];
    for (x, y) in ca.chunks_exact(8).zip(cb.chunks_exact(8)) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s = combine(acc);
    for (x, y) in ta.iter().zip(tb) {
        s += x * y;
    }
    s
}

/// f32 sum in the same order as [`dot`].
#[inline]
pub(crate) fn sum(a: &[f32]) -> f32 {
    let (c, t) = a.split_at(a.len() - a.len() % 8);
    let mut acc = [0.0f32; 8];
    for x in c.chunks_exact(8) {
        for j in 0..8 {
            acc[j] += x[j];
        }
    }
    let mut s = combine(acc);
    for x in t {
        s += x;
    }
    s
}

#[inline]
fn combine(a: [f32; 8]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// Ordering used by argmax, topk and routers: NaN ranks as -inf, `-0.0 == 0.0`.
pub(crate) trait Rank: Copy {
    fn rank_cmp(self, other: Self) -> Ordering;
}

impl Rank for f32 {
    fn rank_cmp(self, other: f32) -> Ordering {
        let k = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
        k(self).partial_cmp(&k(other)).unwrap_or(Ordering::Equal)
    }
}

impl Rank for i64 {
    fn rank_cmp(self, other: i64) -> Ordering {
        self.cmp(&other)
    }
}

/// Index of the largest element; the lowest index wins ties (0 for an empty row).
pub(crate) fn argmax_row<T: Rank>(row: &[T]) -> usize {
    let mut best = 0;
    for i in 1..row.len() {
        if row[i].rank_cmp(row[best]) == Ordering::Greater {
            best = i;
        }
    }
    best
}

/// Writes into `idx` the indices of the `k` largest elements of `row`, largest first, ties
/// by lower index. `idx` is scratch of any content; it ends with length `k`.
pub(crate) fn topk_row<T: Rank>(row: &[T], k: usize, idx: &mut Vec<usize>) {
    idx.clear();
    idx.extend(0..row.len());
    let cmp = |a: &usize, b: &usize| row[*b].rank_cmp(row[*a]).then(a.cmp(b));
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_unstable_by(cmp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_sum_orders() {
        let a: Vec<f32> = (1..=11).map(|i| i as f32).collect();
        assert_eq!(sum(&a), 66.0);
        assert_eq!(dot(&a, &a), 506.0); // Σ i² for i in 1..=11
        assert_eq!(dot(&[], &[]), 0.0);
    }

    #[test]
    fn topk_ties_and_nan() {
        let row = [1.0, 3.0, f32::NAN, 3.0, 2.0, -0.0, 0.0];
        let mut idx = Vec::new();
        topk_row(&row, 4, &mut idx);
        assert_eq!(idx, vec![1, 3, 4, 0]);
        topk_row(&row, 7, &mut idx);
        assert_eq!(idx, vec![1, 3, 4, 0, 5, 6, 2]);
        assert_eq!(argmax_row(&row), 1);
        assert_eq!(argmax_row(&[f32::NAN, -1.0]), 1);
        assert_eq!(argmax_row(&[2i64, 7, 7]), 1);
    }
}
