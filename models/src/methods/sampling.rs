//! Sampled acceptance and draft draws: target and draft distributions (temperature, top-k,
//! top-p), speculative sampling over a chain, the prefill's draw of the first token, and the
//! counter-based RNG every draw reads.

use specc_ir::op::B;
use specc_ir::{BinaryOp, DType, Dim, Graph, IrError, Op, TensorType, ValueId};

use super::step::{i32_ty, s, Builder, Common, StepShape};
use crate::spec_config::Acceptance;

/// One draft token from a logits row `[B, 1, V]`: the argmax (greedy) or a draw from
/// [`probs`] of the row with uniform column `col` (sampled acceptance).
pub(super) fn choose(
    b: &mut Builder,
    shape: &StepShape,
    c: &Common,
    row: ValueId,
    col: u64,
    dists: &mut Vec<ValueId>,
) -> Result<ValueId, IrError> {
    match (&shape.acceptance, c.uniforms) {
        (Acceptance::Sample { .. }, Some(u)) => {
            let q = probs(b, row)?;
            dists.push(q);
            let q2 = b.reshape(q, &[B, b_vocab(b.g, q)])?;
            let uj = b.slice_cols(u, col, 1)?;
            let uj = b.reshape(uj, &[B])?;
            let t = b.g.add(Op::Sample, &[q2, uj])?;
            b.reshape(t, &[B, s(1)])
        }
        _ => b.g.add(Op::Argmax, &[row]),
    }
}

/// `[B, 1, V]` f32 one-hot of `tok[B, 1]`.
pub(super) fn one_hot(b: &mut Builder, tok: ValueId, vocab: u64) -> Result<ValueId, IrError> {
    let io = b.g.add(
        Op::Iota {
            axis: 2,
            ty: i32_ty(&[B, s(1), s(vocab)]),
        },
        &[],
    )?;
    let t3 = b.reshape(tok, &[B, s(1), s(1)])?;
    let zeros = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: i32_ty(&[B, s(1), s(vocab)]),
        },
        &[],
    )?;
    let tb = b.g.add(Op::Gather { axis: 2 }, &[t3, zeros])?;
    let eq = b.bin(BinaryOp::Eq, io, tb)?;
    b.g.add(Op::Cast { to: DType::F32 }, &[eq])
}

pub(super) fn b_vocab(g: &Graph, x: ValueId) -> Dim {
    *g.ty(x)
        .shape
        .dims()
        .last()
        .expect("logits have a vocab axis")
}

/// Per lane, the distribution its draws come from, f32 `[B, 3]`: `[temperature, top_k,
/// top_p]` (sampled acceptance only). Temperature ≤ 0 (or NaN) is greedy decoding for the
/// lane; top_k < 1 or ≥ V and top_p ≥ 1 keep every token. Admission writes a lane's row
/// before its prefill (whose draw of the first token reads it), so one captured step serves
/// greedy and sampled lanes together, each with its own knobs.
pub const SAMPLING: &str = "spec.sampling";

