//! Keeps a standalone draft's cache whole across plain steps (adaptive speculation).
//!
//! `draft_model`'s invariant: at a speculative step's start the draft cache holds slots
//! `0..len-1` (its first forward re-reads `[x(len-1), x(len)]`). A plain step (k = 0)
//! runs no draft, so from the first plain step at length `n0` on the cache holds
//! `0..n0-1` only. Before the next speculative step the host runs the draft prefill over
//! the committed tokens `x(n0-1) .. x(len-2)` at their positions, restoring the invariant.
//!
//! The host has those tokens: a lane's committed sequence is its prompt, the first token
//! admission returned, then every token the ring emitted (`len = prompt + emitted`, and
//! `x(len)` is the last emitted token), so [`DraftSync`] keeps each lane's tokens as the
//! backend reads them from the ring. A lane becomes "behind" only when a plain step runs
//! while its tokens are all read, so its `len` is known without reading device state.
//! Only exactness-neutral state moves: the draft cache feeds proposals, never the output.

use specc_ir::engine::Priming;

use crate::admission::PrefillInputs;

/// Per lane: its committed tokens and where its draft cache stops.
#[derive(Clone, Debug, Default)]
pub struct DraftSync {
    /// Whether the method's draft can be re-primed from tokens (a standalone draft).
    enabled: bool,
    tokens: Vec<Vec<u32>>,
    /// The first position the draft cache misses, for a lane that ran plain steps.
    behind: Vec<Option<usize>>,
    /// Lanes admitted without priming their draft.
    unprimed: u64,
}

impl DraftSync {
    /// Bookkeeping for `lanes` lanes of a method primed by `priming`.
    pub fn new(priming: Priming, lanes: usize) -> DraftSync {
        DraftSync {
            enabled: priming == Priming::Prompt,
            tokens: vec![Vec::new(); lanes],
            behind: vec![None; lanes],
            unprimed: 0,
        }
    }

    /// Whether plain steps can be taken and undone (a standalone draft).
    pub fn can_reprime(&self) -> bool {
        self.enabled
    }

    /// Lane `lane` was admitted with `prompt`; `first` is its token after the prompt.
    pub fn admit(&mut self, lane: usize, prompt: &[u32], first: u32) {
        if lane >= self.tokens.len() {
            self.tokens.resize(lane + 1, Vec::new());
            self.behind.resize(lane + 1, None);
        }
        self.tokens[lane] = prompt.to_vec();
        self.tokens[lane].push(first);
        self.behind[lane] = None;
    }

    /// Lane `lane` was admitted with `prompt` without priming its draft (plain decoding ran
    /// when it joined): its cache holds nothing, so the lane is behind from slot 0 and the
    /// next speculative step first re-primes all of it.
    pub fn admit_unprimed(&mut self, lane: usize, prompt: &[u32], first: u32) {
        self.admit(lane, prompt, first);
        if self.enabled {
            self.behind[lane] = Some(0);
            self.unprimed += 1;
        }
    }

    /// Lanes admitted without priming their draft ([`DraftSync::admit_unprimed`]).
    pub fn unprimed_admissions(&self) -> u64 {
        self.unprimed
    }

    /// Tokens read from lane `lane`'s ring.
    pub fn emitted(&mut self, lane: usize, tokens: &[u32]) {
        if let Some(t) = self.tokens.get_mut(lane) {
            t.extend_from_slice(tokens);
        }
    }

