//! Generic kernels over quantised weights read as stored ([`crate::quant`]): `dequantize`
//! (MLA's `kv_b_proj` sliced per head) and the element loads of the per-token
//! `moe_experts` kernel. Values are the interpreter's: `q · scale` rounded once to f32
//! (and `dequantize` rounds that to its output dtype).

use super::{store, Kernel, TensorArg};
use crate::abi::{Dtype, KernelSource};
use crate::quant::QuantFormat;
use crate::writer::emit;
use crate::Error;

/// A quantised `[.., N, K]` weight operand and its scale operand, as a kernel reads them.
pub(super) struct QuantRows {
    pub format: QuantFormat,
    pub n: u64,
    pub k: u64,
}

impl QuantRows {
    /// `w` with `scale`, checked against the format's rules (`family` names errors).
    pub fn of(family: &'static str, w: &TensorArg, scale: &TensorArg) -> Result<Self, Error> {
        let format = QuantFormat::of(w.dtype).ok_or_else(|| {
            Error::param(
                family,
                "weights",
                format!("{} is not a quantised format", w.dtype),
            )
        })?;
        let r = w.dims.len();
        if r < 2 {
            return Err(Error::param(family, "weights", "must be at least 2-D"));
        }
        let (n, k) = (w.dims[r - 2], w.dims[r - 1]);
        let sdt = match scale.dtype {
            specc_ir::DType::BF16 => Dtype::BF16,
            specc_ir::DType::F16 => Dtype::F16,
            specc_ir::DType::F32 => Dtype::F32,
            other => {
                return Err(Error::param(family, "scale", format!("{other} scales")));
            }
        };
        format.check(family, k, sdt)?;
        let lead: u64 = w.dims[..r - 2].iter().product();
        if scale.numel() != lead * format.scale_numel(n, k) {
            return Err(Error::param(
                family,
                "scale",
                format!("{:?} does not match weights {:?}", scale.dims, w.dims),
            ));
        }
        Ok(QuantRows { format, n, k })
    }

    /// Stored bytes of one `[N, K]` matrix (the stride between stacked experts).
    pub fn matrix_bytes(&self) -> u64 {
        self.format.weight_bytes(self.n, self.k)
    }

    /// Scale elements of one `[N, K]` matrix.
    pub fn matrix_scales(&self) -> u64 {
        self.format.scale_numel(self.n, self.k)
    }

    /// C++ f32 expression of the dequantised element `(row, col)` of the matrix at byte
    /// pointer `w` with scale pointer `s`.
    pub fn value(&self, w: &str, s: &str, row: &str, col: &str) -> String {
        let rb = self.format.row_bytes(self.k);
        let rowp = format!("{w} + (long long)({row}) * {rb}");
        format!(
            "({} * {})",
            self.format.elem_expr(&rowp, col),
            self.format.scale_expr(s, row, col, self.k)
        )
    }
}

/// `dequantize`: `out[.., r, c] = R(q · scale)` for every element, one thread each.
pub(super) fn dequantize(
    w: &TensorArg,
    scale: &TensorArg,
    out: &TensorArg,
) -> Result<KernelSource, Error> {
    let q = QuantRows::of("dequantize", w, scale)?;
    let mut k = Kernel::new("dequantize", w.dtype);
    k.ptr("w", w, false);
    k.ptr("s", scale, false);
    k.ptr("y", out, true);
    let n = out.numel();
    let (rows, cols) = (q.n, q.k);
    let (mb, ms) = (q.matrix_bytes(), q.matrix_scales());
    k.grid_stride(n, |b| {
        emit!(b, "const long long mat = e / {}ll;", rows * cols);
        emit!(b, "const long long r = (e / {cols}ll) % {rows}ll;");
        emit!(b, "const long long c = e % {cols}ll;");
        emit!(b, "const unsigned char* wm = w + mat * {mb}ll;");
        emit!(b, "const auto* sm = s + mat * {ms}ll;");
        let v = q.value("wm", "sm", "r", "c");
        emit!(b, "y[e] = {};", store(out.dtype, &v));
    });
    Ok(k.finish_flat(n))
}
