//! Draft trees, verified and committed the same way whichever method drafted them (DDTree,
//! EAGLE-3 with topk > 1): the target's forward over the tree's nodes under a tree mask,
//! the walk that accepts one root-to-node path, and the commit that moves the path's cache
//! rows into place.
//!
//! Slots: with n = `len`, tree node `i` (node 0 = the bonus token x(n)) is verified at RoPE
//! position `n + depth(i)` and written into the target caches at slot `n + i`, so verify
//! touches slots `n .. n + budget − 1` (the host keeps `len + budget ≤ Ctx`). After the
//! walk accepts `a` nodes, the rows of path node `path_d` move from slot `n + path_d` to
//! `n + d` for `d = 1..=a` (in ascending depth: `path_d ≥ d`, so no unread row is
//! overwritten); slots past `n + a` hold stale rows that the next step overwrites.

use specc_ir::engine::Phase;
use specc_ir::op::{tree_words, B};
use specc_ir::{BinaryOp, DType, Dim, Graph, IrError, Op, ValueId};

use super::sampling::{probs, rng_counters, uniforms};
use super::step::{emit, i32_ty, s, Builder, Common, StepShape, ACCEPTED, VERIFY_TOKENS};
use crate::config::ModelSpec;
use crate::lower::{decoder_layer_masked, embed, lm_head, LayerMask, LayerNames};
use crate::spec_config::Acceptance;

/// A draft tree's size (spec keys `budget` for DDTree, `num_draft_tokens` and `topk` for
/// EAGLE-3 trees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeKnobs {
    /// Nodes per tree, the root (bonus token) included: the verify width.
    pub budget: u32,
    /// Candidate tokens per depth (DDTree: the top-K of each block row; EAGLE-3: children
    /// per frontier node).
    pub topk: u32,
}

/// Most nodes one tree verifies.
pub const MAX_TREE_BUDGET: u32 = 256;

/// Output of the step graph: the built tree `i64[B, budget, 3 + W]` (tests, tracing).
pub const TREE: &str = "tree";

/// The target over the tree's tokens: logits `[B, N, V]`, taps, and every layer's updated
/// (key, value) caches.
struct TreeVerify {
    logits: ValueId,
    taps: ValueId,
    caches: Vec<(ValueId, ValueId)>,
}

fn tree_forward(
    g: &mut Graph,
    target: &ModelSpec,
    tokens: ValueId,
    positions: ValueId,
    mask: LayerMask,
    taps: &[usize],
) -> Result<TreeVerify, IrError> {
    let (mut x, table) = embed(g, target, "", tokens)?;
    let mut tapped = vec![None; taps.len()];
    let mut caches = Vec::with_capacity(target.layers);
    for layer in 0..target.layers {
        let names = LayerNames::of(target, "", layer);
        let (y, kc, vc) = decoder_layer_masked(g, target, &names, x, positions, mask)?;
        x = y;
        caches.push((kc, vc));
        for (i, &t) in taps.iter().enumerate() {
            if t == layer {
                tapped[i] = Some(x);
            }
        }
    }
    let tapped: Vec<ValueId> = tapped
        .into_iter()
        .map(|t| t.expect("tap layers are < layers"))
        .collect();
    let taps = g.add(Op::Concat { axis: 2 }, &tapped)?;
    Ok(TreeVerify {
        logits: lm_head(g, target, "", x, table)?,
        taps,
        caches,
    })
}

/// Column `col` of `x[B, N, C]` as `[B, N]` i32.
fn column(b: &mut Builder, x: ValueId, col: u64, n: u64) -> Result<ValueId, IrError> {
    let c = b.g.add(
        Op::Slice {
            axis: 2,
            start: col,
            len: 1,
        },
        &[x],
    )?;
    let c = b.reshape(c, &[B, s(n)])?;
    b.g.add(Op::Cast { to: DType::I32 }, &[c])
}

