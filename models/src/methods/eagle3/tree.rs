//! The EAGLE-3 dynamic draft tree (topk > 1, EAGLE-2/3 style), fed by the same catch-up
//! of the head on the pairs the previous verify left as the chain's.
//!
//! Tree drafting (depth D = `num_steps`, K = `topk`, N = `num_draft_tokens`):
//! - depth 1: the K best tokens of the catch-up's last output (scores = log-probs);
//! - expanding depth e = 1..D−1: the head runs on that depth's frontier of K nodes at
//!   once (RoPE position `n + e − 1`, head cache slot `n + (e−1)·K + i`, tree attention over
//!   the head's prefix `0..n` and the frontier node's ancestors among the draft slots),
//!   each row yields its top-K children with cumulative score = parent's + log-prob;
//!   the next frontier is the K best of those K² children (ties to the lower index);
//! - every candidate (K at depth 1, K² per later depth, in that order) goes to
//!   `tree_select`, which keeps the N − 1 best under the root x(n). A child's score is
//!   one f32 add of a log-prob ≤ 0 to its parent's, so it is ≤ the parent's, and parents
//!   precede children: the selection is prefix-closed.
//!
//! Verify, accept and commit are the shared tree's (`methods::tree`: `verify_tree`,
//! `accept_and_commit`); the accepted path's taps and tokens become the head's next pairs,
//! as in the chain.
//! Head cache: slots `n ..` past the prefix hold this step's draft rows; the next step's
//! catch-up overwrites `n ..= n + a` and attention never reads past the prefix otherwise.

use specc_ir::engine::Phase;
use specc_ir::op::{tree_words, B};
use specc_ir::{BinaryOp, DType, Graph, IrError, Op, TensorType, ValueId};

use super::head::{self, Eagle3Spec, HeadAttn};
use super::pairs::{bcast_last, catch_up, eagle_states};
use crate::config::ModelSpec;
use crate::lower::embed;
use crate::methods::step::{begin, commit_all, s, Builder, StepShape};
use crate::methods::tree::{accept_and_commit, verify_tree, TreeKnobs};

/// The K best children of each of the head's output rows `[B, r, H]`: target token ids
/// `i32[B, r, K]` and their log-probs `f32[B, r, K]` (best first, ties to the lower id).
fn top_children(
    b: &mut Builder,
    eagle: &Eagle3Spec,
    out: ValueId,
    k: u64,
) -> Result<(ValueId, ValueId), IrError> {
    let logits = head::draft_logits(b.g, eagle, out)?;
    let probs = b.g.add(Op::Softmax, &[logits])?;
    let logp = b.g.add(Op::Unary(specc_ir::UnaryOp::Log), &[probs])?;
    let ids = b.g.add(Op::TopK { k }, &[logp])?;
    let lp = b.g.add(Op::Gather { axis: 2 }, &[logp, ids])?;
    Ok((head::to_target(b.g, eagle, ids)?, lp))
}

/// `i64[B, k, words]`: row `i` holds bit `first + i` alone (a frontier row's own draft slot).
fn own_bits(b: &mut Builder, first: u64, k: u64, words: u64) -> Result<ValueId, IrError> {
    let mut rows = Vec::with_capacity(k as usize);
    for i in 0..k {
        let u = first + i;
        let mut cols = Vec::with_capacity(words as usize);
        for w in 0..words {
            let v = if u / 64 == w {
                (1u64 << (u % 64)) as i64
            } else {
                0
            };
            cols.push(b.g.add(
                Op::Fill {
                    value: v as f64,
                    ty: TensorType::new(DType::I64, [B, s(1), s(1)]),
                },
                &[],
            )?);
        }
        rows.push(b.g.add(Op::Concat { axis: 2 }, &cols)?);
    }
    b.g.add(Op::Concat { axis: 1 }, &rows)
}

/// The frontier the head expands at one depth: `k` rows.
struct Frontier {
    /// Target token ids `[B, k]`.
    tokens: ValueId,
    /// Cumulative log-probs `f32[B, k]`.
    scores: ValueId,
    /// Candidate indices (for `tree_select`'s parents) `[B, k]`.
    cand: ValueId,
    /// The head input `g` of each row: its parent's output `[B, k, H]`.
    hidden: ValueId,
    /// The parent's ancestor words among the draft slots `i64[B, k, W]` (none at depth 1).
    parent_anc: Option<ValueId>,
}

/// Lowers one EAGLE-3 draft-tree step (greedy or sampled acceptance, as the shared tree's
/// `accept_and_commit`). `shape.num_steps` is the depth D; `tree.budget`
/// the verified nodes N (root included), `tree.topk` the K children per frontier node.
pub fn lower_eagle3_tree_step(
    target: &ModelSpec,
    eagle: &Eagle3Spec,
    shape: &StepShape,
    tree: TreeKnobs,
) -> Result<Graph, IrError> {
    lower_eagle3_tree(target, eagle, shape, tree, shape.num_steps + 1)
}

