//! Admission on the device: lanes are prefilled together at one window, chunk by chunk
//! (the session's prefill chunk is a budget of rows per prefill across the window's lanes,
//! [`admission::lane_chunk`]; each chunk attends to the cache rows the earlier ones
//! wrote), one chunk per
//! [`CudaSpecSession::prefill_chunk`] call so a host can replay the other lanes' steps
//! between them. The admitted lanes' step states are armed only after their last chunk:
//! until then their budget stays 0, so the steps mask them (they write no cache slot and
//! commit nothing) while their caches fill.
//!
//! The draft is primed on the device: the drafter prefill's `hidden` input is filled by
//! device-to-device copies from the target prefill's `taps` output in its arena (DFlash:
//! the whole buffer; EAGLE-3: one copy per run of consecutive pair rows, the rows no pair
//! writes zeroed), and an EAGLE-3 lane's first `eagle.hidden` row is staged on the device
//! ([`staged_slots`]). The host reads only the first tokens, after a chunk that ends a
//! prompt; a chunk that ends none is only queued.

use std::sync::Arc;

use specc_ir::engine::{Priming, StepContract};
use specc_models::methods::{DFLASH_HIDDEN, EAGLE_HIDDEN, FIRST_TOKEN, HIDDEN, SAMPLING, STREAM};

use super::{place, prefill_bucket, read_i32, CudaSpecSession};
use crate::admission::{self, Admit, CopyRun, LaneSampling};
use crate::cuda::prefills::{DeviceSpan, Input, PrefillAt};
use crate::cuda::{CudaEngine, DeviceBuffer};
use crate::RuntimeError;

/// EAGLE-3's staging of each lane's `eagle.hidden` bytes (`[lanes, per lane]`, zeroed; the
/// session's `staged_slots`): the chunk that ends a lane's prompt copies its last prompt
/// row's taps into the first row of the lane's bytes (the rest stay zero: nothing else
/// writes them), and arming the lane copies its bytes into the state. The state cannot take
/// them earlier: every step commits `eagle.hidden` of every lane, masked ones too, and steps
/// run between an admission's chunks. `None` for the other methods.
pub(super) fn staged_slots(
    dev: &CudaEngine,
    contract: &StepContract,
    lanes: usize,
) -> Result<Option<Arc<DeviceBuffer>>, RuntimeError> {
    let Priming::Pairs { .. } = contract.priming() else {
        return Ok(None);
    };
    let per = dev.state_lane_bytes(EAGLE_HIDDEN)?;
    let label = "staged `eagle.hidden` lanes";
    Ok(Some(dev.dev.alloc_zeroed(label, per * lanes as u64)?))
}

/// One lane of an admission.
struct Row {
    lane: usize,
    prompt: Vec<u32>,
    max_new: usize,
    sampling: LaneSampling,
}

/// Lanes admitted together, in progress.
pub(crate) struct PendingGroup {
    rows: Vec<Row>,
    /// The window's batch bucket and first lane (its prompt bucket is each chunk's).
    window: (usize, usize),
    /// Prompt rows prefilled so far (the same for every lane: they start together).
    done: usize,
    /// Each lane's first token, once its last chunk ran.
    first: Vec<Option<u32>>,
    /// EAGLE-3: whether each lane's `eagle.hidden` slot 0 (its last prompt row's taps) is
    /// staged ([`staged_slots`]), once its last chunk ran; copied when the lane is armed.
    slots: Vec<bool>,
    /// Whether the draft is prefilled (not left to lazy priming), fixed when it began.
    primed: bool,
}

impl PendingGroup {
    fn lanes(&self) -> impl Iterator<Item = usize> + '_ {
        self.rows.iter().map(|r| r.lane)
    }
}

