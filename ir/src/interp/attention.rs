//! KV-cache writes and masked attention.

use super::matmul::dots_rows;
use super::tensor::{round_to, Data, Tensor};
use super::util::{f32s, i64s, OpResult, Out};
use crate::op::AttnMask;

/// Writes `x[b, t]` into `cache[b, min(pos[b, t], Ctx - 1)]` in place, in order of `t`
/// (a later token wins a shared slot); lanes with negative `pos` write nothing. Any storage
/// (float caches, int token rings). Checks everything before the first write, so on error
/// `cache` is unchanged.
pub(crate) fn kv_write(cache: &mut Tensor, x: &Tensor, pos: &Tensor) -> Result<(), String> {
    let pv = i64s(pos, "kv_write positions")?;
    if cache.shape.len() != 4 || x.shape.len() != 4 {
        return Err(format!(
            "kv_write needs rank-4 cache and value: {cache}, {x}"
        ));
    }
    let (b, ctx) = (cache.shape[0], cache.shape[1]);
    let row = cache.shape[2] * cache.shape[3];
    let t = x.shape[1];
    if x.shape[0] != b || x.shape[2] * x.shape[3] != row || pv.len() != b * t {
        return Err(format!(
            "kv_write shapes: cache {cache}, value {x}, pos {pos}"
        ));
    }
    let slots = |bi: usize, ti: usize| {
        let p = pv[bi * t + ti];
        (p >= 0 && ctx > 0).then(|| {
            let slot = (p as usize).min(ctx - 1);
            ((bi * ctx + slot) * row, (bi * t + ti) * row)
        })
    };
    fn write<T: Copy>(
        dst: &mut [T],
        src: &[T],
        row: usize,
        at: impl Iterator<Item = (usize, usize)>,
    ) {
        for (d, s) in at {
            dst[d..d + row].copy_from_slice(&src[s..s + row]);
        }
    }
    let at = (0..b).flat_map(|bi| (0..t).filter_map(move |ti| slots(bi, ti)));
    match (&mut cache.data, &x.data) {
        (Data::F32(c), Data::F32(v)) => write(c, v, row, at),
        (Data::I64(c), Data::I64(v)) => write(c, v, row, at),
        _ => {
            return Err(format!(
                "kv_write cache {cache} and value {x} stored differently"
            ))
        }
    }
    Ok(())
}

/// Overwrites `state` with `x` (same type), in place.
pub(crate) fn assign(state: &mut Tensor, x: &Tensor) -> Result<(), String> {
    if state.dtype != x.dtype || state.shape != x.shape {
        return Err(format!("assign {x} to state {state}"));
    }
    x.check_storage()?;
    state.data.clone_from(&x.data);
    Ok(())
}

/// The allowed cache slots of one query.
#[derive(Clone, Copy)]
enum Allowed<'a> {
    /// Slots `0..end`.
    Prefix { end: usize },
    /// Slots `0..prefix` and `prefix + u` for bits `u < nodes` of `words` (bit `u % 64`
    /// of word `u / 64`).
    Tree {
        prefix: i64,
        words: &'a [i64],
        nodes: i64,
    },
}

impl Allowed<'_> {
    /// Replaces `slots` by the allowed slots below `ctx`, in increasing order (the order
    /// the attention sums in), visiting only those.
    fn list(self, ctx: usize, slots: &mut Vec<usize>) {
        slots.clear();
        match self {
            Allowed::Prefix { end } => slots.extend(0..end.min(ctx)),
            Allowed::Tree {
                prefix,
                words,
                nodes,
            } => {
                let prefix_end = prefix.clamp(0, ctx as i64) as usize;
                slots.extend(0..prefix_end);
                // Node `u` sits at slot `prefix + u`; nodes at negative slots are part
                // of the prefix range already (`u < 0` there) or below slot 0.
                for (wi, &word) in words.iter().enumerate() {
                    let mut bits = word as u64;
                    while bits != 0 {
                        let u = (wi * 64) as i64 + bits.trailing_zeros() as i64;
                        bits &= bits - 1;
                        let s = prefix + u;
                        if u < nodes && s >= prefix_end as i64 && s < ctx as i64 {
                            slots.push(s as usize);
                        }
                    }
                }
            }
        }
    }
}

