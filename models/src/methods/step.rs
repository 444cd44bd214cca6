//! The step skeleton every method shares (DESIGN.md §3): one graph per batch bucket holds
//! the whole step — drafting (the method's own), verify of the drafted tokens in one target
//! forward, acceptance, commit and emit, all on device. The graph reads no host input:
//! everything it needs is in states.
//!
//! States (B = the bucket's sequences; R = ring capacity; all i32):
//! - `spec.len[B]`: n, tokens committed to the target KV cache (slots `0..n`);
//! - `spec.pending[B,2]`: `[x(n-1), x(n)]`, the last committed token and the bonus token
//!   x(n), which is decided but not yet in any cache;
//! - `spec.budget[B]`: tokens the sequence may still emit; a lane with budget ≤ 0 is
//!   finished and masked (positions −1: it writes no cache slot and commits nothing);
//! - `spec.ring[B,R,1,1]` and `spec.emitted[B]`: every emitted token, token number `e`
//!   at ring slot `e mod R`; `emitted` counts them (the host reads both asynchronously);
//! - `spec.step[B]`: steps taken (the RNG counter of sampled acceptance);
//! - under sampled acceptance, `spec.stream[B]` (each lane's RNG stream) and the f32
//!   `spec.sampling[B,3]` (each lane's temperature, top-k and top-p; temperature 0 is greedy
//!   for that lane), which admission writes before the prefill;
//! - the target's KV caches `kv.{l}.{k,v}`, and the draft's own states under its prefix.
//!
//! Cache slots past a sequence's length may hold stale values: attention reads slots
//! `0..=pos` only, so they are never seen, and the next step overwrites them.
//!
//! Host contract: admit a lane by prefilling target and draft with the prompt, then set
//! `len = P`, `pending = [x(P-1), x(P)]` (x(P) = the target's token after the prompt:
//! the prefill's argmax, or under sampled acceptance its draw [`FIRST_TOKEN`]),
//! `budget = min(max_new, Ctx - P - k - 2)` and `emitted = 0`. Then
//! `len + k + 1 < Ctx` whenever `budget > 0`, so no position leaves the cache; kernels
//! clamp positions anyway.

use specc_ir::engine::Phase;
use specc_ir::op::B;
use specc_ir::{BinaryOp, DType, Dim, Graph, IrError, Op, ReduceOp, Shape, TensorType, ValueId};

use super::sampling::{
    b_vocab, first_token, probs, rng_counters, sample_accept, uniforms, FIRST_TOKEN,
};
use crate::config::ModelSpec;
use crate::lower::{decoder_layer, embed, lm_head, LayerNames};
use crate::spec_config::Acceptance;

pub const LEN: &str = "spec.len";
pub const PENDING: &str = "spec.pending";
pub const BUDGET: &str = "spec.budget";
pub const RING: &str = "spec.ring";
pub const EMITTED: &str = "spec.emitted";
pub const STEP: &str = "spec.step";
/// Per lane, the stream its draws take from the counter-based RNG (i32 `[B]`, below 2^20;
/// sampled acceptance only): admission sets it, to the lane's index unless the host asks for
/// another (a server keys it by a request's seed, so the request's draws do not depend on
/// its lane).
pub const STREAM: &str = "spec.stream";
/// Outputs of the step graph (for tests and tracing; the host needs only states).
pub const ACCEPTED: &str = "accepted";
pub const VERIFY_TOKENS: &str = "verify_tokens";

/// Shape knobs of one step graph.
#[derive(Clone, Debug, PartialEq)]
pub struct StepShape {
    /// k, draft tokens per step.
    pub num_steps: u64,
    /// Ring capacity per sequence, in tokens.
    pub ring: u64,
    pub acceptance: Acceptance,
}

pub(super) fn i32_ty(dims: &[Dim]) -> TensorType {
    TensorType::new(DType::I32, dims.iter().copied())
}

pub(super) fn s(n: u64) -> Dim {
    Dim::Static(n)
}

pub(super) struct Builder<'a> {
    pub(super) g: &'a mut Graph,
}

