//! What the step variants of adaptive speculation share ([`super::SpecMethod::variants`]):
//! the draft sizes, and the plain step of a draft that reads the target's hidden states.
//!
//! A variant runs over exactly the configured step's states, so any step may follow any
//! other. A draft that reads target taps (EAGLE-3's pending pairs, DFlash's pending
//! context) keeps a pending-rows state of `R` = the configured k (or depth) + 1 rows, of
//! which `count` rows at positions `base ..` are not in its caches yet. A variant of
//! smaller k commits its `a + 1 ≤ k' + 1` rows padded to `R` (rows past `count` are never
//! read). Plain decoding (k = 0) cannot drop those rows — their taps exist nowhere else,
//! and the host has tokens, not hidden states, to re-prime from — so it defers them: its
//! step verifies x(n) alone and queues x(n)'s row in a ring of [`CATCH_UP_ROWS`] rows
//! beside the pending rows (one row's scatter per lane: no draft weight is read, no state
//! is rewritten whole), so it costs what plain decoding does. The queue is `count` pending
//! rows then `len − base − count` ring rows, at positions `base .. len − 1`. A separate
//! catch-up graph ([`lower_tap_catch_up`], the contract's
//! [`specc_ir::engine::CatchUp`]) writes all of them into the draft's caches at once —
//! weights read once for every row, as a prefill does — and leaves the pending rows a
//! speculative step expects; the host replays it before the first speculative step after
//! plain steps, and before a plain step that would overflow the ring. The draft's caches
//! then hold exactly what they would had speculation never stopped.

use specc_ir::op::B;
use specc_ir::{BinaryOp, Dim, Graph, IrError, Op, TensorType, ValueId};

use super::step::{
    begin, commit_all, i32_ty, pending_positions, s, verify_and_commit, Builder, Common, Drafted,
    StepShape,
};
use crate::config::ModelSpec;
use crate::error::ModelError;
use crate::spec_config::Acceptance;

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

/// Rows of the queue ring of a tap-reading draft's plain steps, per lane: the most plain
/// steps between two catch-ups ([`specc_ir::engine::CatchUp`]).
pub const CATCH_UP_ROWS: u64 = 32;

/// Names of a tap-reading draft's queue-ring states: the taps `[B, D, 1, W]` and (EAGLE-3)
/// the pair tokens `[B, D, 1, 1]` of the rows its plain steps queued, `D` =
/// [`CATCH_UP_ROWS`].
pub(super) struct RingNames {
    pub hidden: &'static str,
    pub tokens: Option<&'static str>,
}

/// The queue-ring states of [`RingNames`].
struct Ring {
    hidden: ValueId,
    tokens: Option<ValueId>,
}

/// Declares the queue ring beside the pending rows `p` (same dtype and row width).
fn ring_states(b: &mut Builder, names: &RingNames, p: &PendingRows) -> Result<Ring, IrError> {
    let ty = b.g.ty(p.hidden).clone();
    let width = ty.shape.dims()[2];
    let d = s(CATCH_UP_ROWS);
    let hidden =
        b.g.state(names.hidden, TensorType::new(ty.dtype, [B, d, s(1), width]))?;
    let tokens = match names.tokens {
        Some(n) => Some(b.g.state(n, i32_ty(&[B, d, s(1), s(1)]))?),
        None => None,
    };
    Ok(Ring { hidden, tokens })
}

/// `x[B]` clamped to `lo..=hi`.
fn clamp(b: &mut Builder, x: ValueId, lo: i64, hi: i64) -> Result<ValueId, IrError> {
    let lo = b.fill_i32(lo, &[B])?;
    let hi = b.fill_i32(hi, &[B])?;
    let x = b.bin(BinaryOp::Max, x, lo)?;
    b.bin(BinaryOp::Min, x, hi)
}

