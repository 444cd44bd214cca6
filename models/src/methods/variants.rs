//! What the step variants of adaptive speculation share ([`super::SpecMethod::variants`]):
//! the draft sizes, and the plain step of a draft that reads the target's hidden states.
//!
//! A variant runs over exactly the configured step's states, so any step may follow any
//! other. A draft that reads target taps (EAGLE-3's pending pairs, DFlash's pending
//! context) keeps a pending-rows state of `R` = the configured k (or depth) + 1 rows, of
//! which `count` rows at positions `base ..` are not in its caches yet. A variant of
//! smaller k commits its `a + 1 ≤ k' + 1` rows padded to `R` (rows past `count` are never
//! read). Plain decoding (k = 0) cannot drop those rows — their taps exist nowhere else,
//! and the host has tokens, not hidden states, to re-prime from — so its step treats them
//! as a queue: it writes the first pending row into the draft's caches exactly as a
//! speculative step's catch-up does (the draft's q/k/v projections only: no draft token is
//! proposed), verifies x(n) alone with the taps and appends its row. The draft stays whole
//! across plain steps (the next speculative step catches up what is still queued), at the
//! cost of one row's projections per lane (for EAGLE-3 `fc` and the head's q/k/v, for
//! DFlash `fc` and every drafter layer's q/k/v: at the 8B shape 1.3 % and 2.8 % of the
//! target's weight bytes).

use specc_ir::op::B;
use specc_ir::{BinaryOp, DType, Dim, Graph, IrError, Op, TensorType, ValueId};

use super::step::{
    begin, commit_all, pending_positions, s, verify_and_commit, Builder, Common, Drafted, StepShape,
};
use crate::config::ModelSpec;
use crate::error::ModelError;

/// Draft sizes of the variants besides the configured `k`, ascending: plain decoding, one
/// token, and about half of `k` (a few graphs cover the range where the best k moves with
/// load and acceptance).
pub fn variant_ks(k: u64) -> Vec<u64> {
    let mut ks: Vec<u64> = [0, 1, k.div_ceil(2)]
        .into_iter()
        .filter(|&j| j < k)
        .collect();
    ks.dedup();
    ks
}

/// The step at each of `ks`, lowered by `lower(k, shape at k)`; errors name `what`.
pub(super) fn lower_variants(
    shape: &StepShape,
    what: &str,
    ks: &[u64],
    lower: impl Fn(u64, &StepShape) -> Result<Graph, IrError>,
) -> Result<Vec<(u64, Graph)>, ModelError> {
    ks.iter()
        .map(|&k| {
            let at = StepShape {
                num_steps: k,
                ..shape.clone()
            };
            lower(k, &at)
                .map(|g| (k, g))
                .map_err(|e| super::lower_err(what, e))
        })
        .collect()
}

/// A tap-reading draft's pending rows as one step reads them.
pub(super) struct PendingRows {
    /// Target taps `[B, R, W]`.
    pub hidden: ValueId,
    /// EAGLE-3's pair tokens `[B, R]` (none for DFlash).
    pub tokens: Option<ValueId>,
    pub count: ValueId,
    pub base: ValueId,
}

impl PendingRows {
    /// `R`: the rows the state holds.
    fn rows(&self, b: &Builder) -> u64 {
        b.g.ty(self.hidden).shape.dims()[1]
            .as_static()
            .expect("pending rows are static")
    }

    /// The commits that leave a step's `a1 = a + 1` verified rows (`taps` `[B, r, W]`,
    /// `tokens` `[B, r]`, `r ≤ R`) pending at `base = n`.
    pub(super) fn commits(
        &self,
        b: &mut Builder,
        c: &Common,
        taps: ValueId,
        tokens: Option<ValueId>,
        a1: ValueId,
    ) -> Result<Vec<(ValueId, ValueId)>, IrError> {
        let rows = self.rows(b);
        let mut out = vec![(self.hidden, pad_rows(b, taps, rows)?)];
        if let (Some(state), Some(t)) = (self.tokens, tokens) {
            out.push((state, pad_rows(b, t, rows)?));
        }
        out.extend([(self.count, a1), (self.base, c.len)]);
        Ok(out)
    }
}

/// `x` `[B, r, ..]` padded with zeros along axis 1 to `rows` (`r ≤ rows`).
pub(super) fn pad_rows(b: &mut Builder, x: ValueId, rows: u64) -> Result<ValueId, IrError> {
    let ty = b.g.ty(x).clone();
    let r = ty.shape.dims()[1].as_static().expect("static rows");
    if r == rows {
        return Ok(x);
    }
    assert!(r < rows, "a variant commits at most the configured rows");
    let mut dims: Vec<Dim> = ty.shape.dims().to_vec();
    dims[1] = s(rows - r);
    let zeros = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: TensorType::new(ty.dtype, dims),
        },
        &[],
    )?;
    b.g.add(Op::Concat { axis: 1 }, &[x, zeros])
}

