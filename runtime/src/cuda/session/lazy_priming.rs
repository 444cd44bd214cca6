//! Lazy draft priming on the device, as on the CPU (`SpecCpuSession::admit_lane`): a lane
//! that joins while the policy runs plain decoding skips a standalone draft's prefill,
//! which plain steps would leave behind anyway, and joins unprimed ([`DraftSync`]): the
//! first speculative step re-primes its whole draft cache from its committed tokens
//! (`CudaSpecSession::sync_draft`). Only a draft primed from tokens can wait; a draft that
//! reads the target prefill's taps (EAGLE-3, DFlash, DDTree) is primed at admission, and
//! its plain steps keep it whole.
//!
//! [`DraftSync`]: crate::draft_sync::DraftSync

use super::CudaSpecSession;

impl CudaSpecSession<'_> {
    /// Whether an admission now skips the draft prefill: plain decoding is the current
    /// variant, the policy switches, and the draft can be re-primed from tokens.
    pub(super) fn primes_lazily(&self) -> bool {
        let plain_now = self
            .policy
            .current()
            .is_some_and(|v| self.policy.ks()[v] == 0);
        plain_now && self.policy.switches() && self.sync.can_reprime()
    }

    /// Records lane `lane`'s admission (`prompt`, first token `first`) with the draft
    /// primed (`primed`) or left to the first speculative step.
    pub(super) fn admit_draft(&mut self, lane: usize, prompt: &[u32], first: u32, primed: bool) {
        match primed {
            true => self.sync.admit(lane, prompt, first),
            false => self.sync.admit_unprimed(lane, prompt, first),
        }
    }

    /// Admissions that skipped the draft prefill because plain decoding was running.
    pub fn unprimed_admissions(&self) -> u64 {
        self.sync.unprimed_admissions()
    }
}