/// The distribution sampled acceptance draws from, f32 `[..., V]` for `logits[..., V]`, per
/// lane with its own [`SAMPLING`] row: softmax(logits / temperature), restricted to the
/// `top_k` largest scaled logits (those tying the k-th are kept, as HF's
/// `TopKLogitsWarper` does; [`Op::TopKThreshold`]), then to the nucleus of mass `top_p` of
/// what remains ([`Op::TopPThreshold`]), renormalised by a softmax over the kept logits (the
/// others set to −inf). A greedy lane (temperature ≤ 0) gets the one-hot of the argmax of its
/// logits instead: a draw from it is the argmax, and rejection sampling between one-hot
/// distributions accepts a draft exactly when it is the target's argmax, with the target's
/// argmax as the correction and the bonus — greedy acceptance, token for token.
///
/// Drafts that sample draw from the same filtered distribution of their own logits:
/// speculative sampling is exact for whatever distribution the drafts were drawn from (it
/// is passed as `q`), and one filtered like the target's agrees with it more often.
pub(super) fn probs(b: &mut Builder, logits: ValueId) -> Result<ValueId, IrError> {
    let ty = b.g.ty(logits).clone();
    let dims = ty.shape.dims().to_vec();
    let vocab = b_vocab(b.g, logits)
        .as_static()
        .expect("logits have a static vocab axis");
    let x = match ty.dtype {
        DType::F32 => logits,
        _ => b.g.add(Op::Cast { to: DType::F32 }, &[logits])?,
    };
    let params =
        b.g.state(SAMPLING, TensorType::new(DType::F32, [B, s(3)]))?;
    let row_dims = &dims[..dims.len() - 1];
    let knob = |b: &mut Builder, col: u64| -> Result<ValueId, IrError> {
        let v = b.slice_cols(params, col, 1)?;
        let v = b.reshape(v, &[B])?;
        per_row(b, v, row_dims)
    };
    let temperature = knob(b, 0)?;
    let top_k = knob(b, 1)?;
    let top_p = knob(b, 2)?;
    let f32_rows = TensorType::new(DType::F32, row_dims.iter().copied());
    let zero = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: f32_rows.clone(),
        },
        &[],
    )?;
    let one = b.g.add(
        Op::Fill {
            value: 1.0,
            ty: f32_rows,
        },
        &[],
    )?;
    let sampled = b.bin(BinaryOp::Lt, zero, temperature)?;
    // A greedy lane's sampled branch is discarded; temperature 1 keeps it finite.
    let t = b.g.add(Op::Select, &[sampled, temperature, one])?;
    let inv_t = b.bin(BinaryOp::Div, one, t)?;
    let inv_t = spread_rows(b, inv_t, vocab)?;
    let scaled = b.bin(BinaryOp::Mul, x, inv_t)?;
    let k = b.g.add(Op::Cast { to: DType::I32 }, &[top_k])?;
    let kth = b.g.add(Op::TopKThreshold, &[scaled, k])?;
    let kth = spread_rows(b, kth, vocab)?;
    let below = b.bin(BinaryOp::Lt, scaled, kth)?;
    let scaled = drop_logits(b, below, scaled)?;
    let p = b.g.add(Op::Softmax, &[scaled])?;
    let tau = b.g.add(Op::TopPThreshold, &[p, top_p])?;
    let tau = spread_rows(b, tau, vocab)?;
    let outside = b.bin(BinaryOp::Lt, p, tau)?;
    let kept = drop_logits(b, outside, scaled)?;
    let p = b.g.add(Op::Softmax, &[kept])?;
    // Greedy lanes: the one-hot of the argmax of the logits as they are.
    let best = b.g.add(Op::Argmax, &[logits])?;
    let best = spread_rows(b, best, vocab)?;
    let io = b.g.add(
        Op::Iota {
            axis: dims.len() - 1,
            ty: TensorType::new(DType::I32, dims.iter().copied()),
        },
        &[],
    )?;
    let hot = b.bin(BinaryOp::Eq, io, best)?;
    let hot = b.g.add(Op::Cast { to: DType::F32 }, &[hot])?;
    let t_full = spread_rows(b, temperature, vocab)?;
    let zero_full = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: TensorType::new(DType::F32, dims.iter().copied()),
        },
        &[],
    )?;
    let sampled = b.bin(BinaryOp::Lt, zero_full, t_full)?;
    b.g.add(Op::Select, &[sampled, p, hot])
}

/// A per-lane value `v[B]` repeated over the rows `[B, ...]` of one lane (`row_dims`, led by
/// `B`): gathers with zero indices along each further axis.
fn per_row(b: &mut Builder, v: ValueId, row_dims: &[Dim]) -> Result<ValueId, IrError> {
    let mut cur: Vec<Dim> = std::iter::once(B)
        .chain(row_dims[1..].iter().map(|_| Dim::Static(1)))
        .collect();
    let mut x = b.reshape(v, &cur)?;
    for (axis, &d) in row_dims.iter().enumerate().skip(1) {
        cur[axis] = d;
        let zeros = b.g.add(
            Op::Fill {
                value: 0.0,
                ty: TensorType::new(DType::I32, cur.iter().copied()),
            },
            &[],
        )?;
        x = b.g.add(Op::Gather { axis }, &[x, zeros])?;
    }
    Ok(x)
}

/// A per-row value `x[...]` repeated along a new last axis of `n`.
fn spread_rows(b: &mut Builder, x: ValueId, n: u64) -> Result<ValueId, IrError> {
    let mut dims = b.g.ty(x).shape.dims().to_vec();
    dims.push(Dim::Static(1));
    let x = b.reshape(x, &dims)?;
    spread_last(b, x, n)
}

