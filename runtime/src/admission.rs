//! Host-side admission math shared by both backends: prefill inputs for a batch of prompts
//! (shorter prompts padded with masked lanes), the step states that arm the device loop,
//! and the EAGLE-3 pair layout. Backends only move the resulting values into their memory.

use specc_ir::engine::Acceptance;
use specc_models::methods::{
    BUDGET, DFLASH_BASE, DFLASH_COUNT, EAGLE_BASE, EAGLE_COUNT, EAGLE_TOKENS, EMITTED, LEN,
    PENDING, SAMPLING, STEP, STREAM,
};
use specc_models::spec_bundle::MIN_PREFILL_T;

use crate::RuntimeError;

/// Prefill inputs: `[lanes, t]` token ids and positions (−1 marks padding).
pub struct PrefillInputs {
    pub t: usize,
    pub tokens: Vec<i64>,
    pub positions: Vec<i64>,
}

/// Checks the batch and lays out its prefill inputs.
pub fn prefill_inputs(
    prompts: &[Vec<u32>],
    k: usize,
    max_context: u64,
) -> Result<PrefillInputs, RuntimeError> {
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let t = check_prompts(&refs, k, max_context)?;
    Ok(padded(prompts, t, |p, i| p.get(i).map(|&x| x as i64)))
}

/// Checks that every prompt is non-empty and leaves room for a step of `k` draft tokens
/// in the context; the longest prompt's length.
pub fn check_prompts(
    prompts: &[&[u32]],
    k: usize,
    max_context: u64,
) -> Result<usize, RuntimeError> {
    let t = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    if t == 0 || prompts.iter().any(|p| p.is_empty()) {
        return Err(RuntimeError::EmptyStep);
    }
    let needed = t + k + 3;
    if needed as u64 > max_context {
        return Err(RuntimeError::ContextOverflow {
            needed,
            max_context,
        });
    }
    Ok(t)
}

/// `[lanes, t]` tokens and positions where `at(prompt, i)` gives lane tokens (None = pad).
fn padded(
    prompts: &[Vec<u32>],
    t: usize,
    at: impl Fn(&Vec<u32>, usize) -> Option<i64>,
) -> PrefillInputs {
    let mut tokens = Vec::with_capacity(prompts.len() * t);
    let mut positions = Vec::with_capacity(prompts.len() * t);
    for p in prompts {
        for i in 0..t {
            match at(p, i) {
                Some(x) => {
                    tokens.push(x);
                    positions.push(i as i64);
                }
                None => {
                    tokens.push(0);
                    positions.push(-1);
                }
            }
        }
    }
    PrefillInputs {
        t,
        tokens,
        positions,
    }
}

/// Each lane's first generated token: the target's greedy token after its last prompt
/// token (`next` is the prefill's `next_token`, `[lanes, 1]`: the prefill chooses on each
/// lane's last prompt row only).
pub fn first_tokens(next: &[i64], prompts: &[Vec<u32>]) -> Vec<u32> {
    next[..prompts.len()].iter().map(|&x| x as u32).collect()
}

/// Each lane's first generated token: the prefill's drawn `first_token` (`[lanes]`, present
/// under sampled acceptance) when it has one, else [`first_tokens`].
pub fn first_tokens_of(drawn: Option<&[i64]>, next: &[i64], prompts: &[Vec<u32>]) -> Vec<u32> {
    first_tokens(drawn.unwrap_or(next), prompts)
}

/// An i32 state value to set at admission.
pub struct StateInit {
    pub name: &'static str,
    pub dims: Vec<usize>,
    pub values: Vec<i64>,
}

impl StateInit {
    /// Little-endian i32 bytes (what the device holds).
    pub fn i32_bytes(&self) -> Vec<u8> {
        self.values
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect()
    }
}

/// The most tokens a lane admitted with a `prompt`-token prompt may emit in a context of
/// `max_context` slots when a step writes up to `k + 1` of them past its length: the lane's
/// budget keeps `len + k + 1 < Ctx` while it is positive. A larger request is clamped to
/// this (hosts say so), never wrapped.
pub fn max_new_tokens(prompt: usize, k: usize, max_context: u64) -> usize {
    let ctx = usize::try_from(max_context).unwrap_or(usize::MAX);
    ctx.saturating_sub(prompt).saturating_sub(k + 2)
}

