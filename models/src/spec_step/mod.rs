//! The whole speculative step as ONE graph per batch bucket (DESIGN.md §3): k draft steps
//! unrolled, verify of k + 1 tokens in one target forward, acceptance, commit and emit, all
//! on device. The graph reads no host input: everything it needs is in states.
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
//! - the target's KV caches `kv.{l}.{k,v}` and the draft's `draft/kv.{l}.{k,v}`.
//!
//! Draft-cache invariant: at a step's start the draft cache holds slots `0..n-1`; the
//! first draft forward re-reads `[x(n-1), x(n)]` at `[n-1, n]`, so whether the previous
//! step accepted everything or nothing, the draft sees every committed token once.
//! Cache slots past a sequence's length may hold stale values: attention reads slots
//! `0..=pos` only, so they are never seen, and the next step overwrites them.
//!
//! Host contract: admit a lane by prefilling target and draft with the prompt, then set
//! `len = P`, `pending = [x(P-1), x(P)]` (x(P) = the target's greedy token after the
//! prompt), `budget = min(max_new, Ctx - P - k - 2)` and `emitted = 0`. Then
//! `len + k + 1 < Ctx` whenever `budget > 0`, so no position leaves the cache; kernels
//! clamp positions anyway.

use specc_ir::op::B;
use specc_ir::{BinaryOp, DType, Dim, Graph, IrError, Op, Shape, TensorType, ValueId};

use crate::config::ModelSpec;
use crate::eagle3::{self, Eagle3Spec};
use crate::lower::{decoder_layer, embed, lm_head, LayerNames};
use crate::spec_config::Acceptance;
use crate::spec_config::TreeKnobs;

pub const LEN: &str = "spec.len";
pub const PENDING: &str = "spec.pending";
pub const BUDGET: &str = "spec.budget";
pub const RING: &str = "spec.ring";
pub const EMITTED: &str = "spec.emitted";
pub const STEP: &str = "spec.step";
/// Prefix of every draft weight and state name in the step graph.
pub const DRAFT_PREFIX: &str = "draft/";
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

fn i32_ty(dims: &[Dim]) -> TensorType {
    TensorType::new(DType::I32, dims.iter().copied())
}

fn s(n: u64) -> Dim {
    Dim::Static(n)
}

struct Builder<'a> {
    g: &'a mut Graph,
}

impl Builder<'_> {
    fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> Result<ValueId, IrError> {
        self.g.add(Op::Binary(op), &[a, b])
    }

    fn fill_i32(&mut self, value: i64, dims: &[Dim]) -> Result<ValueId, IrError> {
        self.g.add(
            Op::Fill {
                value: value as f64,
                ty: i32_ty(dims),
            },
            &[],
        )
    }

    fn iota(&mut self, cols: u64) -> Result<ValueId, IrError> {
        self.g.add(
            Op::Iota {
                axis: 1,
                ty: i32_ty(&[B, s(cols)]),
            },
            &[],
        )
    }

    fn reshape(&mut self, x: ValueId, dims: &[Dim]) -> Result<ValueId, IrError> {
        self.g.add(
            Op::Reshape {
                shape: Shape::new(dims.iter().copied()),
            },
            &[x],
        )
    }

    /// `v[B]` repeated into `[B, cols]` (a gather with zero indices).
    fn bcast_cols(&mut self, v: ValueId, cols: u64) -> Result<ValueId, IrError> {
        let v2 = self.reshape(v, &[B, s(1)])?;
        let zeros = self.fill_i32(0, &[B, s(cols)])?;
        self.g.add(Op::Gather { axis: 1 }, &[v2, zeros])
    }

    /// Column `idx[b]` of `x[B, n]`, as `[B, 1]`.
    fn pick(&mut self, x: ValueId, idx: ValueId) -> Result<ValueId, IrError> {
        let i2 = self.reshape(idx, &[B, s(1)])?;
        self.g.add(Op::Gather { axis: 1 }, &[x, i2])
    }

    fn slice_cols(&mut self, x: ValueId, start: u64, len: u64) -> Result<ValueId, IrError> {
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
    fn positions(&mut self, start: ValueId, cols: u64, live: ValueId) -> Result<ValueId, IrError> {
        let st = self.bcast_cols(start, cols)?;
        let io = self.iota(cols)?;
        let pos = self.bin(BinaryOp::Add, st, io)?;
        let neg = self.fill_i32(-1, &[B, s(cols)])?;
        let live2 = self.bcast_cols_bool(live, cols)?;
        self.g.add(Op::Select, &[live2, pos, neg])
    }

    fn bcast_cols_bool(&mut self, live: ValueId, cols: u64) -> Result<ValueId, IrError> {
        let as_int = self.g.add(Op::Cast { to: DType::I32 }, &[live])?;
        let b = self.bcast_cols(as_int, cols)?;
        let zero = self.fill_i32(0, &[B, s(cols)])?;
        let lt = self.bin(BinaryOp::Lt, zero, b)?;
        Ok(lt)
    }
}

