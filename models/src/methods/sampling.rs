//! Sampled acceptance and draft draws: target and draft distributions at a temperature,
//! speculative sampling over a chain, and the counter-based RNG every draw reads.

use specc_ir::op::B;
use specc_ir::{BinaryOp, DType, Dim, Graph, IrError, Op, TensorType, ValueId};

use super::step::{i32_ty, s, Builder, Common, StepShape};
use crate::spec_config::Acceptance;

/// One draft token from a logits row `[B, 1, V]`: the argmax (greedy) or a draw from
/// softmax(row / temperature) with uniform column `col` (sampled acceptance).
pub(super) fn choose(
    b: &mut Builder,
    shape: &StepShape,
    c: &Common,
    row: ValueId,
    col: u64,
    dists: &mut Vec<ValueId>,
) -> Result<ValueId, IrError> {
    match (&shape.acceptance, c.uniforms) {
        (Acceptance::Sample { temperature, .. }, Some(u)) => {
            let q = probs(b, row, *temperature)?;
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

/// softmax(logits / temperature) over the vocab.
pub(super) fn probs(
    b: &mut Builder,
    logits: ValueId,
    temperature: f64,
) -> Result<ValueId, IrError> {
    let inv_t = b.g.add(
        Op::Fill {
            value: 1.0 / temperature,
            ty: b.g.ty(logits).clone(),
        },
        &[],
    )?;
    let scaled = b.bin(BinaryOp::Mul, logits, inv_t)?;
    b.g.add(Op::Softmax, &[scaled])
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

/// Distinct RNG counters `((step · 2^20 + lane) · S + column)` as i64 `[B, cols]`, `S` = 64
/// or the next power of two of `cols` (so columns never reach the next lane's counters).
pub(super) fn rng_counters(b: &mut Builder, step: ValueId, cols: u64) -> Result<ValueId, IrError> {
    let i64_ty = TensorType::new(DType::I64, [B, s(cols)]);
    let step64 = b.g.add(Op::Cast { to: DType::I64 }, &[step])?;
    let v2 = b.reshape(step64, &[B, s(1)])?;
    let zeros = b.fill_i32(0, &[B, s(cols)])?;
    let st = b.g.add(Op::Gather { axis: 1 }, &[v2, zeros])?;
    let lane = b.g.add(
        Op::Iota {
            axis: 0,
            ty: i64_ty.clone(),
        },
        &[],
    )?;
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