/// One lane to admit: where, its prompt, its budget of new tokens, how it samples.
#[derive(Clone, Copy, Debug)]
pub struct Admit<'p> {
    pub lane: usize,
    pub prompt: &'p [u32],
    pub max_new: usize,
    pub sampling: LaneSampling,
}

/// The common step states: `len = P`, `pending = [x(P-1), x(P)]`, the budget
/// (`max_new` clamped to [`max_new_tokens`]), and zeroed counters.
pub fn step_states(
    prompts: &[&[u32]],
    first: &[u32],
    max_new: usize,
    max_context: u64,
    k: usize,
) -> Vec<StateInit> {
    let lanes = prompts.len();
    let per_lane = |f: &dyn Fn(usize) -> i64| StateInit {
        name: "",
        dims: vec![lanes],
        values: (0..lanes).map(f).collect(),
    };
    let mut len = per_lane(&|b| prompts[b].len() as i64);
    len.name = LEN;
    // The clamped budget is below the context, which a device i32 holds.
    let mut budget =
        per_lane(&|b| max_new.min(max_new_tokens(prompts[b].len(), k, max_context)) as i64);
    budget.name = BUDGET;
    let mut emitted = per_lane(&|_| 0);
    emitted.name = EMITTED;
    let mut step = per_lane(&|_| 0);
    step.name = STEP;
    let pending = StateInit {
        name: PENDING,
        dims: vec![lanes, 2],
        values: (0..lanes)
            .flat_map(|b| {
                [
                    *prompts[b].last().expect("non-empty prompt") as i64,
                    first[b] as i64,
                ]
            })
            .collect(),
    };
    vec![len, pending, budget, emitted, step]
}

/// Streams are below this (the RNG counter holds a stream in 20 bits).
pub const STREAMS: u32 = 1 << 20;

/// The lanes' RNG streams (sampled acceptance), written before the prefill, whose draw of
/// the first token reads them. Values are taken modulo [`STREAMS`].
pub fn stream_state(streams: &[u32]) -> StateInit {
    StateInit {
        name: STREAM,
        dims: vec![streams.len()],
        values: streams.iter().map(|&s| (s % STREAMS) as i64).collect(),
    }
}

/// How one lane draws its tokens under sampled acceptance (a greedy engine has nothing to
/// set: its lanes take the argmax). Written into the lane's device state at admission.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaneSampling {
    /// The lane's RNG stream (taken modulo [`STREAMS`]): the same stream, prompt and knobs
    /// give the same tokens in any lane, next to any others.
    pub stream: u32,
    /// ≤ 0: greedy decoding for this lane (the target's argmax, exactly).
    pub temperature: f32,
    /// 0: every token.
    pub top_k: u32,
    /// 1: every token.
    pub top_p: f32,
}

impl LaneSampling {
    /// Greedy decoding on stream `stream`.
    pub fn greedy(stream: u32) -> LaneSampling {
        LaneSampling {
            stream,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        }
    }

    /// The engine's knobs (what lanes admitted without their own get) on stream `stream`.
    pub fn defaults(acceptance: &Acceptance, stream: u32) -> LaneSampling {
        match *acceptance {
            Acceptance::Greedy => LaneSampling::greedy(stream),
            Acceptance::Sample {
                temperature,
                top_k,
                top_p,
                ..
            } => LaneSampling {
                stream,
                temperature: temperature as f32,
                top_k: top_k.map_or(0, |k| u32::try_from(k).unwrap_or(u32::MAX)),
                top_p: top_p as f32,
            },
        }
    }
}

/// An f32 state value to set at admission.
pub struct StateInitF32 {
    pub name: &'static str,
    pub dims: Vec<usize>,
    pub values: Vec<f32>,
}