/// `live ? base[b] + offs[b, i] : −1` over `[B, cols]`.
fn offset_or_neg(
    b: &mut Builder,
    base: ValueId,
    offs: ValueId,
    keep: ValueId,
    cols: u64,
) -> Result<ValueId, IrError> {
    let bc = b.bcast_cols(base, cols)?;
    let p = b.bin(BinaryOp::Add, bc, offs)?;
    let neg = b.fill_i32(-1, &[B, s(cols)])?;
    b.g.add(Op::Select, &[keep, p, neg])
}

/// The target's verify of a built tree `[B, N, 3 + W]`: its tokens, the forward under the
/// tree mask (RoPE at `len + depth`, cache slot `len + node`) with `taps`.
pub(super) struct VerifiedTree {
    tokens: ValueId,
    forward: TreeVerify,
}

pub(super) fn verify_tree(
    b: &mut Builder,
    c: &Common,
    target: &ModelSpec,
    tree_v: ValueId,
    n: u64,
    taps: &[usize],
) -> Result<VerifiedTree, IrError> {
    let tokens = column(b, tree_v, 0, n)?;
    let depth = column(b, tree_v, 2, n)?;
    let ancestors = b.g.add(
        Op::Slice {
            axis: 2,
            start: 3,
            len: tree_words(n),
        },
        &[tree_v],
    )?;
    let live_n = b.bcast_cols_bool(c.live, n)?;
    let rope_pos = offset_or_neg(b, c.len, depth, live_n, n)?;
    let slots = b.positions(c.len, n, c.live)?;
    let mask = LayerMask::Tree {
        slots,
        prefix_len: c.len,
        ancestors,
    };
    let forward = b.g.with_phase(Phase::Target, |g| {
        tree_forward(g, target, tokens, rope_pos, mask, taps)
    })?;
    Ok(VerifiedTree { tokens, forward })
}

/// What a tree step commits besides the method's own states.
pub(super) struct TreeCommit {
    /// Accepted nodes + 1 (`[B]`, also for dead lanes).
    pub a1: ValueId,
    /// The target taps along the accepted path, `[B, depth + 1, taps]`.
    pub path_taps: ValueId,
    /// Emitted tokens `[B, depth + 1]`: path tokens at depths `1..=a`, then the bonus.
    pub emit_tokens: ValueId,
    /// The common states' (state, new value) pairs.
    pub commits: Vec<(ValueId, ValueId)>,
}

