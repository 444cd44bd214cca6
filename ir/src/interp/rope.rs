//! Rotary position embedding, mirroring HF transformers' f32 arithmetic step by step
//! (`modeling_rope_utils.py`, `LlamaRotaryEmbedding`, `apply_rotary_pos_emb`).

use super::tensor::{round_bf16, round_to, Tensor};
use super::util::{f32s, i64s, OpResult, Out};
use crate::op::{RopeScaling, RopeStyle};
use crate::DType;

/// The `dim / 2` inverse frequencies of a rotation over `dim` features, in f32 as HF
/// computes them. Each torch step is one f32 rounding here; torch's `a / t` for a Python
/// scalar `a` is `reciprocal(t) * a`, so it is written that way.
///
/// - base: `1 / theta^(2i / dim)` with `theta` rounded to f32, the exponent an f32
///   division, and the power in f64 rounded to f32 (torch uses SLEEF `powf`, which can
///   differ by one ulp).
/// - `Llama3` (`_compute_llama3_parameters`): wavelength `λ = (1/f) · 2π`; `f / factor`
///   where `λ > L/low`; `((1 - s) · f) / factor + s · f` with `s = ((1/λ) · L - low) /
///   (high - low)` where `L/high <= λ <= L/low`; `f` unchanged where `λ < L/high`.
/// - `Yarn` (`_compute_yarn_parameters`): `low = max(floor(c(beta_fast)), 0)`,
///   `high = min(ceil(c(beta_slow)), dim - 1)` with `c(r) = dim · ln(L / (2πr)) / (2 ln θ)`
///   in f64 (`high += 0.001` when equal); `ramp = clamp((i - low) / (high - low), 0, 1)`,
///   `e = 1 - ramp`; `f' = (1 / (factor · p)) · (1 - e) + (1 / p) · e` with `p = θ^(2i/dim)`.
pub fn rope_inv_freq(theta: f64, scaling: &RopeScaling, dim: usize) -> Vec<f32> {
    let base = theta as f32;
    let pos_freq: Vec<f32> = (0..dim / 2)
        .map(|i| {
            let e = (2 * i) as f32 / dim as f32;
            (base as f64).powf(e as f64) as f32
        })
        .collect();
    let inv: Vec<f32> = pos_freq.iter().map(|&p| 1.0 / p).collect();
    match *scaling {
        RopeScaling::None => inv,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => {
            let l = original_max_position as f64;
            let (lo_wl, hi_wl) = ((l / low_freq_factor) as f32, (l / high_freq_factor) as f32);
            let two_pi = std::f64::consts::TAU as f32;
            let (factor, low) = (factor as f32, low_freq_factor as f32);
            let span = (high_freq_factor - low_freq_factor) as f32;
            inv.iter()
                .map(|&f| {
                    let wl = (1.0 / f) * two_pi;
                    let fl = if wl > lo_wl { f / factor } else { f };
                    // HF: `~(λ < L/high) * ~(λ > L/low)`; λ is never NaN for finite θ.
                    let medium = wl >= hi_wl && wl <= lo_wl;
                    if medium {
                        let s = ((1.0 / wl) * l as f32 - low) / span;
                        ((1.0 - s) * fl) / factor + s * fl
                    } else {
                        fl
                    }
                })
                .collect()
        }
        RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            ..
        } => {
            let d = dim as f64;
            let corr = |r: f64| {
                (d * (original_max_position as f64 / (r * 2.0 * std::f64::consts::PI)).ln())
                    / (2.0 * theta.ln())
            };
            let low = corr(beta_fast).floor().max(0.0);
            let mut high = corr(beta_slow).ceil().min(d - 1.0);
            if low == high {
                high += 0.001;
            }
            let (low32, span) = (low as f32, (high - low) as f32);
            let f32factor = factor as f32;
            pos_freq
                .iter()
                .zip(&inv)
                .enumerate()
                .map(|(i, (&p, &extra))| {
                    let inter = 1.0 / (f32factor * p);
                    let ramp = ((i as f32 - low32) / span).clamp(0.0, 1.0);
                    let e = 1.0 - ramp;
                    inter * (1.0 - e) + extra * e
                })
                .collect()
        }
    }
}

