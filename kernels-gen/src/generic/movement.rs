//! Data movement, copying raw bits: `copy` / `reshape` / `assign`, `slice`, `concat`,
//! `gather`, `embedding`, `kv_write`.
//!
//! Contiguous runs move in the widest unit (up to 16 bytes) that divides every run length
//! and offset involved, one thread per unit; `gather` moves single elements.

use super::{raw_type, unit_bytes, Kernel, TensorArg};
use crate::abi::KernelSource;
use crate::writer::emit;

/// `y = x` over all bytes (`out` may have other dims: a reshape, or a state).
pub(super) fn copy(family: &'static str, x: &TensorArg, out: &TensorArg) -> KernelSource {
    let bytes = x.numel() * x.elem_bytes();
    let w = unit_bytes(&[bytes, x.loc.byte_offset(), out.loc.byte_offset()]);
    let n = bytes / w;
    let mut k = Kernel::new(family, x.dtype);
    k.ptr_as("x", x.loc, raw_type(w), false);
    k.ptr_as("y", out.loc, raw_type(w), true);
    k.grid_stride(n, |w| w.line("y[e] = x[e];"));
    k.finish_flat(n)
}

/// `y[o, j, i] = x[o, start + j, i]` around `axis`.
pub(super) fn slice(axis: usize, start: u64, x: &TensorArg, out: &TensorArg) -> KernelSource {
    let (outer, n, inner) = x.around(axis);
    let len = out.dims[axis];
    let s = x.elem_bytes() * inner;
    let (run, stride, skip) = (len * s, n * s, start * s);
    let w = unit_bytes(&[
        run,
        stride,
        skip,
        x.loc.byte_offset(),
        out.loc.byte_offset(),
    ]);
    let (run, stride, skip) = (run / w, stride / w, skip / w);
    let total = outer * run;
    let mut k = Kernel::new("slice", x.dtype);
    k.ptr_as("x", x.loc, raw_type(w), false);
    k.ptr_as("y", out.loc, raw_type(w), true);
    k.grid_stride(total, |w| {
        emit!(w, "const long long o = e / {run}ll, r = e % {run}ll;");
        emit!(w, "y[e] = x[o * {stride}ll + {skip}ll + r];");
    });
    k.finish_flat(total)
}

/// `y[o, :, i]` is the operands' `[o, :, i]` one after another along `axis`.
pub(super) fn concat(axis: usize, xs: &[TensorArg], out: &TensorArg) -> KernelSource {
    let (outer, _, inner) = out.around(axis);
    let s = out.elem_bytes() * inner;
    let runs: Vec<u64> = xs.iter().map(|x| x.dims[axis] * s).collect();
    let mut all: Vec<u64> = runs.clone();
    all.extend(xs.iter().map(|x| x.loc.byte_offset()));
    all.push(out.loc.byte_offset());
    let w = unit_bytes(&all);
    let runs: Vec<u64> = runs.iter().map(|r| r / w).collect();
    let row: u64 = runs.iter().sum();
    let total = outer * row;
    let mut k = Kernel::new("concat", out.dtype);
    for (j, x) in xs.iter().enumerate() {
        k.ptr_as(&format!("x{j}"), x.loc, raw_type(w), false);
    }
    k.ptr_as("y", out.loc, raw_type(w), true);
    k.grid_stride(total, |w| {
        emit!(w, "const long long o = e / {row}ll, r = e % {row}ll;");
        let mut begin = 0u64;
        for (j, &run) in runs.iter().enumerate() {
            let copy = format!("y[e] = x{j}[o * {run}ll + (r - {begin}ll)];");
            if j + 1 == runs.len() {
                w.line(copy);
            } else {
                w.if_block(format_args!("r < {}ll", begin + run), |w| {
                    w.line(copy);
                    w.line("continue;");
                });
            }
            begin += run;
        }
    });
    k.finish_flat(total)
}

