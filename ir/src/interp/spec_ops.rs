//! Speculative-decoding ops: sample, top_p_threshold, random_uniform, accept_chain.

use super::tensor::Tensor;
use super::util::{f32s, i64s, last_dim, OpResult, Out};

/// Values of one block of a row in [`sample`]'s running sum.
pub const SAMPLE_BLOCK: usize = 256;

/// Inverse CDF per row over a blocked running sum, so that a kernel can sum the blocks in
/// parallel and still match it bit for bit: the row is cut into blocks of [`SAMPLE_BLOCK`]
/// values; `s_j` is block `j`'s sequential f32 sum, `P_j = s_0 + … + s_{j−1}` (sequential,
/// `P_0 = 0`), the total `P_n`, and the running sum at element `r` of block `j` is
/// `P_j + (x_0 + … + x_r)` (the block's own sequential partial sum, added to `P_j` once).
/// The result is the smallest `i` whose running sum exceeds `u · total`; `V − 1` when none
/// does (`u ≥ 1`, or all-zero / NaN probabilities). The running sum is monotone over
/// non-negative values (f32 addition is monotone in each operand, and a block's last
/// running sum is `P_{j+1}`), so for `u` in `[0, 1)` the result always has non-zero
/// probability: zeros never raise the running sum past the threshold.
pub(crate) fn sample(probs: &Tensor, u: &Tensor, out: &Out) -> OpResult {
    let p = f32s(probs, "sample probs")?;
    let uv = f32s(u, "sample uniforms")?;
    let v = last_dim(probs);
    if v == 0 {
        return Err("sample over an empty vocabulary".into());
    }
    let res = p
        .chunks(v)
        .zip(uv)
        .map(|(row, &u)| sample_row(row, u) as i64)
        .collect();
    Ok(out.i64(res))
}

/// [`sample`] of one row.
fn sample_row(row: &[f32], u: f32) -> usize {
    let sequential = |xs: &[f32]| xs.iter().fold(0.0f32, |a, &b| a + b);
    let starts: Vec<f32> = row
        .chunks(SAMPLE_BLOCK)
        .scan(0.0f32, |acc, blk| {
            let start = *acc;
            *acc += sequential(blk);
            Some(start)
        })
        .collect();
    let last = row.chunks(SAMPLE_BLOCK).last().map_or(0.0, sequential);
    let total = starts.last().map_or(0.0, |&s| s + last);
    let thr = u * total;
    for (j, blk) in row.chunks(SAMPLE_BLOCK).enumerate() {
        let mut partial = 0.0f32;
        for (r, &x) in blk.iter().enumerate() {
            partial += x;
            if starts[j] + partial > thr {
                return j * SAMPLE_BLOCK + r;
            }
        }
    }
    row.len() - 1
}

/// Per row, the smallest `t ≥ 0` with `S(t) = Σ_{w_j > t} w_j < p · Z` (`w` = the positive
/// elements, others 0; `Z = Σ w`; `p` the row's), 0 when `p · Z = 0` or `p ≥ 1` (or NaN).
/// `S` only drops at elements, so the answer is the least element whose strictly larger
/// elements weigh less than `p · Z`: walk the distinct values in descending order, adding
/// each one's mass after testing it. Sums are f64 (a kernel's f32 sums may differ only
/// where `S` lies within rounding of `p · Z`).
pub(crate) fn top_p_threshold(probs: &Tensor, ps: &Tensor, out: &Out) -> OpResult {
    let x = f32s(probs, "top_p_threshold probs")?;
    let ps = f32s(ps, "top_p_threshold p")?;
    let v = last_dim(probs);
    if v == 0 {
        return Err("top_p_threshold over an empty row".into());
    }
    let res = x
        .chunks(v)
        .zip(ps)
        .map(|(row, &p)| {
            // p ≥ 1 or NaN: nothing is cut.
            if p >= 1.0 || p.is_nan() {
                return 0.0;
            }
            let mut w: Vec<f32> = row.iter().map(|&e| if e > 0.0 { e } else { 0.0 }).collect();
            let target = p as f64 * w.iter().map(|&e| e as f64).sum::<f64>();
            if target <= 0.0 {
                return 0.0;
            }
            w.sort_unstable_by(|a, b| b.total_cmp(a));
            let (mut above, mut tau, mut i) = (0.0f64, 0.0f32, 0);
            while i < w.len() && above < target {
                tau = w[i];
                while i < w.len() && w[i] == tau {
                    above += w[i] as f64;
                    i += 1;
                }
            }
            tau
        })
        .collect();
    Ok(out.f32(res))
}