impl StateInitF32 {
    /// Little-endian f32 bytes (what the device holds).
    pub fn f32_bytes(&self) -> Vec<u8> {
        self.values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}

/// The lanes' sampling knobs, `[lanes, 3]` rows `[temperature, top_k, top_p]` (the step
/// graphs' [`SAMPLING`] state), written before the prefill, whose draw of the first token
/// reads them. top_k is exact in f32 below 2^24, past any vocabulary.
pub fn sampling_state(lanes: &[LaneSampling]) -> StateInitF32 {
    StateInitF32 {
        name: SAMPLING,
        dims: vec![lanes.len(), 3],
        values: lanes
            .iter()
            .flat_map(|l| [l.temperature, l.top_k.min(1 << 24) as f32, l.top_p])
            .collect(),
    }
}

/// Checks a prefill chunk size (0: whole prompts): a prompt bucket engines plan, a power
/// of two from [`MIN_PREFILL_T`] within `max_context`, so every chunk's prefill runs at a
/// bucket no larger than the chunk.
pub fn check_chunk(chunk: usize, max_context: u64) -> Result<(), RuntimeError> {
    if chunk == 0 {
        return Ok(());
    }
    if !chunk.is_power_of_two() || chunk < MIN_PREFILL_T || chunk as u64 > max_context {
        return Err(RuntimeError::Engine(format!(
            "prefill chunk {chunk}: must be a power of two from {MIN_PREFILL_T} to the context ({max_context})"
        )));
    }
    Ok(())
}

/// The most rows one launch of a generated kernel covers: the kernels that give each row
/// its own block along grid y (embeddings, row-wise elementwise ops) stop at CUDA's limit of
/// 65 535 blocks there.
pub const MAX_LAUNCH_ROWS: usize = 65_535;

/// The prefill budget a GPU session of `lanes` lanes runs for `chunk` (0: whole prompts of
/// up to `max_context` tokens): `chunk` where its widest prefill fits [`MAX_LAUNCH_ROWS`],
/// else the largest power of two that does. A budgeted prefill of `b ≤ lanes` lanes takes
/// at most `max(chunk, b × MIN_PREFILL_T)` rows ([`lane_chunk`]): one launch up to
/// `MAX_LAUNCH_ROWS / MIN_PREFILL_T` (4095) lanes; a whole-prompt prefill takes up to
/// `lanes ×` the context's prompt bucket.
pub fn chunk_within_launch(chunk: usize, lanes: usize, max_context: u64) -> usize {
    let whole = usize::try_from(max_context)
        .unwrap_or(usize::MAX)
        .next_power_of_two()
        .max(MIN_PREFILL_T);
    let widest = match chunk {
        0 => lanes.max(1).saturating_mul(whole),
        c => c,
    };
    if widest <= MAX_LAUNCH_ROWS {
        return chunk;
    }
    1 << MAX_LAUNCH_ROWS.ilog2()
}

/// The prefill chunk hosts use unless told otherwise (or the largest prompt bucket within
/// a smaller context).
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// `chunk` checked ([`check_chunk`]), or without one the default: [`DEFAULT_PREFILL_CHUNK`]
/// or the largest prompt bucket within `max_context` (0, whole prompts, below the smallest).
pub fn prefill_chunk_or_default(
    chunk: Option<usize>,
    max_context: u64,
) -> Result<usize, RuntimeError> {
    match chunk {
        Some(c) => check_chunk(c, max_context).map(|()| c),
        None => {
            let ctx = usize::try_from(max_context).unwrap_or(usize::MAX);
            let c = DEFAULT_PREFILL_CHUNK.min(ctx);
            let c = if c == 0 { 0 } else { 1 << c.ilog2() };
            Ok(if c < MIN_PREFILL_T { 0 } else { c })
        }
    }
}

/// One lane's rows of a prefill chunk: prompt positions `start..start + len` (`len` 0: the
/// lane is padding in this chunk). A chunk's rows attend to the cache rows earlier chunks
/// wrote (attention is causal over the cache by position), so the chunks of a prompt
/// leave the caches a whole prefill would.
#[derive(Clone, Copy, Debug)]
pub struct ChunkRows<'p> {
    pub prompt: &'p [u32],
    pub start: usize,
    pub len: usize,
}