/// Moves row `src[b, i]` to row `dst[b, i]` of each sequence in place, in order of `i`
/// (slots clamped to `Ctx - 1`; negative indices copy nothing). Checks shapes before the
/// first write.
pub(crate) fn kv_move(cache: &mut Tensor, src: &Tensor, dst: &Tensor) -> Result<(), String> {
    let sv = i64s(src, "kv_move src")?;
    let dv = i64s(dst, "kv_move dst")?;
    if cache.shape.len() < 2 || src.shape.len() != 2 || src.shape != dst.shape {
        return Err(format!(
            "kv_move shapes: cache {cache}, src {src}, dst {dst}"
        ));
    }
    let (b, ctx) = (cache.shape[0], cache.shape[1]);
    let row: usize = cache.shape[2..].iter().product();
    let n = src.shape[1];
    if src.shape[0] != b {
        return Err(format!("kv_move batch: cache {cache}, src {src}"));
    }
    fn mv<T: Copy>(c: &mut [T], row: usize, moves: &[(usize, usize)]) {
        for &(s, d) in moves {
            c.copy_within(s..s + row, d);
        }
    }
    let mut moves = Vec::new();
    for bi in 0..b {
        for i in 0..n {
            let (s, d) = (sv[bi * n + i], dv[bi * n + i]);
            if s >= 0 && d >= 0 && ctx > 0 {
                let slot = |p: i64| (bi * ctx + (p as usize).min(ctx - 1)) * row;
                moves.push((slot(s), slot(d)));
            }
        }
    }
    match &mut cache.data {
        Data::F32(c) => mv(c, row, &moves),
        Data::I64(c) => mv(c, row, &moves),
    }
    Ok(())
}