/// [`lower_eagle3_tree_step`] over pending-pair states of `rows ≥ depth + 1` rows (a
/// shallower variant over the configured tree's states: `methods::variants`).
pub(super) fn lower_eagle3_tree(
    target: &ModelSpec,
    eagle: &Eagle3Spec,
    shape: &StepShape,
    tree: TreeKnobs,
    rows: u64,
) -> Result<Graph, IrError> {
    let depth = shape.num_steps;
    let (n, k) = (tree.budget as u64, tree.topk as u64);
    let words = tree_words(((depth - 1) * k).max(1));
    let hdim = s(eagle.hidden() as u64);
    let mut g = Graph::new("spec_step_eagle3_tree");
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, shape)?;
    let st = eagle_states(&mut b, target, eagle, rows)?;
    let out_row = catch_up(&mut b, &c, target, eagle, &st, rows)?;

    // Depth 1: the K best tokens after the catch-up; their parent is the root.
    let (tok1, lp1) = top_children(&mut b, eagle, out_row, k)?;
    let tok1 = b.reshape(tok1, &[B, s(k)])?;
    let lp1 = b.reshape(lp1, &[B, s(k)])?;
    let zeros_k = b.fill_i32(0, &[B, s(k)])?;
    let zeros_k3 = b.reshape(zeros_k, &[B, s(k), s(1)])?;
    let rows0 = bcast_last(&mut b, zeros_k3, hdim)?;
    let mut scores = vec![lp1];
    let mut tokens = vec![tok1];
    let mut parents = vec![b.fill_i32(-1, &[B, s(k)])?];
    let mut f = Frontier {
        tokens: tok1,
        scores: lp1,
        cand: b.iota(k)?,
        hidden: b.g.add(Op::Gather { axis: 1 }, &[out_row, rows0])?,
        parent_anc: None,
    };
    let mut next_cand = k;
    for e in 1..depth {
        // Expand depth e: head rows at RoPE n + e − 1, draft slots n + (e−1)·K + i.
        let bits = own_bits(&mut b, (e - 1) * k, k, words)?;
        let anc = match f.parent_anc {
            // Distinct bits: parent's | own = parent's + own.
            Some(p) => b.bin(BinaryOp::Add, p, bits)?,
            None => bits,
        };
        let first_slot = b.fill_i32(((e - 1) * k) as i64, &[B])?;
        let first_slot = b.bin(BinaryOp::Add, c.len, first_slot)?;
        let slots = b.positions(first_slot, k, c.live)?;
        let pos = b.fill_i32(e as i64 - 1, &[B])?;
        let pos = b.bin(BinaryOp::Add, c.len, pos)?;
        let pos = b.bcast_cols(pos, k)?;
        let live_k = b.bcast_cols_bool(c.live, k)?;
        let neg = b.fill_i32(-1, &[B, s(k)])?;
        let pos = b.g.add(Op::Select, &[live_k, pos, neg])?;
        let (emb, _) =
            b.g.with_phase(Phase::Draft, |g| embed(g, target, "", f.tokens))?;
        let attn = HeadAttn::Tree {
            slots,
            prefix_len: c.len,
            ancestors: anc,
            query_rows: e * k,
        };
        let out = head::midlayer_masked(b.g, eagle, emb, f.hidden, pos, attn)?;
        let (ctok, clp) = top_children(&mut b, eagle, out, k)?;
        // Children of frontier row i: candidates next_cand + i·K + j.
        let fs = b.reshape(f.scores, &[B, s(k), s(1)])?;
        let fs = bcast_last(&mut b, fs, s(k))?;
        let cs = b.bin(BinaryOp::Add, fs, clp)?;
        let cs = b.reshape(cs, &[B, s(k * k)])?;
        let ct = b.reshape(ctok, &[B, s(k * k)])?;
        let fc = b.reshape(f.cand, &[B, s(k), s(1)])?;
        let fc = bcast_last(&mut b, fc, s(k))?;
        let cp = b.reshape(fc, &[B, s(k * k)])?;
        scores.push(cs);
        tokens.push(ct);
        parents.push(cp);
        if e + 1 < depth {
            let sel = b.g.add(Op::TopK { k }, &[cs])?;
            let kk = b.fill_i32(k as i64, &[B, s(k)])?;
            let prow = b.bin(BinaryOp::Div, sel, kk)?;
            let prow3 = b.reshape(prow, &[B, s(k), s(1)])?;
            let hid_idx = bcast_last(&mut b, prow3, hdim)?;
            let anc_idx = bcast_last(&mut b, prow3, s(words))?;
            let off = b.fill_i32(next_cand as i64, &[B, s(k)])?;
            f = Frontier {
                tokens: b.g.add(Op::Gather { axis: 1 }, &[ct, sel])?,
                scores: b.g.add(Op::Gather { axis: 1 }, &[cs, sel])?,
                cand: b.bin(BinaryOp::Add, sel, off)?,
                hidden: b.g.add(Op::Gather { axis: 1 }, &[out, hid_idx])?,
                parent_anc: Some(b.g.add(Op::Gather { axis: 1 }, &[anc, anc_idx])?),
            };
        }
        next_cand += k * k;
    }
    let cat = |b: &mut Builder, xs: &[ValueId]| b.g.add(Op::Concat { axis: 1 }, xs);
    let scores = cat(&mut b, &scores)?;
    let tokens = cat(&mut b, &tokens)?;
    let parents = cat(&mut b, &parents)?;
    let bonus_in = b.slice_cols(c.pending, 1, 1)?;
    let root = b.reshape(bonus_in, &[B])?;
    let tree_v = b.g.add(
        Op::TreeSelect { nodes: n },
        &[scores, tokens, parents, root],
    )?;

    let v = verify_tree(&mut b, &c, target, tree_v, n, &eagle.taps)?;
    let t = accept_and_commit(&mut b, &c, shape, tree_v, v, depth)?;
    let mut commits = st
        .pending()
        .commits(&mut b, &c, t.path_taps, Some(t.emit_tokens), t.a1)?;
    commits.extend(t.commits);
    commit_all(&mut b, &commits)?;
    Ok(g)
}