impl ChunkRows<'_> {
    /// Whether this chunk holds the prompt's last row (the one the first token follows).
    pub fn ends(&self) -> bool {
        self.len > 0 && self.start + self.len == self.prompt.len()
    }
}

/// The prompt bucket a prefill of `t` rows per lane runs at: the next power of two, at
/// least [`MIN_PREFILL_T`] (the smallest an engine plans).
pub fn prefill_bucket(t: usize) -> usize {
    t.next_power_of_two().max(MIN_PREFILL_T)
}

/// The prompt rows each lane of an admission window of `window` lanes takes per chunk when
/// the prefill chunk `chunk` is a budget of rows per prefill across the window (0: whole
/// prompts, and 0 back): the largest power of two within `chunk / window`, at least
/// [`MIN_PREFILL_T`] (a prefill of fewer rows per lane runs at that bucket all the same).
///
/// A chunk's prompt bucket `tb` is the [`prefill_bucket`] of its longest lane rows, a power
/// of two no larger than this one, so one prefill of the window holds
///
/// `window × tb ≤ max(chunk, window × MIN_PREFILL_T)`
///
/// rows: at most `chunk` whenever `chunk ≥ window × MIN_PREFILL_T`. An admission's window
/// is fixed, so every chunk of it takes the same rows per lane and its lanes' chunks keep a
/// shared start position.
pub fn lane_chunk(chunk: usize, window: usize) -> usize {
    if chunk == 0 {
        return 0;
    }
    let per = chunk / window.max(1);
    if per < MIN_PREFILL_T {
        return MIN_PREFILL_T;
    }
    1 << per.ilog2()
}

/// The chunk of at most `chunk` rows from position `start` of each prompt (`chunk` 0:
/// the rest of every prompt); `chunk` is per lane ([`lane_chunk`]).
pub fn chunk_rows<'p>(prompts: &[&'p [u32]], start: usize, chunk: usize) -> Vec<ChunkRows<'p>> {
    prompts
        .iter()
        .map(|p| {
            let rest = p.len().saturating_sub(start);
            ChunkRows {
                prompt: p,
                start,
                len: if chunk == 0 { rest } else { rest.min(chunk) },
            }
        })
        .collect()
}

/// `[lanes, t]` tokens and positions of a chunk, `t` its longest rows (at least 1).
pub fn chunk_inputs(rows: &[ChunkRows]) -> PrefillInputs {
    let t = rows.iter().map(|r| r.len).max().unwrap_or(0).max(1);
    let mut tokens = Vec::with_capacity(rows.len() * t);
    let mut positions = Vec::with_capacity(rows.len() * t);
    for r in rows {
        for i in 0..t {
            if i < r.len {
                tokens.push(r.prompt[r.start + i] as i64);
                positions.push((r.start + i) as i64);
            } else {
                tokens.push(0);
                positions.push(-1);
            }
        }
    }
    PrefillInputs {
        t,
        tokens,
        positions,
    }
}

/// `pre` split into windows of at most `chunk` columns (0: one window), each `[lanes,
/// its width]`: a prefill whose lanes' positions increase along the row runs as its
/// windows in order (each attends to the cache rows the earlier ones wrote).
pub fn column_chunks(pre: &PrefillInputs, chunk: usize) -> Vec<PrefillInputs> {
    let width = if chunk == 0 { pre.t.max(1) } else { chunk };
    let lanes = pre.tokens.len() / pre.t.max(1);
    (0..pre.t)
        .step_by(width)
        .map(|c0| {
            let t = width.min(pre.t - c0);
            let cols = |v: &[i64]| -> Vec<i64> {
                (0..lanes)
                    .flat_map(|b| v[b * pre.t + c0..][..t].iter().copied())
                    .collect()
            };
            PrefillInputs {
                t,
                tokens: cols(&pre.tokens),
                positions: cols(&pre.positions),
            }
        })
        .collect()
}

