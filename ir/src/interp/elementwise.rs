//! Leaves and elementwise ops: fill, iota, binary, unary, silu_mul, cast, select.

use super::tensor::{round_bf16, round_to, stored_as_f32, wrap_int, Data, Tensor};
use super::util::{f32s, i64s, OpResult, Out};
use crate::op::{BinaryOp, UnaryOp};
use crate::DType;

/// `value` in every element: rounded for floats, truncated toward zero for ints,
/// `value != 0` for bool.
pub(crate) fn fill(value: f64, out: &Out) -> OpResult {
    let n = out.numel();
    Ok(if stored_as_f32(out.dtype) {
        out.f32(vec![round_to(out.dtype, value as f32); n])
    } else {
        let v = if out.dtype == DType::Bool {
            (value != 0.0) as i64
        } else {
            wrap_int(out.dtype, value as i64)
        };
        out.i64(vec![v; n])
    })
}

pub(crate) fn iota(axis: usize, out: &Out) -> OpResult {
    let (outer, n, inner) = super::util::around(&out.shape, axis);
    let mut v = Vec::with_capacity(out.numel());
    for _ in 0..outer {
        for i in 0..n {
            v.extend(std::iter::repeat_n(wrap_int(out.dtype, i as i64), inner));
        }
    }
    Ok(out.i64(v))
}

/// `a op b` with `b` repeating over the leading dims of `a` (its shape is a suffix).
pub(crate) fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, out: &Out) -> OpResult {
    let m = b.numel();
    match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => {
            if op.is_comparison() {
                let f = |p: f32, q: f32| match op {
                    BinaryOp::Eq => (p == q) as i64,
                    _ => (p < q) as i64,
                };
                return Ok(out.i64(bcast(x, y, m, f)));
            }
            Ok(out.f32(float_binary(op, x, y, m, out.dtype)))
        }
        (Data::I64(x), Data::I64(y)) => {
            let f = |p: i64, q: i64| {
                let r = match op {
                    BinaryOp::Add => p.wrapping_add(q),
                    BinaryOp::Sub => p.wrapping_sub(q),
                    BinaryOp::Mul => p.wrapping_mul(q),
                    BinaryOp::Div => p.checked_div(q).unwrap_or(0),
                    BinaryOp::Max => p.max(q),
                    BinaryOp::Min => p.min(q),
                    BinaryOp::Rem => p.checked_rem_euclid(q).unwrap_or(0),
                    BinaryOp::Eq => (p == q) as i64,
                    BinaryOp::Lt => (p < q) as i64,
                };
                wrap_int(out.dtype, r)
            };
            Ok(out.i64(bcast(x, y, m, f)))
        }
        _ => Err(format!(
            "{} operands stored differently: {a}, {b}",
            op.name()
        )),
    }
}

/// `round(x op y)` for a float `op` (not a comparison), `y` repeating every `m` elements of
/// `x`: the operation and the rounding are chosen once, so each pair's loop is a plain
/// (vectorisable) pass; the bits are those of [`round_to`] of the f32 result.
fn float_binary(op: BinaryOp, x: &[f32], y: &[f32], m: usize, dtype: DType) -> Vec<f32> {
    macro_rules! rounded {
        ($f:expr) => {
            match dtype {
                DType::BF16 => bcast(x, y, m, |p, q| round_bf16($f(p, q))),
                DType::F32 => bcast(x, y, m, $f),
                _ => bcast(x, y, m, |p, q| round_to(dtype, $f(p, q))),
            }
        };
    }
    match op {
        BinaryOp::Add => rounded!(|p: f32, q: f32| p + q),
        BinaryOp::Sub => rounded!(|p: f32, q: f32| p - q),
        BinaryOp::Mul => rounded!(|p: f32, q: f32| p * q),
        BinaryOp::Div => rounded!(|p: f32, q: f32| p / q),
        BinaryOp::Max => rounded!(|p: f32, q: f32| p.max(q)),
        BinaryOp::Min => rounded!(|p: f32, q: f32| p.min(q)),
        BinaryOp::Rem => rounded!(|p: f32, q: f32| p % q),
        BinaryOp::Eq | BinaryOp::Lt => unreachable!("comparisons are not float results"),
    }
}

fn bcast<T: Copy, R>(x: &[T], y: &[T], m: usize, f: impl Fn(T, T) -> R) -> Vec<R> {
    if m == 0 {
        return Vec::new();
    }
    let mut v = Vec::with_capacity(x.len());
    for c in x.chunks(m) {
        v.extend(c.iter().zip(y).map(|(&p, &q)| f(p, q)));
    }
    v
}

pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub(crate) fn unary(op: UnaryOp, x: &Tensor, out: &Out) -> OpResult {
    match &x.data {
        Data::F32(v) => {
            let f = |p: f32| match op {
                UnaryOp::Neg => -p,
                UnaryOp::Exp => p.exp(),
                UnaryOp::Log => p.ln(),
                UnaryOp::Sqrt => p.sqrt(),
                UnaryOp::Recip => 1.0 / p,
                UnaryOp::Silu => silu(p),
                UnaryOp::Sigmoid => sigmoid(p),
                UnaryOp::Not => (p == 0.0) as u8 as f32,
            };
            Ok(out.f32(v.iter().map(|&p| round_to(out.dtype, f(p))).collect()))
        }
        Data::I64(v) => {
            let f = |p: i64| match op {
                UnaryOp::Neg => wrap_int(out.dtype, p.wrapping_neg()),
                UnaryOp::Not => (p == 0) as i64,
                _ => unreachable!("float-only unary on an integer checked before"),
            };
            if !matches!(op, UnaryOp::Neg | UnaryOp::Not) {
                return Err(format!("{} on integer tensor {x}", op.name()));
            }
            Ok(out.i64(v.iter().map(|&p| f(p)).collect()))
        }
    }
}

/// `round(round(silu(gate)) · up)`: the activation is rounded to the dtype before the
/// product, as HF's `act_fn(gate_proj(x)) * up_proj(x)` does.
pub(crate) fn silu_mul(gate: &Tensor, up: &Tensor, out: &Out) -> OpResult {
    let g = f32s(gate, "silu_mul gate")?;
    let u = f32s(up, "silu_mul up")?;
    let d = out.dtype;
    if gate.dtype == DType::BF16 && d == DType::BF16 {
        let table = silu_bf16();
        return Ok(out.f32(
            g.iter()
                .zip(u)
                .map(|(&g, &u)| {
                    let b = g.to_bits();
                    // A bf16 tensor holds bf16 values (low 16 bits zero); anything else
                    // is computed as below.
                    let a = if b & 0xffff == 0 {
                        table[(b >> 16) as usize]
                    } else {
                        round_bf16(silu(g))
                    };
                    round_bf16(a * u)
                })
                .collect(),
        ));
    }
    Ok(out.f32(
        g.iter()
            .zip(u)
            .map(|(&g, &u)| round_to(d, round_to(d, silu(g)) * u))
            .collect(),
    ))
}

/// `R(silu(g))` in bf16 for every bf16 value `g`, indexed by its top 16 bits: the
/// activation of a bf16 `silu_mul` is a function of 65536 inputs, computed once (the same
/// `silu` and rounding as the op's definition, so the lookup is exact).
fn silu_bf16() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| round_to(DType::BF16, silu(f32::from_bits((h as u32) << 16))))
            .collect()
    })
}

/// Float → float rounds; float → int truncates toward zero, saturating at the int range
/// (NaN → 0); float → bool is `x != 0`; int → float rounds to nearest; int → i32 wraps.
pub(crate) fn cast(x: &Tensor, out: &Out) -> OpResult {
    let to = out.dtype;
    Ok(match (&x.data, stored_as_f32(to)) {
        (Data::F32(v), true) => out.f32(v.iter().map(|&p| round_to(to, p)).collect()),
        (Data::F32(v), false) => out.i64(
            v.iter()
                .map(|&p| match to {
                    DType::Bool => (p != 0.0) as i64,
                    DType::I32 => p as i32 as i64,
                    _ => p as i64,
                })
                .collect(),
        ),
        (Data::I64(v), true) => out.f32(v.iter().map(|&p| round_to(to, p as f32)).collect()),
        (Data::I64(v), false) => out.i64(v.iter().map(|&p| wrap_int(to, p)).collect()),
    })
}