/// `x[..., 1]` repeated along its last axis into `[..., n]` (a gather with zero indices).
fn spread_last(b: &mut Builder, x: ValueId, n: u64) -> Result<ValueId, IrError> {
    let ty = b.g.ty(x).clone();
    let axis = ty.shape.rank() - 1;
    let zeros = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: TensorType::new(
                DType::I32,
                ty.shape.with_last(Dim::Static(n)).dims().to_vec(),
            ),
        },
        &[],
    )?;
    b.g.add(Op::Gather { axis }, &[x, zeros])
}

/// `logits` with −inf where `drop` holds: tokens a softmax then gives probability 0.
fn drop_logits(b: &mut Builder, drop: ValueId, logits: ValueId) -> Result<ValueId, IrError> {
    let neg_inf = b.g.add(
        Op::Fill {
            value: f64::NEG_INFINITY,
            ty: b.g.ty(logits).clone(),
        },
        &[],
    )?;
    b.g.add(Op::Select, &[drop, neg_inf, logits])
}

/// Output of a target prefill under sampled acceptance: each lane's first generated token,
/// `i32[B]` (greedy prefills leave the host to read `next_token` at the last position).
pub const FIRST_TOKEN: &str = "first_token";

/// The token after each lane's prompt under sampled acceptance, `i32[B]`: a draw from
/// [`probs`] of `row` `[B, 1, V]`, the logits at the lane's last prompt row, with the
/// uniform of counter `−1 − stream` (the lane's [`STREAM`](super::step::STREAM), which
/// admission writes before the prefill runs). Step counters ([`rng_counters`]) are never negative,
/// so this draw shares no uniform with a step ([`uniforms`] XORs one seed word into both,
/// which keeps their sign bits apart).
pub(super) fn first_token(
    b: &mut Builder,
    row: ValueId,
    acceptance: &Acceptance,
) -> Result<ValueId, IrError> {
    let Acceptance::Sample { seed, .. } = *acceptance else {
        unreachable!("only sampled acceptance draws the first token")
    };
    let v = b_vocab(b.g, row);
    let p = probs(b, row)?;
    let p = b.reshape(p, &[B, v])?;
    let i64_b = TensorType::new(DType::I64, [B]);
    let stream =
        b.g.state(super::step::STREAM, TensorType::new(DType::I32, [B]))?;
    let lane = b.g.add(Op::Cast { to: DType::I64 }, &[stream])?;
    let minus_one = b.g.add(
        Op::Fill {
            value: -1.0,
            ty: i64_b,
        },
        &[],
    )?;
    let counter = b.bin(BinaryOp::Sub, minus_one, lane)?;
    let u = uniforms(b, counter, seed)?;
    b.g.add(Op::Sample, &[p, u])
}