/// EAGLE-3 priming of one chunk: the head's prefill reads pairs (taps at position i,
/// x(i+1)) at position i for every i of the chunk below P − 1 (`[lanes, t]` with
/// padding). Every token is the prompt's, so a pair never waits for the next chunk; the
/// pair at P − 1 (with the first generated token) is left in the step states for the
/// first step's catch-up ([`eagle_states`]).
pub struct EaglePairs {
    pub inputs: PrefillInputs,
    /// Copies of tap rows: (destination row in the head prefill's `hidden`, source row in
    /// the chunk's target prefill `taps`, `[lanes, chunk_t]`). Rows not listed are zero.
    pub hidden_rows: Vec<(usize, usize)>,
}

/// The pairs of the chunk `rows` whose target prefill ran at `chunk_t` rows per lane;
/// `None` when no lane has a pair in it (a last chunk of one row).
pub fn eagle_pairs(rows: &[ChunkRows], chunk_t: usize) -> Option<EaglePairs> {
    let pairs = |r: &ChunkRows| {
        let end = (r.start + r.len).min(r.prompt.len().saturating_sub(1));
        end.saturating_sub(r.start)
    };
    let t = rows.iter().map(pairs).max().unwrap_or(0);
    if t == 0 {
        return None;
    }
    let mut tokens = vec![0i64; rows.len() * t];
    let mut positions = vec![-1i64; rows.len() * t];
    let mut hidden_rows = Vec::new();
    for (b, r) in rows.iter().enumerate() {
        for j in 0..pairs(r) {
            let i = r.start + j;
            tokens[b * t + j] = r.prompt[i + 1] as i64;
            positions[b * t + j] = i as i64;
            hidden_rows.push((b * t + j, b * chunk_t + j));
        }
    }
    Some(EaglePairs {
        inputs: PrefillInputs {
            t,
            tokens,
            positions,
        },
        hidden_rows,
    })
}

/// The row of the chunk's `taps` (`[lanes, chunk_t]`) holding lane `b`'s last prompt
/// position, when this chunk ends its prompt: the `eagle.hidden` slot of the first step.
pub fn eagle_slot_row(rows: &[ChunkRows], b: usize, chunk_t: usize) -> Option<usize> {
    let r = &rows[b];
    r.ends().then(|| b * chunk_t + r.len - 1)
}

/// Where row `src` of a chunk's rows (`[lanes, chunk_t]`, lane `b` at window row
/// `rel[b]`) lies in its target prefill's `[window, tb]` rows.
pub fn window_row(src: usize, rel: &[usize], tb: usize, chunk_t: usize) -> usize {
    rel[src / chunk_t] * tb + src % chunk_t
}

/// The head prefill's `hidden` rows (`[window, tpb]`, `tpb` the bucket of `pairs.inputs.t`)
/// copied from the chunk's target prefill `taps` rows (`[window, tb]`, the chunk
/// `chunk_t` rows per lane), lane `b` at window row `rel[b]`: [`EaglePairs::hidden_rows`]
/// as runs of rows. The head's rows no run writes are zero.
pub fn eagle_hidden_runs(
    pairs: &EaglePairs,
    rel: &[usize],
    tb: usize,
    tpb: usize,
    chunk_t: usize,
) -> Vec<CopyRun> {
    let tp = pairs.inputs.t;
    row_runs(pairs.hidden_rows.iter().map(|&(dst, src)| {
        let b = dst / tp;
        debug_assert_eq!(b, src / chunk_t, "a pair stays in its lane");
        (rel[b] * tpb + dst % tp, window_row(src, rel, tb, chunk_t))
    }))
}

/// A copy of `len` consecutive units (rows or bytes) from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyRun {
    pub dst: usize,
    pub src: usize,
    pub len: usize,
}

impl CopyRun {
    /// The same copy with each unit `unit` units long (rows to bytes).
    pub fn scaled(self, unit: usize) -> CopyRun {
        CopyRun {
            dst: self.dst * unit,
            src: self.src * unit,
            len: self.len * unit,
        }
    }
}

