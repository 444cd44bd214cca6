//! What a host loop needs from a backend: admit a batch, run steps, read emitted tokens.

use crate::admission::{Admit, LaneSampling};
use crate::{AdaptivePolicy, RuntimeError, SpecStats};

/// What [`Speculator::drain_behind`] read.
pub struct Behind {
    /// Per lane, the tokens of the steps read.
    pub tokens: Vec<Vec<u32>>,
    /// Per lane, whether it was live after the last step read.
    pub live: Vec<bool>,
    /// Whether a step queued is not read yet (its tokens come with the next read).
    pub unread: bool,
}

/// A batch of lanes advanced one (speculative) step at a time; implemented by the CPU
/// interpreter backend and the CUDA graph backend over the same graphs.
pub trait Speculator {
    /// Prefills every lane and arms the device state; each lane's first token.
    fn admit(&mut self, prompts: &[Vec<u32>], max_new: usize) -> Result<Vec<u32>, RuntimeError>;
    /// Lanes of the session.
    fn lanes(&self) -> usize;
    /// Prefills lane `lane` alone, keeping every other lane's state (continuous batching);
    /// the lane's first token. Under sampled acceptance the lane draws with `sampling`'s
    /// knobs (temperature 0: greedy) from its RNG stream (the same stream, knobs, prompt and
    /// budget give the same tokens in any lane); a greedy engine ignores them.
    fn admit_lane(
        &mut self,
        lane: usize,
        prompt: &[u32],
        max_new: usize,
        sampling: LaneSampling,
    ) -> Result<u32, RuntimeError>;
    /// Prefills several free lanes (as [`Speculator::admit_lane`] each); a backend may run
    /// them in one prefill. Their first tokens, in list order.
    fn admit_lanes(&mut self, rows: &[Admit]) -> Result<Vec<u32>, RuntimeError> {
        rows.iter()
            .map(|r| self.admit_lane(r.lane, r.prompt, r.max_new, r.sampling))
            .collect()
    }
    /// Sets the most rows one prefill takes across the lanes admitted together (0: whole
    /// prompts in one prefill): a power of two from the smallest prompt bucket. Every
    /// admission of `n` lanes prefills its prompts in chunks of
    /// [`crate::admission::lane_chunk`]`(chunk, n)` rows per lane at positions `c·that ..`,
    /// each attending to the rows before it; a lane's tokens are those of a whole prefill.
    fn set_prefill_chunk(&mut self, chunk: usize) -> Result<(), RuntimeError>;
    /// Queues the admission of free lanes without prefilling anything: its chunks run one
    /// per [`Speculator::prefill_chunk`] call, so the other lanes may step between them.
    /// The lanes are armed (stepped from then on) only after their last chunk.
    fn begin_admission(&mut self, rows: &[Admit]) -> Result<(), RuntimeError>;
    /// Runs one prefill (within the chunk's budget of rows) of the first queued admission; the
    /// lanes it armed, with their first tokens (none before an admission's last chunk).
    /// On an error the failing admission is dropped: its lanes leave
    /// [`Speculator::prefilling`].
    fn prefill_chunk(&mut self) -> Result<Vec<(usize, u32)>, RuntimeError>;
    /// Lanes whose queued admission has not been armed yet.
    fn prefilling(&self) -> Vec<usize>;
    /// Drops lane `lane` from the queued admissions (its client went away); it stays free.
    fn cancel_admission(&mut self, lane: usize);
    /// The knobs of a lane admitted without its own (the engine's acceptance), on RNG
    /// stream `stream`.
    fn default_sampling(&self, stream: u32) -> LaneSampling;
    /// Queues one step.
    fn step(&mut self) -> Result<(), RuntimeError>;
    /// Queues one step of a batch whose lanes from `n` on are all free or finished: the
    /// backend may run it at a smaller batch bucket holding lanes `0..n`.
    fn step_upto(&mut self, n: usize) -> Result<(), RuntimeError> {
        let _ = n;
        self.step()
    }
    /// Tokens emitted since the last drain, per lane.
    fn drain(&mut self) -> Result<Vec<Vec<u32>>, RuntimeError>;
    /// Lanes whose budget is not exhausted.
    fn live(&self) -> Result<Vec<bool>, RuntimeError>;
    /// The tokens of every queued step but the newest (which may still run), per lane, and
    /// which lanes were live after the last of them (a lane admitted since counts as live):
    /// a host that queues its next step before reading the last keeps the device busy
    /// while it handles tokens. A backend that runs each step as it is queued reads them
    /// all ([`Speculator::drain`], [`Speculator::live`]).
    fn drain_behind(&mut self) -> Result<Behind, RuntimeError> {
        self.drain_all()
    }
    /// Every queued step's tokens and the lanes live after them ([`Speculator::drain`],
    /// [`Speculator::live`]): nothing is left unread.
    fn drain_all(&mut self) -> Result<Behind, RuntimeError> {
        let tokens = self.drain()?;
        Ok(Behind {
            tokens,
            live: self.live()?,
            unread: false,
        })
    }
    /// Masks lane `b` from the next step on (EOS, client gone).
    fn finish(&mut self, b: usize) -> Result<(), RuntimeError>;
    fn stats(&self) -> &SpecStats;
    fn stats_mut(&mut self) -> &mut SpecStats;
    /// Which step variant each step runs (adaptive speculation), with its counts.
    fn policy(&self) -> &AdaptivePolicy;
    fn policy_mut(&mut self) -> &mut AdaptivePolicy;
}

