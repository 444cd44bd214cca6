//! Chunked admission on the CPU backend: a lane's prompt is prefilled in chunks of at most
//! the session's prefill chunk, one chunk per [`SpecCpuSession::prefill_chunk`] call, so a
//! host can run the other lanes' steps between them. The chunks run at batch 1 on states
//! of the admission's own (the live lanes' states are never touched), which are copied
//! into the lane after the last chunk: only then is the lane armed.

use std::collections::HashMap;
use std::time::Instant;

use specc_ir::interp::Tensor;

use super::SpecCpuSession;
use crate::admission::{self, Admit, LaneSampling};
use crate::RuntimeError;

/// One lane's admission in progress.
pub(super) struct PendingLane {
    lane: usize,
    prompt: Vec<u32>,
    max_new: usize,
    sampling: LaneSampling,
    /// Prompt rows prefilled so far.
    done: usize,
    /// The admission's batch-1 states (caches and draft states of the rows so far).
    states: HashMap<String, Tensor>,
    /// Whether the draft prefill is skipped (plain decoding ran when it began).
    unprimed: bool,
    first: Option<u32>,
    began: Instant,
}

impl SpecCpuSession<'_> {
    /// Sets the most rows one prefill takes across the lanes prefilled together (0: whole
    /// prompts in one prefill): each of `n` lanes takes [`admission::lane_chunk`]`(chunk,
    /// n)` rows per chunk (a lane admitted alone, `chunk`). A power of two from the
    /// smallest prompt bucket ([`admission::check_chunk`]).
    pub fn set_prefill_chunk(&mut self, chunk: usize) -> Result<(), RuntimeError> {
        admission::check_chunk(chunk, self.max_context)?;
        self.prefill_chunk = chunk;
        Ok(())
    }

    /// Queues lane `row.lane`'s admission (a free lane): its chunks run in
    /// [`SpecCpuSession::prefill_chunk`] calls, after those of admissions queued before.
    pub fn begin_admission(&mut self, row: &Admit) -> Result<(), RuntimeError> {
        if row.lane >= self.lanes {
            return Err(RuntimeError::Engine(format!(
                "lane {} is out of range: the session has {} lanes",
                row.lane, self.lanes
            )));
        }
        if self.pending.iter().any(|p| p.lane == row.lane) {
            return Err(RuntimeError::Engine(format!(
                "lane {} is already being admitted",
                row.lane
            )));
        }
        let k = self.graphs.contract.num_steps;
        admission::check_prompts(&[row.prompt], k, self.max_context)?;
        // While the policy runs plain decoding a standalone draft's prefill would be wasted:
        // the lane joins unprimed and the first speculative step re-primes it (DraftSync).
        let plain_now = self
            .policy
            .current()
            .is_some_and(|v| self.policy.ks()[v] == 0);
        self.pending.push_back(PendingLane {
            lane: row.lane,
            prompt: row.prompt.to_vec(),
            max_new: row.max_new,
            sampling: row.sampling,
            done: 0,
            states: HashMap::new(),
            unprimed: plain_now && self.policy.switches() && self.sync.can_reprime(),
            first: None,
            began: Instant::now(),
        });
        Ok(())
    }

    /// Lanes whose admission is still prefilling.
    pub fn prefilling(&self) -> Vec<usize> {
        self.pending.iter().map(|p| p.lane).collect()
    }

    /// Drops lane `lane`'s admission in progress (its client went away): the lane stays
    /// free, nothing of it was written into the session's states.
    pub fn cancel_admission(&mut self, lane: usize) {
        self.pending.retain(|p| p.lane != lane);
    }

    /// Runs the next chunk of the first queued admission; the lane and its first token when
    /// that chunk was its last (the lane is armed: the next step advances it). An
    /// admission whose chunk fails is dropped.
    pub fn prefill_chunk(&mut self) -> Result<Vec<(usize, u32)>, RuntimeError> {
        let Some(mut p) = self.pending.pop_front() else {
            return Ok(Vec::new());
        };
        let full = std::mem::replace(&mut self.states, std::mem::take(&mut p.states));
        let rows = std::mem::replace(&mut self.rows, 1);
        let drained = std::mem::take(&mut self.drained);
        self.skip_priming = p.unprimed;
        let ran = self.pending_chunk(&mut p);
        self.skip_priming = false;
        p.states = std::mem::replace(&mut self.states, full);
        self.rows = rows;
        self.drained = drained;
        let Some(first) = ran? else {
            self.pending.push_front(p);
            return Ok(Vec::new());
        };
        if p.lane >= self.rows {
            self.resize(p.lane + 1)?;
        }
        for (name, t) in &p.states {
            self.put_lane(name, p.lane, t)?;
        }
        self.drained[p.lane] = 0;
        self.admitted(p.lane, &p.prompt, first);
        if p.unprimed {
            self.sync.admit_unprimed(p.lane, &p.prompt, first);
        }
        if crate::policy::trace_on() {
            crate::policy::trace(format_args!(
                "admit lane={} prompt={}{} {:.2}ms",
                p.lane,
                p.prompt.len(),
                if p.unprimed { " unprimed" } else { "" },
                p.began.elapsed().as_secs_f64() * 1e3
            ));
        }
        Ok(vec![(p.lane, first)])
    }

    /// One chunk of `p` over the session's states (swapped for `p`'s, at batch 1); its
    /// first token once the prompt is done and the states armed.
    fn pending_chunk(&mut self, p: &mut PendingLane) -> Result<Option<u32>, RuntimeError> {
        let prompt = [p.prompt.as_slice()];
        if p.done == 0 {
            self.begin_states(&prompt, &[p.sampling])?;
        }
        let per_lane = admission::lane_chunk(self.prefill_chunk, prompt.len());
        let rows = admission::chunk_rows(&prompt, p.done, per_lane);
        let mut first = [p.first];
        self.run_chunk(&rows, &mut first)?;
        p.first = first[0];
        p.done += rows[0].len;
        if p.done < p.prompt.len() {
            return Ok(None);
        }
        let first = p.first.expect("the last chunk chose the first token");
        self.arm(&prompt, &[first], p.max_new)?;
        Ok(Some(first))
    }
}