impl Builder<'_> {
    pub(super) fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> Result<ValueId, IrError> {
        self.g.add(Op::Binary(op), &[a, b])
    }

    pub(super) fn fill_i32(&mut self, value: i64, dims: &[Dim]) -> Result<ValueId, IrError> {
        self.g.add(
            Op::Fill {
                value: value as f64,
                ty: i32_ty(dims),
            },
            &[],
        )
    }

    pub(super) fn iota(&mut self, cols: u64) -> Result<ValueId, IrError> {
        self.g.add(
            Op::Iota {
                axis: 1,
                ty: i32_ty(&[B, s(cols)]),
            },
            &[],
        )
    }

    pub(super) fn reshape(&mut self, x: ValueId, dims: &[Dim]) -> Result<ValueId, IrError> {
        self.g.add(
            Op::Reshape {
                shape: Shape::new(dims.iter().copied()),
            },
            &[x],
        )
    }

    /// `v[B]` repeated into `[B, cols]` (a gather with zero indices).
    pub(super) fn bcast_cols(&mut self, v: ValueId, cols: u64) -> Result<ValueId, IrError> {
        let v2 = self.reshape(v, &[B, s(1)])?;
        let zeros = self.fill_i32(0, &[B, s(cols)])?;
        self.g.add(Op::Gather { axis: 1 }, &[v2, zeros])
    }

    /// Column `idx[b]` of `x[B, n]`, as `[B, 1]`.
    pub(super) fn pick(&mut self, x: ValueId, idx: ValueId) -> Result<ValueId, IrError> {
        let i2 = self.reshape(idx, &[B, s(1)])?;
        self.g.add(Op::Gather { axis: 1 }, &[x, i2])
    }

    pub(super) fn slice_cols(
        &mut self,
        x: ValueId,
        start: u64,
        len: u64,
    ) -> Result<ValueId, IrError> {
        self.g.add(
            Op::Slice {
                axis: 1,
                start,
                len,
            },
            &[x],
        )
    }

    /// `start[B] + [0, 1, .., cols-1]`, or −1 where `live` is false.
    pub(super) fn positions(
        &mut self,
        start: ValueId,
        cols: u64,
        live: ValueId,
    ) -> Result<ValueId, IrError> {
        let st = self.bcast_cols(start, cols)?;
        let io = self.iota(cols)?;
        let pos = self.bin(BinaryOp::Add, st, io)?;
        let neg = self.fill_i32(-1, &[B, s(cols)])?;
        let live2 = self.bcast_cols_bool(live, cols)?;
        self.g.add(Op::Select, &[live2, pos, neg])
    }

    pub(super) fn bcast_cols_bool(&mut self, live: ValueId, cols: u64) -> Result<ValueId, IrError> {
        let as_int = self.g.add(Op::Cast { to: DType::I32 }, &[live])?;
        let b = self.bcast_cols(as_int, cols)?;
        let zero = self.fill_i32(0, &[B, s(cols)])?;
        let lt = self.bin(BinaryOp::Lt, zero, b)?;
        Ok(lt)
    }
}

/// A whole model forward over `tokens[B, t]` at `positions[B, t]`, under a name prefix
/// (`""` for the target, a draft's prefix for a standalone draft). Returns f32 logits `[B, t, V]`
/// and the outputs of the decoder layers listed in `taps`, concatenated on the last axis.
pub fn forward_with_taps(
    g: &mut Graph,
    spec: &ModelSpec,
    prefix: &str,
    tokens: ValueId,
    positions: ValueId,
    taps: &[usize],
) -> Result<(ValueId, Option<ValueId>), IrError> {
    let (x, table, taps_v) = forward_hidden(g, spec, prefix, tokens, positions, taps)?;
    Ok((lm_head(g, spec, prefix, x, table)?, taps_v))
}

/// [`forward_with_taps`] up to the last decoder layer: its output `[B, t, H]` (before the
/// final norm), the embedding table (the LM head of tied embeddings) and the taps.
fn forward_hidden(
    g: &mut Graph,
    spec: &ModelSpec,
    prefix: &str,
    tokens: ValueId,
    positions: ValueId,
    taps: &[usize],
) -> Result<(ValueId, ValueId, Option<ValueId>), IrError> {
    let (mut x, table) = embed(g, spec, prefix, tokens)?;
    let mut tapped = vec![None; taps.len()];
    for layer in 0..spec.layers {
        x = decoder_layer(g, spec, &LayerNames::of(spec, prefix, layer), x, positions)?;
        for (i, &t) in taps.iter().enumerate() {
            if t == layer {
                tapped[i] = Some(x);
            }
        }
    }
    let taps_v = if taps.is_empty() {
        None
    } else {
        let vals: Vec<ValueId> = tapped
            .into_iter()
            .map(|t| t.expect("tap layers are < layers"))
            .collect();
        Some(g.add(Op::Concat { axis: 2 }, &vals)?)
    };
    Ok((x, table, taps_v))
}