/// Plain decoding over a tap-reading draft's states (module docs): x(n) verified alone with
/// `taps`, and its row (x(n)'s taps and, where the draft pairs them with tokens, x(n+1))
/// queued at ring row `n − base − count` — the rows queued since the last catch-up, as the
/// pending rows `0..count` hold positions `base ..` — clamped into the ring, not written
/// for a masked lane. Reads no draft weight and leaves the pending rows, `count` and `base`
/// as they are: the host replays the catch-up ([`lower_tap_catch_up`]) before the next
/// speculative step, or before the ring would overflow.
pub(super) fn lower_tap_plain_step(
    name: &str,
    target: &ModelSpec,
    shape: &StepShape,
    taps: &[usize],
    ring: &RingNames,
    states: impl FnOnce(&mut Builder) -> Result<PendingRows, IrError>,
) -> Result<Graph, IrError> {
    let shape = StepShape {
        num_steps: 0,
        ..shape.clone()
    };
    let mut g = Graph::new(name);
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, &shape)?;
    let p = states(&mut b)?;
    let ring = ring_states(&mut b, ring, &p)?;
    let d = Drafted {
        tokens: Vec::new(),
        dists: Vec::new(),
    };
    let v = verify_and_commit(&mut b, &c, target, &shape, d, taps)?;
    let taps_v = v.taps.expect("a tap-reading draft's verify taps");

    let queued = b.bin(BinaryOp::Sub, c.len, p.base)?;
    let queued = b.bin(BinaryOp::Sub, queued, p.count)?;
    let slot = clamp(&mut b, queued, 0, CATCH_UP_ROWS as i64 - 1)?;
    let none = b.fill_i32(-1, &[B])?;
    let slot = b.g.add(Op::Select, &[c.live, slot, none])?;
    let slot = b.reshape(slot, &[B, s(1)])?;
    let width = b.g.ty(taps_v).shape.dims()[2];
    let row = b.reshape(taps_v, &[B, s(1), s(1), width])?;
    b.g.add(Op::KvWrite, &[ring.hidden, row, slot])?;
    if let Some(t) = ring.tokens {
        let token = b.reshape(v.emit_tokens, &[B, s(1), s(1), s(1)])?;
        b.g.add(Op::KvWrite, &[t, token, slot])?;
    }
    commit_all(&mut b, &v.commits)?;
    Ok(g)
}