/// `(x[B, T, H, D], pos[B, T])`: for each token, `angle_i = f32(pos) · f_i` (f32),
/// `c_i = round(f32(cos(angle_i)) · mscale)`, `s_i` likewise (cos/sin evaluated in f64 and
/// rounded to f32; rounding is to the dtype of `x`, as HF casts cos/sin to `x.dtype`). Then,
/// for each pair `(a, b)` of the style, HF's `x·cos + rotate_half(x)·sin` with each product
/// and the sum rounded to the dtype: `a' = R(R(a·c) + R(-b·s))`, `b' = R(R(b·c) + R(a·s))`.
/// `Half` pairs `(i, i + r/2)`, `Interleaved` pairs `(2i, 2i + 1)`, both at frequency `i`
/// (HF's DeepSeek-V3 de-interleaves first, permuting the output features; the pairs and
/// values are the same). Features `r..D` pass through.
pub(crate) fn rope(
    x: &Tensor,
    pos: &Tensor,
    theta: f64,
    scaling: &RopeScaling,
    style: RopeStyle,
    rotary_dim: usize,
    out: &Out,
) -> OpResult {
    let xv = f32s(x, "rope input")?;
    let pv = i64s(pos, "rope positions")?;
    let (h, d) = (x.shape[2], x.shape[3]);
    if rotary_dim > d || !rotary_dim.is_multiple_of(2) {
        return Err(format!("rotary_dim {rotary_dim} invalid for head dim {d}"));
    }
    let half = rotary_dim / 2;
    let dt = out.dtype;
    let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
    let mut res = xv.to_vec();
    let key = TableKey {
        theta,
        scaling: scaling.clone(),
        rotary_dim,
        dtype: dt,
    };
    for (tok, &p) in pv.iter().enumerate() {
        TABLES.with_borrow_mut(|tables| cos_sin(tables, &key, p, &mut cos, &mut sin));
        let heads = &mut res[tok * h * d..(tok + 1) * h * d];
        // The rounding and the pairing chosen once per token, so each head's pass is a
        // plain loop.
        match (dt, style) {
            (DType::BF16, RopeStyle::Half) => rotate(heads, d, &cos, &sin, half_pairs, round_bf16),
            (DType::BF16, RopeStyle::Interleaved) => {
                rotate(heads, d, &cos, &sin, interleaved_pairs, round_bf16)
            }
            (_, RopeStyle::Half) => rotate(heads, d, &cos, &sin, half_pairs, |v| round_to(dt, v)),
            (_, RopeStyle::Interleaved) => {
                rotate(heads, d, &cos, &sin, interleaved_pairs, |v| round_to(dt, v))
            }
        }
    }
    Ok(out.f32(res))
}

/// The features rotated together as pair `i` of `half`: `(i, i + half)`.
fn half_pairs(i: usize, half: usize) -> (usize, usize) {
    (i, i + half)
}

/// The features rotated together as pair `i`: `(2i, 2i + 1)`.
fn interleaved_pairs(i: usize, _half: usize) -> (usize, usize) {
    (2 * i, 2 * i + 1)
}

/// Rotates pairs `0..cos.len()` of every head (`d` features each) of `heads`:
/// `a' = r(r(a·c) + r(−b·s))`, `b' = r(r(b·c) + r(a·s))`.
#[inline(always)]
fn rotate(
    heads: &mut [f32],
    d: usize,
    cos: &[f32],
    sin: &[f32],
    pair: impl Fn(usize, usize) -> (usize, usize),
    r: impl Fn(f32) -> f32,
) {
    let half = cos.len();
    for v in heads.chunks_exact_mut(d) {
        for i in 0..half {
            let (ia, ib) = pair(i, half);
            let (a, b) = (v[ia], v[ib]);
            v[ia] = r(r(a * cos[i]) + r(-b * sin[i]));
            v[ib] = r(r(b * cos[i]) + r(a * sin[i]));
        }
    }
}