/// Plain decoding over a tap-reading draft's states (module docs). The pending rows are a
/// queue: rows `0..count` hold positions `base .. len − 1` (`base + count = len`). The step
/// writes the first pending row into the draft's caches (`write` gets that row's states and
/// its positions `[B, 1]`, −1 where there is none, and returns the values computed only for
/// codegen's fused q/k/v pattern, kept alive as outputs `draft_q.{i}`), verifies x(n) alone
/// with `taps`, and appends x(n)'s row: `count' = max(count, 1)`, `base' = n + 1 − count'`.
/// One row a step, whatever `R`, so a plain stretch costs the draft one row per lane; the
/// next speculative step catches up the rest.
pub(super) fn lower_tap_plain_step(
    name: &str,
    target: &ModelSpec,
    shape: &StepShape,
    taps: &[usize],
    states: impl FnOnce(&mut Builder) -> Result<PendingRows, IrError>,
    write: impl FnOnce(&mut Builder, &PendingRows, ValueId) -> Result<Vec<ValueId>, IrError>,
) -> Result<Graph, IrError> {
    let shape = StepShape {
        num_steps: 0,
        ..shape.clone()
    };
    let mut g = Graph::new(name);
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, &shape)?;
    let p = states(&mut b)?;
    let rows = p.rows(&b);
    let first_count = b.bin(BinaryOp::Min, p.count, c.one_b)?;
    let first = PendingRows {
        hidden: b.slice_cols(p.hidden, 0, 1)?,
        tokens: match p.tokens {
            Some(t) => Some(b.slice_cols(t, 0, 1)?),
            None => None,
        },
        count: first_count,
        base: p.base,
    };
    let pos = pending_positions(&mut b, &c, p.base, first_count, 1)?;
    let keep = write(&mut b, &first, pos)?;
    for (i, q) in keep.into_iter().enumerate() {
        b.g.set_output(&format!("draft_q.{i}"), q);
    }
    let d = Drafted {
        tokens: Vec::new(),
        dists: Vec::new(),
    };
    let v = verify_and_commit(&mut b, &c, target, &shape, d, taps)?;
    let taps_v = v.taps.expect("a tap-reading draft's verify taps");

    // The queue: rows 1..count move down one, x(n)'s row goes at count' − 1.
    let count = b.bin(BinaryOp::Max, p.count, c.one_b)?;
    let last = b.bin(BinaryOp::Sub, count, c.one_b)?;
    let base = b.bin(BinaryOp::Sub, c.len, last)?;
    let io = b.iota(rows)?;
    let last_cols = b.bcast_cols(last, rows)?;
    let moved = b.bin(BinaryOp::Lt, io, last_cols)?;
    let width = b.g.ty(p.hidden).shape.dims()[2];
    let moved3 = widen_bool(&mut b, moved, rows, width)?;
    let zeros = b.fill_i32(0, &[B, s(rows), width])?;
    let appended = b.g.add(Op::Gather { axis: 1 }, &[taps_v, zeros])?;
    let shifted = shift_down(&mut b, p.hidden, rows)?;
    let hidden = b.g.add(Op::Select, &[moved3, shifted, appended])?;
    let mut commits = vec![(p.hidden, hidden)];
    if let Some(t) = p.tokens {
        let bonus = b.reshape(v.emit_tokens, &[B])?;
        let appended = b.bcast_cols(bonus, rows)?;
        let shifted = shift_down(&mut b, t, rows)?;
        commits.push((t, b.g.add(Op::Select, &[moved, shifted, appended])?));
    }
    commits.extend([(p.count, count), (p.base, base)]);
    commits.extend(v.commits);
    commit_all(&mut b, &commits)?;
    Ok(g)
}

/// Rows `1..rows` of `x` `[B, rows, ..]` moved to `0..rows−1` (the last row repeated).
fn shift_down(b: &mut Builder, x: ValueId, rows: u64) -> Result<ValueId, IrError> {
    let tail = b.slice_cols(x, 1, rows - 1)?;
    let end = b.slice_cols(x, rows - 1, 1)?;
    b.g.add(Op::Concat { axis: 1 }, &[tail, end])
}

/// A bool `[B, rows]` repeated along a new last axis of `width`.
fn widen_bool(b: &mut Builder, m: ValueId, rows: u64, width: Dim) -> Result<ValueId, IrError> {
    let m = b.g.add(Op::Cast { to: DType::I32 }, &[m])?;
    let m = b.reshape(m, &[B, s(rows), s(1)])?;
    let zeros = b.fill_i32(0, &[B, s(rows), width])?;
    let wide = b.g.add(Op::Gather { axis: 2 }, &[m, zeros])?;
    b.g.add(Op::Binary(BinaryOp::Lt), &[zeros, wide])
}

/// Nodes of a draft tree of `depth` levels with `topk` candidates per node: `1 + Σ topk^d`,
/// saturated.
pub(super) fn tree_nodes(depth: u64, topk: u64) -> u64 {
    (1..=depth).fold(1u64, |n, d| n.saturating_add(topk.saturating_pow(d as u32)))
}

/// The budget of a smaller tree variant of `depth` levels, for a configured tree of `budget`
/// nodes over `full_depth` levels: the budget scaled with the depth, no more than the nodes
/// such a tree has (`nodes`), at least the root and one node.
pub(super) fn scaled_budget(budget: u64, depth: u64, full_depth: u64, nodes: u64) -> u64 {
    (budget * depth).div_ceil(full_depth).min(nodes).max(2)
}