/// Speculative sampling (Leviathan et al.): accept draft token x_j with probability
/// min(1, p_j(x_j) / q_j(x_j)); at the first rejection a, draw from norm(max(0, p_a − q_a));
/// if all k are accepted draw the bonus from p_k. `p[B,k+1,V]`, `q[B,k,V]` are the target
/// and draft distributions the tokens were drawn under; `u[B,2k+1]` uniforms.
/// Returns (accepted[B], bonus[B,1]).
pub(super) fn sample_accept(
    b: &mut Builder,
    p: ValueId,
    q: ValueId,
    draft_tokens: ValueId,
    u: ValueId,
    k: u64,
) -> Result<(ValueId, ValueId), IrError> {
    let v = b_vocab(b.g, p);
    let idx = b.reshape(draft_tokens, &[B, s(k), s(1)])?;
    let p_head = b.g.add(
        Op::Slice {
            axis: 1,
            start: 0,
            len: k,
        },
        &[p],
    )?;
    let px = b.g.add(Op::Gather { axis: 2 }, &[p_head, idx])?;
    let qx = b.g.add(Op::Gather { axis: 2 }, &[q, idx])?;
    let px = b.reshape(px, &[B, s(k)])?;
    let qx = b.reshape(qx, &[B, s(k)])?;
    // accept_j ⇔ u_j · q_j(x) < p_j(x)  (no division; q_j(x) > 0 since x was drawn from q).
    let u_acc = b.slice_cols(u, 0, k)?;
    let uq = b.bin(BinaryOp::Mul, u_acc, qx)?;
    let ok = b.bin(BinaryOp::Lt, uq, px)?;
    let ok_i = b.g.add(Op::Cast { to: DType::I32 }, &[ok])?;
    let ones = b.fill_i32(1, &[B, s(k + 1)])?;
    let a = b.g.add(Op::AcceptChain, &[ok_i, ones])?;
    // Residuals max(0, p_j − q_j) for j < k, then p_k; `sample` normalises by the sum.
    let diff = b.bin(BinaryOp::Sub, p_head, q)?;
    let zero = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: b.g.ty(diff).clone(),
        },
        &[],
    )?;
    let resid = b.bin(BinaryOp::Max, diff, zero)?;
    let p_last = b.g.add(
        Op::Slice {
            axis: 1,
            start: k,
            len: 1,
        },
        &[p],
    )?;
    let dists = b.g.add(Op::Concat { axis: 1 }, &[resid, p_last])?;
    let a3 = b.reshape(a, &[B, s(1), s(1)])?;
    let zeros = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: i32_ty(&[B, s(1), v]),
        },
        &[],
    )?;
    let a_rows = b.g.add(Op::Gather { axis: 2 }, &[a3, zeros])?;
    let row = b.g.add(Op::Gather { axis: 1 }, &[dists, a_rows])?;
    let row = b.reshape(row, &[B, v])?;
    let u_bonus = b.slice_cols(u, k, 1)?;
    let u_bonus = b.reshape(u_bonus, &[B])?;
    let tok = b.g.add(Op::Sample, &[row, u_bonus])?;
    let tok = b.reshape(tok, &[B, s(1)])?;
    Ok((a, tok))
}

/// The uniforms of `counters` under the user's `seed`. `random_uniform` XORs its seed into
/// each counter, so seeds differing in a few low bits would only permute the counters of
/// neighbouring columns and lanes (seed 1's uniforms would be seed 0's, reordered): the op
/// gets `splitmix64(seed)` instead, and two seeds then share a uniform only where two
/// counters differ by a random-looking 64-bit word, which the small counters of a step and
/// the prefill's −1 − lane never do in practice.
pub(super) fn uniforms(b: &mut Builder, counters: ValueId, seed: u64) -> Result<ValueId, IrError> {
    let seed = specc_ir::interp::splitmix64(seed);
    b.g.add(Op::RandomUniform { seed }, &[counters])
}

/// Distinct RNG counters `((step · 2^20 + stream) · S + column)` as i64 `[B, cols]`, `S` = 64
/// or the next power of two of `cols` (so columns never reach the next stream's counters);
/// `stream` is the lanes' [`STREAM`](super::step::STREAM) (`[B]`, below 2^20).
pub(super) fn rng_counters(
    b: &mut Builder,
    step: ValueId,
    stream: ValueId,
    cols: u64,
) -> Result<ValueId, IrError> {
    let i64_ty = TensorType::new(DType::I64, [B, s(cols)]);
    let zeros = b.fill_i32(0, &[B, s(cols)])?;
    // `[B]` i32 → `[B, cols]` i64, the lane's value in every column.
    let spread = |b: &mut Builder, v: ValueId| -> Result<ValueId, IrError> {
        let v64 = b.g.add(Op::Cast { to: DType::I64 }, &[v])?;
        let v2 = b.reshape(v64, &[B, s(1)])?;
        b.g.add(Op::Gather { axis: 1 }, &[v2, zeros])
    };
    let st = spread(b, step)?;
    let lane = spread(b, stream)?;
    let col = b.g.add(
        Op::Iota {
            axis: 1,
            ty: i64_ty.clone(),
        },
        &[],
    )?;
    let fill = |b: &mut Builder, v: f64| {
        b.g.add(
            Op::Fill {
                value: v,
                ty: i64_ty.clone(),
            },
            &[],
        )
    };
    let c20 = fill(b, (1u64 << 20) as f64)?;
    // Columns per (step, lane): 64, or the next power of two for wider draws (tree nodes).
    let stride = fill(b, cols.next_power_of_two().max(64) as f64)?;
    let x = b.bin(BinaryOp::Mul, st, c20)?;
    let x = b.bin(BinaryOp::Add, x, lane)?;
    let x = b.bin(BinaryOp::Mul, x, stride)?;
    b.bin(BinaryOp::Add, x, col)
}