/// `softmax(scale · q·kᵀ) · v` over the allowed slots, per query row and head, with query
/// head `h` reading kv head `h / (Hq / Hkv)`. Scores, the softmax (max-subtracted `exp`)
/// and `Σ p·v` are f32; the sum is divided by `Σ p` at the end and rounded once to the q
/// dtype. A query with no allowed slot outputs zeros. `pos` is read only by `Causal`.
pub(crate) fn attention(args: &[&Tensor], scale: f64, mask: AttnMask, out: &Out) -> OpResult {
    let (q, k, v, pos) = (args[0], args[1], args[2], args[3]);
    let qv = f32s(q, "attention q")?;
    let kv = f32s(k, "attention k")?;
    let vv = f32s(v, "attention v")?;
    let pv = i64s(pos, "attention positions")?;
    let (b, t, hq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (ctx, hkv, dv) = (k.shape[1], k.shape[2], v.shape[3]);
    if hkv == 0 || hq % hkv != 0 {
        return Err(format!("{hq} q heads not a multiple of {hkv} kv heads"));
    }
    let group = hq / hkv;
    let tree = match mask {
        AttnMask::Causal => None,
        AttnMask::Tree => Some((
            i64s(args[4], "attention prefix_len")?,
            i64s(args[5], "attention ancestors")?,
        )),
    };
    let scale = scale as f32;
    // Words per query; tree bits at or beyond min(T, 64·W) select no node.
    let words = match mask {
        AttnMask::Tree if args[5].shape.len() == 3 => args[5].shape[2],
        _ => 1,
    };
    let nodes = t.min(64 * words) as i64;
    let mut res = vec![0.0f32; b * t * hq * dv];
    let mut slots = Vec::with_capacity(ctx);
    let mut krows: Vec<&[f32]> = Vec::with_capacity(ctx);
    let mut qrows: Vec<&[f32]> = Vec::with_capacity(group);
    let mut scores = vec![0.0f32; group * ctx];
    let mut acc = vec![0.0f32; dv];
    #[cfg(target_arch = "x86_64")]
    let avx = std::arch::is_x86_feature_detected!("avx");
    #[cfg(not(target_arch = "x86_64"))]
    let avx = false;
    for bi in 0..b {
        for ti in 0..t {
            let allowed = match tree {
                None => Allowed::Prefix {
                    end: pv[bi * t + ti].saturating_add(1).clamp(0, ctx as i64) as usize,
                },
                Some((pl, anc)) => Allowed::Tree {
                    prefix: pl[bi],
                    words: &anc[(bi * t + ti) * words..][..words],
                    nodes,
                },
            };
            allowed.list(ctx, &mut slots);
            if slots.is_empty() {
                continue;
            }
            let n = slots.len();
            for kh in 0..hkv {
                // The kv head's rows once, their scores for every query head reading it.
                krows.clear();
                krows.extend(
                    slots
                        .iter()
                        .map(|&s| &kv[((bi * ctx + s) * hkv + kh) * d..][..d]),
                );
                let heads = kh * group..(kh + 1) * group;
                qrows.clear();
                qrows.extend(
                    heads
                        .clone()
                        .map(|h| &qv[((bi * t + ti) * hq + h) * d..][..d]),
                );
                dots_rows(&qrows, &krows, &mut scores, n);
                let vrow = |s: usize| &vv[((bi * ctx + s) * hkv + kh) * dv..][..dv];
                for (g, h) in heads.enumerate() {
                    let sc = &mut scores[g * n..][..n];
                    let l = softmax_weighted_sum(sc, scale, &slots, vrow, &mut acc, avx);
                    let o = &mut res[((bi * t + ti) * hq + h) * dv..][..dv];
                    if l > 0.0 {
                        for (o, &a) in o.iter_mut().zip(&acc) {
                            *o = round_to(out.dtype, a / l);
                        }
                    }
                }
            }
        }
    }
    Ok(out.f32(res))
}

/// Values of `acc` summed in registers at once (four AVX registers).
const ACC_CHUNK: usize = 32;

/// One query row and head: scales `scores` (of `slots`, in increasing order), takes
/// `p = exp(score − max)` over them, sums `l = Σ p` and `acc = Σ p · v(slot)` in slot
/// order (`acc` overwritten), and returns `l` (0 when every score is −∞). With `avx` the
/// same operations run in 8-wide registers: every element is its own `mul` then `add`, so
/// the bits do not depend on the width.
fn softmax_weighted_sum<'v>(
    scores: &mut [f32],
    scale: f32,
    slots: &[usize],
    v: impl Fn(usize) -> &'v [f32],
    acc: &mut [f32],
    avx: bool,
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx {
        // SAFETY: the caller checked that the CPU supports AVX.
        return unsafe { softmax_weighted_sum_avx(scores, scale, slots, v, acc) };
    }
    let _ = avx;
    softmax_weighted_sum_body(scores, scale, slots, v, acc)
}

/// [`softmax_weighted_sum`] compiled for AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn softmax_weighted_sum_avx<'v>(
    scores: &mut [f32],
    scale: f32,
    slots: &[usize],
    v: impl Fn(usize) -> &'v [f32],
    acc: &mut [f32],
) -> f32 {
    softmax_weighted_sum_body(scores, scale, slots, v, acc)
}

#[inline(always)]
fn softmax_weighted_sum_body<'v>(
    scores: &mut [f32],
    scale: f32,
    slots: &[usize],
    v: impl Fn(usize) -> &'v [f32],
    acc: &mut [f32],
) -> f32 {
    acc.fill(0.0);
    let l = exps(scores, scale);
    if l == 0.0 {
        return 0.0;
    }
    // `ACC_CHUNK` values of `acc` held in registers over all slots: each value is still
    // `Σ p·v` in slot order, one multiply and one add a slot, as in one pass.
    let mut start = 0;
    while start + ACC_CHUNK <= acc.len() {
        let mut r = [0.0f32; ACC_CHUNK];
        for (&p, &s) in scores.iter().zip(slots) {
            let x: &[f32; ACC_CHUNK] = v(s)[start..start + ACC_CHUNK]
                .try_into()
                .expect("a chunk of the row");
            for (a, &x) in r.iter_mut().zip(x) {
                *a += p * x;
            }
        }
        acc[start..start + ACC_CHUNK].copy_from_slice(&r);
        start += ACC_CHUNK;
    }
    if start < acc.len() {
        let tail = &mut acc[start..];
        for (&p, &s) in scores.iter().zip(slots) {
            for (a, &x) in tail.iter_mut().zip(&v(s)[start..]) {
                *a += p * x;
            }
        }
    }
    l
}