    /// Per lane, its sequence length (the step's `len`: committed tokens − 1) as of the
    /// tokens read so far; 0 for a lane never admitted. A finished lane keeps its last.
    pub fn lengths(&self) -> impl Iterator<Item = i64> + '_ {
        self.tokens.iter().map(|t| t.len().saturating_sub(1) as i64)
    }

    /// Whether a plain step over `live` would leave a lane's draft behind at an unknown
    /// length: the backend must read every ring first.
    pub fn needs_tokens_before_plain(&self, live: &[bool]) -> bool {
        self.enabled
            && live
                .iter()
                .zip(&self.behind)
                .any(|(&l, b)| l && b.is_none())
    }

    /// A plain step is about to run over `live` (every ring read): lanes whose draft was
    /// whole now miss slots from `len - 1` on.
    pub fn plain_step(&mut self, live: &[bool]) {
        if !self.enabled {
            return;
        }
        for (lane, &l) in live.iter().enumerate() {
            if l && self.behind[lane].is_none() && self.tokens[lane].len() >= 2 {
                // len = tokens − 1; the cache holds slots 0..len-1.
                self.behind[lane] = Some(self.tokens[lane].len() - 2);
            }
        }
    }

    /// Whether a lane in `live` needs its draft re-primed before a speculative step.
    pub fn behind(&self, live: &[bool]) -> bool {
        self.enabled
            && live
                .iter()
                .zip(&self.behind)
                .any(|(&l, b)| l && b.is_some())
    }

    /// Each lane of `live` (below `lanes`) that is behind: `(lane, from, upto)`, its draft
    /// cache missing slots `from..upto` (`upto` = len − 1, len = tokens − 1).
    fn gaps(&self, live: &[bool], lanes: usize) -> Vec<(usize, usize, usize)> {
        (0..lanes.min(live.len()))
            .filter(|&b| live[b])
            .filter_map(|b| Some((b, self.behind[b]?, self.tokens[b].len().saturating_sub(2))))
            .collect()
    }

    /// The prefill row-tokens [`DraftSync::reprime`] would run now over `live` with
    /// `lanes` rows: `lanes` × the longest gap (from the tokens read so far), 0 when no
    /// lane is behind.
    pub fn backlog(&self, live: &[bool], lanes: usize) -> usize {
        let gaps = self.gaps(live, lanes);
        lanes
            * gaps
                .iter()
                .map(|&(_, f, u)| u.saturating_sub(f))
                .max()
                .unwrap_or(0)
    }

    /// The draft prefill that re-primes every lane of `live` that is behind (every ring
    /// read), `lanes` rows of `t` = the longest gap; other rows are padding (position −1).
    /// Marks those lanes whole. `None` when no lane is behind.
    pub fn reprime(&mut self, live: &[bool], lanes: usize) -> Option<PrefillInputs> {
        let gaps = self.gaps(live, lanes);
        let t = gaps.iter().map(|&(_, f, u)| u.saturating_sub(f)).max()?;
        for &(b, _, _) in &gaps {
            self.behind[b] = None;
        }
        if t == 0 {
            return None;
        }
        let mut tokens = vec![0i64; lanes * t];
        let mut positions = vec![-1i64; lanes * t];
        for (b, from, upto) in gaps {
            for (j, p) in (from..upto).enumerate() {
                tokens[b * t + j] = self.tokens[b][p] as i64;
                positions[b * t + j] = p as i64;
            }
        }
        Some(PrefillInputs {
            t,
            tokens,
            positions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_stretch_is_reprimed_from_the_slot_before_it_to_len_minus_two() {
        let mut s = DraftSync::new(Priming::Prompt, 2);
        s.admit(0, &[10, 11, 12], 13); // len 3: x(0..3) in the cache, pending [12, 13]
        s.admit(1, &[20, 21], 22);
        assert!(s.needs_tokens_before_plain(&[true, false]));
        s.plain_step(&[true, false]); // lane 0 misses slot 2 on; lane 1 not in the step
        s.emitted(0, &[14]); // len 4
        s.plain_step(&[true, false]);
        s.emitted(0, &[15]); // len 5: the cache must hold slots 0..=3
        assert_eq!(s.lengths().collect::<Vec<_>>(), vec![5, 2]);
        assert!(!s.needs_tokens_before_plain(&[true, false]));
        assert!(s.behind(&[true, true]));
        assert_eq!(
            s.backlog(&[true, true], 2),
            2 * 2,
            "2 rows of the 2-token gap"
        );
        let r = s.reprime(&[true, true], 2).expect("lane 0 is behind");
        assert_eq!(r.t, 2);
        assert_eq!(r.tokens, vec![12, 13, 0, 0]);
        assert_eq!(r.positions, vec![2, 3, -1, -1]);
        assert!(!s.behind(&[true, true]));
        assert_eq!(s.backlog(&[true, true], 2), 0);
        assert!(s.reprime(&[true, true], 2).is_none());
    }

    #[test]
    fn an_unprimed_lane_is_reprimed_from_slot_zero() {
        let mut s = DraftSync::new(Priming::Prompt, 1);
        s.admit_unprimed(0, &[10, 11, 12], 13); // len 3: slots 0..=1 must be cached
        assert!(s.behind(&[true]));
        s.emitted(0, &[14]); // len 4: slots 0..=2
        assert_eq!(s.unprimed_admissions(), 1);
        assert_eq!(s.backlog(&[true], 1), 3, "the whole sequence");
        let r = s.reprime(&[true], 1).expect("the lane is behind");
        assert_eq!(r.tokens, vec![10, 11, 12]);
        assert_eq!(r.positions, vec![0, 1, 2]);
        assert!(!s.behind(&[true]));
    }

    #[test]
    fn methods_with_target_hidden_states_never_reprime() {
        let mut s = DraftSync::new(
            Priming::Context {
                taps_width: 8,
                rows: 4,
            },
            1,
        );
        s.admit(0, &[1, 2], 3);
        assert!(!s.can_reprime());
        s.plain_step(&[true]);
        assert!(!s.behind(&[true]));
    }
}
