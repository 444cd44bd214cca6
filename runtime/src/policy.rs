//! Adaptive speculation: which step graph the next step runs.
//!
//! An engine's speculative contract lists the step graphs of its method over one set of
//! states ([`StepContract::step_variants`]): the configured k and, for methods that can
//! switch, smaller k and plain decoding (k = 0). Any variant may follow any other, so the
//! host picks one between steps. Both backends drive the same [`AdaptivePolicy`]:
//!
//! - **Acceptance**: per lane, an exponential moving average of the per-position acceptance
//!   rate `α_j` (position `j` accepted given `1..j` were), updated from each speculative
//!   step's accepted count `a` of `k` (positions `1..=a` accepted, `a + 1` rejected when
//!   `a < k`): what the host reads from the token ring anyway (a lane's tokens of one step
//!   are `a + 1`). A lane starts from the session-wide average, which every observation
//!   also updates. Expected tokens of one lane-step at `k`: `1 + Σ_{i ≤ k} Π_{j ≤ i} α_j`.
//! - **Step times** per (batch bucket, variant), measured when a bucket is first used (a
//!   few timed runs of each variant on scratch states: replays on CUDA, interpreter runs on
//!   the CPU) and, where a step's time is known without a sync (the CPU), refined by an
//!   average of the steps that ran.
//! - **Choice**: the variant with the most expected tokens per second over the lanes in the
//!   step, kept unless another beats it by [`HYSTERESIS`] (no flapping on noise).
//! - **Probing**: acceptance is learnt from speculative steps only, so while plain decoding
//!   wins the estimates freeze. When a speculative variant could still win with every draft
//!   token accepted, one step of it runs after [`PROBE_FIRST`] plain steps, then after
//!   twice as many each time plain stays ahead (up to [`PROBE_LAST`]).
//!
//! Switching keeps every lane exact: verify accepts only the target's own tokens whatever
//! the draft proposed. It does move the draft: a plain step leaves a standalone draft's
//! cache behind, which [`crate::draft_sync::DraftSync`] re-primes before the next
//! speculative step. Methods whose draft cannot be re-primed (EAGLE-3, DFlash, DDTree read
//! target hidden states a plain step does not keep) have no variants: the policy never
//! switches them. Under sampled acceptance the draws of a step depend on its k, so a seed's
//! tokens would depend on the load: the CLI defaults to `fixed` there.

use std::collections::{HashMap, VecDeque};
use std::fmt;

/// How the host picks each step's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecPolicy {
    /// The highest expected goodput, from measured step times and running acceptance.
    Adaptive,
    /// Always the configured k.
    Fixed,
}

impl fmt::Display for SpecPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpecPolicy::Adaptive => "adaptive",
            SpecPolicy::Fixed => "fixed",
        })
    }
}

/// A switch must promise this much more goodput than the current variant.
pub const HYSTERESIS: f64 = 0.05;
/// Weight of one observation in a lane's acceptance average.
const LANE_EMA: f64 = 0.2;
/// Weight of one observation in the session-wide average new lanes start from.
const PRIOR_EMA: f64 = 0.02;
/// Acceptance assumed before any observation.
const PRIOR_ALPHA: f64 = 0.7;
/// Weight of one measured step in a variant's time.
const TIME_EMA: f64 = 0.1;
/// Plain steps before the first probe of a speculative variant, and the most between two.
pub const PROBE_FIRST: u64 = 64;
pub const PROBE_LAST: u64 = 4096;

/// The policy's state: acceptance per lane, step times per bucket, the current choice.
#[derive(Clone, Debug)]
pub struct AdaptivePolicy {
    /// Draft tokens of each variant, ascending (the variant's index is its position).
    ks: Vec<usize>,
    /// The configured variant (the largest k).
    configured: usize,
    mode: SpecPolicy,
    prior: Vec<f64>,
    lanes: Vec<Vec<f64>>,
    /// Seconds per step, by (bucket, variant).
    times: HashMap<(usize, usize), f64>,
    current: Option<usize>,
    /// The variant of the last step (the current one, or a probe).
    last: Option<usize>,
    plain_run: u64,
    probe_after: u64,
    forced: VecDeque<usize>,
    /// Lanes whose tokens must not depend on the variant (sampled lanes: a step's draws
    /// depend on its k): while one is live every step runs the configured variant.
    pinned: Vec<bool>,
    /// Steps run per variant.
    steps: Vec<u64>,
}