/// Row copies `(dst, src)` in order merged into runs: a copy continues the run before it
/// when both its rows follow that run's last ones (an EAGLE-3 chunk's pairs of one lane
/// are one run, [`EaglePairs::hidden_rows`]).
pub fn row_runs(rows: impl IntoIterator<Item = (usize, usize)>) -> Vec<CopyRun> {
    let mut runs: Vec<CopyRun> = Vec::new();
    for (dst, src) in rows {
        match runs.last_mut() {
            Some(r) if r.dst + r.len == dst && r.src + r.len == src => r.len += 1,
            _ => runs.push(CopyRun { dst, src, len: 1 }),
        }
    }
    runs
}

/// EAGLE-3 step states after priming: the first generated token pending at P − 1
/// (`count = 1`, `base = P − 1`), its taps in the `eagle.hidden` slot 0.
pub fn eagle_states(prompts: &[&[u32]], first: &[u32], k: usize) -> Vec<StateInit> {
    let lanes = prompts.len();
    let mut tokens = vec![0i64; lanes * (k + 1)];
    for b in 0..lanes {
        tokens[b * (k + 1)] = first[b] as i64;
    }
    vec![
        StateInit {
            name: EAGLE_TOKENS,
            dims: vec![lanes, k + 1],
            values: tokens,
        },
        StateInit {
            name: EAGLE_COUNT,
            dims: vec![lanes],
            values: vec![1; lanes],
        },
        StateInit {
            name: EAGLE_BASE,
            dims: vec![lanes],
            values: prompts.iter().map(|p| p.len() as i64 - 1).collect(),
        },
    ]
}