/// Each lane's last prompt row of `x[B, T, W]`, as `[B, 1, W]`. A prefill chunk holds a
/// lane's tokens in rows `0..n` and padding (position −1) after them, so the last row is
/// `n − 1` with `n` the count of positions ≥ 0, whatever position the chunk starts at; a
/// lane of padding only reads row 0 (its outputs are meaningless, the index stays in range).
fn last_rows(b: &mut Builder, x: ValueId, positions: ValueId) -> Result<ValueId, IrError> {
    let t = specc_ir::op::T;
    let width = b.g.ty(x).shape.dims()[2];
    let padding = b.fill_i32(-1, &[B, t])?;
    let real = b.bin(BinaryOp::Lt, padding, positions)?;
    let real = b.g.add(Op::Cast { to: DType::I32 }, &[real])?;
    let n = b.g.add(Op::Reduce(ReduceOp::Sum), &[real])?;
    let one = b.fill_i32(1, &[B])?;
    let zero = b.fill_i32(0, &[B])?;
    let row = b.bin(BinaryOp::Sub, n, one)?;
    let row = b.bin(BinaryOp::Max, row, zero)?;
    let row = b.reshape(row, &[B, s(1), s(1)])?;
    let zeros = b.fill_i32(0, &[B, s(1), width])?;
    let rows = b.g.add(Op::Gather { axis: 2 }, &[row, zeros])?;
    b.g.add(Op::Gather { axis: 1 }, &[x, rows])
}

/// [`forward_with_taps`] without taps.
pub fn forward(
    g: &mut Graph,
    spec: &ModelSpec,
    prefix: &str,
    tokens: ValueId,
    positions: ValueId,
) -> Result<ValueId, IrError> {
    Ok(forward_with_taps(g, spec, prefix, tokens, positions, &[])?.0)
}

/// The per-sequence step states every method shares, read at the step's start.
pub(super) struct Common {
    pub(super) len: ValueId,
    pub(super) pending: ValueId,
    pub(super) budget: ValueId,
    pub(super) emitted: ValueId,
    pub(super) step: ValueId,
    pub(super) live: ValueId,
    pub(super) zero_b: ValueId,
    pub(super) one_b: ValueId,
    /// Uniforms `[B, 2k+1]` under sampled acceptance: columns 0..k accept/reject, k the
    /// bonus, k+1.. the draft's own draws.
    pub(super) uniforms: Option<ValueId>,
    /// The lanes' RNG streams ([`STREAM`]) under sampled acceptance.
    pub(super) stream: Option<ValueId>,
}

pub(super) fn begin(b: &mut Builder, shape: &StepShape) -> Result<Common, IrError> {
    let k = shape.num_steps;
    let vec_b = i32_ty(&[B]);
    let len = b.g.state(LEN, vec_b.clone())?;
    let pending = b.g.state(PENDING, i32_ty(&[B, s(2)]))?;
    let budget = b.g.state(BUDGET, vec_b.clone())?;
    let emitted = b.g.state(EMITTED, vec_b.clone())?;
    let step = b.g.state(STEP, vec_b)?;
    let zero_b = b.fill_i32(0, &[B])?;
    let one_b = b.fill_i32(1, &[B])?;
    let live = b.bin(BinaryOp::Lt, zero_b, budget)?;
    let (uniforms, stream) = match &shape.acceptance {
        Acceptance::Greedy => (None, None),
        Acceptance::Sample { seed, .. } => {
            let stream = b.g.state(STREAM, i32_ty(&[B]))?;
            let counters = rng_counters(b, step, stream, 2 * k + 1)?;
            (Some(uniforms(b, counters, *seed)?), Some(stream))
        }
    };
    Ok(Common {
        len,
        pending,
        budget,
        emitted,
        step,
        live,
        zero_b,
        one_b,
        uniforms,
        stream,
    })
}

/// What the drafting phase hands to verification.
pub(super) struct Drafted {
    /// k tokens `[B, 1]` each, in target ids.
    pub(super) tokens: Vec<ValueId>,
    /// The distribution each token was drawn from, `[B, 1, V]` each (sampled acceptance).
    pub(super) dists: Vec<ValueId>,
}

