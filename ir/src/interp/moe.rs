//! Mixture-of-experts routing and expert evaluation.

use super::elementwise::{sigmoid, silu};
use super::matmul::WeightRows;
use super::nn::softmax_row;
use super::tensor::{round_to, Tensor};
use super::util::{dot, f32s, last_dim, topk_row, OpResult, Out, Rank};
use crate::op::MoeScoring;

/// Router parameters (the fields of `Op::MoeRoute`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Route {
    pub top_k: usize,
    pub scoring: MoeScoring,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub scaling: f64,
}

/// Per row, all in f32: `s` = softmax or sigmoid of the logits; `c = s + bias` (or `s`).
/// When `n_group > 1`, each group of `E / n_group` consecutive experts scores the sum of its
/// two largest `c` (its only one when groups have one expert), the `topk_group` best groups
/// are kept (ties by lower group index) and the other experts are excluded. The `top_k`
/// best remaining `c` are chosen (ties by lower index); their gates are `s` at those
/// experts, divided by the sum of the chosen `s` (in rank order) when `norm_topk_prob`,
/// then multiplied by `scaling`. Every other gate is 0.
///
/// This is transformers 5.24's DeepSeek-V3 router, which masks excluded groups with −inf
/// (older versions masked with 0.0, which differs when a kept expert has `c < 0`); checked
/// against it with a random bias in `models/tests/hf_parity_mla.rs`.
pub(crate) fn moe_route(logits: &Tensor, bias: Option<&Tensor>, r: Route, out: &Out) -> OpResult {
    let lv = f32s(logits, "moe_route logits")?;
    let bias = bias.map(|b| f32s(b, "moe_route bias")).transpose()?;
    let e = last_dim(logits);
    if r.n_group == 0 || !e.is_multiple_of(r.n_group) || r.top_k > e || r.topk_group > r.n_group {
        return Err(format!(
            "moe_route: top_k {}, n_group {}, topk_group {} invalid for {e} experts",
            r.top_k, r.n_group, r.topk_group
        ));
    }
    let gsize = e / r.n_group;
    let scaling = r.scaling as f32;
    let mut res = vec![0.0f32; lv.len()];
    let mut s = vec![0.0f32; e];
    let mut c = vec![0.0f32; e];
    let mut gscore = vec![0.0f32; r.n_group];
    let mut idx = Vec::with_capacity(e);
    let mut kept = vec![true; r.n_group];
    for (row, dst) in lv.chunks(e).zip(res.chunks_mut(e)) {
        match r.scoring {
            MoeScoring::Softmax => softmax_row(row, &mut s),
            MoeScoring::Sigmoid => {
                for (s, &l) in s.iter_mut().zip(row) {
                    *s = sigmoid(l);
                }
            }
        }
        for i in 0..e {
            c[i] = s[i] + bias.map_or(0.0, |b| b[i]);
        }
        kept.fill(true);
        if r.n_group > 1 {
            for (g, gs) in gscore.iter_mut().enumerate() {
                topk_row(&c[g * gsize..(g + 1) * gsize], gsize.min(2), &mut idx);
                *gs = idx.iter().fold(0.0, |a, &i| a + c[g * gsize + i]);
            }
            topk_row(&gscore, r.topk_group, &mut idx);
            kept.fill(false);
            for &g in &idx {
                kept[g] = true;
            }
        }
        // Rank kept experts first, then by c descending, then by index.
        idx.clear();
        idx.extend(0..e);
        let key = |i: usize| (kept[i / gsize], c[i]);
        let cmp = |a: &usize, b: &usize| {
            let ((ka, ca), (kb, cb)) = (key(*a), key(*b));
            kb.cmp(&ka).then(cb.rank_cmp(ca)).then(a.cmp(b))
        };
        if r.top_k > 0 && r.top_k < e {
            idx.select_nth_unstable_by(r.top_k - 1, cmp);
        }
        idx.truncate(r.top_k);
        idx.sort_unstable_by(cmp);
        let denom = if r.norm_topk_prob {
            idx.iter().fold(0.0f32, |a, &i| a + s[i])
        } else {
            1.0
        };
        for &i in &idx {
            let w = if r.norm_topk_prob && denom > 0.0 {
                s[i] / denom
            } else {
                s[i]
            };
            dst[i] = w * scaling;
        }
    }
    Ok(out.f32(res))
}