impl AdaptivePolicy {
    /// A policy over variants of `ks` draft tokens (ascending; the last is the configured
    /// k) for `lanes` lanes.
    pub fn new(ks: Vec<usize>, lanes: usize, mode: SpecPolicy) -> AdaptivePolicy {
        assert!(!ks.is_empty(), "a contract has at least its own step");
        let kmax = *ks.last().expect("not empty");
        let prior = vec![PRIOR_ALPHA; kmax];
        AdaptivePolicy {
            configured: ks.len() - 1,
            steps: vec![0; ks.len()],
            ks,
            mode,
            lanes: vec![prior.clone(); lanes],
            prior,
            times: HashMap::new(),
            current: None,
            last: None,
            plain_run: 0,
            probe_after: PROBE_FIRST,
            forced: VecDeque::new(),
            pinned: vec![false; lanes],
        }
    }

    /// Pins lane `lane` to the configured variant while it is live (`true`), or frees it:
    /// a sampled lane draws differently at each k, so its tokens for a seed would depend on
    /// which variants the load made the policy pick.
    pub fn pin(&mut self, lane: usize, pinned: bool) {
        if lane >= self.pinned.len() {
            self.pinned.resize(lane + 1, false);
        }
        self.pinned[lane] = pinned;
    }

    pub fn mode(&self) -> SpecPolicy {
        self.mode
    }

    pub fn set_mode(&mut self, mode: SpecPolicy) {
        self.mode = mode;
    }

    /// Draft tokens of each variant, ascending.
    pub fn ks(&self) -> &[usize] {
        &self.ks
    }

    /// Steps run per variant (indexed like [`AdaptivePolicy::ks`]).
    pub fn steps(&self) -> &[u64] {
        &self.steps
    }

    /// The variant the policy runs now (probes aside).
    pub fn current(&self) -> Option<usize> {
        self.current
    }

    /// The variant of the last step (a probe included).
    pub fn last(&self) -> Option<usize> {
        self.last
    }

    /// Whether the choice is not always the configured variant (so a backend has to
    /// measure step times and keep drafts in sync).
    pub fn switches(&self) -> bool {
        self.ks.len() > 1 && (self.mode == SpecPolicy::Adaptive || !self.forced.is_empty())
    }

    /// Test hook: the next steps run these variants, in order, whatever the policy says.
    pub fn force(&mut self, schedule: &[usize]) {
        assert!(
            schedule.iter().all(|&v| v < self.ks.len()),
            "a known variant"
        );
        self.forced.extend(schedule);
    }

    /// Whether step times at `bucket` are still to be measured.
    pub fn needs_times(&self, bucket: usize) -> bool {
        self.switches() && (0..self.ks.len()).any(|v| !self.times.contains_key(&(bucket, v)))
    }

    /// Sets a variant's step time at `bucket` (a measurement at load).
    pub fn set_time(&mut self, bucket: usize, variant: usize, seconds: f64) {
        self.times.insert((bucket, variant), seconds.max(1e-9));
    }

    /// Folds the measured time of a step that ran into its variant's average.
    pub fn observe_time(&mut self, bucket: usize, variant: usize, seconds: f64) {
        let t = self.times.entry((bucket, variant)).or_insert(seconds);
        *t += TIME_EMA * (seconds.max(1e-9) - *t);
    }

    /// Lane `lane` starts a new sequence: its acceptance is the session-wide average.
    pub fn admit(&mut self, lane: usize) {
        if lane >= self.lanes.len() {
            self.lanes.resize(lane + 1, self.prior.clone());
        }
        self.lanes[lane] = self.prior.clone();
    }

    /// A speculative step of variant `variant` accepted `accepted` draft tokens in `lane`.
    pub fn observe(&mut self, lane: usize, variant: usize, accepted: usize) {
        let k = self.ks[variant];
        if lane >= self.lanes.len() {
            self.lanes.resize(lane + 1, self.prior.clone());
        }
        for j in 0..k.min(accepted + 1) {
            let hit = if j < accepted { 1.0 } else { 0.0 };
            self.lanes[lane][j] += LANE_EMA * (hit - self.lanes[lane][j]);
            self.prior[j] += PRIOR_EMA * (hit - self.prior[j]);
        }
    }