/// What verification leaves for method-specific commits.
pub(super) struct Verified {
    pub(super) accepted: ValueId,
    pub(super) emit_tokens: ValueId,
    pub(super) taps: Option<ValueId>,
    /// (state, new value) pairs, applied by [`commit_all`].
    pub(super) commits: Vec<(ValueId, ValueId)>,
}

/// Verify, accept, commit and emit: the method-independent second half of a step.
pub(super) fn verify_and_commit(
    b: &mut Builder,
    c: &Common,
    target: &ModelSpec,
    shape: &StepShape,
    drafted: Drafted,
    taps: &[usize],
) -> Result<Verified, IrError> {
    let k = shape.num_steps;
    // verify: x(n), d1..dk at n..n+k in one target forward.
    let bonus_in = b.slice_cols(c.pending, 1, 1)?;
    let mut vt = vec![bonus_in];
    vt.extend(drafted.tokens.iter().copied());
    let verify_tokens = b.g.add(Op::Concat { axis: 1 }, &vt)?;
    let vpos = b.positions(c.len, k + 1, c.live)?;
    let (target_logits, taps_v) = b.g.with_phase(Phase::Target, |g| {
        forward_with_taps(g, target, "", verify_tokens, vpos, taps)
    })?;

    // accept: a in 0..=k, and the token after the accepted prefix.
    let (accepted, bonus) = match (&shape.acceptance, c.uniforms) {
        // k = 0: plain decoding; the "bonus" is the next token itself.
        _ if k == 0 => {
            let bonus = match (&shape.acceptance, c.uniforms) {
                (Acceptance::Sample { .. }, Some(u)) => {
                    let p = probs(b, target_logits)?;
                    let p = b.reshape(p, &[B, b_vocab(b.g, p)])?;
                    let u0 = b.slice_cols(u, 0, 1)?;
                    let u0 = b.reshape(u0, &[B])?;
                    let t = b.g.add(Op::Sample, &[p, u0])?;
                    b.reshape(t, &[B, s(1)])?
                }
                _ => b.g.add(Op::Argmax, &[target_logits])?,
            };
            (c.zero_b, bonus)
        }
        (Acceptance::Sample { .. }, Some(u)) => {
            let draft_tokens = b.g.add(Op::Concat { axis: 1 }, &drafted.tokens)?;
            let q = b.g.add(Op::Concat { axis: 1 }, &drafted.dists)?;
            let p = probs(b, target_logits)?;
            sample_accept(b, p, q, draft_tokens, u, k)?
        }
        _ => {
            let draft_tokens = b.g.add(Op::Concat { axis: 1 }, &drafted.tokens)?;
            let target_next = b.g.add(Op::Argmax, &[target_logits])?;
            let a = b.g.add(Op::AcceptChain, &[draft_tokens, target_next])?;
            let bonus = b.pick(target_next, a)?;
            (a, bonus)
        }
    };
    let a = b.g.add(Op::Select, &[c.live, accepted, c.zero_b])?;

    // commit: len += a + 1, pending = [token at n + a, bonus], budget -= a + 1.
    let a1 = b.bin(BinaryOp::Add, a, c.one_b)?;
    let a1_live = b.g.add(Op::Select, &[c.live, a1, c.zero_b])?;
    let new_len = b.bin(BinaryOp::Add, c.len, a1_live)?;
    let last = b.pick(verify_tokens, a)?;
    let new_pending = b.g.add(Op::Concat { axis: 1 }, &[last, bonus])?;
    let live2 = b.bcast_cols_bool(c.live, 2)?;
    let new_pending = b.g.add(Op::Select, &[live2, new_pending, c.pending])?;
    let new_budget = b.bin(BinaryOp::Sub, c.budget, a1_live)?;
    let new_step = b.bin(BinaryOp::Add, c.step, c.one_b)?;

    // emit d1..da and the bonus into the ring at (emitted + t) mod R, t ≤ a.
    let io = b.iota(k + 1)?;
    let emit_tokens = if k == 0 {
        bonus
    } else {
        let tail = b.slice_cols(verify_tokens, 1, k)?;
        let shifted = b.g.add(Op::Concat { axis: 1 }, &[tail, bonus])?;
        let a_cols = b.bcast_cols(a, k + 1)?;
        let is_bonus = b.bin(BinaryOp::Eq, io, a_cols)?;
        let bonus_flat = b.reshape(bonus, &[B])?;
        let bonus_cols = b.bcast_cols(bonus_flat, k + 1)?;
        b.g.add(Op::Select, &[is_bonus, bonus_cols, shifted])?
    };
    let new_emitted = emit(b, c, shape.ring, emit_tokens, a1_live, io)?;

    let commits = vec![
        (c.len, new_len),
        (c.pending, new_pending),
        (c.budget, new_budget),
        (c.emitted, new_emitted),
        (c.step, new_step),
    ];
    b.g.set_output(ACCEPTED, a);
    b.g.set_output(VERIFY_TOKENS, verify_tokens);
    Ok(Verified {
        accepted: a,
        emit_tokens,
        taps: taps_v,
        commits,
    })
}

