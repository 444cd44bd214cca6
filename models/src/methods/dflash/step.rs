//! The DFlash step: k = block_size − 1 draft tokens from ONE drafter forward, verified as
//! a chain.

use specc_ir::{BinaryOp, Graph, IrError, Op};

use super::context::{draft_block, pending_rows, DFLASH_RING_HIDDEN};
use super::drafter;
use super::drafter::DFlashSpec;
use crate::config::ModelSpec;
use crate::methods::sampling::choose;
use crate::methods::step::{begin, commit_all, verify_and_commit, Builder, Drafted, StepShape};
use crate::methods::variants::{lower_tap_catch_up, lower_tap_plain_step, RingNames};

/// Lowers one speculative step with a DFlash drafter (k = block_size − 1 drafts from ONE
/// drafter forward).
///
/// 1. Context catch-up: the pending taps rows `t < count` go through `fc` + `hidden_norm`;
///    every drafter layer writes their keys/values at `base + t` (in the same projection as
///    the block's, see [`super::block_logits`]), so the cache holds the context of
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
    dflash: &DFlashSpec,
    shape: &StepShape,
) -> Result<Graph, IrError> {
    assert_eq!(
        shape.num_steps as usize,
        dflash.num_steps(),
        "a DFlash step drafts block_size - 1 tokens"
    );
    lower_dflash_prefix(target, dflash, shape)
}

/// A DFlash step that verifies the block's first `shape.num_steps` drafts, `1 ..=
/// block_size − 1` (fewer: a shorter variant over the configured step's states,
/// `methods::variants`). The drafter still runs its whole block.
pub(in crate::methods) fn lower_dflash_prefix(
    target: &ModelSpec,
    dflash: &DFlashSpec,
    shape: &StepShape,
) -> Result<Graph, IrError> {
    let k = shape.num_steps;
    let full = dflash.num_steps() as u64;
    assert!((1..=full).contains(&k), "verify 1..=block_size - 1 drafts");
    let mut g = Graph::new("spec_step_dflash");
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, shape)?;
    // 1 + 2.
    let block = draft_block(&mut b, &c, target, dflash, full)?;
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
            &[block.logits],
        )?;
        let tok = choose(&mut b, shape, &c, row, k + 1 + j, &mut d.dists)?;
        d.tokens.push(tok);
    }

    // 3. verify; the committed positions' taps are the next step's context.
    let v = verify_and_commit(&mut b, &c, target, shape, d, &dflash.taps)?;
    let taps = v.taps.expect("dflash verify taps its target layers");
    let a1 = b.bin(BinaryOp::Add, v.accepted, c.one_b)?;
    let mut commits = block.pending().commits(&mut b, &c, taps, None, a1)?;
    commits.extend(v.commits);
    commit_all(&mut b, &commits)?;
    Ok(g)
}

/// The queue ring of DFlash's plain steps (`methods::variants`).
const RING: RingNames = RingNames {
    hidden: DFLASH_RING_HIDDEN,
    tokens: None,
};

/// Plain decoding over DFlash states (`methods::variants`): x(n) verified alone; its taps
/// queued in the ring, the drafter untouched.
pub(in crate::methods) fn lower_dflash_plain(
    target: &ModelSpec,
    dflash: &DFlashSpec,
    shape: &StepShape,
) -> Result<Graph, IrError> {
    let rows = dflash.num_steps() as u64 + 1;
    lower_tap_plain_step(
        "spec_step_dflash_plain",
        target,
        shape,
        &dflash.taps,
        &RING,
        |b| pending_rows(b, target, dflash, rows),
    )
}

/// The catch-up of DFlash's plain steps (`methods::variants`): every queued context row
/// written into the drafter's caches (as the prefill writes context,
/// [`drafter::write_context`]); nothing stays pending.
pub(in crate::methods) fn lower_dflash_catch_up(
    target: &ModelSpec,
    dflash: &DFlashSpec,
    shape: &StepShape,
) -> Result<Graph, IrError> {
    let rows = dflash.num_steps() as u64 + 1;
    lower_tap_catch_up(
        "dflash_catch_up",
        shape,
        &RING,
        false,
        |b| pending_rows(b, target, dflash, rows),
        |b, queued, pos| drafter::write_context(b.g, dflash, queued.hidden, pos),
    )
}