impl Speculator for crate::SpecCpuSession<'_> {
    fn lanes(&self) -> usize {
        crate::SpecCpuSession::lanes(self)
    }
    fn admit_lane(
        &mut self,
        lane: usize,
        prompt: &[u32],
        max_new: usize,
        sampling: LaneSampling,
    ) -> Result<u32, RuntimeError> {
        crate::SpecCpuSession::admit_lane(self, lane, prompt, max_new, sampling)
    }
    fn set_prefill_chunk(&mut self, chunk: usize) -> Result<(), RuntimeError> {
        crate::SpecCpuSession::set_prefill_chunk(self, chunk)
    }
    fn begin_admission(&mut self, rows: &[Admit]) -> Result<(), RuntimeError> {
        rows.iter()
            .try_for_each(|r| crate::SpecCpuSession::begin_admission(self, r))
    }
    fn prefill_chunk(&mut self) -> Result<Vec<(usize, u32)>, RuntimeError> {
        crate::SpecCpuSession::prefill_chunk(self)
    }
    fn prefilling(&self) -> Vec<usize> {
        crate::SpecCpuSession::prefilling(self)
    }
    fn cancel_admission(&mut self, lane: usize) {
        crate::SpecCpuSession::cancel_admission(self, lane)
    }
    fn default_sampling(&self, stream: u32) -> LaneSampling {
        LaneSampling::defaults(self.acceptance(), stream)
    }
    fn step_upto(&mut self, n: usize) -> Result<(), RuntimeError> {
        crate::SpecCpuSession::step_upto(self, n)
    }
    fn admit(&mut self, prompts: &[Vec<u32>], max_new: usize) -> Result<Vec<u32>, RuntimeError> {
        crate::SpecCpuSession::admit(self, prompts, max_new)
    }
    fn step(&mut self) -> Result<(), RuntimeError> {
        crate::SpecCpuSession::step(self)
    }
    fn drain(&mut self) -> Result<Vec<Vec<u32>>, RuntimeError> {
        crate::SpecCpuSession::drain(self)
    }
    fn live(&self) -> Result<Vec<bool>, RuntimeError> {
        Ok(crate::SpecCpuSession::live(self))
    }
    fn finish(&mut self, b: usize) -> Result<(), RuntimeError> {
        crate::SpecCpuSession::finish(self, b);
        Ok(())
    }
    fn stats(&self) -> &SpecStats {
        &self.stats
    }
    fn stats_mut(&mut self) -> &mut SpecStats {
        &mut self.stats
    }
    fn policy(&self) -> &AdaptivePolicy {
        crate::SpecCpuSession::policy(self)
    }
    fn policy_mut(&mut self) -> &mut AdaptivePolicy {
        crate::SpecCpuSession::policy_mut(self)
    }
}

