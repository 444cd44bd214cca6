//! What every DFlash-drafted step shares (DFlash, DDTree): the drafter's pending context,
//! the block forward that first writes that context into the drafter's caches, and the
//! prefill that writes the prompt's context.

use specc_ir::op::B;
use specc_ir::{DType, Graph, IrError, Op, TensorType, ValueId};

use super::drafter::{self, DFlashSpec};
use crate::config::ModelSpec;
use crate::methods::step::{i32_ty, pending_positions, s, Builder, Common, HIDDEN};
use crate::methods::variants::PendingRows;

/// DFlash step states (besides the common ones): the taps of the committed positions whose
/// context the drafter's KV cache does not hold yet (rows `0..count` at positions
/// `base + row`), from the previous verify. Admission sets `count = 0`: the drafter's
/// prefill already wrote the context of every prompt position.
pub const DFLASH_HIDDEN: &str = "dflash.hidden";
pub const DFLASH_COUNT: &str = "dflash.count";
pub const DFLASH_BASE: &str = "dflash.base";
/// The ring where plain steps queue their context rows `[B, D, 1, n_tap·H]` until the
/// catch-up (`methods::variants`).
pub const DFLASH_RING_HIDDEN: &str = "dflash.ring_hidden";

/// The drafter's block forward of one step, and the pending-context states it read.
pub(in crate::methods) struct DraftBlock {
    /// `dflash.hidden` `[B, k + 1, n_tap·H]`, `dflash.count`, `dflash.base`.
    pub hidden: ValueId,
    pub count: ValueId,
    pub base: ValueId,
    /// The bonus token x(n) `[B, 1]`: the block's first token.
    pub bonus: ValueId,
    /// f32 logits `[B, k + 1, V]`; row `i` predicts the token at `n + i`.
    pub logits: ValueId,
}

/// One drafter forward over the block `[x(n), MASK × k]` at `n..n+k` (k = the drafter's
/// `block_size − 1`); each layer first writes the pending context rows (the previous step's
/// committed positions) into its caches.
pub(in crate::methods) fn draft_block(
    b: &mut Builder,
    c: &Common,
    target: &ModelSpec,
    dflash: &DFlashSpec,
    k: u64,
) -> Result<DraftBlock, IrError> {
    let (hidden, count, base) = pending_context(b, target, dflash, k + 1)?;
    let cpos = pending_positions(b, c, base, count, k + 1)?;
    let ctx = drafter::context(b.g, dflash, hidden)?;
    let bonus = b.slice_cols(c.pending, 1, 1)?;
    let masks = b.fill_i32(dflash.mask_token as i64, &[B, s(k)])?;
    let block = b.g.add(Op::Concat { axis: 1 }, &[bonus, masks])?;
    let bpos = b.positions(c.len, k + 1, c.live)?;
    let logits = drafter::block_logits(b.g, target, dflash, Some((ctx, cpos)), block, bpos, c.len)?;
    Ok(DraftBlock {
        hidden,
        count,
        base,
        bonus,
        logits,
    })
}

impl DraftBlock {
    /// The pending-context states as the shared pending-rows commits see them.
    pub(in crate::methods) fn pending(&self) -> PendingRows {
        PendingRows {
            hidden: self.hidden,
            tokens: None,
            count: self.count,
            base: self.base,
        }
    }
}

/// The pending-context states, `dflash.hidden` of `rows` rows.
fn pending_context(
    b: &mut Builder,
    target: &ModelSpec,
    dflash: &DFlashSpec,
    rows: u64,
) -> Result<(ValueId, ValueId, ValueId), IrError> {
    let w = dflash.taps_width() as u64;
    let hidden = b.g.state(
        DFLASH_HIDDEN,
        TensorType::new(target.dtype, [B, s(rows), s(w)]),
    )?;
    let count = b.g.state(DFLASH_COUNT, i32_ty(&[B]))?;
    let base = b.g.state(DFLASH_BASE, i32_ty(&[B]))?;
    Ok((hidden, count, base))
}

/// The pending-context states as one step reads them, `dflash.hidden` of `rows` rows.
pub(in crate::methods) fn pending_rows(
    b: &mut Builder,
    target: &ModelSpec,
    dflash: &DFlashSpec,
    rows: u64,
) -> Result<PendingRows, IrError> {
    let (hidden, count, base) = pending_context(b, target, dflash, rows)?;
    Ok(PendingRows {
        hidden,
        tokens: None,
        count,
        base,
    })
}

/// The DFlash drafter's prefill: the context of the prompt positions (input `hidden`
/// `[B, T, n_tap·H]` = the target prefill's `taps`, unchanged, at `positions` `[B, T]`,
/// −1 for padding) written into every drafter layer's KV cache. Outputs `q.{l}`: the
/// context queries, unused (see [`drafter::write_context`]).
pub fn lower_dflash_prefill(target: &ModelSpec, dflash: &DFlashSpec) -> Result<Graph, IrError> {
    let mut g = Graph::new("dflash_prefill");
    let t = specc_ir::op::T;
    let hidden = g.input(
        HIDDEN,
        TensorType::new(target.dtype, [B, t, s(dflash.taps_width() as u64)]),
    )?;
    let positions = g.input("positions", TensorType::new(DType::I32, [B, t]))?;
    let qs = drafter::write_context(&mut g, dflash, hidden, positions)?;
    for (l, q) in qs.into_iter().enumerate() {
        g.set_output(&format!("q.{l}"), q);
    }
    Ok(g)
}
