//! Elementwise ops, one thread per output element: `fill`, `iota`, binary and unary ops,
//! `silu_mul`, `cast`, `select`, `random_uniform`.
//!
//! Values are computed as the interpreter holds them: f32 for floats, i64 for ints and bool
//! ([`super::value_type`]), then stored once in the result dtype.

use super::{
    c_type, f32_expr, i64_lit, is_float, load, raw_type, store, value_type, Kernel, TensorArg,
};
use crate::abi::KernelSource;
use crate::writer::emit;
use crate::Error;
use specc_ir::{BinaryOp, DType, UnaryOp};

/// `value` in every element: `R(f32(value))` for floats, truncated toward zero (saturating,
/// then wrapped) for ints, `value != 0` for bool.
pub(super) fn fill(value: f64, out: &TensorArg) -> Result<KernelSource, Error> {
    let n = out.numel();
    let lit = match out.dtype {
        d if is_float(d) => format!("from_f32<{}>({})", c_type(d), f32_expr(value as f32)),
        DType::Bool => format!("(b8){}", (value != 0.0) as u8),
        DType::I32 => format!("(int){}", value as i64 as i32),
        DType::I64 => i64_lit(value as i64),
        other => {
            return Err(Error::param(
                "fill",
                "dtype",
                format!("{other} has no fill value"),
            ))
        }
    };
    let mut k = Kernel::new("fill", out.dtype);
    k.ptr("y", out, true);
    emit!(k.body, "const {} v = {lit};", c_type(out.dtype));
    k.grid_stride(n, |w| w.line("y[e] = v;"));
    Ok(k.finish_flat(n))
}

/// Element `e` is its index along `axis`.
pub(super) fn iota(axis: usize, out: &TensorArg) -> KernelSource {
    let n = out.numel();
    let (_, len, inner) = out.around(axis);
    let mut k = Kernel::new("iota", out.dtype);
    k.ptr("y", out, true);
    let v = format!("(e / {inner}ll) % {len}ll");
    k.grid_stride(n, |w| emit!(w, "y[e] = {};", store(out.dtype, &v)));
    k.finish_flat(n)
}

/// The f32 (or, for comparisons, bool) expression of a float binary op.
fn float_binary(op: BinaryOp, a: &str, b: &str) -> String {
    match op {
        BinaryOp::Add => format!("{a} + {b}"),
        BinaryOp::Sub => format!("{a} - {b}"),
        BinaryOp::Mul => format!("{a} * {b}"),
        BinaryOp::Div => format!("{a} / {b}"),
        // Both ignore NaN like Rust's f32::max / f32::min.
        BinaryOp::Max => format!("fmaxf({a}, {b})"),
        BinaryOp::Min => format!("fminf({a}, {b})"),
        BinaryOp::Rem => format!("fmodf({a}, {b})"),
        BinaryOp::Eq => format!("{a} == {b}"),
        BinaryOp::Lt => format!("{a} < {b}"),
    }
}

/// The i64 (or bool) expression of an integer / bool binary op.
fn int_binary(op: BinaryOp, a: &str, b: &str) -> String {
    match op {
        BinaryOp::Add => format!("wadd({a}, {b})"),
        BinaryOp::Sub => format!("wsub({a}, {b})"),
        BinaryOp::Mul => format!("wmul({a}, {b})"),
        BinaryOp::Div => format!("idiv({a}, {b})"),
        BinaryOp::Max => format!("imax({a}, {b})"),
        BinaryOp::Min => format!("imin({a}, {b})"),
        BinaryOp::Rem => format!("irem_euclid({a}, {b})"),
        BinaryOp::Eq => format!("{a} == {b}"),
        BinaryOp::Lt => format!("{a} < {b}"),
    }
}

/// `y[e] = a[e] op b[e mod |b|]`: `b`'s shape is a suffix of `a`'s.
pub(super) fn binary(op: BinaryOp, a: &TensorArg, b: &TensorArg, out: &TensorArg) -> KernelSource {
    let (n, m) = (out.numel(), b.numel());
    let d = a.dtype;
    let mut k = Kernel::new(op.name(), d);
    k.ptr("a", a, false);
    k.ptr("b", b, false);
    k.ptr("y", out, true);
    let bi = match m {
        1 => "0".to_string(),
        _ if m == n => "e".to_string(),
        _ => format!("e % {m}ll"),
    };
    let vt = value_type(d);
    let expr = if is_float(d) {
        float_binary(op, "va", "vb")
    } else {
        int_binary(op, "va", "vb")
    };
    // A comparison gives a bool; `store` of a C++ bool as b8 is 0 or 1.
    let value = if op.is_comparison() {
        format!("(long long)({expr})")
    } else {
        expr
    };
    k.grid_stride(n, |w| {
        emit!(w, "const {vt} va = {};", load(d, "a[e]"));
        emit!(w, "const {vt} vb = {};", load(d, &format!("b[{bi}]")));
        emit!(w, "y[e] = {};", store(out.dtype, &value));
    });
    k.finish_flat(n)
}