/// The catch-up of a tap-reading draft ([`specc_ir::engine::CatchUp`]): the queued rows —
/// pending rows `0..count`, then ring rows `0..len − base − count` — at positions
/// `base .. len − 1` go into the draft's caches in one pass (`write` gets them, `[B, N]`
/// rows with N = R + [`CATCH_UP_ROWS`], and their positions, −1 where there is none; it
/// returns the values computed only for codegen's fused q/k/v pattern, kept alive as
/// outputs `draft_q.{i}`). With `keep_last` (EAGLE-3: a speculative step's catch-up needs
/// the head's output at its last pending pair) the last queued row is not written but left
/// pending alone (`count = 1`, `base = len − 1`); otherwise nothing stays pending
/// (`count = 0`, `base = len`). Every index is clamped: a ring overrun (the host replays
/// this graph before one can happen) loses draft rows, never a buffer bound.
pub(super) fn lower_tap_catch_up(
    name: &str,
    shape: &StepShape,
    ring: &RingNames,
    keep_last: bool,
    states: impl FnOnce(&mut Builder) -> Result<PendingRows, IrError>,
    write: impl FnOnce(&mut Builder, &PendingRows, ValueId) -> Result<Vec<ValueId>, IrError>,
) -> Result<Graph, IrError> {
    // Reads no draw: the same graph serves greedy and sampled engines.
    let shape = StepShape {
        num_steps: 0,
        acceptance: Acceptance::Greedy,
        ..shape.clone()
    };
    let mut g = Graph::new(name);
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, &shape)?;
    let p = states(&mut b)?;
    let ring = ring_states(&mut b, ring, &p)?;
    let r = p.rows(&b);
    let n = r + CATCH_UP_ROWS;
    let width = b.g.ty(p.hidden).shape.dims()[2];

    // Queue row j: pending row j below count, else ring row j − count (index R + j − count
    // of the two concatenated), at most the last.
    let count = clamp(&mut b, p.count, 0, r as i64)?;
    let io = b.iota(n)?;
    let cnt = b.bcast_cols(count, n)?;
    let pending = b.bin(BinaryOp::Lt, io, cnt)?;
    let rows_c = b.fill_i32(r as i64, &[B, s(n)])?;
    let shift = b.bin(BinaryOp::Sub, rows_c, cnt)?;
    let from_ring = b.bin(BinaryOp::Add, io, shift)?;
    let idx = b.g.add(Op::Select, &[pending, io, from_ring])?;
    let last_c = b.fill_i32(n as i64 - 1, &[B, s(n)])?;
    let idx = b.bin(BinaryOp::Min, idx, last_c)?;
    let ring_h = b.reshape(ring.hidden, &[B, s(CATCH_UP_ROWS), width])?;
    let all_h = b.g.add(Op::Concat { axis: 1 }, &[p.hidden, ring_h])?;
    let idx3 = b.reshape(idx, &[B, s(n), s(1)])?;
    let idx3 = bcast_last(&mut b, idx3, width)?;
    let hidden = b.g.add(Op::Gather { axis: 1 }, &[all_h, idx3])?;
    let tokens = match (p.tokens, ring.tokens) {
        (Some(t), Some(rt)) => {
            let rt = b.reshape(rt, &[B, s(CATCH_UP_ROWS)])?;
            let all_t = b.g.add(Op::Concat { axis: 1 }, &[t, rt])?;
            Some(b.g.add(Op::Gather { axis: 1 }, &[all_t, idx])?)
        }
        _ => None,
    };

    // len − base rows are queued (at most what the two hold).
    let queued = b.bin(BinaryOp::Sub, c.len, p.base)?;
    let most = b.fill_i32(CATCH_UP_ROWS as i64, &[B])?;
    let most = b.bin(BinaryOp::Add, count, most)?;
    let queued = b.bin(BinaryOp::Min, queued, most)?;
    let queued = b.bin(BinaryOp::Max, queued, c.zero_b)?;
    let written = match keep_last {
        true => {
            let w = b.bin(BinaryOp::Sub, queued, c.one_b)?;
            b.bin(BinaryOp::Max, w, c.zero_b)?
        }
        false => queued,
    };
    let pos = pending_positions(&mut b, &c, p.base, written, n)?;
    let rows = PendingRows {
        hidden,
        tokens,
        count: written,
        base: p.base,
    };
    let keep = write(&mut b, &rows, pos)?;
    for (i, q) in keep.into_iter().enumerate() {
        b.g.set_output(&format!("draft_q.{i}"), q);
    }

    let mut commits = Vec::new();
    if keep_last {
        // Row `written` (the last queued) becomes pending row 0.
        let at = b.reshape(written, &[B, s(1), s(1)])?;
        let at = bcast_last(&mut b, at, width)?;
        let row = b.g.add(Op::Gather { axis: 1 }, &[hidden, at])?;
        commits.push((p.hidden, pad_rows(&mut b, row, r)?));
        if let (Some(state), Some(t)) = (p.tokens, tokens) {
            let token = b.pick(t, written)?;
            commits.push((state, pad_rows(&mut b, token, r)?));
        }
    }
    let left = b.bin(BinaryOp::Sub, queued, written)?;
    let base = b.bin(BinaryOp::Add, p.base, written)?;
    commits.extend([(p.count, left), (p.base, base)]);
    commit_all(&mut b, &commits)?;
    Ok(g)
}

/// `idx[B, r, 1]` repeated along its last axis to `width` (gather indices of whole rows).
fn bcast_last(b: &mut Builder, idx: ValueId, width: Dim) -> Result<ValueId, IrError> {
    let mut dims = b.g.ty(idx).shape.dims().to_vec();
    *dims.last_mut().expect("rank ≥ 1") = width;
    let zeros = b.fill_i32(0, &dims)?;
    b.g.add(Op::Gather { axis: 2 }, &[idx, zeros])
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
