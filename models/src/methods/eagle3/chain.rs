//! The EAGLE-3 chain (topk = 1): the head drafts k tokens one after another from its
//! catch-up output, feeding its own output back.

use specc_ir::engine::Phase;
use specc_ir::op::B;
use specc_ir::{BinaryOp, Graph, IrError};

use super::head::{self, Eagle3Spec};
use super::pairs::{catch_up, eagle_states, write_pairs, EAGLE_RING_HIDDEN, EAGLE_RING_TOKENS};
use crate::config::ModelSpec;
use crate::lower::embed;
use crate::methods::sampling::one_hot;
use crate::methods::step::{begin, commit_all, verify_and_commit, Builder, Drafted, StepShape};
use crate::methods::variants::{lower_tap_catch_up, lower_tap_plain_step, RingNames};

/// Lowers one speculative step with an EAGLE-3 head (chain, topk = 1).
///
/// Catch-up of the pending pairs (`pairs::catch_up`); chained steps feed the head's own
/// output back (no `fc`) at the following positions. After verify, the k + 1 verify
/// positions' taps and the emitted tokens become the next step's pairs (`count = a + 1`,
/// `base = n`).
pub fn lower_eagle3_step(
    target: &ModelSpec,
    eagle: &Eagle3Spec,
    shape: &StepShape,
) -> Result<Graph, IrError> {
    lower_eagle3_chain(target, eagle, shape, shape.num_steps + 1)
}

/// [`lower_eagle3_step`] over pending-pair states of `rows ≥ k + 1` rows (a variant of
/// smaller k over the configured step's states: `methods::variants`).
pub(super) fn lower_eagle3_chain(
    target: &ModelSpec,
    eagle: &Eagle3Spec,
    shape: &StepShape,
    rows: u64,
) -> Result<Graph, IrError> {
    let k = shape.num_steps;
    let mut g = Graph::new("spec_step_eagle3");
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, shape)?;
    let st = eagle_states(&mut b, target, eagle, rows)?;
    let mut out_row = catch_up(&mut b, &c, target, eagle, &st, rows)?;

    let mut d = Drafted {
        tokens: Vec::new(),
        dists: Vec::new(),
    };
    for j in 0..k {
        let tok = head::next_token(b.g, eagle, out_row)?;
        if c.uniforms.is_some() {
            // The head drafts greedily: q is the point mass on its token.
            d.dists.push(one_hot(&mut b, tok, target.vocab as u64)?);
        }
        d.tokens.push(tok);
        if j + 1 < k {
            // Pair (out_row, tok) at position n - 1 + j + 1 = len + j.
            let offset = b.fill_i32(j as i64, &[B])?;
            let start = b.bin(BinaryOp::Add, c.len, offset)?;
            let p = b.positions(start, 1, c.live)?;
            let (e1, _) =
                b.g.with_phase(Phase::Draft, |g| embed(g, target, "", tok))?;
            out_row = head::midlayer(b.g, eagle, e1, out_row, p)?;
        }
    }
    let v = verify_and_commit(&mut b, &c, target, shape, d, &eagle.taps)?;
    let taps = v.taps.expect("eagle verify taps three layers");
    let a1 = b.bin(BinaryOp::Add, v.accepted, c.one_b)?;
    let mut commits = st
        .pending()
        .commits(&mut b, &c, taps, Some(v.emit_tokens), a1)?;
    commits.extend(v.commits);
    commit_all(&mut b, &commits)?;
    Ok(g)
}

/// The queue ring of EAGLE-3's plain steps (`methods::variants`).
pub(super) const RING: RingNames = RingNames {
    hidden: EAGLE_RING_HIDDEN,
    tokens: Some(EAGLE_RING_TOKENS),
};

/// Plain decoding over EAGLE-3 states of `rows` pending pairs (`methods::variants`): x(n)
/// verified alone; its taps and x(n+1) queued in the ring, the head untouched.
pub(super) fn lower_eagle3_plain(
    target: &ModelSpec,
    eagle: &Eagle3Spec,
    shape: &StepShape,
    rows: u64,
) -> Result<Graph, IrError> {
    lower_tap_plain_step(
        "spec_step_eagle3_plain",
        target,
        shape,
        &eagle.taps,
        &RING,
        |b| Ok(eagle_states(b, target, eagle, rows)?.pending()),
    )
}

/// The catch-up of EAGLE-3's plain steps over states of `rows` pending pairs
/// (`methods::variants`): every queued pair but the last through `fc` and the head's cache
/// writes, as [`write_pairs`] writes them; the last stays pending.
pub(super) fn lower_eagle3_catch_up(
    target: &ModelSpec,
    eagle: &Eagle3Spec,
    shape: &StepShape,
    rows: u64,
) -> Result<Graph, IrError> {
    lower_tap_catch_up(
        "eagle3_catch_up",
        shape,
        &RING,
        true,
        |b| Ok(eagle_states(b, target, eagle, rows)?.pending()),
        |b, queued, pos| Ok(vec![write_pairs(b, target, eagle, queued, pos)?]),
    )
}