    /// Expected tokens one step of `k` draft tokens emits in `lane`.
    pub fn expected_tokens(&self, lane: usize, k: usize) -> f64 {
        let alphas = self.lanes.get(lane).unwrap_or(&self.prior);
        let mut run = 1.0;
        let mut total = 1.0;
        for &a in &alphas[..k] {
            run *= a;
            total += run;
        }
        total
    }

    /// Expected tokens per second of `variant` at `bucket` over the lanes in `live`.
    pub fn goodput(&self, bucket: usize, variant: usize, live: &[bool]) -> f64 {
        let t = self.times.get(&(bucket, variant)).copied().unwrap_or(1.0);
        let tokens: f64 = live
            .iter()
            .enumerate()
            .filter(|(_, &l)| l)
            .map(|(lane, _)| self.expected_tokens(lane, self.ks[variant]))
            .sum();
        tokens / t
    }

    /// The variant of the next step at `bucket` over the lanes in `live`; counts it.
    pub fn choose(&mut self, bucket: usize, live: &[bool]) -> usize {
        let (v, probe) = self.pick(bucket, live);
        self.steps[v] += 1;
        self.last = Some(v);
        // A probe is not the policy's choice: the next step starts from the current one.
        if !probe {
            self.current = Some(v);
        }
        v
    }

