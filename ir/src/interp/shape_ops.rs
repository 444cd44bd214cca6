//! Data movement: reshape, slice, concat, gather, embedding.

use super::tensor::{Data, Tensor};
use super::util::{around, i64s, OpResult, Out};

/// Applies `f` to the storage vector of whichever variant `$data` holds, producing the same
/// variant.
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::F32($v) => Data::F32($body),
            Data::I64($v) => Data::I64($body),
        }
    };
}

pub(crate) fn reshape(x: &Tensor, out: &Out) -> OpResult {
    if x.numel() != out.numel() {
        return Err(format!("cannot view {x} as {:?}", out.shape));
    }
    Ok(out.tensor(x.data.clone()))
}

pub(crate) fn slice(x: &Tensor, axis: usize, start: usize, len: usize, out: &Out) -> OpResult {
    let (outer, n, inner) = around(&x.shape, axis);
    if start + len > n {
        return Err(format!("slice {start}..{} of {x} axis {axis}", start + len));
    }
    fn f<T: Copy>(
        v: &[T],
        outer: usize,
        n: usize,
        inner: usize,
        start: usize,
        len: usize,
    ) -> Vec<T> {
        let mut r = Vec::with_capacity(outer * len * inner);
        for o in 0..outer {
            let base = o * n * inner;
            r.extend_from_slice(&v[base + start * inner..base + (start + len) * inner]);
        }
        r
    }
    Ok(out.tensor(map_data!(&x.data, v => f(v, outer, n, inner, start, len))))
}

pub(crate) fn concat(xs: &[&Tensor], axis: usize, out: &Out) -> OpResult {
    let (outer, _, inner) = around(&out.shape, axis);
    let first = xs[0];
    let same = |t: &Tensor| std::mem::discriminant(&t.data) == std::mem::discriminant(&first.data);
    if let Some(t) = xs.iter().find(|t| !same(t)) {
        return Err(format!("concat operands stored differently: {first}, {t}"));
    }
    let data = match &first.data {
        Data::F32(_) => Data::F32(concat_generic(xs, axis, outer, inner, |t| match &t.data {
            Data::F32(v) => v.as_slice(),
            Data::I64(_) => unreachable!("storage checked above"),
        })),
        Data::I64(_) => Data::I64(concat_generic(xs, axis, outer, inner, |t| match &t.data {
            Data::I64(v) => v.as_slice(),
            Data::F32(_) => unreachable!("storage checked above"),
        })),
    };
    Ok(out.tensor(data))
}