pub(crate) fn select(cond: &Tensor, a: &Tensor, b: &Tensor, out: &Out) -> OpResult {
    let c = i64s(cond, "select condition")?;
    let pick = |i: usize| c[i] != 0;
    Ok(out.tensor(match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => Data::F32(
            (0..c.len())
                .map(|i| if pick(i) { x[i] } else { y[i] })
                .collect(),
        ),
        (Data::I64(x), Data::I64(y)) => Data::I64(
            (0..c.len())
                .map(|i| if pick(i) { x[i] } else { y[i] })
                .collect(),
        ),
        _ => return Err(format!("select operands stored differently: {a}, {b}")),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::op::Op;

    #[test]
    fn binary_broadcasts_suffix_and_rounds() {
        let a = tf(DType::BF16, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = tf(DType::BF16, &[2], &[0.00390625, 10.0]);
        // 1 + 2^-8 rounds to 1 in bf16 (tie to even); 3 + 2^-8 rounds to 3.
        let r = run_op(Op::Binary(BinaryOp::Add), vec![a.clone(), b.clone()]);
        assert_eq!(r.as_f32().unwrap(), &[1.0, 12.0, 3.0, 14.0]);
        let r = run_op(Op::Binary(BinaryOp::Lt), vec![a, b]);
        assert_eq!(r.dtype, DType::Bool);
        assert_eq!(r.as_i64().unwrap(), &[0, 1, 0, 1]);
        let s = tf(DType::F32, &[], &[2.0]);
        let x = tf(DType::F32, &[3], &[1.0, -4.0, 6.0]);
        let r = run_op(Op::Binary(BinaryOp::Div), vec![x.clone(), s.clone()]);
        assert_eq!(r.as_f32().unwrap(), &[0.5, -2.0, 3.0]);
        let r = run_op(Op::Binary(BinaryOp::Max), vec![x, s]);
        assert_eq!(r.as_f32().unwrap(), &[2.0, 2.0, 6.0]);
    }

    #[test]
    fn binary_ints_wrap_and_divide_by_zero() {
        let a = ti(DType::I32, &[4], &[i32::MAX as i64, 7, -7, 5]);
        let b = ti(DType::I32, &[4], &[1, 2, 2, 0]);
        let r = run_op(Op::Binary(BinaryOp::Add), vec![a.clone(), b.clone()]);
        assert_eq!(r.as_i64().unwrap(), &[i32::MIN as i64, 9, -5, 5]);
        let r = run_op(Op::Binary(BinaryOp::Div), vec![a.clone(), b.clone()]);
        assert_eq!(r.as_i64().unwrap(), &[i32::MAX as i64, 3, -3, 0]);
        let r = run_op(Op::Binary(BinaryOp::Eq), vec![a.clone(), a]);
        assert_eq!(r.as_i64().unwrap(), &[1, 1, 1, 1]);
        // rem: Euclidean for ints (non-negative for a positive divisor), by zero is 0.
        let a = ti(DType::I64, &[4], &[7, -7, 9, 5]);
        let b = ti(DType::I64, &[4], &[3, 3, 5, 0]);
        let r = run_op(Op::Binary(BinaryOp::Rem), vec![a, b]);
        assert_eq!(r.as_i64().unwrap(), &[1, 2, 4, 0]);
        // fmod for floats: the sign of the dividend.
        let a = tf(DType::F32, &[2], &[7.5, -7.5]);
        let b = tf(DType::F32, &[2], &[2.0, 2.0]);
        let r = run_op(Op::Binary(BinaryOp::Rem), vec![a, b]);
        assert_eq!(r.as_f32().unwrap(), &[1.5, -1.5]);
    }

    #[test]
    fn unary_ops() {
        let x = tf(DType::F32, &[3], &[0.0, 1.0, -2.0]);
        let e = std::f32::consts::E;
        let cases: [(UnaryOp, [f32; 3]); 5] = [
            (UnaryOp::Neg, [-0.0, -1.0, 2.0]),
            (UnaryOp::Exp, [1.0, e, 1.0 / (e * e)]),
            (UnaryOp::Sigmoid, [0.5, 0.731_058_6, 0.119_202_92]),
            // silu(x) = x·sigmoid(x)
            (UnaryOp::Silu, [0.0, 0.731_058_6, -0.238_405_84]),
            (UnaryOp::Recip, [f32::INFINITY, 1.0, -0.5]),
        ];
        for (op, want) in cases {
            let r = run_op(Op::Unary(op), vec![x.clone()]);
            assert_close(r.as_f32().unwrap(), &want, 1e-6);
        }
        let r = run_op(
            Op::Unary(UnaryOp::Sqrt),
            vec![tf(DType::BF16, &[1], &[2.0])],
        );
        // sqrt(2) = 1.41421… rounds to bf16 1.4140625.
        assert_eq!(r.as_f32().unwrap(), &[1.4140625]);
        let r = run_op(
            Op::Unary(UnaryOp::Not),
            vec![ti(DType::Bool, &[2], &[0, 1])],
        );
        assert_eq!(r.as_i64().unwrap(), &[1, 0]);
        let r = run_op(Op::Unary(UnaryOp::Neg), vec![ti(DType::I64, &[1], &[3])]);
        assert_eq!(r.as_i64().unwrap(), &[-3]);
    }

    /// The bf16 table is `R(silu(g))` for every bf16 `g` (NaNs included), and a gate
    /// that is not a bf16 value still takes the definition.
    #[test]
    fn silu_bf16_table_is_the_definition() {
        let t = silu_bf16();
        for h in 0..=u16::MAX {
            let g = f32::from_bits((h as u32) << 16);
            let want = round_to(DType::BF16, silu(g));
            assert_eq!(
                t[h as usize].to_bits(),
                want.to_bits(),
                "bf16 bits {h:#06x}"
            );
        }
        let odd = Tensor {
            dtype: DType::BF16,
            shape: vec![2],
            data: Data::F32(vec![0.75, 1.0 + f32::EPSILON]),
        };
        let up = tf(DType::BF16, &[2], &[3.0, 1.0]);
        let out = Out {
            dtype: DType::BF16,
            shape: vec![2],
        };
        let r = silu_mul(&odd, &up, &out).unwrap();
        let want = round_to(DType::BF16, round_to(DType::BF16, silu(1.0 + f32::EPSILON)));
        assert_eq!(r.as_f32().unwrap(), &[1.5234375, want]);
    }

    #[test]
    fn silu_mul_rounds_activation_first() {
        // silu(0.75) = 0.5078854 -> bf16 0.5078125; × 3 = 1.5234375 (HF order). Rounding
        // once would give 0.5078854 × 3 = 1.5236562 -> 1.53125.
        // silu(1.5) = 1.2263618 -> bf16 1.2265625; × 3 = 3.6796875 -> bf16 3.6875
        // (a tie, to even); once: 3.6790853 -> 3.671875.
        let g = tf(DType::BF16, &[2], &[0.75, 1.5]);
        let u = tf(DType::BF16, &[2], &[3.0, 3.0]);
        let r = run_op(Op::SiluMul, vec![g, u]);
        assert_eq!(r.as_f32().unwrap(), &[1.5234375, 3.6875]);
        // f32: silu(3) · 2 = 2.8577223 · 2.
        let g = tf(DType::F32, &[1], &[3.0]);
        let u = tf(DType::F32, &[1], &[2.0]);
        let r = run_op(Op::SiluMul, vec![g, u]);
        assert_close(r.as_f32().unwrap(), &[5.715_444_6], 1e-6);
    }

    #[test]
    fn cast_rules() {
        let x = tf(DType::F32, &[5], &[1.7, -1.7, 0.0, f32::NAN, 3e10]);
        let r = run_op(Op::Cast { to: DType::I32 }, vec![x.clone()]);
        assert_eq!(r.as_i64().unwrap(), &[1, -1, 0, 0, i32::MAX as i64]);
        let r = run_op(Op::Cast { to: DType::Bool }, vec![x.clone()]);
        assert_eq!(r.as_i64().unwrap(), &[1, 1, 0, 1, 1]);
        let r = run_op(Op::Cast { to: DType::BF16 }, vec![x]);
        assert_eq!(r.as_f32().unwrap()[0], 1.703125);
        let i = ti(DType::I64, &[2], &[257, 1 << 33]);
        let r = run_op(Op::Cast { to: DType::BF16 }, vec![i.clone()]);
        assert_eq!(r.as_f32().unwrap(), &[256.0, 8589934592.0]);
        let r = run_op(Op::Cast { to: DType::I32 }, vec![i]);
        assert_eq!(r.as_i64().unwrap(), &[257, 0]);
    }

    #[test]
    fn select_fill_iota() {
        let c = ti(DType::Bool, &[3], &[1, 0, 1]);
        let a = ti(DType::I32, &[3], &[1, 2, 3]);
        let b = ti(DType::I32, &[3], &[-1, -2, -3]);
        let r = run_op(Op::Select, vec![c, a, b]);
        assert_eq!(r.as_i64().unwrap(), &[1, -2, 3]);
        let r = run_op(
            Op::Fill {
                value: 0.1,
                ty: tt(DType::BF16, &[2]),
            },
            vec![],
        );
        assert_eq!(r.as_f32().unwrap(), &[0.100_097_656; 2]);
        let r = run_op(
            Op::Iota {
                axis: 1,
                ty: tt(DType::I32, &[2, 3]),
            },
            vec![],
        );
        assert_eq!(r.as_i64().unwrap(), &[0, 1, 2, 0, 1, 2]);
        let r = run_op(
            Op::Iota {
                axis: 0,
                ty: tt(DType::I64, &[2, 2]),
            },
            vec![],
        );
        assert_eq!(r.as_i64().unwrap(), &[0, 0, 1, 1]);
    }
}