/// Writes the first `n_emit[b]` of `tokens[B, cols]` into the ring at `(emitted + t) mod R`
/// (`io` = `b.iota(cols)`); returns the new `emitted`.
pub(super) fn emit(
    b: &mut Builder,
    c: &Common,
    ring_len: u64,
    tokens: ValueId,
    n_emit: ValueId,
    io: ValueId,
) -> Result<ValueId, IrError> {
    let cols = b.g.ty(tokens).shape.dims()[1]
        .as_static()
        .expect("a static number of emitted columns");
    let base = b.bcast_cols(c.emitted, cols)?;
    let e = b.bin(BinaryOp::Add, base, io)?;
    let r = b.fill_i32(ring_len as i64, &[B, s(cols)])?;
    let slot = b.bin(BinaryOp::Rem, e, r)?;
    let n_cols = b.bcast_cols(n_emit, cols)?;
    let keep = b.bin(BinaryOp::Lt, io, n_cols)?;
    let neg = b.fill_i32(-1, &[B, s(cols)])?;
    let ring_pos = b.g.add(Op::Select, &[keep, slot, neg])?;
    let ring = b.g.state(RING, i32_ty(&[B, s(ring_len), s(1), s(1)]))?;
    let rows = b.reshape(tokens, &[B, s(cols), s(1), s(1)])?;
    b.g.add(Op::KvWrite, &[ring, rows, ring_pos])?;
    b.bin(BinaryOp::Add, c.emitted, n_emit)
}

/// Positions of pending rows: `base[b] + [0, .., cols-1]` where the column is `< count[b]`
/// and the lane is live, else −1.
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

/// Overwrites each state with its new value. Every assign comes after every read of the
/// old values (the verifier's in-place rule), so all commits of a step go through here
/// once, last.
pub(super) fn commit_all(b: &mut Builder, commits: &[(ValueId, ValueId)]) -> Result<(), IrError> {
    for &(state, value) in commits {
        b.g.add(Op::Assign, &[state, value])?;
    }
    Ok(())
}

/// Input of a draft prefill that reads the target prefill's `taps` (EAGLE-3, DFlash).
pub const HIDDEN: &str = "hidden";

/// The target's prefill (bucket `T`) as admission needs it: the final norm, LM head and
/// token choice run on each lane's last prompt row only ([`last_rows`]), so the logits
/// never take `B·T·V` floats. Outputs: `next_token` `[B, 1]` (the argmax after each lane's
/// prompt), under sampled acceptance [`FIRST_TOKEN`] (each lane's first generated token,
/// drawn) and, when `taps` is not empty, `taps` `[B, T, n_tap·H]` (the tapped layers'
/// outputs at every row, for a draft that reads them). Every row's logits are
/// [`crate::lower::lower_dense`]'s (`specc logits`).
pub fn lower_target_prefill(
    target: &ModelSpec,
    taps: &[usize],
    acceptance: &Acceptance,
) -> Result<Graph, IrError> {
    let mut g = Graph::new("target_prefill");
    let ids = TensorType::new(DType::I32, [B, specc_ir::op::T]);
    let tokens = g.input("tokens", ids.clone())?;
    let positions = g.input("positions", ids)?;
    let (hidden, table, taps_v) = g.with_phase(Phase::Target, |g| {
        forward_hidden(g, target, "", tokens, positions, taps)
    })?;
    let last = last_rows(&mut Builder { g: &mut g }, hidden, positions)?;
    let logits = g.with_phase(Phase::Target, |g| lm_head(g, target, "", last, table))?;
    let next = g.add(Op::Argmax, &[logits])?;
    g.set_output("next_token", next);
    if let Acceptance::Sample { .. } = acceptance {
        let first = first_token(&mut Builder { g: &mut g }, logits, acceptance)?;
        g.set_output(FIRST_TOKEN, first);
    }
    if let Some(t) = taps_v {
        g.set_output("taps", t);
    }
    Ok(g)
}