fn concat_generic<'t, T: Copy + 't>(
    xs: &[&'t Tensor],
    axis: usize,
    outer: usize,
    inner: usize,
    get: impl Fn(&'t Tensor) -> &'t [T],
) -> Vec<T> {
    let mut v = Vec::new();
    for o in 0..outer {
        for t in xs {
            let chunk = t.shape[axis] * inner;
            v.extend_from_slice(&get(t)[o * chunk..(o + 1) * chunk]);
        }
    }
    v
}

/// `out[o, j, i] = x[o, clamp(idx[o, j, i], 0, n-1), i]` around `axis`.
pub(crate) fn gather(x: &Tensor, idx: &Tensor, axis: usize, out: &Out) -> OpResult {
    let ix = i64s(idx, "gather index")?;
    let (outer, n, inner) = around(&x.shape, axis);
    let m = idx.shape[axis];
    if n == 0 {
        return Err(format!("gather from empty axis {axis} of {x}"));
    }
    fn f<T: Copy>(v: &[T], ix: &[i64], outer: usize, m: usize, n: usize, inner: usize) -> Vec<T> {
        let mut r = Vec::with_capacity(ix.len());
        for o in 0..outer {
            for j in 0..m {
                for i in 0..inner {
                    let k = ix[(o * m + j) * inner + i].clamp(0, n as i64 - 1) as usize;
                    r.push(v[(o * n + k) * inner + i]);
                }
            }
        }
        r
    }
    Ok(out.tensor(map_data!(&x.data, v => f(v, ix, outer, m, n, inner))))
}

/// Rows `table[clamp(id, 0, V-1)]`.
pub(crate) fn embedding(table: &Tensor, ids: &Tensor, out: &Out) -> OpResult {
    let ids = i64s(ids, "embedding ids")?;
    let (v, h) = (table.shape[0], table.shape[1]);
    if v == 0 {
        return Err(format!("embedding table {table} is empty"));
    }
    fn f<T: Copy>(t: &[T], ids: &[i64], v: usize, h: usize) -> Vec<T> {
        let mut r = Vec::with_capacity(ids.len() * h);
        for &id in ids {
            let row = id.clamp(0, v as i64 - 1) as usize;
            r.extend_from_slice(&t[row * h..(row + 1) * h]);
        }
        r
    }
    Ok(out.tensor(map_data!(&table.data, t => f(t, ids, v, h))))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::op::{dims, Op};
    use crate::{DType, Dim, Shape};

    #[test]
    fn reshape_keeps_data() {
        let x = ti(DType::I32, &[2, 3], &[0, 1, 2, 3, 4, 5]);
        let r = run_op(
            Op::Reshape {
                shape: dims(&[Dim::Static(3), Dim::Static(2)]),
            },
            vec![x],
        );
        assert_eq!(r.shape, vec![3, 2]);
        assert_eq!(r.as_i64().unwrap(), &[0, 1, 2, 3, 4, 5]);
        let x = tf(DType::F32, &[1], &[7.0]);
        let r = run_op(
            Op::Reshape {
                shape: Shape(vec![]),
            },
            vec![x],
        );
        assert_eq!(r.shape, Vec::<usize>::new());
    }

    #[test]
    fn slice_middle_axis() {
        // x[a, b, c] = 100a + 10b + c, shape [2, 3, 2]; take b in 1..3.
        let v: Vec<f32> = (0..2)
            .flat_map(|a| {
                (0..3).flat_map(move |b| (0..2).map(move |c| (100 * a + 10 * b + c) as f32))
            })
            .collect();
        let x = tf(DType::F32, &[2, 3, 2], &v);
        let r = run_op(
            Op::Slice {
                axis: 1,
                start: 1,
                len: 2,
            },
            vec![x],
        );
        assert_eq!(r.shape, vec![2, 2, 2]);
        assert_eq!(
            r.as_f32().unwrap(),
            &[10.0, 11.0, 20.0, 21.0, 110.0, 111.0, 120.0, 121.0]
        );
    }

    #[test]
    fn concat_axes() {
        let a = ti(DType::I64, &[2, 1], &[1, 2]);
        let b = ti(DType::I64, &[2, 2], &[3, 4, 5, 6]);
        let r = run_op(Op::Concat { axis: 1 }, vec![a.clone(), b.clone()]);
        assert_eq!(r.as_i64().unwrap(), &[1, 3, 4, 2, 5, 6]);
        let c = ti(DType::I64, &[1, 1], &[9]);
        let r = run_op(Op::Concat { axis: 0 }, vec![a, c]);
        assert_eq!(r.as_i64().unwrap(), &[1, 2, 9]);
    }

    #[test]
    fn gather_clamps_indices() {
        let x = tf(DType::F32, &[2, 3], &[0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
        let idx = ti(DType::I32, &[2, 2], &[2, -5, 1, 99]);
        let r = run_op(Op::Gather { axis: 1 }, vec![x.clone(), idx]);
        assert_eq!(r.as_f32().unwrap(), &[2.0, 0.0, 11.0, 12.0]);
        let idx = ti(DType::I64, &[1, 3], &[1, 0, 1]);
        let r = run_op(Op::Gather { axis: 0 }, vec![x, idx]);
        assert_eq!(r.as_f32().unwrap(), &[10.0, 1.0, 12.0]);
    }

    #[test]
    fn embedding_clamps_ids() {
        let table = tf(DType::BF16, &[3, 2], &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        let ids = ti(DType::I32, &[1, 3], &[2, -1, 7]);
        let r = run_op(Op::Embedding, vec![table, ids]);
        assert_eq!(r.shape, vec![1, 3, 2]);
        assert_eq!(r.dtype, DType::BF16);
        assert_eq!(r.as_f32().unwrap(), &[2.0, 2.5, 0.0, 0.5, 2.0, 2.5]);
    }
}