/// One row's scores scaled and replaced by `exp(score − max)` (the exps in a pass of their
/// own: no sum is live across the libm call); returns their sum in slot order, or 0 with
/// every `p` 0 when every score is −∞.
#[inline(always)]
fn exps(row: &mut [f32], scale: f32) -> f32 {
    // The max in 8 lanes, then across them: the same value as one pass (`max` ignores a
    // NaN either way, and a zero's sign does not change `score − m`).
    let mut lanes = [f32::NEG_INFINITY; 8];
    for chunk in row.chunks_mut(8) {
        for (l, score) in lanes.iter_mut().zip(chunk) {
            *score *= scale;
            *l = l.max(*score);
        }
    }
    let m = lanes.into_iter().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        row.fill(0.0);
        return 0.0;
    }
    let mut l = 0.0f32;
    for score in row.iter_mut() {
        *score = (*score - m).exp();
        l += *score;
    }
    l
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::testutil::*;
    use super::super::{run, Env};
    use crate::op::{AttnMask, Op};
    use crate::{Bindings, BucketDim, DType, Dim, Graph, TensorType};

    fn attn(mask: AttnMask) -> Op {
        Op::Attention { scale: 1.0, mask }
    }

    /// k = [[1, 0], [0, 1], [1, 1]] (Ctx 3, one kv head), v = [[1], [2], [4]].
    fn kv3() -> (super::Tensor, super::Tensor) {
        let k = tf(DType::F32, &[1, 3, 1, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let v = tf(DType::F32, &[1, 3, 1, 1], &[1.0, 2.0, 4.0]);
        (k, v)
    }

    #[test]
    fn causal_mask_and_empty_query() {
        // q = [ln2, 0]: scores vs k = [ln2, 0, ln2] -> weights e^s = [2, 1, 2].
        // pos 0: slot 0 only -> 1. pos 1: (2·1 + 1·2)/3 = 4/3. pos 2: (2 + 2 + 8)/5 = 12/5.
        // pos -1: no slot -> 0. pos 9: clamped to the 3 slots -> 12/5.
        let l2 = 2f32.ln();
        let q = tf(
            DType::F32,
            &[1, 5, 1, 2],
            &[l2, 0.0, l2, 0.0, l2, 0.0, l2, 0.0, l2, 0.0],
        );
        let pos = ti(DType::I32, &[1, 5], &[0, 1, 2, -1, 9]);
        let (k, v) = kv3();
        let r = run_op(attn(AttnMask::Causal), vec![q, k, v, pos]);
        assert_close(r.as_f32().unwrap(), &[1.0, 4.0 / 3.0, 2.4, 0.0, 2.4], 1e-6);
    }

    #[test]
    fn tree_mask_prefix_and_ancestors() {
        // Ctx 3, prefix_len 1: slot 0 is the prefix, slots 1, 2 are tree nodes 0, 1.
        // Weights as above [2, 1, 2]. Query 0 bits 0b01 -> slots {0, 1}: (2 + 2)/3 = 4/3.
        // Query 1 bits 0b10 -> slots {0, 2}: (2 + 8)/4 = 2.5. Bit 5 (beyond T = 2) ignored.
        let l2 = 2f32.ln();
        let q = tf(DType::F32, &[1, 2, 1, 2], &[l2, 0.0, l2, 0.0]);
        let pos = ti(DType::I32, &[1, 2], &[-1, -1]);
        let pl = ti(DType::I32, &[1], &[1]);
        let anc = ti(DType::I64, &[1, 2], &[0b1, 0b10 | 1 << 5]);
        let (k, v) = kv3();
        let r = run_op(attn(AttnMask::Tree), vec![q, k, v, pos, pl, anc]);
        assert_close(r.as_f32().unwrap(), &[4.0 / 3.0, 2.5], 1e-6);
        // Prefix 0 and no bits: nothing allowed -> zeros.
        let q = tf(DType::F32, &[1, 1, 1, 2], &[l2, 0.0]);
        let (k, v) = kv3();
        let r = run_op(
            attn(AttnMask::Tree),
            vec![
                q,
                k,
                v,
                ti(DType::I32, &[1, 1], &[2]),
                ti(DType::I32, &[1], &[0]),
                ti(DType::I64, &[1, 1], &[0]),
            ],
        );
        assert_eq!(r.as_f32().unwrap(), &[0.0]);
    }

    /// Two words per query (T = 66): bit 64 is bit 0 of word 1. Keys are zero, so the
    /// output is the mean of the allowed slots' values v[s] = s.
    #[test]
    fn tree_mask_multi_word() {
        let t = 66;
        let q = tf(DType::F32, &[1, t, 1, 1], &vec![1.0; t]);
        let k = tf(DType::F32, &[1, t, 1, 1], &vec![0.0; t]);
        let vals: Vec<f32> = (0..t).map(|s| s as f32).collect();
        let v = tf(DType::F32, &[1, t, 1, 1], &vals);
        let pos = ti(DType::I32, &[1, t], &vec![-1; t]);
        let pl = ti(DType::I32, &[1], &[0]);
        let mut anc = vec![0i64; t * 2];
        anc[0] = 1; // node 0: slot 0
        anc[2 * 64 + 1] = 1; // node 64: slot 64
        anc[2 * 65] = 1; // node 65: slots 0 and 65
        anc[2 * 65 + 1] = 0b10 | 1 << 7; // bit 71 (>= T) ignored
        let anc = ti(DType::I64, &[1, t, 2], &anc);
        let r = run_op(attn(AttnMask::Tree), vec![q, k, v, pos, pl, anc]);
        let r = r.as_f32().unwrap();
        assert_eq!(r[0], 0.0);
        assert_eq!(r[64], 64.0);
        assert_eq!(r[65], 32.5);
        assert_eq!(r[1], 0.0, "no allowed slot: zeros");
    }

    /// Pseudo-random values in [-1, 1).
    fn values(seed: u64, n: usize) -> Vec<f32> {
        (0..n as u64)
            .map(|i| {
                let h = super::super::splitmix64(seed.wrapping_mul(0x9E37) ^ i);
                (h >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// Each query of a batch gets exactly the bits it gets alone (T = 1).
    #[test]
    fn queries_in_a_batch_equal_queries_alone() {
        let (t, ctx, hq, hkv, d) = (5, 40, 4, 2, 36);
        let q = tf(DType::BF16, &[1, t, hq, d], &values(1, t * hq * d));
        let k = tf(DType::BF16, &[1, ctx, hkv, d], &values(2, ctx * hkv * d));
        let v = tf(DType::BF16, &[1, ctx, hkv, d], &values(3, ctx * hkv * d));
        let pos = [3, 17, 39, 0, 25];
        let qv = q.as_f32().unwrap();
        let query = |i: usize| tf(DType::BF16, &[1, 1, hq, d], &qv[i * hq * d..][..hq * d]);
        let causal = |q, pos: &[i64]| {
            let n = pos.len();
            let p = ti(DType::I32, &[1, n], pos);
            run_op(attn(AttnMask::Causal), vec![q, k.clone(), v.clone(), p])
        };
        let batch = causal(q.clone(), &pos);
        for i in 0..t {
            let alone = causal(query(i), &pos[i..=i]);
            let got = &batch.as_f32().unwrap()[i * hq * d..][..hq * d];
            assert_eq!(got, alone.as_f32().unwrap(), "query {i}");
        }
    }

    #[test]
    fn gqa_head_mapping_and_scale() {
        // Hq = 4, Hkv = 2: q heads 0, 1 read kv head 0; heads 2, 3 read kv head 1.
        // Ctx 2. kv head 0: k = [[1], [0]], v = [[10], [20]]; kv head 1: k = [[0], [1]],
        // v = [[30], [40]]. q = 1 for every head, scale ln3: head 0 weights (3, 1) -> 12.5;
        // head 2 weights (1, 3) -> 37.5.
        let q = tf(DType::F32, &[1, 1, 4, 1], &[1.0; 4]);
        let k = tf(DType::F32, &[1, 2, 2, 1], &[1.0, 0.0, 0.0, 1.0]);
        let v = tf(DType::F32, &[1, 2, 2, 1], &[10.0, 30.0, 20.0, 40.0]);
        let pos = ti(DType::I32, &[1, 1], &[1]);
        let op = Op::Attention {
            scale: 3f64.ln(),
            mask: AttnMask::Causal,
        };
        let r = run_op(op, vec![q, k, v, pos]);
        assert_close(r.as_f32().unwrap(), &[12.5, 12.5, 37.5, 37.5], 1e-6);
    }

    #[test]
    fn bf16_output_rounded_once() {
        // Two equal scores: mean of v = (1 + 1.0078125)/2 = 1.00390625 -> bf16 1.0 (tie).
        let q = tf(DType::BF16, &[1, 1, 1, 1], &[0.0]);
        let k = tf(DType::BF16, &[1, 2, 1, 1], &[1.0, 1.0]);
        let v = tf(DType::BF16, &[1, 2, 1, 2], &[1.0, 3.0, 1.0078125, 3.0]);
        let pos = ti(DType::I32, &[1, 1], &[1]);
        let r = run_op(attn(AttnMask::Causal), vec![q, k, v, pos]);
        assert_eq!(r.dtype, DType::BF16);
        assert_eq!(r.shape, vec![1, 1, 1, 2]);
        assert_eq!(r.as_f32().unwrap(), &[1.0, 3.0]);
    }

    #[test]
    fn kv_write_in_place_with_padding_lanes() {
        // cache state [B=2, Ctx, 1, 2], written through `run`: bucket dims bound by `bind`.
        let ctx = Dim::Bucket(BucketDim::Ctx);
        let tdim = Dim::Bucket(BucketDim::T);
        let bdim = Dim::Bucket(BucketDim::B);
        let mut g = Graph::new("kv");
        let c = g
            .state(
                "k0",
                TensorType::new(DType::BF16, [bdim, ctx, Dim::Static(1), Dim::Static(2)]),
            )
            .unwrap();
        let x = g
            .input(
                "x",
                TensorType::new(DType::BF16, [bdim, tdim, Dim::Static(1), Dim::Static(2)]),
            )
            .unwrap();
        let p = g
            .input("pos", TensorType::new(DType::I32, [bdim, tdim]))
            .unwrap();
        let w = g.add(Op::KvWrite, &[c, x, p]).unwrap();
        g.set_output("cache", w);
        let x = tf(
            DType::BF16,
            &[2, 2, 1, 2],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        );
        let weights: HashMap<String, super::Tensor> = HashMap::new();
        let mut states = HashMap::new();
        let step = |states: &mut HashMap<String, super::Tensor>, pos: &[i64]| {
            let mut inputs = HashMap::new();
            inputs.insert("x".to_string(), x.clone());
            inputs.insert("pos".to_string(), ti(DType::I32, &[2, 2], pos));
            let mut env = Env {
                bind: Bindings::new(2, 2, 4),
                inputs,
                weights: &weights,
                states,
            };
            run(&g, &mut env).unwrap()
        };
        // Sequence 0 writes slots 1 and 7 (clamped to 3); sequence 1 has a padding lane,
        // then slot 0.
        let out = step(&mut states, &[1, 7, -1, 0]);
        let want = [
            0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 4.0, // sequence 0, slots 0..4
            7.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, // sequence 1
        ];
        assert_eq!(out["cache"].as_f32().unwrap(), want);
        assert_eq!(states["k0"].as_f32().unwrap(), want);
        assert_eq!(states["k0"].shape, vec![2, 4, 1, 2]);
        // A second run starts from the stored cache.
        let out = step(&mut states, &[0, -5, -1, -1]);
        assert_eq!(&out["cache"].as_f32().unwrap()[..4], &[1.0, 2.0, 1.0, 2.0]);
        assert_eq!(&states["k0"].as_f32().unwrap()[8..10], &[7.0, 8.0]);
    }
}