/// A whole model forward over `tokens[B, t]` at `positions[B, t]`, under a name prefix
/// (`""` for the target, [`DRAFT_PREFIX`] for the draft). Returns f32 logits `[B, t, V]`
/// and the outputs of the decoder layers listed in `taps`, concatenated on the last axis.
pub fn forward_with_taps(
    g: &mut Graph,
    spec: &ModelSpec,
    prefix: &str,
    tokens: ValueId,
    positions: ValueId,
    taps: &[usize],
) -> Result<(ValueId, Option<ValueId>), IrError> {
    let (mut x, table) = embed(g, spec, prefix, tokens)?;
    let mut tapped = vec![None; taps.len()];
    for layer in 0..spec.layers {
        x = decoder_layer(
            g,
            spec,
            &LayerNames::with_prefix(prefix, layer),
            x,
            positions,
        )?;
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
    Ok((lm_head(g, spec, prefix, x, table)?, taps_v))
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
struct Common {
    len: ValueId,
    pending: ValueId,
    budget: ValueId,
    emitted: ValueId,
    step: ValueId,
    live: ValueId,
    zero_b: ValueId,
    one_b: ValueId,
    /// Uniforms `[B, 2k+1]` under sampled acceptance: columns 0..k accept/reject, k the
    /// bonus, k+1.. the draft's own draws.
    uniforms: Option<ValueId>,
}

fn begin(b: &mut Builder, shape: &StepShape) -> Result<Common, IrError> {
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
    let uniforms = match &shape.acceptance {
        Acceptance::Greedy => None,
        Acceptance::Sample { seed, .. } => {
            let counters = rng_counters(b, step, 2 * k + 1)?;
            Some(b.g.add(Op::RandomUniform { seed: *seed }, &[counters])?)
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
    })
}

/// What the drafting phase hands to verification.
struct Drafted {
    /// k tokens `[B, 1]` each, in target ids.
    tokens: Vec<ValueId>,
    /// The distribution each token was drawn from, `[B, 1, V]` each (sampled acceptance).
    dists: Vec<ValueId>,
}

/// What verification leaves for method-specific commits.
struct Verified {
    accepted: ValueId,
    emit_tokens: ValueId,
    taps: Option<ValueId>,
    /// (state, new value) pairs, applied by [`commit_all`].
    commits: Vec<(ValueId, ValueId)>,
}

/// Verify, accept, commit and emit: the method-independent second half of a step.
fn verify_and_commit(
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
    let (target_logits, taps_v) = forward_with_taps(b.g, target, "", verify_tokens, vpos, taps)?;

    // accept: a in 0..=k, and the token after the accepted prefix.
    let (accepted, bonus) = match (&shape.acceptance, c.uniforms) {
        // k = 0: plain decoding; the "bonus" is the next token itself.
        _ if k == 0 => {
            let bonus = match (&shape.acceptance, c.uniforms) {
                (Acceptance::Sample { temperature, .. }, Some(u)) => {
                    let p = probs(b, target_logits, *temperature)?;
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
        (Acceptance::Sample { temperature, .. }, Some(u)) => {
            let draft_tokens = b.g.add(Op::Concat { axis: 1 }, &drafted.tokens)?;
            let q = b.g.add(Op::Concat { axis: 1 }, &drafted.dists)?;
            let p = probs(b, target_logits, *temperature)?;
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
fn emit(
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

/// Overwrites each state with its new value. Every assign comes after every read of the
/// old values (the verifier's in-place rule), so all commits of a step go through here
/// once, last.
fn commit_all(b: &mut Builder, commits: &[(ValueId, ValueId)]) -> Result<(), IrError> {
    for &(state, value) in commits {
        b.g.add(Op::Assign, &[state, value])?;
    }
    Ok(())
}

/// One draft token from a logits row `[B, 1, V]`: the argmax (greedy) or a draw from
/// softmax(row / temperature) with uniform column `col` (sampled acceptance).
fn choose(
    b: &mut Builder,
    shape: &StepShape,
    c: &Common,
    row: ValueId,
    col: u64,
    dists: &mut Vec<ValueId>,
) -> Result<ValueId, IrError> {
    match (&shape.acceptance, c.uniforms) {
        (Acceptance::Sample { temperature, .. }, Some(u)) => {
            let q = probs(b, row, *temperature)?;
            dists.push(q);
            let q2 = b.reshape(q, &[B, b_vocab(b.g, q)])?;
            let uj = b.slice_cols(u, col, 1)?;
            let uj = b.reshape(uj, &[B])?;
            let t = b.g.add(Op::Sample, &[q2, uj])?;
            b.reshape(t, &[B, s(1)])
        }
        _ => b.g.add(Op::Argmax, &[row]),
    }
}

/// Lowers one speculative step with a standalone draft model (`draft_model`).
pub fn lower_draft_model_step(
    target: &ModelSpec,
    draft: &ModelSpec,
    shape: &StepShape,
) -> Result<Graph, IrError> {
    let k = shape.num_steps;
    let mut g = Graph::new("spec_step_draft_model");
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, shape)?;
    // draft: catch up on [x(n-1), x(n)], then k - 1 single-token steps.
    let len_m1 = b.bin(BinaryOp::Sub, c.len, c.one_b)?;
    let pos0 = b.positions(len_m1, 2, c.live)?;
    let logits0 = forward(b.g, draft, DRAFT_PREFIX, c.pending, pos0)?;
    let mut row = b.g.add(
        Op::Slice {
            axis: 1,
            start: 1,
            len: 1,
        },
        &[logits0],
    )?;
    let mut d = Drafted {
        tokens: Vec::new(),
        dists: Vec::new(),
    };
    for j in 0..k {
        let tok = choose(&mut b, shape, &c, row, k + 1 + j, &mut d.dists)?;
        d.tokens.push(tok);
        if j + 1 < k {
            let offset = b.fill_i32(j as i64 + 1, &[B])?;
            let start = b.bin(BinaryOp::Add, c.len, offset)?;
            let pos = b.positions(start, 1, c.live)?;
            row = forward(b.g, draft, DRAFT_PREFIX, tok, pos)?;
        }
    }
    let v = verify_and_commit(&mut b, &c, target, shape, d, &[])?;
    commit_all(&mut b, &v.commits)?;
    Ok(g)
}

/// Plain greedy decoding of `target`: its prefill (no taps) and its [`lower_decode_step`]
/// with a ring of `ring` tokens per sequence — the graphs of `--spec none`.
pub fn lower_plain_greedy(target: &ModelSpec, ring: u64) -> Result<(Graph, Graph), IrError> {
    let shape = StepShape {
        num_steps: 0,
        ring,
        acceptance: Acceptance::Greedy,
    };
    Ok((
        lower_target_prefill(target, &[])?,
        lower_decode_step(target, &shape)?,
    ))
}

/// Plain decoding as a self-feeding step graph (k = 0): one target token per step, chosen
/// on device and emitted into the ring, with the same states and host contract as the
/// speculative steps. This is the graph the CUDA backend captures for `--spec none`.
pub fn lower_decode_step(target: &ModelSpec, shape: &StepShape) -> Result<Graph, IrError> {
    let mut shape = shape.clone();
    shape.num_steps = 0;
    let mut g = Graph::new("decode_step");
    let mut b = Builder { g: &mut g };
    let c = begin(&mut b, &shape)?;
    let d = Drafted {
        tokens: Vec::new(),
        dists: Vec::new(),
    };
    let v = verify_and_commit(&mut b, &c, target, &shape, d, &[])?;
    commit_all(&mut b, &v.commits)?;
    Ok(g)
}

/// `[B, 1, V]` f32 one-hot of `tok[B, 1]`.
fn one_hot(b: &mut Builder, tok: ValueId, vocab: u64) -> Result<ValueId, IrError> {
    let io = b.g.add(
        Op::Iota {
            axis: 2,
            ty: i32_ty(&[B, s(1), s(vocab)]),
        },
        &[],
    )?;
    let t3 = b.reshape(tok, &[B, s(1), s(1)])?;
    let zeros = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: i32_ty(&[B, s(1), s(vocab)]),
        },
        &[],
    )?;
    let tb = b.g.add(Op::Gather { axis: 2 }, &[t3, zeros])?;
    let eq = b.bin(BinaryOp::Eq, io, tb)?;
    b.g.add(Op::Cast { to: DType::F32 }, &[eq])
}

fn b_vocab(g: &Graph, x: ValueId) -> Dim {
    *g.ty(x)
        .shape
        .dims()
        .last()
        .expect("logits have a vocab axis")
}

/// softmax(logits / temperature) over the vocab.
fn probs(b: &mut Builder, logits: ValueId, temperature: f64) -> Result<ValueId, IrError> {
    let inv_t = b.g.add(
        Op::Fill {
            value: 1.0 / temperature,
            ty: b.g.ty(logits).clone(),
        },
        &[],
    )?;
    let scaled = b.bin(BinaryOp::Mul, logits, inv_t)?;
    b.g.add(Op::Softmax, &[scaled])
}

/// Speculative sampling (Leviathan et al.): accept draft token x_j with probability
/// min(1, p_j(x_j) / q_j(x_j)); at the first rejection a, draw from norm(max(0, p_a − q_a));
/// if all k are accepted draw the bonus from p_k. `p[B,k+1,V]`, `q[B,k,V]` are the target
/// and draft distributions the tokens were drawn under; `u[B,2k+1]` uniforms.
/// Returns (accepted[B], bonus[B,1]).
fn sample_accept(
    b: &mut Builder,
    p: ValueId,
    q: ValueId,
    draft_tokens: ValueId,
    u: ValueId,
    k: u64,
) -> Result<(ValueId, ValueId), IrError> {
    let v = b_vocab(b.g, p);
    let idx = b.reshape(draft_tokens, &[B, s(k), s(1)])?;
    let p_head = b.g.add(
        Op::Slice {
            axis: 1,
            start: 0,
            len: k,
        },
        &[p],
    )?;
    let px = b.g.add(Op::Gather { axis: 2 }, &[p_head, idx])?;
    let qx = b.g.add(Op::Gather { axis: 2 }, &[q, idx])?;
    let px = b.reshape(px, &[B, s(k)])?;
    let qx = b.reshape(qx, &[B, s(k)])?;
    // accept_j ⇔ u_j · q_j(x) < p_j(x)  (no division; q_j(x) > 0 since x was drawn from q).
    let u_acc = b.slice_cols(u, 0, k)?;
    let uq = b.bin(BinaryOp::Mul, u_acc, qx)?;
    let ok = b.bin(BinaryOp::Lt, uq, px)?;
    let ok_i = b.g.add(Op::Cast { to: DType::I32 }, &[ok])?;
    let ones = b.fill_i32(1, &[B, s(k + 1)])?;
    let a = b.g.add(Op::AcceptChain, &[ok_i, ones])?;
    // Residuals max(0, p_j − q_j) for j < k, then p_k; `sample` normalises by the sum.
    let diff = b.bin(BinaryOp::Sub, p_head, q)?;
    let zero = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: b.g.ty(diff).clone(),
        },
        &[],
    )?;
    let resid = b.bin(BinaryOp::Max, diff, zero)?;
    let p_last = b.g.add(
        Op::Slice {
            axis: 1,
            start: k,
            len: 1,
        },
        &[p],
    )?;
    let dists = b.g.add(Op::Concat { axis: 1 }, &[resid, p_last])?;
    let a3 = b.reshape(a, &[B, s(1), s(1)])?;
    let zeros = b.g.add(
        Op::Fill {
            value: 0.0,
            ty: i32_ty(&[B, s(1), v]),
        },
        &[],
    )?;
    let a_rows = b.g.add(Op::Gather { axis: 2 }, &[a3, zeros])?;
    let row = b.g.add(Op::Gather { axis: 1 }, &[dists, a_rows])?;
    let row = b.reshape(row, &[B, v])?;
    let u_bonus = b.slice_cols(u, k, 1)?;
    let u_bonus = b.reshape(u_bonus, &[B])?;
    let tok = b.g.add(Op::Sample, &[row, u_bonus])?;
    let tok = b.reshape(tok, &[B, s(1)])?;
    Ok((a, tok))
}

/// Distinct RNG counters `((step · 2^20 + lane) · S + column)` as i64 `[B, cols]`, `S` = 64
/// or the next power of two of `cols` (so columns never reach the next lane's counters).
fn rng_counters(b: &mut Builder, step: ValueId, cols: u64) -> Result<ValueId, IrError> {
    let i64_ty = TensorType::new(DType::I64, [B, s(cols)]);
    let step64 = b.g.add(Op::Cast { to: DType::I64 }, &[step])?;
    let v2 = b.reshape(step64, &[B, s(1)])?;
    let zeros = b.fill_i32(0, &[B, s(cols)])?;
    let st = b.g.add(Op::Gather { axis: 1 }, &[v2, zeros])?;
    let lane = b.g.add(
        Op::Iota {
            axis: 0,
            ty: i64_ty.clone(),
        },
        &[],
    )?;
    let col = b.g.add(
        Op::Iota {
            axis: 1,
            ty: i64_ty.clone(),
        },
        &[],
    )?;
    let fill = |b: &mut Builder, v: f64| {
        b.g.add(
            Op::Fill {
                value: v,
                ty: i64_ty.clone(),
            },
            &[],
        )
    };
    let c20 = fill(b, (1u64 << 20) as f64)?;
    // Columns per (step, lane): 64, or the next power of two for wider draws (tree nodes).
    let stride = fill(b, cols.next_power_of_two().max(64) as f64)?;
    let x = b.bin(BinaryOp::Mul, st, c20)?;
    let x = b.bin(BinaryOp::Add, x, lane)?;
    let x = b.bin(BinaryOp::Mul, x, stride)?;
    b.bin(BinaryOp::Add, x, col)
}

/// Inputs of the EAGLE-3 prefill graph.
pub const HIDDEN: &str = "hidden";

/// The target's prefill (bucket `T`): `logits`, `next_token` and, when `taps` is not
/// empty, `taps` `[B, T, 3H]` (the tapped layers' outputs, for an EAGLE-3 head).
pub fn lower_target_prefill(target: &ModelSpec, taps: &[usize]) -> Result<Graph, IrError> {
    let mut g = Graph::new("target_prefill");
    let ids = TensorType::new(DType::I32, [B, specc_ir::op::T]);
    let tokens = g.input("tokens", ids.clone())?;
    let positions = g.input("positions", ids)?;
    let (logits, taps_v) = forward_with_taps(&mut g, target, "", tokens, positions, taps)?;
    let next = g.add(Op::Argmax, &[logits])?;
    g.set_output("logits", logits);
    g.set_output("next_token", next);
    if let Some(t) = taps_v {
        g.set_output("taps", t);
    }
    Ok(g)
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
    let (emb, _) = embed(&mut g, target, "", tokens)?;
    let g0 = eagle3::fc(&mut g, eagle, hidden)?;
    let out = eagle3::midlayer(&mut g, eagle, emb, g0, positions)?;
    g.set_output("out", out);
    Ok(g)
}

mod ddtree;
mod dflash;
mod eagle3_steps;
pub use ddtree::{lower_ddtree_step, TREE};
pub use dflash::{
    lower_dflash_prefill, lower_dflash_step, DFLASH_BASE, DFLASH_COUNT, DFLASH_HIDDEN,
};
pub use eagle3_steps::{
    lower_eagle3_step, lower_eagle3_tree_step, EAGLE_BASE, EAGLE_COUNT, EAGLE_HIDDEN, EAGLE_TOKENS,
};