/// Per token, for each expert `e` with a non-zero gate in increasing `e`: `g = R(x·Wg_eᵀ)`,
/// `u = R(x·Wu_eᵀ)`, `a = R(R(silu(g)) · u)`, `y = R(a·Wd_eᵀ)` (each a matmul or
/// silu_mul as defined elsewhere, `R` rounding to the dtype of `x`); then
/// `out = R(Σ_e gate_e · y_e)` accumulated in f32.
pub(crate) fn moe_experts(args: &[&Tensor], out: &Out) -> OpResult {
    let (x, gates, wg, wu, wd) = (args[0], args[1], args[2], args[3], args[4]);
    let scale = |i: usize| args.get(5 + i).copied();
    let xv = f32s(x, "moe_experts input")?;
    let gv = f32s(gates, "moe_experts gates")?;
    let (e, f, h) = (wg.shape[0], wg.shape[1], wg.shape[2]);
    // Only experts some token selects are checked and read.
    let experts = (0..e)
        .map(|ei| {
            if !gv.chunks(e).any(|g| g[ei] != 0.0) {
                return Ok(None);
            }
            Ok(Some([
                WeightRows::expert(wg, scale(0), ei)?,
                WeightRows::expert(wu, scale(1), ei)?,
                WeightRows::expert(wd, scale(2), ei)?,
            ]))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let dt = out.dtype;
    let r = |v: f32| round_to(dt, v);
    let mut res = Vec::with_capacity(xv.len());
    let mut act = vec![0.0f32; f];
    let mut acc = vec![0.0f32; h];
    let (mut bg, mut bu, mut bd) = (vec![0.0f32; h], vec![0.0f32; h], vec![0.0f32; f]);
    let tokens = xv.len().checked_div(h).unwrap_or(0);
    for t in 0..tokens {
        let xr = &xv[t * h..(t + 1) * h];
        let gr = &gv[t * e..(t + 1) * e];
        acc.fill(0.0);
        for (ei, &gate) in gr.iter().enumerate() {
            if gate == 0.0 {
                continue;
            }
            let [we_g, we_u, we_d] = experts[ei].as_ref().expect("a selected expert");
            for (j, a) in act.iter_mut().enumerate() {
                let g = r(dot(xr, we_g.row(j, h, &mut bg)));
                let u = r(dot(xr, we_u.row(j, h, &mut bu)));
                *a = r(r(silu(g)) * u);
            }
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc += gate * r(dot(&act, we_d.row(j, f, &mut bd)));
            }
        }
        res.extend(acc.iter().map(|&a| r(a)));
    }
    Ok(out.f32(res))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::op::{MoeScoring, Op};
    use crate::DType;

    fn route(
        top_k: u64,
        scoring: MoeScoring,
        n_group: u64,
        topk_group: u64,
        norm: bool,
        scaling: f64,
    ) -> Op {
        Op::MoeRoute {
            top_k,
            scoring,
            n_group,
            topk_group,
            norm_topk_prob: norm,
            scaling,
        }
    }

    #[test]
    fn softmax_router_topk_norm() {
        // logits ln[1, 2, 3, 4] -> s = [.1, .2, .3, .4]; top-2 = experts 3, 2.
        let l: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| v.ln()).collect();
        let x = tf(DType::F32, &[1, 4], &l);
        let r = run_op(
            route(2, MoeScoring::Softmax, 1, 1, false, 1.0),
            vec![x.clone()],
        );
        assert_close(r.as_f32().unwrap(), &[0.0, 0.0, 0.3, 0.4], 1e-6);
        // Renormalised: .3/.7, .4/.7; scaled by 2.
        let r = run_op(route(2, MoeScoring::Softmax, 1, 1, true, 2.0), vec![x]);
        assert_close(r.as_f32().unwrap(), &[0.0, 0.0, 0.6 / 0.7, 0.8 / 0.7], 1e-6);
    }

    #[test]
    fn router_ties_by_lower_index() {
        let x = tf(DType::F32, &[1, 4], &[1.0, 2.0, 2.0, 2.0]);
        let r = run_op(route(2, MoeScoring::Sigmoid, 1, 1, false, 1.0), vec![x]);
        let s2 = 1.0 / (1.0 + (-2f32).exp());
        assert_close(r.as_f32().unwrap(), &[0.0, s2, s2, 0.0], 1e-6);
    }

    #[test]
    fn sigmoid_router_bias_selects_but_does_not_weigh() {
        // s = sigmoid(0) = .5 for all; bias favours expert 2 then 0.
        let x = tf(DType::F32, &[1, 4], &[0.0; 4]);
        let b = tf(DType::F32, &[4], &[0.1, -0.2, 0.3, 0.0]);
        let r = run_op(route(2, MoeScoring::Sigmoid, 1, 1, false, 1.0), vec![x, b]);
        assert_eq!(r.as_f32().unwrap(), &[0.5, 0.0, 0.5, 0.0]);
    }

    #[test]
    fn grouped_routing_keeps_best_groups() {
        // 8 experts, 4 groups of 2, keep 2 groups, top-3. Sigmoid of logits chosen so that
        // c = s directly: use s via logits = logit(s).
        // s = [.9, .1 | .6, .6 | .8, .05 | .7, .2]: group sums (top-2 of 2) = [1.0, 1.2,
        // .85, .9] -> groups 1, 0 kept. Best 3 of {.9, .1, .6, .6}: experts 0, 2, 3 (the
        // .6 tie by index). Expert 4 (.8) and 6 (.7) are excluded with their groups.
        let s = [0.9f32, 0.1, 0.6, 0.6, 0.8, 0.05, 0.7, 0.2];
        let l: Vec<f32> = s.iter().map(|&p| (p / (1.0 - p)).ln()).collect();
        let x = tf(DType::F32, &[1, 8], &l);
        let r = run_op(
            route(3, MoeScoring::Sigmoid, 4, 2, true, 1.0),
            vec![x.clone()],
        );
        let d = 0.9 + 0.6 + 0.6;
        assert_close(
            r.as_f32().unwrap(),
            &[0.9 / d, 0.0, 0.6 / d, 0.6 / d, 0.0, 0.0, 0.0, 0.0],
            1e-5,
        );
        // Without grouping the best 3 are experts 0, 4, 6.
        let r = run_op(route(3, MoeScoring::Sigmoid, 1, 1, false, 1.0), vec![x]);
        assert_close(
            r.as_f32().unwrap(),
            &[0.9, 0.0, 0.0, 0.0, 0.8, 0.0, 0.7, 0.0],
            1e-5,
        );
    }

    #[test]
    fn experts_weighted_sum() {
        // H = 2, F = 1, E = 3. Expert e: w_gate row [a, 0], w_up row [0, 1], w_down [[1], [2]].
        // x = [2, 3]: g = 2a, u = 3, act = silu(2a)·3, y = [act, 2·act].
        // Gates [0.5, 0, 0.25]: expert 1 skipped (its weights are NaN to prove it).
        let x = tf(DType::F32, &[1, 2], &[2.0, 3.0]);
        let gates = tf(DType::F32, &[1, 3], &[0.5, 0.0, 0.25]);
        let wg = tf(
            DType::F32,
            &[3, 1, 2],
            &[1.0, 0.0, f32::NAN, 0.0, -1.0, 0.0],
        );
        let wu = tf(DType::F32, &[3, 1, 2], &[0.0, 1.0, f32::NAN, 1.0, 0.0, 1.0]);
        let wd = tf(DType::F32, &[3, 2, 1], &[1.0, 2.0, f32::NAN, 2.0, 1.0, 2.0]);
        let r = run_op(Op::MoeExperts, vec![x, gates, wg, wu, wd]);
        let silu = |v: f32| v / (1.0 + (-v).exp());
        let a0 = silu(2.0) * 3.0;
        let a2 = silu(-2.0) * 3.0;
        let y0 = 0.5 * a0 + 0.25 * a2;
        assert_close(r.as_f32().unwrap(), &[y0, 2.0 * y0], 1e-6);
    }

    #[test]
    fn quantised_experts_dequantise_per_expert() {
        // H = 2, F = 1, E = 2, int4 group 2 (one group per row). Expert e's rows are q·s_e:
        // expert 0: gate [1, 0]·0.5, up [0, 2]·0.5, down [[2], [4]]·0.25;
        // expert 1: gate [0, -1]·1, up [1, 1]·1, down [[1], [-1]]·2.
        let x = tf(DType::F32, &[1, 2], &[2.0, 3.0]);
        let gates = tf(DType::F32, &[1, 2], &[0.5, 0.25]);
        let i4 = DType::Int4Group { group: 2 };
        let wg = ti(i4, &[2, 1, 2], &[1, 0, 0, -1]);
        let wu = ti(i4, &[2, 1, 2], &[0, 2, 1, 1]);
        let wd = ti(i4, &[2, 2, 1], &[2, 4, 1, -1]);
        let sg = tf(DType::BF16, &[2, 1, 1], &[0.5, 1.0]);
        let su = tf(DType::BF16, &[2, 1, 1], &[0.5, 1.0]);
        let sd = tf(DType::BF16, &[2, 2, 1], &[0.25, 0.25, 2.0, 2.0]);
        let r = run_op(Op::MoeExperts, vec![x, gates, wg, wu, wd, sg, su, sd]);
        let silu = |v: f32| v / (1.0 + (-v).exp());
        // Expert 0: g = 1, u = 3, a = 3·silu(1), y = [0.5a, a].
        let a0 = silu(1.0) * 3.0;
        // Expert 1: g = -3, u = 5, a = 5·silu(-3), y = [2a, -2a].
        let a1 = silu(-3.0) * 5.0;
        let want = [0.5 * 0.5 * a0 + 0.25 * 2.0 * a1, 0.5 * a0 - 0.25 * 2.0 * a1];
        assert_close(r.as_f32().unwrap(), &want, 1e-6);
        // Missing scales are refused.
        let x = tf(DType::F32, &[1, 2], &[2.0, 3.0]);
        let gates = tf(DType::F32, &[1, 2], &[0.5, 0.25]);
        let wg = ti(i4, &[2, 1, 2], &[1, 0, 0, -1]);
        let wu = ti(i4, &[2, 1, 2], &[0, 2, 1, 1]);
        let wd = ti(i4, &[2, 2, 1], &[2, 4, 1, -1]);
        let e = try_run_op(Op::MoeExperts, vec![x, gates, wg, wu, wd]).unwrap_err();
        assert!(e.to_string().contains("3 scale operands"), "{e}");
    }

    #[test]
    fn fp8_experts_use_their_own_block_scales() {
        // H = 1, F = 1, E = 2: expert 1's scales differ from expert 0's.
        let x = tf(DType::F32, &[1, 1], &[1.0]);
        let gates = tf(DType::F32, &[1, 2], &[0.0, 1.0]);
        let f8 = DType::Fp8E4M3;
        let wg = tf(f8, &[2, 1, 1], &[1.0, 1.0]);
        let wu = tf(f8, &[2, 1, 1], &[1.0, 1.0]);
        let wd = tf(f8, &[2, 1, 1], &[1.0, 1.0]);
        let sg = tf(DType::F32, &[2, 1, 1], &[f32::NAN, 2.0]);
        let su = tf(DType::F32, &[2, 1, 1], &[f32::NAN, 3.0]);
        let sd = tf(DType::F32, &[2, 1, 1], &[f32::NAN, 0.5]);
        let r = run_op(Op::MoeExperts, vec![x, gates, wg, wu, wd, sg, su, sd]);
        let silu = |v: f32| v / (1.0 + (-v).exp());
        assert_close(r.as_f32().unwrap(), &[0.5 * 3.0 * silu(2.0)], 1e-6);
    }
}