impl CudaSpecSession<'_> {
    /// Sets the most rows one prefill takes across the lanes admitted together (0: whole
    /// prompts in one prefill): each lane of a window of `b` lanes takes
    /// [`admission::lane_chunk`]`(chunk, b)` rows per chunk. A power of two from the
    /// smallest prompt bucket ([`admission::check_chunk`]), so no prefill runs at a prompt
    /// bucket above it; smaller where the widest prefill would not fit one launch
    /// ([`admission::chunk_within_launch`]).
    pub fn set_prefill_chunk(&mut self, chunk: usize) -> Result<(), RuntimeError> {
        admission::check_chunk(chunk, self.max_context)?;
        self.prefill_chunk = admission::chunk_within_launch(chunk, self.lanes, self.max_context);
        Ok(())
    }

    /// Prefills every lane and arms the step states; returns each lane's first token. Under
    /// sampled acceptance lane `b` draws on stream `b` with the engine's default knobs.
    pub fn admit(
        &mut self,
        prompts: &[Vec<u32>],
        max_new: usize,
    ) -> Result<Vec<u32>, RuntimeError> {
        assert_eq!(prompts.len(), self.lanes, "one prompt per lane");
        let acceptance = &self.engine.engine.acceptance;
        let rows: Vec<Admit> = prompts
            .iter()
            .enumerate()
            .map(|(b, p)| Admit {
                lane: b,
                prompt: p,
                max_new,
                sampling: LaneSampling::defaults(acceptance, b as u32),
            })
            .collect();
        self.pending.clear();
        let g = self.group(&rows, (self.lanes, 0))?;
        self.run_group(g)
    }

    /// Prefills lane `lane` alone and arms its step states, leaving the other lanes' states
    /// as they are (continuous batching). The prefill runs at [`CudaSpecSession::
    /// lone_window`]: the same plan whatever the lane and the load, the lanes of the window
    /// other than `lane` padding (position −1: they write nothing), so a lane's tokens do
    /// not depend on the others'. Returns the lane's first token. Under sampled acceptance
    /// the lane draws with `sampling`'s knobs from its RNG stream.
    pub fn admit_lane(
        &mut self,
        lane: usize,
        prompt: &[u32],
        max_new: usize,
        sampling: LaneSampling,
    ) -> Result<u32, RuntimeError> {
        let row = Admit {
            lane,
            prompt,
            max_new,
            sampling,
        };
        Ok(self.admit_lanes(&[row])?[0])
    }

    /// Admits several free lanes, every chunk of their prefills here
    /// ([`CudaSpecSession::begin_admission`]). Each lane's first token, in list order.
    pub fn admit_lanes(&mut self, rows: &[Admit]) -> Result<Vec<u32>, RuntimeError> {
        if !self.pending.is_empty() {
            return Err(RuntimeError::Engine(
                "an admission is prefilling: run its chunks before admitting lanes whole".into(),
            ));
        }
        self.begin_admission(rows)?;
        let mut first = Vec::new();
        while !self.pending.is_empty() {
            match self.prefill_chunk() {
                Ok(armed) => first.extend(armed),
                Err(e) => {
                    // The admissions after the failing one are dropped too: nothing waits
                    // for them.
                    self.pending.clear();
                    return Err(e);
                }
            }
        }
        Ok(rows
            .iter()
            .map(|r| {
                first
                    .iter()
                    .find(|(l, _)| *l == r.lane)
                    .expect("every admitted lane is armed")
                    .1
            })
            .collect())
    }

    /// Queues the admission of free lanes: each alone at its [`CudaSpecSession::
    /// lone_window`], or, with [`CudaSpecSession::shrink_buckets`] on (tokens may then
    /// depend on the load), all together at the smallest window that holds them
    /// ([`CudaSpecSession::admission_window`]). Their chunks run in
    /// [`CudaSpecSession::prefill_chunk`] calls, after those of admissions queued before.
    pub fn begin_admission(&mut self, rows: &[Admit]) -> Result<(), RuntimeError> {
        let lanes = self.lanes;
        let busy = self.prefilling();
        if let Some(r) = rows
            .iter()
            .find(|r| r.lane >= lanes || busy.contains(&r.lane))
        {
            return Err(RuntimeError::Engine(format!(
                "lane {} is out of range ({lanes} lanes) or already being admitted",
                r.lane
            )));
        }
        if self.shrink {
            let at: Vec<usize> = rows.iter().map(|r| r.lane).collect();
            let g = self.group(rows, self.windows.covering(&at))?;
            self.pending.push_back(g);
            return Ok(());
        }
        for r in rows {
            let g = self.group(std::slice::from_ref(r), self.windows.lone(r.lane))?;
            self.pending.push_back(g);
        }
        Ok(())
    }

    /// Lanes whose admission is still prefilling.
    pub fn prefilling(&self) -> Vec<usize> {
        self.pending.iter().flat_map(PendingGroup::lanes).collect()
    }

    /// Drops lane `lane` from its admission in progress (its client went away): the lane
    /// stays free (budget 0); the rows its chunks wrote are never read.
    pub fn cancel_admission(&mut self, lane: usize) {
        for g in &mut self.pending {
            if let Some(i) = g.rows.iter().position(|r| r.lane == lane) {
                g.rows.remove(i);
                g.first.remove(i);
                g.slots.remove(i);
            }
        }
        self.pending.retain(|g| !g.rows.is_empty());
    }

    /// Runs the next chunk of the first queued admission; its lanes and first tokens when
    /// that chunk was its last (the lanes are armed: the next step advances them). An
    /// admission whose chunk fails is dropped.
    pub fn prefill_chunk(&mut self) -> Result<Vec<(usize, u32)>, RuntimeError> {
        let Some(mut g) = self.pending.pop_front() else {
            return Ok(Vec::new());
        };
        if !self.chunk(&mut g)? {
            self.pending.push_front(g);
            return Ok(Vec::new());
        }
        let first = self.arm(&g)?;
        Ok(g.lanes().zip(first).collect())
    }

    /// An admission of `rows` at window `(b, first lane)`, checked.
    fn group(&self, rows: &[Admit], window: (usize, usize)) -> Result<PendingGroup, RuntimeError> {
        let prompts: Vec<&[u32]> = rows.iter().map(|r| r.prompt).collect();
        let longest =
            admission::check_prompts(&prompts, self.contract.num_steps, self.max_context)?;
        let widest = match admission::lane_chunk(self.prefill_chunk, window.0) {
            0 => longest,
            c => longest.min(c),
        };
        let tb = prefill_bucket(widest);
        if tb as u64 > self.max_context {
            return Err(RuntimeError::ContextOverflow {
                needed: tb,
                max_context: self.max_context,
            });
        }
        Ok(PendingGroup {
            rows: rows
                .iter()
                .map(|r| Row {
                    lane: r.lane,
                    prompt: r.prompt.to_vec(),
                    max_new: r.max_new,
                    sampling: r.sampling,
                })
                .collect(),
            window,
            done: 0,
            first: vec![None; rows.len()],
            slots: vec![false; rows.len()],
            primed: !self.primes_lazily(),
        })
    }

    /// Every chunk of `g`, then its arming; first tokens in `g`'s order.
    fn run_group(&mut self, mut g: PendingGroup) -> Result<Vec<u32>, RuntimeError> {
        while !self.chunk(&mut g)? {}
        self.arm(&g)
    }

    /// Runs `g`'s next chunk: one target prefill of the window at the chunk's prompt bucket
    /// (the lanes of the window not in `g`, and those whose prompt ended, padding; at most
    /// `max(prefill chunk, window × MIN_PREFILL_T)` rows, [`admission::lane_chunk`]) and the
    /// method's draft priming of the same rows. Whether the prompts are done.
    fn chunk(&mut self, g: &mut PendingGroup) -> Result<bool, RuntimeError> {
        let at: Vec<usize> = g.lanes().collect();
        // Each lane's place inside the window (the prefill's batch rows).
        let rel: Vec<usize> = at.iter().map(|&l| l - g.window.1).collect();
        debug_assert!(rel.iter().all(|&r| r < g.window.0));
        if g.done == 0 {
            self.write_sampling(g, &at)?;
        }
        let prompts: Vec<&[u32]> = g.rows.iter().map(|r| r.prompt.as_slice()).collect();
        // The window is the group's for every chunk: each chunk takes the same rows per lane.
        let per_lane = admission::lane_chunk(self.prefill_chunk, g.window.0);
        let rows = admission::chunk_rows(&prompts, g.done, per_lane);
        let pre = admission::chunk_inputs(&rows);
        let (wb, tb) = (g.window.0, prefill_bucket(pre.t));
        self.stats.widest_prefill = self.stats.widest_prefill.max(wb * tb);
        let window = PrefillAt {
            b: wb,
            t: tb,
            lane: g.window.1,
        };
        let (tokens, pos) = place(&pre, &rel, wb, tb);
        // The first tokens are read only when a prompt ends in this chunk (the one sync of
        // an admission's chunks); under sampled acceptance the prefill draws them.
        let ends = rows.iter().any(|r| r.ends());
        let drawn = self
            .prefill(self.contract.target_prefill, window)?
            .io(FIRST_TOKEN)
            .is_ok();
        let chosen = if drawn { FIRST_TOKEN } else { "next_token" };
        let outs: &[&str] = if ends { &[chosen] } else { &[] };
        let out = self.run_prefill(true, window, &tokens, &pos, &[], outs)?;
        if ends {
            let chosen = read_i32(&out[0]);
            for (i, r) in rows.iter().enumerate() {
                if r.ends() {
                    g.first[i] = Some(chosen[rel[i]] as u32);
                }
            }
        }
        match self.contract.priming() {
            Priming::None => {}
            Priming::Prompt if !g.primed => {}
            Priming::Prompt => {
                self.run_prefill(false, window, &tokens, &pos, &[], &[])?;
            }
            Priming::Pairs { taps_width, .. } => {
                let taps = self.prefill_io(true, window, "taps")?;
                let row = taps.bytes as usize / (wb * tb);
                debug_assert_eq!(row % taps_width, 0);
                if let Some(pairs) = admission::eagle_pairs(&rows, pre.t) {
                    let tpb = prefill_bucket(pairs.inputs.t);
                    let (ht, hp) = place(&pairs.inputs, &rel, wb, tpb);
                    let runs: Vec<CopyRun> =
                        admission::eagle_hidden_runs(&pairs, &rel, tb, tpb, pre.t)
                            .into_iter()
                            .map(|r| r.scaled(row))
                            .collect();
                    let hidden = Input::Device {
                        from: &taps,
                        runs: &runs,
                    };
                    let head_at = PrefillAt { t: tpb, ..window };
                    self.run_prefill(false, head_at, &ht, &hp, &[(HIDDEN, hidden)], &[])?;
                }
                for (b, staged) in g.slots.iter_mut().enumerate() {
                    if let Some(src) = admission::eagle_slot_row(&rows, b, pre.t) {
                        let slot = self.staged_slot(at[b])?;
                        let s = admission::window_row(src, &rel, tb, pre.t) * row;
                        taps.copy_to(&slot, 0, s as u64, row as u64)?;
                        *staged = true;
                    }
                }
            }
            Priming::Context { taps_width, .. } => {
                // The target prefill's taps [wb, tb, W] are the drafter prefill's input
                // as they are, at the same (padded) positions: one copy of the whole buffer.
                let taps = self.prefill_io(true, window, "taps")?;
                debug_assert_eq!((taps.bytes as usize / (wb * tb)) % taps_width, 0);
                let input = self.prefill_io(false, window, HIDDEN)?;
                if input.bytes != taps.bytes {
                    return Err(RuntimeError::Engine(format!(
                        "{} holds {} bytes, {} {}",
                        input.what, input.bytes, taps.what, taps.bytes
                    )));
                }
                let runs = [CopyRun {
                    dst: 0,
                    src: 0,
                    len: taps.bytes as usize,
                }];
                let hidden = Input::Device {
                    from: &taps,
                    runs: &runs,
                };
                self.run_prefill(false, window, &tokens, &pos, &[(HIDDEN, hidden)], &[])?;
            }
        }
        g.done += pre.t;
        Ok(rows.iter().all(|r| r.start + r.len >= r.prompt.len()))
    }

    /// Lane `lane`'s bytes of the staged `eagle.hidden` lanes ([`staged_slots`]).
    fn staged_slot(&self, lane: usize) -> Result<DeviceSpan, RuntimeError> {
        let buf = self.staged_slots.as_ref().ok_or_else(|| {
            RuntimeError::Engine("EAGLE-3 priming without staged `eagle.hidden` lanes".into())
        })?;
        let per = self.lane_bytes(EAGLE_HIDDEN)?;
        Ok(DeviceSpan {
            buf: buf.clone(),
            offset: lane as u64 * per,
            bytes: per,
            what: format!("lane {lane} of the staged `{EAGLE_HIDDEN}`"),
        })
    }

    /// The admitted lanes' RNG streams and sampling knobs, which the prefills' draw of the
    /// first token reads.
    fn write_sampling(&self, g: &PendingGroup, at: &[usize]) -> Result<(), RuntimeError> {
        let sampling: Vec<LaneSampling> = g.rows.iter().map(|r| r.sampling).collect();
        if self.engine.state(STREAM).is_ok() {
            let streams: Vec<u32> = sampling.iter().map(|l| l.stream).collect();
            self.write_rows(&admission::stream_state(&streams), at)?;
        }
        if self.engine.state(SAMPLING).is_ok() {
            let bytes = admission::sampling_state(&sampling).f32_bytes();
            let per = bytes.len() / at.len();
            for (i, &lane) in at.iter().enumerate() {
                self.write_lane(SAMPLING, lane, &bytes[i * per..][..per])?;
            }
        }
        Ok(())
    }

    /// After `g`'s last chunk: arms its lanes' draft and step states and rings, the other
    /// lanes' states left as they are. The first tokens, in `g`'s order.
    fn arm(&mut self, g: &PendingGroup) -> Result<Vec<u32>, RuntimeError> {
        let k = self.contract.num_steps;
        let at: Vec<usize> = g.lanes().collect();
        let prompts: Vec<&[u32]> = g.rows.iter().map(|r| r.prompt.as_slice()).collect();
        let first: Vec<u32> = g
            .first
            .iter()
            .map(|f| f.expect("every prompt ends in a chunk"))
            .collect();
        match self.contract.priming() {
            Priming::None | Priming::Prompt => {}
            Priming::Pairs { depth, .. } => {
                let per = self.lane_bytes(EAGLE_HIDDEN)?;
                let state = self.engine.state(EAGLE_HIDDEN)?;
                for (&lane, &staged) in at.iter().zip(&g.slots) {
                    assert!(staged, "every prompt ends in a chunk");
                    let to = DeviceSpan {
                        buf: state.clone(),
                        offset: lane as u64 * per,
                        bytes: per,
                        what: format!("lane {lane} of state `{EAGLE_HIDDEN}`"),
                    };
                    self.staged_slot(lane)?.copy_to(&to, 0, 0, per)?;
                }
                for s in admission::eagle_states(&prompts, &first, depth) {
                    self.write_rows(&s, &at)?;
                }
            }
            Priming::Context { .. } => {
                let n = self.lane_bytes(DFLASH_HIDDEN)? as usize;
                for &lane in &at {
                    self.write_lane(DFLASH_HIDDEN, lane, &vec![0u8; n])?;
                }
                for s in admission::dflash_states(&prompts) {
                    self.write_rows(&s, &at)?;
                }
            }
        }
        for (i, r) in g.rows.iter().enumerate() {
            let one = [prompts[i]];
            for s in admission::step_states(&one, &first[i..=i], r.max_new, self.max_context, k) {
                self.write_rows(&s, &at[i..=i])?;
            }
        }
        for &lane in &at {
            self.ring.reset_lane(lane)?;
        }
        self.engine.synchronize()?;
        for (((&lane, p), &f), r) in at.iter().zip(&prompts).zip(&first).zip(&g.rows) {
            self.admit_draft(lane, p, f, g.primed);
            self.policy.admit(lane);
            self.admitted[lane] = true;
            self.sampled[lane] = r.sampling.temperature > 0.0;
            self.undrained[lane].clear();
        }
        Ok(first)
    }
}