/// Per row, its `k`-th largest element (duplicates counted, NaN as −inf, −0 as +0); −inf
/// when `k < 1` or `k ≥ n`.
pub(crate) fn top_k_threshold(x: &Tensor, ks: &Tensor, out: &Out) -> OpResult {
    let xs = f32s(x, "top_k_threshold values")?;
    let ks = i64s(ks, "top_k_threshold k")?;
    let n = last_dim(x);
    if n == 0 {
        return Err("top_k_threshold over an empty row".into());
    }
    let res = xs
        .chunks(n)
        .zip(ks)
        .map(|(row, &k)| {
            if k < 1 || k as u64 >= n as u64 {
                return f32::NEG_INFINITY;
            }
            let mut w: Vec<f32> = row
                .iter()
                .map(|&e| if e.is_nan() { f32::NEG_INFINITY } else { e })
                .collect();
            w.sort_unstable_by(|a, b| b.total_cmp(a));
            w[k as usize - 1] + 0.0
        })
        .collect();
    Ok(out.f32(res))
}

/// SplitMix64 (Steele, Lea, Flood 2014; Vigna's `splitmix64.c`): one step from state `x`,
/// i.e. the output mix of `x + 0x9E3779B97F4A7C15`.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `(splitmix64(seed ^ counter) >> 40) / 2^24`: exact in f32, in `[0, 1 - 2^-24]`.
pub(crate) fn random_uniform(counter: &Tensor, seed: u64, out: &Out) -> OpResult {
    let c = i64s(counter, "random_uniform counter")?;
    Ok(out.f32(
        c.iter()
            .map(|&x| (splitmix64(seed ^ x as u64) >> 40) as f32 / (1u32 << 24) as f32)
            .collect(),
    ))
}