#[cfg(feature = "cuda")]
impl Speculator for crate::cuda::CudaSpecSession<'_> {
    fn lanes(&self) -> usize {
        crate::cuda::CudaSpecSession::lanes(self)
    }
    fn admit_lane(
        &mut self,
        lane: usize,
        prompt: &[u32],
        max_new: usize,
        sampling: LaneSampling,
    ) -> Result<u32, RuntimeError> {
        crate::cuda::CudaSpecSession::admit_lane(self, lane, prompt, max_new, sampling)
    }
    fn admit_lanes(&mut self, rows: &[Admit]) -> Result<Vec<u32>, RuntimeError> {
        crate::cuda::CudaSpecSession::admit_lanes(self, rows)
    }
    fn set_prefill_chunk(&mut self, chunk: usize) -> Result<(), RuntimeError> {
        crate::cuda::CudaSpecSession::set_prefill_chunk(self, chunk)
    }
    fn begin_admission(&mut self, rows: &[Admit]) -> Result<(), RuntimeError> {
        crate::cuda::CudaSpecSession::begin_admission(self, rows)
    }
    fn prefill_chunk(&mut self) -> Result<Vec<(usize, u32)>, RuntimeError> {
        crate::cuda::CudaSpecSession::prefill_chunk(self)
    }
    fn prefilling(&self) -> Vec<usize> {
        crate::cuda::CudaSpecSession::prefilling(self)
    }
    fn cancel_admission(&mut self, lane: usize) {
        crate::cuda::CudaSpecSession::cancel_admission(self, lane)
    }
    fn default_sampling(&self, stream: u32) -> LaneSampling {
        LaneSampling::defaults(&self.engine.engine.acceptance, stream)
    }
    fn admit(&mut self, prompts: &[Vec<u32>], max_new: usize) -> Result<Vec<u32>, RuntimeError> {
        crate::cuda::CudaSpecSession::admit(self, prompts, max_new)
    }
    fn step_upto(&mut self, n: usize) -> Result<(), RuntimeError> {
        crate::cuda::CudaSpecSession::step_upto(self, n)
    }
    fn step(&mut self) -> Result<(), RuntimeError> {
        crate::cuda::CudaSpecSession::step(self)
    }
    fn drain(&mut self) -> Result<Vec<Vec<u32>>, RuntimeError> {
        // Acceptance is counted as the ring is read: a lane's tokens of one step are a + 1.
        crate::cuda::CudaSpecSession::drain(self)
    }
    fn live(&self) -> Result<Vec<bool>, RuntimeError> {
        crate::cuda::CudaSpecSession::live(self)
    }
    fn drain_behind(&mut self) -> Result<Behind, RuntimeError> {
        crate::cuda::CudaSpecSession::drain_behind(self)
    }
    fn finish(&mut self, b: usize) -> Result<(), RuntimeError> {
        crate::cuda::CudaSpecSession::finish(self, b)
    }
    fn stats(&self) -> &SpecStats {
        &self.stats
    }
    fn stats_mut(&mut self) -> &mut SpecStats {
        &mut self.stats
    }
    fn policy(&self) -> &AdaptivePolicy {
        crate::cuda::CudaSpecSession::policy(self)
    }
    fn policy_mut(&mut self) -> &mut AdaptivePolicy {
        crate::cuda::CudaSpecSession::policy_mut(self)
    }
}
