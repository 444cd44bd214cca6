//! Multi-head latent attention (DeepSeek-V3 / Kimi-K2) in the absorbed form: per-head
//! weight products (`head_matmul`) and attention over the shared latent cache
//! (`mla_attention`).

use super::tensor::round_to;
use super::tensor::Tensor;
use super::util::{dot, f32s, i64s, OpResult, Out};
use crate::op::AttnMask;

/// `x[..., H, K]` times each head's own matrix: `w[H, K, N]` (`trans_w` false, the sum
/// runs down `w[h]`'s rows) or `w[H, N, K]` (`trans_w` true, dot products with `w[h]`'s
/// rows, as `matmul`). f32 accumulation in dot order, `R` once.
pub(crate) fn head_matmul(x: &Tensor, w: &Tensor, trans_w: bool, out: &Out) -> OpResult {
    let xv = f32s(x, "head_matmul input")?;
    let wv = f32s(w, "head_matmul weight")?;
    let (h, k) = (x.shape[x.shape.len() - 2], x.shape[x.shape.len() - 1]);
    let n = if trans_w { w.shape[1] } else { w.shape[2] };
    if w.shape[0] != h || (if trans_w { w.shape[2] } else { w.shape[1] }) != k {
        return Err(format!("head_matmul shapes: input {x}, weight {w}"));
    }
    // Per head, the weight as rows of length K (transposed once when given as [K, N]).
    let rows: Vec<Vec<f32>> = (0..h)
        .map(|hi| {
            let m = &wv[hi * k * n..(hi + 1) * k * n];
            if trans_w {
                m.to_vec()
            } else {
                let mut t = vec![0.0f32; n * k];
                for (ki, row) in m.chunks(n).enumerate() {
                    for (ni, &v) in row.iter().enumerate() {
                        t[ni * k + ki] = v;
                    }
                }
                t
            }
        })
        .collect();
    let mut res = Vec::with_capacity(xv.len() / k.max(1) * n);
    for (i, xr) in xv.chunks(k.max(1)).enumerate() {
        let wr = &rows[i % h];
        res.extend((0..n).map(|ni| round_to(out.dtype, dot(xr, &wr[ni * k..(ni + 1) * k]))));
    }
    Ok(out.f32(res))
}

/// Which cache slots one query may attend (the `attention` masks).
#[derive(Clone, Copy)]
enum Slots<'a> {
    /// `0..end`.
    Prefix(usize),
    /// `0..prefix` and `prefix + u` for the bits `u < nodes` set in `words`.
    Tree {
        prefix: i64,
        words: &'a [i64],
        nodes: i64,
    },
}

impl Slots<'_> {
    fn contains(self, s: usize) -> bool {
        match self {
            Slots::Prefix(end) => s < end,
            Slots::Tree {
                prefix,
                words,
                nodes,
            } => {
                let u = s as i64 - prefix;
                u < 0 || (u < nodes && (words[(u / 64) as usize] as u64) >> (u % 64) & 1 == 1)
            }
        }
    }
}

