//! Row-wise elementwise kernels: `add`, `mul`, `silu_mul` (SwiGLU of two views), and the
//! `embedding` gather. Each thread handles one vector of up to 8 elements (16-byte accesses
//! where alignment allows); the grid is `(column blocks, rows)`.
//!
//! Numerics: inputs converted to f32, one op, rounded once to the output dtype (the op's
//! result dtype); SwiGLU is `R(R(silu(a)) · b)` like the interpreter (HF's
//! `act_fn(gate) * up`). Kernel name dtype: the output dtype.

use crate::abi::{
    pick_vec, Dtype, Extent, KernelBuilder, KernelSource, LaunchSpec, Loc, Rows, View,
};
use crate::writer::emit;
use crate::Error;

/// The elementwise function of two operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryFn {
    /// `a + b`
    Add,
    /// `a · b`
    Mul,
    /// `silu(a) · b` (a = gate, b = up)
    SiluMul,
}

impl BinaryFn {
    fn family(self) -> &'static str {
        match self {
            BinaryFn::Add => "add",
            BinaryFn::Mul => "mul",
            BinaryFn::SiluMul => "silu_mul",
        }
    }

    /// The f32 expression before the final rounding to `out` (the result type).
    fn expr(self, a: &str, b: &str, out: &str) -> String {
        match self {
            BinaryFn::Add => format!("{a} + {b}"),
            BinaryFn::Mul => format!("{a} * {b}"),
            BinaryFn::SiluMul => format!("round_to<{out}>(silu_f32({a})) * {b}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct BinaryParams {
    pub op: BinaryFn,
    pub rows: Rows,
    pub cols: u32,
    pub a: View,
    /// `row_stride = 0` broadcasts one row of `b` over all rows.
    pub b: View,
    pub out: View,
}

/// Threads per block for `units` vectors per row.
fn block_threads(units: u32) -> u32 {
    units.next_multiple_of(32).clamp(32, 256)
}

pub fn binary(p: &BinaryParams) -> Result<KernelSource, Error> {
    let family = p.op.family();
    if p.cols == 0 {
        return Err(Error::param(family, "cols", "must be positive"));
    }
    if ![p.a, p.b, p.out].iter().all(|v| v.dtype.is_float()) {
        return Err(Error::param(
            family,
            "dtype",
            "operands and result must be float types",
        ));
    }
    let vw = pick_vec(p.cols as u64, &[p.a, p.b, p.out], &[]);
    let units = p.cols / vw;
    let nt = block_threads(units);
    let mut kb = KernelBuilder::new(family, p.out.dtype);
    let w = &mut kb.body;
    emit!(w, "constexpr int VW = {vw};");
    w.line("const int r = blockIdx.y;");
    w.line("const int i = (blockIdx.x * blockDim.x + threadIdx.x) * VW;");
    emit!(w, "if (i >= {}) return;", p.cols);
    for (name, v, mutable) in [("a", p.a, false), ("b", p.b, false), ("y", p.out, true)] {
        let cv = if mutable { "" } else { "const " };
        emit!(
            w,
            "{cv}{}* {name} = {} + (long long)r * {} + i;",
            v.dtype.c_type(),
            v.loc.ptr(v.dtype, mutable),
            v.row_stride
        );
    }
    w.line("float va[VW], vb[VW], vy[VW];");
    w.line("ld_vec<VW>(a, va);");
    w.line("ld_vec<VW>(b, vb);");
    let expr = p.op.expr("va[e]", "vb[e]", p.out.dtype.c_type());
    w.for_unrolled("e", 0, "VW", |w| emit!(w, "vy[e] = {expr};"));
    w.line("st_vec<VW>(y, vy);");
    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(units.div_ceil(nt)),
            p.rows.extent(1, 1),
            Extent::Fixed(1),
        ],
        block: [nt, 1, 1],
        smem_bytes: 0,
    };
    Ok(kb.finish(launch))
}

/// `out[r] = table[clamp(ids[r], 0, vocab - 1)]`.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingParams {
    pub rows: Rows,
    /// `[rows]` token ids (i32 or i64).
    pub ids: Loc,
    pub ids_dtype: Dtype,
    /// `[vocab, hidden]`.
    pub table: Loc,
    pub table_dtype: Dtype,
    pub vocab: u32,
    pub hidden: u32,
    /// `[rows, hidden]`; a dtype other than the table's is a fused cast.
    pub out: View,
}

pub fn embedding(p: &EmbeddingParams) -> Result<KernelSource, Error> {
    const FAMILY: &str = "embedding";
    if !p.ids_dtype.is_int() {
        return Err(Error::param(FAMILY, "ids_dtype", "must be i32 or i64"));
    }
    if p.vocab == 0 || p.hidden == 0 {
        return Err(Error::param(FAMILY, "vocab/hidden", "must be positive"));
    }
    if !(p.table_dtype.is_float() && p.out.dtype.is_float()) {
        return Err(Error::param(
            FAMILY,
            "dtype",
            "table and out must be float types",
        ));
    }
    let table = View::new(p.table, p.table_dtype, p.hidden as u64);
    let vw = pick_vec(p.hidden as u64, &[table, p.out], &[]);
    let units = p.hidden / vw;
    let nt = block_threads(units);
    let mut kb = KernelBuilder::new(FAMILY, p.table_dtype);
    let w = &mut kb.body;
    emit!(w, "constexpr int VW = {vw};");
    w.line("const int r = blockIdx.y;");
    w.line("const int i = (blockIdx.x * blockDim.x + threadIdx.x) * VW;");
    emit!(w, "if (i >= {}) return;", p.hidden);
    emit!(
        w,
        "const long long id = (long long)({})[r];",
        p.ids.ptr(p.ids_dtype, false)
    );
    emit!(
        w,
        "const long long row = id < 0 ? 0 : (id > {} ? {} : id);",
        p.vocab - 1,
        p.vocab - 1
    );
    w.line("float v[VW];");
    emit!(
        w,
        "ld_vec<VW>({} + row * {} + i, v);",
        p.table.ptr(p.table_dtype, false),
        p.hidden
    );
    emit!(
        w,
        "st_vec<VW>({} + (long long)r * {} + i, v);",
        p.out.loc.ptr(p.out.dtype, true),
        p.out.row_stride
    );
    let launch = LaunchSpec {
        grid: [
            Extent::Fixed(units.div_ceil(nt)),
            p.rows.extent(1, 1),
            Extent::Fixed(1),
        ],
        block: [nt, 1, 1],
        smem_bytes: 0,
    };
    Ok(kb.finish(launch))
}