/// DFlash admission: the drafter's prefill reads each chunk's target prefill `taps` and
/// `positions` unchanged (padding rows have position −1 and write nothing), so after the
/// last chunk the drafter's KV cache holds the context of every prompt position `0..P`.
/// Nothing is left pending for the first step: `count = 0`, `base = P` (the
/// `dflash.hidden` rows are unread).
pub fn dflash_states(prompts: &[&[u32]]) -> Vec<StateInit> {
    let lanes = prompts.len();
    vec![
        StateInit {
            name: DFLASH_COUNT,
            dims: vec![lanes],
            values: vec![0; lanes],
        },
        StateInit {
            name: DFLASH_BASE,
            dims: vec![lanes],
            values: prompts.iter().map(|p| p.len() as i64).collect(),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_chunks_fit_one_launch() {
        // 16 lanes × 4096 whole-prompt rows = 65 536: one over the grid's limit.
        assert_eq!(chunk_within_launch(0, 16, 4096), 32_768);
        assert_eq!(lane_chunk(32_768, 16), 2048, "a full window's lanes");
        assert_eq!(chunk_within_launch(0, 15, 4096), 0, "15 × 4096 fits");
        assert_eq!(chunk_within_launch(512, 16, 4096), 512);
        assert_eq!(chunk_within_launch(0, 1, 131_072), 32_768);
        assert_eq!(
            chunk_within_launch(0, 1, 100_000),
            32_768,
            "the bucket is 131 072"
        );
        assert_eq!(
            chunk_within_launch(8192, 64, 8192),
            8192,
            "a budget across lanes"
        );
        assert_eq!(chunk_within_launch(131_072, 1, 131_072), 32_768);
    }

    #[test]
    fn row_copies_merge_into_runs() {
        let runs = row_runs([
            (0, 16),
            (1, 17),
            (2, 18),
            (8, 32),
            (9, 33),
            (10, 40),
            (3, 19),
        ]);
        let run = |dst, src, len| CopyRun { dst, src, len };
        assert_eq!(
            runs,
            vec![run(0, 16, 3), run(8, 32, 2), run(10, 40, 1), run(3, 19, 1)]
        );
        assert_eq!(run(2, 5, 3).scaled(8), run(16, 40, 24));
        assert!(row_runs([]).is_empty());
    }

    #[test]
    fn eagle_pairs_copy_one_run_per_lane() {
        // Two lanes of a chunk of 16 rows: lane 0's prompt ends inside it, lane 1's not.
        let (a, b): (Vec<u32>, Vec<u32>) = ((1..=10).collect(), (1..=40).collect());
        let rows = chunk_rows(&[&a, &b], 0, 16);
        let p = eagle_pairs(&rows, 16).expect("pairs");
        let runs = row_runs(p.hidden_rows.iter().copied());
        let t = p.inputs.t;
        let run = |dst, src, len| CopyRun { dst, src, len };
        assert_eq!(runs, vec![run(0, 0, 9), run(t, 16, 16)]);
    }

    #[test]
    fn eagle_hidden_runs_move_the_rows_the_host_copy_moved() {
        // Three lanes at window rows 3, 0 and 1 of a window of 4, prompt bucket 32; the
        // rows are 2 units wide. What the host built row by row, the runs build.
        let prompts: Vec<Vec<u32>> = vec![(1..=20).collect(), (1..=7).collect(), vec![5]];
        let ps: Vec<&[u32]> = prompts.iter().map(|p| p.as_slice()).collect();
        let (rel, wb, tb, w) = ([3usize, 0, 1], 4, 32, 2);
        for start in [0, 16] {
            let rows = chunk_rows(&ps, start, 16);
            let chunk_t = chunk_inputs(&rows).t;
            let taps: Vec<u32> = (0..(wb * tb * w) as u32).collect();
            let Some(p) = eagle_pairs(&rows, chunk_t) else {
                continue;
            };
            let tpb = prefill_bucket(p.inputs.t);
            let mut host = vec![0u32; wb * tpb * w];
            for &(dst, src) in &p.hidden_rows {
                let (b, j) = (dst / p.inputs.t, dst % p.inputs.t);
                let (d, s) = (rel[b] * tpb + j, rel[b] * tb + src % chunk_t);
                host[d * w..][..w].copy_from_slice(&taps[s * w..][..w]);
            }
            let mut device = vec![0u32; wb * tpb * w];
            for r in eagle_hidden_runs(&p, &rel, tb, tpb, chunk_t) {
                let r = r.scaled(w);
                device[r.dst..][..r.len].copy_from_slice(&taps[r.src..][..r.len]);
            }
            assert_eq!(device, host, "chunk from {start}");
        }
        let rows = chunk_rows(&ps, 0, 0);
        let t = chunk_inputs(&rows).t;
        let slot = eagle_slot_row(&rows, 1, t).unwrap();
        assert_eq!(
            window_row(slot, &rel, tb, t),
            6,
            "lane 1's row 6 at window row 0"
        );
    }

    #[test]
    fn a_chunk_is_a_budget_across_the_window() {
        // 512 rows: 1 lane takes 512, 4 lanes 128 each, 16 lanes 32 each.
        assert_eq!(lane_chunk(512, 1), 512);
        assert_eq!(lane_chunk(512, 4), 128);
        assert_eq!(lane_chunk(512, 16), 32);
        // 512 / 3 = 170: the power of two below.
        assert_eq!(lane_chunk(512, 3), 128);
        // 512 / 64 = 8: the smallest prompt bucket, 64 × 16 = 1024 rows.
        assert_eq!(lane_chunk(512, 64), MIN_PREFILL_T);
        // A budget below the window's lanes (and below window × 16).
        assert_eq!(lane_chunk(16, 32), MIN_PREFILL_T);
        assert_eq!(lane_chunk(16, 4), MIN_PREFILL_T);
        assert_eq!(lane_chunk(0, 16), 0, "whole prompts");
        assert_eq!(lane_chunk(64, 0), 64, "no lanes counts as one");
        // The 16-lane window of 3000-token prompts: one chunk at 32 × 16 = 512 rows, not
        // 512 × 16 = 8192.
        let prompt = vec![7u32; 3000];
        let prompts = vec![prompt.as_slice(); 16];
        let rows = chunk_rows(&prompts, 0, lane_chunk(512, 16));
        let t = chunk_inputs(&rows).t;
        assert_eq!((t, prefill_bucket(t) * prompts.len()), (32, 512));
    }

    #[test]
    fn a_prefill_stays_within_its_budget() {
        for chunk in (4..=12).map(|e| 1usize << e) {
            for window in 1..=80 {
                let per = lane_chunk(chunk, window);
                let bound = chunk.max(window * MIN_PREFILL_T);
                // Every chunk's longest lane rows are at most `per`.
                for len in [1, per / 2 + 1, per] {
                    let rows = window * prefill_bucket(len);
                    assert!(
                        rows <= bound,
                        "chunk {chunk}, window {window}: {len} rows per lane run {rows} rows, \
                         above {bound}"
                    );
                }
                if chunk >= window * MIN_PREFILL_T {
                    assert!(window * per <= chunk, "chunk {chunk}, window {window}");
                }
            }
        }
    }

    #[test]
    fn budgets_clamp_instead_of_wrapping() {
        let prompt = vec![1u32; 4];
        let prompts = [prompt.as_slice()];
        let budget = |max_new: usize| {
            step_states(&prompts, &[2], max_new, 64, 5)
                .into_iter()
                .find(|s| s.name == BUDGET)
                .unwrap()
                .values
        };
        // 64 slots - 4 prompt - (5 + 2) margin.
        assert_eq!(max_new_tokens(4, 5, 64), 53);
        assert_eq!(budget(10), vec![10]);
        assert_eq!(budget(usize::MAX), vec![53]);
        assert_eq!(
            budget(1 << 63),
            vec![53],
            "2^63 once wrapped to a negative budget"
        );
        assert_eq!(max_new_tokens(60, 5, 64), 0);
    }

    /// (position, token, prompt row of its taps) of every EAGLE-3 pair of `rows`.
    fn pairs_of(rows: &[ChunkRows]) -> Vec<(i64, i64, usize)> {
        let t = rows.iter().map(|r| r.len).max().unwrap_or(1).max(1);
        let Some(p) = eagle_pairs(rows, t) else {
            return Vec::new();
        };
        p.hidden_rows
            .iter()
            .map(|&(dst, src)| {
                let start = rows[src / t].start;
                (
                    p.inputs.positions[dst],
                    p.inputs.tokens[dst],
                    start + src % t,
                )
            })
            .collect()
    }

    #[test]
    fn eagle_pairs_of_the_chunks_are_the_whole_prompts_pairs() {
        let prompt: Vec<u32> = (10..47).collect();
        let whole = pairs_of(&chunk_rows(&[&prompt], 0, 0));
        assert_eq!(whole.len(), prompt.len() - 1);
        for (i, &(pos, tok, row)) in whole.iter().enumerate() {
            assert_eq!((pos, tok, row), (i as i64, prompt[i + 1] as i64, i));
        }
        let mut chunked = Vec::new();
        for start in (0..prompt.len()).step_by(16) {
            let rows = chunk_rows(&[&prompt], start, 16);
            chunked.extend(pairs_of(&rows));
            assert_eq!(
                eagle_slot_row(&rows, 0, rows[0].len),
                (start + 16 >= prompt.len()).then(|| prompt.len() - 1 - start)
            );
        }
        assert_eq!(chunked, whole, "pairs cross chunk boundaries");
    }

    #[test]
    fn column_chunks_split_a_prefill_in_order() {
        let pre = PrefillInputs {
            t: 5,
            tokens: (0..10).collect(),
            positions: (0..10).map(|i| i % 5).collect(),
        };
        let w = column_chunks(&pre, 2);
        assert_eq!(w.iter().map(|c| c.t).collect::<Vec<_>>(), [2, 2, 1]);
        assert_eq!(w[1].tokens, [2, 3, 7, 8]);
        assert_eq!(w[2].positions, [4, 4]);
        assert_eq!(column_chunks(&pre, 0)[0].tokens, pre.tokens);
    }

    #[test]
    fn the_default_chunk_is_a_prompt_bucket_within_the_context() {
        assert_eq!(prefill_chunk_or_default(None, 4096).unwrap(), 512);
        assert_eq!(prefill_chunk_or_default(None, 300).unwrap(), 256);
        assert_eq!(prefill_chunk_or_default(None, 10).unwrap(), 0);
        assert_eq!(prefill_chunk_or_default(Some(0), 300).unwrap(), 0);
        assert!(prefill_chunk_or_default(Some(100), 4096).is_err());
        assert!(prefill_chunk_or_default(Some(1024), 512).is_err());
    }
}