/// `y[e] = f(x[e])`.
pub(super) fn unary(op: UnaryOp, x: &TensorArg, out: &TensorArg) -> KernelSource {
    let n = out.numel();
    let d = x.dtype;
    let expr = if is_float(d) {
        match op {
            UnaryOp::Neg => "-v".to_string(),
            UnaryOp::Exp => "expf(v)".into(),
            UnaryOp::Log => "logf(v)".into(),
            UnaryOp::Sqrt => "sqrtf(v)".into(),
            UnaryOp::Recip => "1.0f / v".into(),
            UnaryOp::Silu => "silu_f32(v)".into(),
            UnaryOp::Sigmoid => "1.0f / (1.0f + expf(-v))".into(),
            // The shape rule only admits bool; this is the interpreter's float fallback.
            UnaryOp::Not => "(float)(v == 0.0f)".into(),
        }
    } else {
        match op {
            UnaryOp::Neg => "wneg(v)".to_string(),
            UnaryOp::Not => "(long long)(v == 0)".into(),
            // The shape rule only admits float operands for these: convert like a cast.
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sqrt
            | UnaryOp::Recip
            | UnaryOp::Silu
            | UnaryOp::Sigmoid => "v".into(),
        }
    };
    let mut k = Kernel::new(op.name(), d);
    k.ptr("x", x, false);
    k.ptr("y", out, true);
    k.grid_stride(n, |w| {
        emit!(w, "const {} v = {};", value_type(d), load(d, "x[e]"));
        emit!(w, "y[e] = {};", store(out.dtype, &expr));
    });
    k.finish_flat(n)
}

/// `y = R(R(silu(g)) · u)`, HF's `act_fn(gate) * up`.
pub(super) fn silu_mul(gate: &TensorArg, up: &TensorArg, out: &TensorArg) -> KernelSource {
    let n = out.numel();
    let t = c_type(out.dtype);
    let mut k = Kernel::new("silu_mul", out.dtype);
    k.ptr("g", gate, false);
    k.ptr("u", up, false);
    k.ptr("y", out, true);
    k.grid_stride(n, |w| {
        emit!(
            w,
            "y[e] = from_f32<{t}>(round_to<{t}>(silu_f32({})) * {});",
            load(gate.dtype, "g[e]"),
            load(up.dtype, "u[e]")
        );
    });
    k.finish_flat(n)
}

/// Float → float rounds once; float → int truncates toward zero, saturating, NaN → 0;
/// float → bool is `x != 0`; int → float rounds the i64 to f32, then to the result;
/// int → int wraps (bool: `!= 0`).
pub(super) fn cast(x: &TensorArg, out: &TensorArg) -> KernelSource {
    let n = out.numel();
    let (from, to) = (x.dtype, out.dtype);
    let v = load(from, "x[e]");
    let expr = match (is_float(from), is_float(to)) {
        (true, true) => store(to, &v),
        (true, false) => match to {
            DType::Bool => format!("(b8)({v} != 0.0f)"),
            DType::I32 => store(to, &format!("f2i32({v})")),
            _ => store(to, &format!("f2i64({v})")),
        },
        (false, true) => store(to, &format!("__ll2float_rn({v})")),
        (false, false) => store(to, &v),
    };
    let mut k = Kernel::new("cast", to);
    k.ptr("x", x, false);
    k.ptr("y", out, true);
    k.grid_stride(n, |w| emit!(w, "y[e] = {expr};"));
    k.finish_flat(n)
}

/// `y[e] = cond[e] ? a[e] : b[e]`, copying elements as raw bits.
pub(super) fn select(
    cond: &TensorArg,
    a: &TensorArg,
    b: &TensorArg,
    out: &TensorArg,
) -> KernelSource {
    let n = out.numel();
    let raw = raw_type(a.elem_bytes());
    let mut k = Kernel::new("select", a.dtype);
    k.ptr("cond", cond, false);
    k.ptr_as("a", a.loc, raw, false);
    k.ptr_as("b", b.loc, raw, false);
    k.ptr_as("y", out.loc, raw, true);
    k.grid_stride(n, |w| w.line("y[e] = cond[e] ? a[e] : b[e];"));
    k.finish_flat(n)
}

/// `(splitmix64(seed ^ counter) >> 40) / 2^24`.
pub(super) fn random_uniform(seed: u64, counter: &TensorArg, out: &TensorArg) -> KernelSource {
    let n = out.numel();
    let mut k = Kernel::new("random_uniform", out.dtype);
    k.ptr("x", counter, false);
    k.ptr("y", out, true);
    k.grid_stride(n, |w| {
        emit!(
            w,
            "y[e] = uniform_f32({seed:#018x}ull, {});",
            load(counter.dtype, "x[e]")
        );
    });
    k.finish_flat(n)
}
