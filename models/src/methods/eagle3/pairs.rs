//! What every EAGLE-3 step shares: the pairs (target taps, token) the head has not seen
//! yet, their catch-up through the head at the step's start, and the head's prefill, which
//! reads the prompt's pairs.

use specc_ir::engine::Phase;
use specc_ir::op::B;
use specc_ir::{BinaryOp, DType, Dim, Graph, IrError, Op, TensorType, ValueId};

use super::head::{self, Eagle3Spec};
use crate::config::ModelSpec;
use crate::lower::embed;
use crate::methods::step::{i32_ty, pending_positions, s, Builder, Common, HIDDEN};
use crate::methods::variants::PendingRows;

/// EAGLE-3 step states (besides the common ones): the taps and tokens of the pairs the
/// head has not seen yet, from the previous verify (or the prefill's last position).
pub const EAGLE_HIDDEN: &str = "eagle.hidden";
pub const EAGLE_TOKENS: &str = "eagle.tokens";
pub const EAGLE_COUNT: &str = "eagle.count";
pub const EAGLE_BASE: &str = "eagle.base";
/// The ring where plain steps queue their pairs' taps `[B, D, 1, 3H]` and tokens
/// `[B, D, 1, 1]` until the catch-up (`methods::variants`).
pub const EAGLE_RING_HIDDEN: &str = "eagle.ring_hidden";
pub const EAGLE_RING_TOKENS: &str = "eagle.ring_tokens";

/// The EAGLE-3 states with `rows` pending pairs.
pub(super) struct EagleStates {
    pub(super) hidden: ValueId,
    pub(super) tokens: ValueId,
    pub(super) count: ValueId,
    pub(super) base: ValueId,
}

impl EagleStates {
    /// The states as the shared pending-rows commits see them.
    pub(super) fn pending(&self) -> PendingRows {
        PendingRows {
            hidden: self.hidden,
            tokens: Some(self.tokens),
            count: self.count,
            base: self.base,
        }
    }
}

pub(super) fn eagle_states(
    b: &mut Builder,
    target: &ModelSpec,
    eagle: &Eagle3Spec,
    rows: u64,
) -> Result<EagleStates, IrError> {
    let h3 = 3 * eagle.hidden() as u64;
    let hid_ty = TensorType::new(target.dtype, [B, s(rows), s(h3)]);
    Ok(EagleStates {
        hidden: b.g.state(EAGLE_HIDDEN, hid_ty)?,
        tokens: b.g.state(EAGLE_TOKENS, i32_ty(&[B, s(rows)]))?,
        count: b.g.state(EAGLE_COUNT, i32_ty(&[B]))?,
        base: b.g.state(EAGLE_BASE, i32_ty(&[B]))?,
    })
}

/// Catch-up: the pairs `(taps[t], tokens[t])` at positions `base + t`, `t < count`, go
/// through `fc` and the head (slots past `count` are masked). Returns the head's output at
/// slot `count − 1` (`[B, 1, H]`), which predicts d1.
pub(super) fn catch_up(
    b: &mut Builder,
    c: &Common,
    target: &ModelSpec,
    eagle: &Eagle3Spec,
    st: &EagleStates,
    rows: u64,
) -> Result<ValueId, IrError> {
    let pos = pending_positions(b, c, st.base, st.count, rows)?;
    let (emb, _) =
        b.g.with_phase(Phase::Draft, |g| embed(g, target, "", st.tokens))?;
    let g0 = head::fc(b.g, eagle, st.hidden)?;
    let out = head::midlayer(b.g, eagle, emb, g0, pos)?;
    let last = b.bin(BinaryOp::Sub, st.count, c.one_b)?;
    let last3 = b.reshape(last, &[B, s(1), s(1)])?;
    let idx = bcast_last(b, last3, s(eagle.hidden() as u64))?;
    b.g.add(Op::Gather { axis: 1 }, &[out, idx])
}

/// The head cache writes of pending pairs (`rows`: their taps and tokens) at `pos`
/// (negative: not written), as [`catch_up`] writes them, without the rest of the head (the
/// catch-up of plain steps drafts nothing). Returns the unused q ([`head::write_pairs`]).
pub(super) fn write_pairs(
    b: &mut Builder,
    target: &ModelSpec,
    eagle: &Eagle3Spec,
    rows: &PendingRows,
    pos: ValueId,
) -> Result<ValueId, IrError> {
    let tokens = rows.tokens.expect("EAGLE-3 pairs carry their tokens");
    let (emb, _) =
        b.g.with_phase(Phase::Draft, |g| embed(g, target, "", tokens))?;
    let g0 = head::fc(b.g, eagle, rows.hidden)?;
    head::write_pairs(b.g, eagle, emb, g0, pos)
}

/// `idx[B, r, 1]` repeated along a new last dim of `width` (gather indices for rows).
pub(super) fn bcast_last(b: &mut Builder, idx: ValueId, width: Dim) -> Result<ValueId, IrError> {
    let mut dims = b.g.ty(idx).shape.dims().to_vec();
    *dims.last_mut().expect("rank ≥ 1") = width;
    let zeros = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: i32_ty(&dims),
        },
        &[],
    )?;
    b.g.add(Op::Gather { axis: 2 }, &[idx, zeros])
}

/// The EAGLE-3 head's prefill: pairs `(fc(hidden[t]), tokens[t])` at `positions[t]` fill
/// the head's KV cache (inputs `hidden` `[B, T, 3H]`, `tokens`, `positions` `[B, T]`).
pub fn lower_eagle3_prefill(target: &ModelSpec, eagle: &Eagle3Spec) -> Result<Graph, IrError> {
    let mut g = Graph::new("eagle3_prefill");
    let t = specc_ir::op::T;
    let ids = TensorType::new(DType::I32, [B, t]);
    let hidden = g.input(
        HIDDEN,
        TensorType::new(target.dtype, [B, t, s(3 * eagle.hidden() as u64)]),
    )?;
    let tokens = g.input("tokens", ids.clone())?;
    let positions = g.input("positions", ids)?;
    let (emb, _) = g.with_phase(Phase::Draft, |g| embed(g, target, "", tokens))?;
    let g0 = head::fc(&mut g, eagle, hidden)?;
    let out = head::midlayer(&mut g, eagle, emb, g0, positions)?;
    g.set_output("out", out);
    Ok(g)
}