    /// The variant, and whether it is a probe.
    fn pick(&mut self, bucket: usize, live: &[bool]) -> (usize, bool) {
        if let Some(v) = self.forced.pop_front() {
            return (v, false);
        }
        if self.mode == SpecPolicy::Fixed || self.ks.len() == 1 {
            return (self.configured, false);
        }
        let pinned = |(lane, &l): (usize, &bool)| l && self.pinned.get(lane) == Some(&true);
        if live.iter().enumerate().any(pinned) {
            // Not the policy's choice: it resumes from its current variant afterwards.
            return (self.configured, true);
        }
        let n = self.ks.len();
        let good: Vec<f64> = (0..n).map(|v| self.goodput(bucket, v, live)).collect();
        let best = (0..n)
            .max_by(|&a, &b| good[a].total_cmp(&good[b]))
            .expect("at least one variant");
        let keep = match self.current {
            Some(c) if good[best] <= good[c] * (1.0 + HYSTERESIS) => c,
            _ => best,
        };
        if self.ks[keep] > 0 {
            self.plain_run = 0;
            if keep == best {
                self.probe_after = PROBE_FIRST;
            }
            return (keep, false);
        }
        self.plain_run += 1;
        let live_n = live.iter().filter(|&&l| l).count() as f64;
        let optimistic = |v: usize| {
            let t = self.times.get(&(bucket, v)).copied().unwrap_or(1.0);
            live_n * (self.ks[v] + 1) as f64 / t
        };
        let could_win = (0..n).any(|v| self.ks[v] > 0 && optimistic(v) > good[keep]);
        if could_win && self.plain_run >= self.probe_after {
            self.plain_run = 0;
            self.probe_after = (self.probe_after * 2).min(PROBE_LAST);
            let probe = (0..n)
                .filter(|&v| self.ks[v] > 0)
                .max_by(|&a, &b| good[a].total_cmp(&good[b]))
                .expect("a speculative variant");
            return (probe, true);
        }
        (keep, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain 1 ms, k=1 1.5 ms, k=3 2 ms, k=5 2.5 ms at bucket 1.
    fn policy(mode: SpecPolicy) -> AdaptivePolicy {
        let mut p = AdaptivePolicy::new(vec![0, 1, 3, 5], 1, mode);
        for (v, t) in [1.0, 1.5, 2.0, 2.5].into_iter().enumerate() {
            p.set_time(1, v, t * 1e-3);
        }
        p
    }

    fn feed(p: &mut AdaptivePolicy, variant: usize, accepted: usize, times: usize) {
        for _ in 0..times {
            p.observe(0, variant, accepted);
        }
    }

    #[test]
    fn high_acceptance_picks_the_longest_draft() {
        let mut p = policy(SpecPolicy::Adaptive);
        feed(&mut p, 3, 5, 50);
        assert!((p.expected_tokens(0, 5) - 6.0).abs() < 1e-3);
        // k=5: 6 tokens / 2.5 ms beats k=3: 4 / 2 ms, k=1: 2 / 1.5 ms and plain.
        assert_eq!(p.choose(1, &[true]), 3);
    }

    #[test]
    fn zero_acceptance_picks_plain_decoding() {
        let mut p = policy(SpecPolicy::Adaptive);
        feed(&mut p, 3, 0, 50);
        assert_eq!(p.choose(1, &[true]), 0);
    }

    #[test]
    fn middling_acceptance_picks_a_middle_k() {
        // α = 0.6 at every position: k=1 1.6/1.5 = 1.067, k=3 (1+.6+.36+.216)/2 = 1.088,
        // k=5 2.38/2.5 = 0.95, plain 1.0 (tokens per ms).
        let mut p = policy(SpecPolicy::Adaptive);
        p.lanes[0] = vec![0.6; 5];
        assert_eq!(p.choose(1, &[true]), 2);
    }

    #[test]
    fn hysteresis_keeps_the_current_variant_on_a_small_edge() {
        let mut p = policy(SpecPolicy::Adaptive);
        p.lanes[0] = vec![0.6; 5];
        assert_eq!(p.choose(1, &[true]), 2);
        // k=1 now 2 % ahead of k=3: not enough to switch.
        p.set_time(1, 1, 1.6 / (1.088 * 1.02) * 1e-3);
        assert!(p.goodput(1, 1, &[true]) > p.goodput(1, 2, &[true]));
        assert_eq!(p.choose(1, &[true]), 2);
        // 10 % ahead: switch.
        p.set_time(1, 1, 1.6 / (1.088 * 1.10) * 1e-3);
        assert_eq!(p.choose(1, &[true]), 1);
    }

    #[test]
    fn fixed_always_runs_the_configured_k_and_forced_schedules_come_first() {
        let mut p = policy(SpecPolicy::Fixed);
        feed(&mut p, 3, 0, 50);
        assert_eq!(p.choose(1, &[true]), 3);
        p.force(&[0, 1]);
        assert_eq!((p.choose(1, &[true]), p.choose(1, &[true])), (0, 1));
        assert_eq!(p.choose(1, &[true]), 3);
        assert_eq!(p.steps(), &[1, 1, 0, 2]);
    }

    #[test]
    fn plain_probes_speculation_with_backoff_only_while_it_could_win() {
        let mut p = policy(SpecPolicy::Adaptive);
        feed(&mut p, 3, 0, 50);
        let probes =
            |p: &mut AdaptivePolicy, n: u64| (0..n).filter(|_| p.choose(1, &[true]) != 0).count();
        assert_eq!(probes(&mut p, PROBE_FIRST), 1);
        assert_eq!(probes(&mut p, PROBE_FIRST), 0, "the interval doubled");
        assert_eq!(probes(&mut p, PROBE_FIRST), 1);
        // Speculation that cannot win even fully accepted is never probed.
        for v in 1..4 {
            p.set_time(1, v, 1.0);
        }
        assert_eq!(probes(&mut p, 10 * PROBE_LAST), 0);
    }

    #[test]
    fn a_new_lane_starts_from_the_session_average() {
        let mut p = AdaptivePolicy::new(vec![0, 2], 2, SpecPolicy::Adaptive);
        for _ in 0..500 {
            p.observe(0, 1, 2);
        }
        p.admit(1);
        assert!(p.expected_tokens(1, 2) > 2.9, "{}", p.expected_tokens(1, 2));
        p.observe(1, 1, 0);
        assert!(p.expected_tokens(1, 2) < p.expected_tokens(0, 2));
    }

    /// A live pinned (sampled) lane holds every step at the configured k; once it leaves,
    /// the policy's own choice resumes.
    #[test]
    fn a_pinned_lane_holds_the_configured_variant() {
        let mut p = AdaptivePolicy::new(vec![0, 1, 3, 5], 2, SpecPolicy::Adaptive);
        for (v, t) in [1.0, 1.5, 2.0, 2.5].into_iter().enumerate() {
            p.set_time(1, v, t * 1e-3);
        }
        for _ in 0..50 {
            p.observe(0, 3, 0);
            p.observe(1, 3, 0);
        }
        assert_eq!(
            p.choose(1, &[true, true]),
            0,
            "no acceptance: plain decoding"
        );
        p.pin(1, true);
        assert_eq!(p.choose(1, &[true, true]), 3, "a sampled lane is live");
        assert_eq!(
            p.choose(1, &[true, false]),
            0,
            "the pinned lane is not live"
        );
        p.pin(1, false);
        assert_eq!(p.choose(1, &[true, true]), 0);
    }
}