/// Per row `b`: the number of leading `i < K` with `draft[b, i] == target[b, i]`.
pub(crate) fn accept_chain(draft: &Tensor, target: &Tensor, out: &Out) -> OpResult {
    let d = i64s(draft, "accept_chain draft")?;
    let t = i64s(target, "accept_chain target")?;
    let (b, k) = (draft.shape[0], draft.shape[1]);
    let res = (0..b)
        .map(|bi| {
            let dr = &d[bi * k..(bi + 1) * k];
            let tr = &t[bi * (k + 1)..bi * (k + 1) + k];
            dr.iter().zip(tr).take_while(|(x, y)| x == y).count() as i64
        })
        .collect();
    Ok(out.i64(res))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::op::Op;
    use crate::DType;

    fn sample_one(probs: &[f32], u: f32) -> i64 {
        let p = tf(DType::F32, &[1, probs.len()], probs);
        let u = tf(DType::F32, &[1], &[u]);
        let r = run_op(Op::Sample, vec![p, u]);
        assert_eq!(r.dtype, DType::I32);
        r.as_i64().unwrap()[0]
    }

    #[test]
    fn sample_inverse_cdf_edges() {
        let p = [0.0, 0.25, 0.0, 0.75, 0.0];
        // cumsum = [0, .25, .25, 1, 1].
        assert_eq!(sample_one(&p, 0.0), 1, "u = 0 skips leading zeros");
        assert_eq!(sample_one(&p, 0.25), 3, "strictly greater than u·sum");
        assert_eq!(sample_one(&p, 0.2), 1);
        assert_eq!(
            sample_one(&p, 1.0 - 1.0 / 16_777_216.0),
            3,
            "u -> 1 skips trailing zeros"
        );
        assert_eq!(sample_one(&p, 1.0), 4, "u = 1 clamps to V - 1");
        assert_eq!(sample_one(&[0.0; 3], 0.5), 2, "all zero clamps to V - 1");
        // Unnormalised: cumsum [2, 8], u·sum = 1.6 -> 0, 2.4 -> 1.
        assert_eq!(sample_one(&[2.0, 6.0], 0.2), 0);
        assert_eq!(sample_one(&[2.0, 6.0], 0.3), 1);
    }

    #[test]
    fn sample_rows() {
        let p = tf(DType::F32, &[2, 2], &[1.0, 0.0, 0.0, 1.0]);
        let u = tf(DType::F32, &[2], &[0.9, 0.1]);
        let r = run_op(Op::Sample, vec![p, u]);
        assert_eq!(r.as_i64().unwrap(), &[0, 1]);
    }

    #[test]
    fn sample_sums_blocks_then_adds_each_partial_once() {
        // Two blocks: s_0 = 256 · 2^-24 is exact, and the running sum of block 1 is
        // P_1 + partial. With one sequential sum 1 + 2^-24 would round back to 1 at every
        // step; here block 0's mass survives as a block: P_1 = 2^-16.
        let mut p = vec![2f32.powi(-24); SAMPLE_BLOCK];
        p.extend([1.0, 1.0]);
        let total = 2f32.powi(-16) + 2.0;
        // u · total just below P_1: an element of block 0.
        let u = (2f32.powi(-16) * 0.5) / total;
        assert!(sample_one(&p, u) < SAMPLE_BLOCK as i64);
        // Just past P_1 + 1: the second element of block 1.
        let u = (2f32.powi(-16) + 1.5) / total;
        assert_eq!(sample_one(&p, u), SAMPLE_BLOCK as i64 + 1);
        // A zero block between never takes the draw.
        let mut q = vec![0.0f32; 2 * SAMPLE_BLOCK];
        q[3] = 0.5;
        q.push(0.5);
        assert_eq!(sample_one(&q, 0.5), 2 * SAMPLE_BLOCK as i64);
        assert_eq!(sample_one(&q, 0.49), 3);
    }

    fn threshold(row: &[f32], p: f64) -> f32 {
        let x = tf(DType::F32, &[1, row.len()], row);
        let r = run_op(
            Op::TopPThreshold,
            vec![x, tf(DType::F32, &[1], &[p as f32])],
        );
        assert_eq!((r.dtype, r.shape.as_slice()), (DType::F32, &[1usize][..]));
        r.as_f32().unwrap()[0]
    }

    #[test]
    fn top_p_threshold_by_hand() {
        // Sorted: 0.5, 0.25, 0.125, 0.125; mass above each: 0, 0.5, 0.75, 0.75.
        let row = [0.125, 0.5, 0.125, 0.25];
        assert_eq!(threshold(&row, 0.5), 0.5, "0.5 alone reaches p = 0.5");
        assert_eq!(threshold(&row, 0.4), 0.5);
        assert_eq!(threshold(&row, 0.6), 0.25, "0.5 + 0.25 reach 0.6");
        assert_eq!(threshold(&row, 0.75), 0.25, "mass above 0.25 is 0.5 < 0.75");
        assert_eq!(
            threshold(&row, 0.8),
            0.125,
            "both 0.125s kept: ties included"
        );
        assert_eq!(threshold(&row, 0.99), 0.125);
        assert_eq!(threshold(&row, 1.0), 0.0, "p = 1 cuts nothing");
        // Unnormalised rows scale p by the row's sum (Z = 8): 6 alone is 0.75 of it.
        assert_eq!(threshold(&[2.0, 6.0], 0.75), 6.0);
        assert_eq!(threshold(&[2.0, 6.0], 0.76), 2.0);
        // Zeros, negatives and NaN weigh nothing and are never the threshold of p < 1.
        assert_eq!(threshold(&[0.0, 0.3, f32::NAN, -1.0, 0.7], 0.9), 0.3);
        assert_eq!(threshold(&[0.0, 0.0], 0.5), 0.0, "an all-zero row gives 0");
    }

    #[test]
    fn top_p_threshold_rows() {
        let x = tf(DType::F32, &[2, 3], &[0.2, 0.7, 0.1, 0.3, 0.3, 0.4]);
        let p = tf(DType::F32, &[2], &[0.5, 0.5]);
        let r = run_op(Op::TopPThreshold, vec![x.clone(), p]);
        assert_eq!(r.as_f32().unwrap(), &[0.7, 0.3]);
        // Each row has its own p; p >= 1 cuts nothing.
        let p = tf(DType::F32, &[2], &[1.0, 0.5]);
        let r = run_op(Op::TopPThreshold, vec![x, p]);
        assert_eq!(r.as_f32().unwrap(), &[0.0, 0.3]);
    }

    fn kth(row: &[f32], k: i64) -> f32 {
        let x = tf(DType::F32, &[1, row.len()], row);
        let r = run_op(Op::TopKThreshold, vec![x, ti(DType::I32, &[1], &[k])]);
        assert_eq!((r.dtype, r.shape.as_slice()), (DType::F32, &[1usize][..]));
        r.as_f32().unwrap()[0]
    }

    #[test]
    fn top_k_threshold_by_hand() {
        let row = [0.5, -2.0, 3.0, 0.5, f32::NAN, -1.0];
        assert_eq!(kth(&row, 1), 3.0);
        assert_eq!(kth(&row, 2), 0.5);
        assert_eq!(kth(&row, 3), 0.5, "duplicates count");
        assert_eq!(kth(&row, 4), -1.0);
        assert_eq!(kth(&row, 5), -2.0);
        assert_eq!(kth(&row, 6), f32::NEG_INFINITY, "k = n cuts nothing");
        assert_eq!(kth(&row, 0), f32::NEG_INFINITY, "k = 0 cuts nothing");
        assert_eq!(kth(&row, -3), f32::NEG_INFINITY);
        assert!(
            kth(&[-0.0, 1.0, -0.0], 2).is_sign_positive(),
            "-0 reads as +0"
        );
        let x = tf(DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 6.0, 5.0, 4.0]);
        let r = run_op(Op::TopKThreshold, vec![x, ti(DType::I64, &[2], &[1, 2])]);
        assert_eq!(r.as_f32().unwrap(), &[3.0, 5.0]);
    }

    #[test]
    fn random_uniform_splitmix64() {
        // Vigna's splitmix64 from state 0 first returns 0xE220A8397B1DCDAF; from 1234567,
        // 6457827717110365317.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(1_234_567), 6_457_827_717_110_365_317);
        let c = ti(DType::I64, &[3], &[0, 5, 1_234_567 ^ 5]);
        let r = run_op(Op::RandomUniform { seed: 5 }, vec![c]);
        // seed ^ counter = 5, 0, 1234567.
        let want_0 = (0xE220A8 as f32) / 16_777_216.0;
        let want_1234567 = ((6_457_827_717_110_365_317u64 >> 40) as f32) / 16_777_216.0;
        let r = r.as_f32().unwrap();
        assert_eq!(r[1], want_0);
        assert_eq!(r[2], want_1234567);
        assert!((0.0..1.0).contains(&r[0]));
    }

    #[test]
    fn accept_chain_counts_prefix() {
        let d = ti(DType::I32, &[3, 3], &[5, 6, 7, 1, 2, 3, 9, 9, 9]);
        let t = ti(DType::I32, &[3, 4], &[5, 6, 7, 8, 0, 2, 3, 4, 9, 9, 8, 9]);
        let r = run_op(Op::AcceptChain, vec![d, t]);
        assert_eq!(r.dtype, DType::I32);
        // All K accepted; 0 accepted (later matches do not count); 2 accepted.
        assert_eq!(r.as_i64().unwrap(), &[3, 0, 2]);
    }
}