/// What the rounded `cos` / `sin` of a position depend on besides the position.
#[derive(Clone, PartialEq)]
struct TableKey {
    theta: f64,
    scaling: RopeScaling,
    rotary_dim: usize,
    dtype: DType,
}

/// The rounded `(cos, sin)` of positions `0..len`, `half` of each per position, filled on
/// demand: the same values [`rope`] defines, computed once per position instead of once
/// per token and layer.
struct Table {
    key: TableKey,
    inv: Vec<f32>,
    mscale: f32,
    /// Per position: `half` cosines, then `half` sines.
    values: Vec<f32>,
}

/// Positions a table holds at most; others are computed each time.
const TABLE_POSITIONS: i64 = 1 << 20;

thread_local! {
    static TABLES: std::cell::RefCell<Vec<Table>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `c_i = R(f32(cos(f32(p) · f_i)) · mscale)` and `s_i` likewise into `cos`, `sin`.
fn cos_sin(tables: &mut Vec<Table>, key: &TableKey, p: i64, cos: &mut [f32], sin: &mut [f32]) {
    let half = key.rotary_dim / 2;
    let at = match tables.iter().position(|t| t.key == *key) {
        Some(i) => i,
        None => {
            tables.push(Table {
                key: key.clone(),
                inv: rope_inv_freq(key.theta, &key.scaling, key.rotary_dim),
                mscale: match key.scaling {
                    RopeScaling::Yarn { mscale, .. } => mscale as f32,
                    _ => 1.0,
                },
                values: Vec::new(),
            });
            tables.len() - 1
        }
    };
    let t = &mut tables[at];
    let dt = key.dtype;
    let one = |inv: &[f32], mscale: f32, p: i64, i: usize| {
        let angle = (p as f32 * inv[i]) as f64;
        (
            round_to(dt, angle.cos() as f32 * mscale),
            round_to(dt, angle.sin() as f32 * mscale),
        )
    };
    if !(0..TABLE_POSITIONS).contains(&p) || half == 0 {
        for i in 0..half {
            (cos[i], sin[i]) = one(&t.inv, t.mscale, p, i);
        }
        return;
    }
    let p = p as usize;
    let have = t.values.len() / (2 * half);
    if p >= have {
        for q in have..=p {
            for i in 0..half {
                let (c, _) = one(&t.inv, t.mscale, q as i64, i);
                t.values.push(c);
            }
            for i in 0..half {
                let (_, s) = one(&t.inv, t.mscale, q as i64, i);
                t.values.push(s);
            }
        }
    }
    let row = &t.values[p * 2 * half..][..2 * half];
    cos.copy_from_slice(&row[..half]);
    sin.copy_from_slice(&row[half..]);
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::op::Op;
    use crate::DType;

    fn rope_op(scaling: RopeScaling, style: RopeStyle, rotary_dim: u64) -> Op {
        Op::Rope {
            theta: 10000.0,
            scaling,
            style,
            rotary_dim,
        }
    }

    /// The position tables give the definition's values whatever order positions come
    /// in, outside the table's range too.
    #[test]
    fn tables_equal_the_definition() {
        let scaling = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.1,
        };
        for dtype in [DType::BF16, DType::F32] {
            let key = TableKey {
                theta: 10000.0,
                scaling: scaling.clone(),
                rotary_dim: 8,
                dtype,
            };
            let inv = rope_inv_freq(10000.0, &scaling, 8);
            let mut tables = Vec::new();
            for p in [7i64, 3, 0, 900, -2, TABLE_POSITIONS + 5, 3] {
                let (mut c, mut s) = ([0.0f32; 4], [0.0f32; 4]);
                cos_sin(&mut tables, &key, p, &mut c, &mut s);
                for i in 0..4 {
                    let angle = (p as f32 * inv[i]) as f64;
                    assert_eq!(
                        c[i],
                        round_to(dtype, angle.cos() as f32 * 1.1),
                        "cos {p} {i}"
                    );
                    assert_eq!(
                        s[i],
                        round_to(dtype, angle.sin() as f32 * 1.1),
                        "sin {p} {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn inv_freq_default() {
        // 10000^(-2i/4) for i = 0, 1.
        assert_eq!(
            rope_inv_freq(10000.0, &RopeScaling::None, 4),
            vec![1.0, 0.01]
        );
    }

    /// Values from HF `_compute_llama3_parameters` (transformers 5.x, torch CPU f32).
    #[test]
    fn inv_freq_llama3_regions() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 64,
        };
        // θ = 10000, dim 16: f_i = 10^(-i/2), λ_i = 2π/f_i. L/high = 16, L/low = 64.
        // i = 0: λ = 6.28 < 16, kept. i = 1: λ = 19.9, s = (64/19.9 - 1)/3 = 0.7403,
        // f = 0.31623·((1 - s)/8 + s) = 0.24438. i = 2: λ = 62.8, s = 0.0062,
        // f = 0.1·(0.9938/8 + 0.0062) = 0.013042. i >= 3: λ > 64, f/8.
        let want = [
            1.0,
            0.244_384_59,
            0.013_042_256,
            0.003_952_847_3,
            0.001_25,
            0.000_395_284_73,
            0.000_125,
            3.952_847_3e-5,
        ];
        assert_eq!(rope_inv_freq(10000.0, &s, 16), want);
        // Llama-3.1-8B: θ = 500000, factor 8, low 1, high 4, L = 8192, dim 128.
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192,
        };
        let f = rope_inv_freq(500000.0, &s, 128);
        let got: Vec<f32> = [0, 20, 40, 45, 48, 50, 63].iter().map(|&i| f[i]).collect();
        let want = [
            1.0,
            0.016_560_44,
            3.428_102_4e-5,
            1.229_763_9e-5,
            6.647_869_7e-6,
            4.411_534_5e-6,
            3.068_926e-7,
        ];
        assert_eq!(got, want);
    }

    /// Values from HF `_compute_yarn_parameters`.
    #[test]
    fn inv_freq_yarn_ramp() {
        // θ = 10000, dim 16, L = 64, factor 4, beta 32/1: low = max(floor(-0.99), 0) = 0,
        // high = ceil(2.02) = 3; ramp = i/3, so f_1 = f/4·(1/3) + f·(2/3) and f_i = f/4 for
        // i >= 3.
        let s = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
        };
        let want = [
            1.0,
            0.237_170_82,
            0.049_999_997,
            0.007_905_695,
            0.002_5,
            0.000_790_569_47,
            0.000_25,
            7.905_695e-5,
        ];
        assert_eq!(rope_inv_freq(10000.0, &s, 16), want);
        // Kimi-K2: θ = 50000, dim 64, factor 32, L = 4096, beta 1/1 (low 19, high 20).
        let s = RopeScaling::Yarn {
            factor: 32.0,
            original_max_position: 4096,
            beta_fast: 1.0,
            beta_slow: 1.0,
            mscale: 1.0,
        };
        let f = rope_inv_freq(50000.0, &s, 64);
        let got: Vec<f32> = [0, 10, 18, 19, 20, 21, 31].iter().map(|&i| f[i]).collect();
        let want = [
            1.0,
            0.034_007_277,
            0.002_274_203_8,
            0.001_621_76,
            3.614_046_7e-5,
            2.577_216_8e-5,
            8.764_413e-7,
        ];
        assert_eq!(got, want);
    }

    fn rot_x() -> (Tensor, Tensor) {
        let x = tf(DType::F32, &[1, 1, 1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let pos = ti(DType::I32, &[1, 1], &[1]);
        (x, pos)
    }

    #[test]
    fn rope_half_f32() {
        // f = [1, 0.01], pos 1. Pairs (0, 2) at angle 1, (1, 3) at angle 0.01:
        // out0 = 1·cos1 - 3·sin1, out2 = 3·cos1 + 1·sin1, out1 = 2·cos.01 - 4·sin.01,
        // out3 = 4·cos.01 + 2·sin.01.
        let (x, pos) = rot_x();
        let r = run_op(rope_op(RopeScaling::None, RopeStyle::Half, 4), vec![x, pos]);
        let (c1, s1, c2, s2) = (1f32.cos(), 1f32.sin(), 0.01f32.cos(), 0.01f32.sin());
        let want = [
            c1 - 3.0 * s1,
            2.0 * c2 - 4.0 * s2,
            3.0 * c1 + s1,
            4.0 * c2 + 2.0 * s2,
        ];
        assert_close(r.as_f32().unwrap(), &want, 1e-6);
    }

    #[test]
    fn rope_interleaved_and_partial() {
        let (c1, s1, c2, s2) = (1f32.cos(), 1f32.sin(), 0.01f32.cos(), 0.01f32.sin());
        // Pairs (0, 1) at angle 1, (2, 3) at angle 0.01.
        let (x, pos) = rot_x();
        let r = run_op(
            rope_op(RopeScaling::None, RopeStyle::Interleaved, 4),
            vec![x, pos],
        );
        let want = [
            c1 - 2.0 * s1,
            2.0 * c1 + s1,
            3.0 * c2 - 4.0 * s2,
            4.0 * c2 + 3.0 * s2,
        ];
        assert_close(r.as_f32().unwrap(), &want, 1e-6);
        // rotary_dim 2: the pair (0, 1) at angle 1 (f = [1]); features 2, 3 pass through.
        let (x, pos) = rot_x();
        let r = run_op(rope_op(RopeScaling::None, RopeStyle::Half, 2), vec![x, pos]);
        assert_close(
            r.as_f32().unwrap(),
            &[c1 - 2.0 * s1, 2.0 * c1 + s1, 3.0, 4.0],
            1e-6,
        );
    }

    #[test]
    fn rope_yarn_mscale_scales_cos_sin() {
        let (x, _) = rot_x();
        let pos = ti(DType::I64, &[1, 1], &[0]);
        let s = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position: 64,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.5,
        };
        // pos 0: cos = 1.5, sin = 0, so every rotated feature is scaled by 1.5.
        let r = run_op(rope_op(s, RopeStyle::Half, 4), vec![x, pos]);
        assert_eq!(r.as_f32().unwrap(), &[1.5, 3.0, 4.5, 6.0]);
    }

    /// Expected values from HF `LlamaRotaryEmbedding` + `apply_rotary_pos_emb` in bf16:
    /// x = arange(24)·0.37 - 3.1 as bf16, shape [1, T=3, H=1, D=8], θ = 10000, pos [0, 5,
    /// 1000].
    #[test]
    fn rope_bf16_matches_hf() {
        let xs: Vec<f32> = (0..24).map(|i| i as f32 * 0.37 - 3.1).collect();
        let x = tf(DType::BF16, &[1, 3, 1, 8], &xs);
        let pos = ti(DType::I64, &[1, 3], &[0, 5, 1000]);
        let r = run_op(rope_op(RopeScaling::None, RopeStyle::Half, 8), vec![x, pos]);
        let want = [
            -3.09375,
            -2.734375,
            -2.359375,
            -1.9921875,
            -1.6171875,
            -1.25,
            -0.87890625,
            -0.51171875,
            1.25,
            -0.6171875,
            0.498_046_88,
            0.95703125,
            0.515625,
            1.609375,
            2.109375,
            2.453125,
            -2.0,
            5.125,
            -0.25,
            -2.40625,
            4.75,
            2.40625,
            -6.15625,
            6.25,
        ];
        assert_eq!(r.as_f32().unwrap(), want);
    }
}