/// Per query row and head: `score(s) = dot(q_lat, c[s]) + dot(q_pe, pe[s])` (each in dot
/// order, one f32 add), times `scale`; softmax with the max subtracted; `Σ p·c[s]` in f32 in
/// slot order, divided by `Σ p` at the end and rounded once to the q dtype. A query with no
/// allowed slot outputs zeros. `pos` is read only by `Causal`.
pub(crate) fn mla_attention(args: &[&Tensor], scale: f64, mask: AttnMask, out: &Out) -> OpResult {
    let (ql, qp, c, pe, pos) = (args[0], args[1], args[2], args[3], args[4]);
    let qlv = f32s(ql, "mla_attention q_lat")?;
    let qpv = f32s(qp, "mla_attention q_pe")?;
    let cv = f32s(c, "mla_attention latent cache")?;
    let pev = f32s(pe, "mla_attention rope cache")?;
    let pv = i64s(pos, "mla_attention positions")?;
    let (b, t, h, l) = (ql.shape[0], ql.shape[1], ql.shape[2], ql.shape[3]);
    let (ctx, r) = (c.shape[1], qp.shape[3]);
    let tree = match mask {
        AttnMask::Causal => None,
        AttnMask::Tree => Some((
            i64s(args[5], "mla_attention prefix_len")?,
            i64s(args[6], "mla_attention ancestors")?,
        )),
    };
    let words = match mask {
        AttnMask::Tree if args[6].shape.len() == 3 => args[6].shape[2],
        _ => 1,
    };
    let nodes = t.min(64 * words) as i64;
    let scale = scale as f32;
    let mut res = vec![0.0f32; b * t * h * l];
    let mut scores = vec![0.0f32; ctx];
    let mut acc = vec![0.0f32; l];
    for bi in 0..b {
        for ti in 0..t {
            let allowed = match tree {
                None => {
                    Slots::Prefix(pv[bi * t + ti].saturating_add(1).clamp(0, ctx as i64) as usize)
                }
                Some((pl, anc)) => Slots::Tree {
                    prefix: pl[bi],
                    words: &anc[(bi * t + ti) * words..][..words],
                    nodes,
                },
            };
            for hi in 0..h {
                let row = (bi * t + ti) * h + hi;
                let (qlr, qpr) = (&qlv[row * l..][..l], &qpv[row * r..][..r]);
                let mut m = f32::NEG_INFINITY;
                let mut any = false;
                for (s, score) in scores.iter_mut().enumerate() {
                    if !allowed.contains(s) {
                        continue;
                    }
                    let slot = bi * ctx + s;
                    let lat = dot(qlr, &cv[slot * l..][..l]);
                    let rot = dot(qpr, &pev[slot * r..][..r]);
                    *score = (lat + rot) * scale;
                    m = m.max(*score);
                    any = true;
                }
                if !any {
                    continue;
                }
                acc.fill(0.0);
                let mut sum = 0.0f32;
                for (s, &score) in scores.iter().enumerate() {
                    if !allowed.contains(s) {
                        continue;
                    }
                    let p = if m == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (score - m).exp()
                    };
                    sum += p;
                    for (a, &x) in acc.iter_mut().zip(&cv[(bi * ctx + s) * l..][..l]) {
                        *a += p * x;
                    }
                }
                if sum > 0.0 {
                    for (o, &a) in res[row * l..][..l].iter_mut().zip(&acc) {
                        *o = round_to(out.dtype, a / sum);
                    }
                }
            }
        }
    }
    Ok(out.f32(res))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::op::{AttnMask, Op};
    use crate::DType;

    #[test]
    fn head_matmul_both_orientations() {
        // Two heads, K = 2, N = 3. Head 0: w = [[1, 2, 3], [4, 5, 6]] ([K, N]); head 1:
        // w = [[0, 1, 0], [1, 0, -1]]. x = [[1, 2], [3, -1]] (one row per head).
        let x = tf(DType::F32, &[1, 2, 2], &[1.0, 2.0, 3.0, -1.0]);
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 1.0, 0.0, 1.0, 0.0, -1.0];
        let wkn = tf(DType::F32, &[2, 2, 3], &w);
        let got = run_op(Op::HeadMatMul { trans_w: false }, vec![x.clone(), wkn]);
        // Head 0: [1+8, 2+10, 3+12]; head 1: [-1, 3, 1].
        assert_eq!(got.shape, vec![1, 2, 3]);
        assert_eq!(got.as_f32().unwrap(), &[9.0, 12.0, 15.0, -1.0, 3.0, 1.0]);
        // The same matrices given as [N, K].
        let wt = [1.0, 4.0, 2.0, 5.0, 3.0, 6.0, 0.0, 1.0, 1.0, 0.0, 0.0, -1.0];
        let wnk = tf(DType::F32, &[2, 3, 2], &wt);
        let got = run_op(Op::HeadMatMul { trans_w: true }, vec![x, wnk]);
        assert_eq!(got.as_f32().unwrap(), &[9.0, 12.0, 15.0, -1.0, 3.0, 1.0]);
    }

    /// L = 2, R = 2, Ctx 3, one head: c = [[1, 0], [0, 1], [2, 2]], pe = [[1, 0], [0, 0],
    /// [0, 1]]; q_lat = [1, 0], q_pe = [0, 1] at position 1: scores over slots 0, 1 are
    /// [1 + 0, 0 + 0] = [1, 0] (slot 2 is in the future).
    #[test]
    fn latent_attention_by_hand() {
        let ql = tf(DType::F32, &[1, 1, 1, 2], &[1.0, 0.0]);
        let qp = tf(DType::F32, &[1, 1, 1, 2], &[0.0, 1.0]);
        let c = tf(DType::F32, &[1, 3, 1, 2], &[1.0, 0.0, 0.0, 1.0, 2.0, 2.0]);
        let pe = tf(DType::F32, &[1, 3, 1, 2], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        let pos = ti(DType::I32, &[1, 1], &[1]);
        let op = Op::MlaAttention {
            scale: 1.0,
            mask: AttnMask::Causal,
        };
        let got = run_op(
            op.clone(),
            vec![ql.clone(), qp.clone(), c.clone(), pe.clone(), pos],
        );
        let (e1, e0) = (1.0f32.exp(), 1.0f32);
        let (p0, p1) = (e1 / (e1 + e0), e0 / (e1 + e0));
        assert_close(got.as_f32().unwrap(), &[p0, p1], 1e-6);
        // At position 2 slot 2 joins: scores [1, 0, 2 + 1 = 3].
        let pos = ti(DType::I32, &[1, 1], &[2]);
        let got = run_op(op, vec![ql, qp, c, pe, pos]);
        let w = [1.0f32.exp(), 1.0, 3.0f32.exp()];
        let z: f32 = w.iter().sum();
        let want = [(w[0] + 2.0 * w[2]) / z, (w[1] + 2.0 * w[2]) / z];
        assert_close(got.as_f32().unwrap(), &want, 1e-6);
    }

    /// The tree mask: slots `0..prefix` plus the ancestor bits; a masked-out future slot
    /// with a huge score changes nothing.
    #[test]
    fn latent_attention_tree_mask() {
        let ql = tf(DType::F32, &[1, 2, 1, 1], &[1.0, 1.0]);
        let qp = tf(DType::F32, &[1, 2, 1, 1], &[0.0, 0.0]);
        // Slot 0 prefix, slots 1, 2 the two tree nodes (siblings).
        let c = tf(DType::F32, &[1, 3, 1, 1], &[0.0, 1.0, 100.0]);
        let pe = tf(DType::F32, &[1, 3, 1, 1], &[0.0, 0.0, 0.0]);
        let pos = ti(DType::I32, &[1, 2], &[1, 1]);
        let prefix = ti(DType::I32, &[1], &[1]);
        let anc = ti(DType::I64, &[1, 2], &[0b01, 0b10]);
        let got = run_op(
            Op::MlaAttention {
                scale: 1.0,
                mask: AttnMask::Tree,
            },
            vec![ql, qp, c, pe, pos, prefix, anc],
        );
        // Node 0 sees slots 0, 1: scores [0, 1], out = e/(1+e)·1.
        let e = 1.0f32.exp();
        let v = got.as_f32().unwrap();
        assert_close(&v[..1], &[e / (1.0 + e)], 1e-6);
        // Node 1 sees slots 0, 2: scores [0, 100], out ≈ 100.
        assert_close(&v[1..], &[100.0], 1e-5);
    }

    /// The absorbed form (`q_nope·W_UK` against the latent cache, `·W_UVᵀ` after) equals
    /// naive MLA: per head k = [W_UK c | pe], v = W_UV c, softmax(scale · q·k) · v.
    #[test]
    fn absorbed_equals_naive() {
        let (h, dn, dr, dv, l, ctx) = (3usize, 4usize, 2usize, 3usize, 5usize, 4usize);
        let mut seed = 7u64;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                })
                .collect()
        };
        let q_nope = rnd(h * dn);
        let q_pe = rnd(h * dr);
        let cache = rnd(ctx * l);
        let pe = rnd(ctx * dr);
        // kv_b as HF stores it: [H·(dn + dv), L], head h's rows [k_nope dn | v dv].
        let kv_b = rnd(h * (dn + dv) * l);
        let scale = 0.37f64;
        let pos_v = 2i64;
        // Naive.
        let mut naive = vec![0.0f32; h * dv];
        for hi in 0..h {
            let w = |row: usize, col: usize| kv_b[(hi * (dn + dv) + row) * l + col];
            let mut scores = Vec::new();
            for s in 0..=pos_v as usize {
                let c = &cache[s * l..(s + 1) * l];
                let k_nope: Vec<f32> = (0..dn)
                    .map(|i| (0..l).map(|j| w(i, j) * c[j]).sum())
                    .collect();
                let mut sc: f32 = (0..dn).map(|i| q_nope[hi * dn + i] * k_nope[i]).sum();
                sc += (0..dr)
                    .map(|i| q_pe[hi * dr + i] * pe[s * dr + i])
                    .sum::<f32>();
                scores.push(sc * scale as f32);
            }
            let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let p: Vec<f32> = scores.iter().map(|&x| (x - m).exp()).collect();
            let z: f32 = p.iter().sum();
            for o in 0..dv {
                naive[hi * dv + o] = (0..=pos_v as usize)
                    .map(|s| {
                        let c = &cache[s * l..(s + 1) * l];
                        let v: f32 = (0..l).map(|j| w(dn + o, j) * c[j]).sum();
                        p[s] / z * v
                    })
                    .sum();
            }
        }
        // Absorbed, through the ops.
        let w_all = tf(DType::F32, &[h, dn + dv, l], &kv_b);
        let slice = |start: usize, len: usize| {
            run_op(
                Op::Slice {
                    axis: 1,
                    start: start as u64,
                    len: len as u64,
                },
                vec![w_all.clone()],
            )
        };
        let (w_uk, w_uv) = (slice(0, dn), slice(dn, dv));
        let qn = tf(DType::F32, &[1, 1, h, dn], &q_nope);
        let q_lat = run_op(Op::HeadMatMul { trans_w: false }, vec![qn, w_uk]);
        let lat = run_op(
            Op::MlaAttention {
                scale,
                mask: AttnMask::Causal,
            },
            vec![
                q_lat,
                tf(DType::F32, &[1, 1, h, dr], &q_pe),
                tf(DType::F32, &[1, ctx, 1, l], &cache),
                tf(DType::F32, &[1, ctx, 1, dr], &pe),
                ti(DType::I32, &[1, 1], &[pos_v]),
            ],
        );
        let o = run_op(Op::HeadMatMul { trans_w: true }, vec![lat, w_uv]);
        assert_eq!(o.shape, vec![1, 1, h, dv]);
        assert_close(o.as_f32().unwrap(), &naive, 1e-5);
    }
}