/// The walk (`tree_accept`, at most `l` moves), then the commit: lengths, pending, emitted
/// tokens, and the cache rows of the path moved from slot `n + path_d` to `n + d`
/// (`kv_move`). Sets the `accepted`, `verify_tokens` and [`TREE`] outputs.
///
/// The target's token at each node is its argmax (greedy), or under sampled acceptance a
/// draw from the node's filtered distribution (`sampling::probs`) with its own uniform. The
/// walk descends while a child of the current node carries the current node's target token
/// and emits that token when none does. Sampled, this is exact for any tree: each emitted
/// token is a fresh draw from the target's (filtered) distribution after the tokens emitted
/// before it (the draws of
/// nodes off the path are independent and discarded), whatever the drafter proposed — the
/// tree's tokens are deterministic (top-K), so there is no draft distribution to correct.
pub(super) fn accept_and_commit(
    b: &mut Builder,
    c: &Common,
    shape: &StepShape,
    tree_v: ValueId,
    v: VerifiedTree,
    l: u64,
) -> Result<TreeCommit, IrError> {
    let (tokens, v) = (v.tokens, v.forward);
    // accept: [a, bonus, path_0..path_L].
    let n = b.g.ty(tokens).shape.dims()[1];
    let target_next = match &shape.acceptance {
        Acceptance::Greedy => b.g.add(Op::Argmax, &[v.logits])?,
        Acceptance::Sample { seed, .. } => {
            let Dim::Static(nodes) = n else {
                unreachable!("a tree's node count is a constant")
            };
            let stream = c
                .stream
                .expect("sampled acceptance reads the lanes' streams");
            let counters = rng_counters(b, c.step, stream, nodes)?;
            let u = uniforms(b, counters, *seed)?;
            let p = probs(b, v.logits)?;
            b.g.add(Op::Sample, &[p, u])?
        }
    };
    let acc =
        b.g.add(Op::TreeAccept { max_depth: l }, &[tree_v, target_next])?;
    let a = b.slice_cols(acc, 0, 1)?;
    let a = b.reshape(a, &[B])?;
    let a = b.g.add(Op::Select, &[c.live, a, c.zero_b])?;
    let bonus = b.slice_cols(acc, 1, 1)?;
    let path = b.slice_cols(acc, 2, l + 1)?;

    // commit: lengths, pending, emitted tokens.
    let a1 = b.bin(BinaryOp::Add, a, c.one_b)?;
    let a1_live = b.g.add(Op::Select, &[c.live, a1, c.zero_b])?;
    let new_len = b.bin(BinaryOp::Add, c.len, a1_live)?;
    let path_tokens = b.g.add(Op::Gather { axis: 1 }, &[tokens, path])?;
    let last = b.pick(path_tokens, a)?;
    let new_pending = b.g.add(Op::Concat { axis: 1 }, &[last, bonus])?;
    let live2 = b.bcast_cols_bool(c.live, 2)?;
    let new_pending = b.g.add(Op::Select, &[live2, new_pending, c.pending])?;
    let new_budget = b.bin(BinaryOp::Sub, c.budget, a1_live)?;
    let new_step = b.bin(BinaryOp::Add, c.step, c.one_b)?;
    let io = b.iota(l + 1)?;
    let tail = b.slice_cols(path_tokens, 1, l)?;
    let shifted = b.g.add(Op::Concat { axis: 1 }, &[tail, bonus])?;
    let a_cols = b.bcast_cols(a, l + 1)?;
    let is_bonus = b.bin(BinaryOp::Eq, io, a_cols)?;
    let bonus_flat = b.reshape(bonus, &[B])?;
    let bonus_cols = b.bcast_cols(bonus_flat, l + 1)?;
    let emit_tokens = b.g.add(Op::Select, &[is_bonus, bonus_cols, shifted])?;
    let new_emitted = emit(b, c, shape.ring, emit_tokens, a1_live, io)?;

    // Cache rows of path depths 1..=a: slot n + path_d → n + d (dead lanes: a1_live = 0).
    let zero_c = b.fill_i32(0, &[B, s(l + 1)])?;
    let below = b.bcast_cols(a1_live, l + 1)?;
    let in_path = b.bin(BinaryOp::Lt, io, below)?;
    let not_root = b.bin(BinaryOp::Lt, zero_c, io)?;
    let in_path = b.g.add(Op::Cast { to: DType::I32 }, &[in_path])?;
    let not_root = b.g.add(Op::Cast { to: DType::I32 }, &[not_root])?;
    let both = b.bin(BinaryOp::Mul, in_path, not_root)?;
    let moved = b.bin(BinaryOp::Lt, zero_c, both)?;
    let src = offset_or_neg(b, c.len, path, moved, l + 1)?;
    let dst = offset_or_neg(b, c.len, io, moved, l + 1)?;
    for (kc, vc) in v.caches {
        b.g.add(Op::KvMove, &[kc, src, dst])?;
        b.g.add(Op::KvMove, &[vc, src, dst])?;
    }

    // The path's taps: the drafter's next context rows.
    let w = *b.g.ty(v.taps).shape.dims().last().expect("taps [B, N, W]");
    let path3 = b.reshape(path, &[B, s(l + 1), s(1)])?;
    let zeros_w = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: i32_ty(&[B, s(l + 1), w]),
        },
        &[],
    )?;
    let path_w = b.g.add(Op::Gather { axis: 2 }, &[path3, zeros_w])?;
    let path_taps = b.g.add(Op::Gather { axis: 1 }, &[v.taps, path_w])?;

    b.g.set_output(ACCEPTED, a);
    b.g.set_output(VERIFY_TOKENS, tokens);
    b.g.set_output(TREE, tree_v);
    Ok(TreeCommit {
        a1,
        path_taps,
        emit_tokens,
        commits: vec![
            (c.len, new_len),
            (c.pending, new_pending),
            (c.budget, new_budget),
            (c.emitted, new_emitted),
            (c.step, new_step),
        ],
    })
}
