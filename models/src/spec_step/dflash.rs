//! The DFlash step graph and the drafter's prefill (the drafter itself: `crate::dflash`).

use super::*;

/// DFlash step states (besides the common ones): the taps of the committed positions whose
/// context the drafter's KV cache does not hold yet (rows `0..count` at positions
/// `base + row`), from the previous verify. Admission sets `count = 0`: the drafter's
/// prefill already wrote the context of every prompt position.
pub const DFLASH_HIDDEN: &str = "dflash.hidden";
pub const DFLASH_COUNT: &str = "dflash.count";
pub const DFLASH_BASE: &str = "dflash.base";

/// `base[b] + [0, .., cols-1]` where the column is `< count[b]` and the lane is live, else −1.
pub(super) fn pending_positions(
    b: &mut Builder,
    c: &Common,
    base: ValueId,
    count: ValueId,
    cols: u64,
) -> Result<ValueId, IrError> {
    let io = b.iota(cols)?;
    let cnt = b.bcast_cols(count, cols)?;
    let valid = b.bin(BinaryOp::Lt, io, cnt)?;
    let valid_i = b.g.add(Op::Cast { to: DType::I32 }, &[valid])?;
    let live_cols = b.bcast_cols_bool(c.live, cols)?;
    let live_i = b.g.add(Op::Cast { to: DType::I32 }, &[live_cols])?;
    let both = b.bin(BinaryOp::Mul, valid_i, live_i)?;
    let zero_c = b.fill_i32(0, &[B, s(cols)])?;
    let keep = b.bin(BinaryOp::Lt, zero_c, both)?;
    let base_c = b.bcast_cols(base, cols)?;
    let pos = b.bin(BinaryOp::Add, base_c, io)?;
    let neg = b.fill_i32(-1, &[B, s(cols)])?;
    b.g.add(Op::Select, &[keep, pos, neg])
}

/// Lowers one speculative step with a DFlash drafter (k = block_size − 1 drafts from ONE
/// drafter forward).
///
/// 1. Context catch-up: the pending taps rows `t < count` go through `fc` + `hidden_norm`;
///    every drafter layer writes their keys/values at `base + t` (in the same projection as
///    the block's, see [`crate::dflash::block_logits`]), so the cache holds the context of
///    positions `0..n` before the layer's attention.
/// 2. Draft: the block `[x(n), MASK × k]` at `n..n+k` attends context slots `0..n` and the
///    whole block; rows `1..=k` give d1..dk (argmax; sampled acceptance draws each from
///    softmax(row / T) — the rows do not depend on each other's draws, so q is exact).
/// 3. Verify with taps = `target_layer_ids`; the taps of the `a + 1` committed positions
///    `n..n+a` become the next step's pending rows (`count = a + 1`, `base = n`).
///
/// Panics unless `shape.num_steps == block_size − 1` ([`crate::SpecBundle`] checks it).
pub fn lower_dflash_step(
    target: &ModelSpec,
    dflash: &crate::dflash::DFlashSpec,
    shape: &StepShape,
) -> Result<Graph, IrError> {
    let k = shape.num_steps;
    assert_eq!(
        k as usize,
        dflash.num_steps(),
        "a DFlash step drafts block_size - 1 tokens"
    );
    let w = dflash.taps_width() as u64;
    let mut g = Graph::new("spec_step_dflash");
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, shape)?;
    let hidden = b.g.state(
        DFLASH_HIDDEN,
        TensorType::new(target.dtype, [B, s(k + 1), s(w)]),
    )?;
    let count = b.g.state(DFLASH_COUNT, i32_ty(&[B]))?;
    let base = b.g.state(DFLASH_BASE, i32_ty(&[B]))?;

    // 1 + 2. one drafter forward over the block [x(n), MASK × k] at n..n+k; each layer
    // first writes the pending context rows (the previous step's committed positions).
    let cpos = pending_positions(&mut b, &c, base, count, k + 1)?;
    let ctx = crate::dflash::context(b.g, dflash, hidden)?;
    let bonus_in = b.slice_cols(c.pending, 1, 1)?;
    let masks = b.fill_i32(dflash.mask_token as i64, &[B, s(k)])?;
    let block = b.g.add(Op::Concat { axis: 1 }, &[bonus_in, masks])?;
    let bpos = b.positions(c.len, k + 1, c.live)?;
    let logits =
        crate::dflash::block_logits(b.g, target, dflash, Some((ctx, cpos)), block, bpos, c.len)?;
    let mut d = Drafted {
        tokens: Vec::new(),
        dists: Vec::new(),
    };
    for j in 0..k {
        let row = b.g.add(
            Op::Slice {
                axis: 1,
                start: j + 1,
                len: 1,
            },
            &[logits],
        )?;
        let tok = choose(&mut b, shape, &c, row, k + 1 + j, &mut d.dists)?;
        d.tokens.push(tok);
    }

    // 3. verify; the committed positions' taps are the next step's context.
    let v = verify_and_commit(&mut b, &c, target, shape, d, &dflash.taps)?;
    let taps = v.taps.expect("dflash verify taps its target layers");
    let a1 = b.bin(BinaryOp::Add, v.accepted, c.one_b)?;
    let mut commits = vec![(hidden, taps), (count, a1), (base, c.len)];
    commits.extend(v.commits);
    commit_all(&mut b, &commits)?;
    Ok(g)
}

/// The DFlash drafter's prefill: the context of the prompt positions (input `hidden`
/// `[B, T, n_tap·H]` = the target prefill's `taps`, unchanged, at `positions` `[B, T]`,
/// −1 for padding) written into every drafter layer's KV cache. Outputs `q.{l}`: the
/// context queries, unused (see [`crate::dflash::write_context`]).
pub fn lower_dflash_prefill(
    target: &ModelSpec,
    dflash: &crate::dflash::DFlashSpec,
) -> Result<Graph, IrError> {
    let mut g = Graph::new("dflash_prefill");
    let t = specc_ir::op::T;
    let hidden = g.input(
        HIDDEN,
        TensorType::new(target.dtype, [B, t, s(dflash.taps_width() as u64)]),
    )?;
    let positions = g.input("positions", TensorType::new(DType::I32, [B, t]))?;
    let qs = crate::dflash::write_context(&mut g, dflash, hidden, positions)?;
    for (l, q) in qs.into_iter().enumerate() {
        g.set_output(&format!("q.{l}"), q);
    }
    Ok(g)
}