/// `y[o, j, i] = x[o, clamp(idx[o, j, i], 0, n - 1), i]` around `axis`.
pub(super) fn gather(axis: usize, x: &TensorArg, idx: &TensorArg, out: &TensorArg) -> KernelSource {
    let (_, n, inner) = x.around(axis);
    let m = idx.dims[axis];
    let total = out.numel();
    let raw = raw_type(x.elem_bytes());
    let mut k = Kernel::new("gather", x.dtype);
    k.ptr_as("x", x.loc, raw, false);
    k.ptr("ix", idx, false);
    k.ptr_as("y", out.loc, raw, true);
    k.grid_stride(total, |w| {
        emit!(
            w,
            "const long long o = e / {}ll, i = e % {inner}ll;",
            m * inner
        );
        w.line("long long j = to_i64(ix[e]);");
        emit!(w, "j = j < 0 ? 0 : (j > {0}ll ? {0}ll : j);", n - 1);
        emit!(w, "y[e] = x[(o * {n}ll + j) * {inner}ll + i];");
    });
    k.finish_flat(total)
}

/// `y[r, :] = table[clamp(ids[r], 0, V - 1), :]`, any table dtype.
pub(super) fn embedding(table: &TensorArg, ids: &TensorArg, out: &TensorArg) -> KernelSource {
    let (v, h) = (table.dims[0], table.dims[1]);
    let row = h * table.elem_bytes();
    let w = unit_bytes(&[row, table.loc.byte_offset(), out.loc.byte_offset()]);
    let row = row / w;
    let total = ids.numel() * row;
    let mut k = Kernel::new("embedding", table.dtype);
    k.ptr_as("t", table.loc, raw_type(w), false);
    k.ptr("ids", ids, false);
    k.ptr_as("y", out.loc, raw_type(w), true);
    k.grid_stride(total, |w| {
        emit!(w, "const long long r = e / {row}ll, u = e % {row}ll;");
        w.line("long long id = to_i64(ids[r]);");
        emit!(w, "id = id < 0 ? 0 : (id > {0}ll ? {0}ll : id);", v - 1);
        emit!(w, "y[e] = t[id * {row}ll + u];");
    });
    k.finish_flat(total)
}

/// Row `x[b, t]` into `cache[b, min(pos[b, t], Ctx - 1)]` in place; `pos < 0` writes
/// nothing. The interpreter writes in order of `t`, so when tokens of one sequence share a
/// slot the last one wins: a unit is skipped when a later token lands in its slot.
pub(super) fn kv_write(
    cache: &TensorArg,
    x: &TensorArg,
    pos: &TensorArg,
    out: &TensorArg,
) -> KernelSource {
    let (ctx, t) = (cache.dims[1], x.dims[1]);
    let row = x.dims[2] * x.dims[3] * x.elem_bytes();
    let w = unit_bytes(&[row, x.loc.byte_offset(), out.loc.byte_offset()]);
    let row = row / w;
    let total = x.numel() * x.elem_bytes() / w;
    let last = ctx - 1;
    let mut k = Kernel::new("kv_write", cache.dtype);
    k.ptr_as("x", x.loc, raw_type(w), false);
    k.ptr("pos", pos, false);
    k.ptr_as("y", out.loc, raw_type(w), true);
    k.grid_stride(total, |w| {
        emit!(w, "const long long bt = e / {row}ll, u = e % {row}ll;");
        emit!(w, "const long long b = bt / {t}ll, t = bt % {t}ll;");
        w.line("const long long p = to_i64(pos[bt]);");
        w.if_block("p < 0", |w| w.line("continue;"));
        emit!(w, "const long long slot = p < {last}ll ? p : {last}ll;");
        w.line("bool later = false;");
        w.for_block(
            "long long t2 = t + 1",
            format_args!("t2 < {t}ll"),
            "++t2",
            |w| {
                emit!(w, "const long long p2 = to_i64(pos[b * {t}ll + t2]);");
                emit!(
                    w,
                    "later = later || (p2 >= 0 && (p2 < {last}ll ? p2 : {last}ll) == slot);"
                );
            },
        );
        w.if_block("later", |w| w.line("continue;"));
        emit!(w, "y[(b * {ctx}ll + slot) * {row}ll + u] = x[e];");
    });
    k.finish_flat(total)
}
