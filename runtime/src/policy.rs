//! Adaptive speculation: which step graph the next step runs.
//!
//! An engine's speculative contract lists the step graphs of its method over one set of
//! states ([`StepContract::step_variants`]): the configured k and, for methods that can
//! switch, smaller k and plain decoding (k = 0). Any variant may follow any other, so the
//! host picks one between steps. Both backends drive the same [`AdaptivePolicy`]:
//!
//! - **Acceptance**: per lane and draft position `j`, the rate `α_j` at which position `j`
//!   is accepted given `1..j` were, learnt from each speculative step's accepted count `a`
//!   of `k` (positions `1..=a` accepted, `a + 1` rejected when `a < k`, later ones untried):
//!   what the host reads from the token ring anyway (a lane's tokens of one step are
//!   `a + 1`). The session counts hits and trials of each position over every lane, each
//!   step first weighing a position's counts down by 63/64 whether it tried the position
//!   or not (they weigh about its last 64 lane-steps), and estimates `π_j = (hits_j +
//!   2·π_{j−1}) / (trials_j + 2)`: the previous position's estimate worth two observations
//!   as the prior (0.7 for position 1). Each lane counts its own the same way, weighed
//!   down by 0.8 (about its last 5), and estimates `α_j = (a_j + 2·π_j) / (n_j + 2)` at the
//!   session's current `π_j`; [`AdaptivePolicy::admit`] clears a lane's counts, and a plain
//!   step weighs them down as a step that tried nothing would. So a lane
//!   just admitted follows the session, which one step of many rejecting lanes moves at
//!   once, and a lane's own evidence soon outweighs it (`policy/acceptance.rs` gives the
//!   reasons for the constants).
//!   Expected tokens of one lane-step at `k`: `1 + Σ_{i ≤ k} Π_{j ≤ i} α_j`.
//! - **Step times** per (batch bucket, variant), measured at load (a few timed runs of
//!   each variant on scratch states: replays of every captured bucket on CUDA; interpreter
//!   runs at batch 1 and at the session's lanes on the CPU, whose buckets in between are
//!   interpolated per variant, the interpreter's step being a fixed part plus a part per
//!   row). Each variant is timed at two contexts, and the policy keeps its growth per
//!   token of the lanes' mean context ([`mean_context`]): attention reads every lane's
//!   context once per query row, so a speculative variant grows faster than plain decoding,
//!   and the variants are compared at the context the lanes are at (times are kept at the
//!   calibration's context and moved along these slopes; a measured step is moved back
//!   before it is folded in).
//!   Where a step's time is known without a sync (the CPU), the steps that run refine
//!   it, and every other variant of that bucket moves by [`DRIFT_SHARE`] of the same
//!   (logarithmic) change: what else changes a running step's time (the machine's load,
//!   the context where no slope is known) changes the others too, so a variant that has
//!   not run for a while is not compared at a stale time; only a share, so that a variant whose time
//!   was misjudged relative to the others is corrected by running it. A variant's first
//!   step after others corrects its own time alone. While speculation runs, one plain step
//!   in [`RETIME_PLAIN`] re-times plain decoding where the backend times steps (a
//!   standalone draft falls one token behind).
//! - **Re-priming** (a standalone draft after plain steps) costs host time before the next
//!   speculative step; the CPU measures it per draft-prefill row-token, and a probe (below)
//!   must be worth it paying that cost.
//! - **Choice**: the variant with the most expected tokens per second over the lanes in the
//!   step, kept unless another beats it by [`HYSTERESIS`] (no flapping on noise).
//! - **Probing**: acceptance is learnt from speculative steps only, so while plain decoding
//!   wins the estimates freeze. One step of a speculative variant runs after
//!   [`PROBE_FIRST`] plain steps, then after twice as many each time plain stays ahead (up
//!   to [`PROBE_LAST`]), when it is worth its cost: the probe's step and the re-priming of
//!   the plain stretch behind it (measured, per row-token) must cost fewer tokens than the
//!   variant would gain over plain decoding in a stretch as long again at the most its
//!   drafts plausibly accept: two standard errors above the session's estimate, whose
//!   evidence plain steps weigh down towards the prior (a fully accepted draft before any
//!   evidence). So a draft seen to accept little is not probed again until its evidence
//!   has faded (a few thousand plain steps), and at many lanes, where only a nearly fully
//!   accepted draft would beat plain decoding, nothing is probed.
//!
//! Switching keeps every lane exact: verify accepts only the target's own tokens whatever
//! the draft proposed. It does move the draft: a plain step leaves a standalone draft's
//! cache behind, which [`crate::draft_sync::DraftSync`] re-primes before the next
//! speculative step. Drafts that read target hidden states (EAGLE-3, DFlash, DDTree) cannot
//! be re-primed from tokens; their plain step writes the draft's queued rows itself and
//! keeps it whole (`models/src/methods/variants.rs`), so nothing is re-primed and their
//! re-priming cost is zero. Under sampled acceptance the draws of a step depend on its k, so a seed's
//! tokens would depend on the load: the CLI defaults to `fixed` there.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::OnceLock;

mod acceptance;
#[cfg(test)]
mod replay;

use acceptance::Acceptance;

/// Whether `SPECC_POLICY_TRACE=1`: every decision prints each variant's estimate, and each
/// step its measured time and tokens, to stderr.
pub fn trace_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SPECC_POLICY_TRACE").is_ok_and(|v| v == "1"))
}

/// Prints one trace line, prefixed with the seconds since the first line.
pub fn trace(line: fmt::Arguments) {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    let t = START.get_or_init(std::time::Instant::now).elapsed();
    eprintln!("{:.4} {line}", t.as_secs_f64());
}

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
/// Weight of one measured step in a variant's time.
const TIME_EMA: f64 = 0.1;
/// Share of the running variant's (logarithmic) time change the other variants of its
/// bucket follow: the part put down to what moves every variant (context, load).
pub const DRIFT_SHARE: f64 = 0.5;
/// Plain steps before the first probe of a speculative variant, and the most between two.
pub const PROBE_FIRST: u64 = 64;
/// Speculative steps between two plain steps that re-time plain decoding (cheap: its
/// draft falls one token behind).
pub const RETIME_PLAIN: u64 = 64;
/// Weight of a step's time in its variant's when the step before ran another variant (or
/// another bucket) and the step was faster than the estimate, or the bucket had no time of
/// its own (an interpolated one): the estimate may be stale, the measurement is fresh, and
/// a step is not fast by accident. Such a step that was slower counts as a continuing one
/// does ([`TIME_EMA`]): it may carry the switch itself (caches the other variant's graph
/// took, the first step of a server) or a burst of load, and a variant priced too dear by
/// one step is not picked again to correct it.
const RETIME_EMA: f64 = 0.5;
/// Steps within which a variant that runs again counts as switched back to: its first step
/// is not folded into its time ([`AdaptivePolicy::observe_time`]). Fewer than
/// [`RETIME_PLAIN`], whose single plain steps are there to be timed.
const SWITCH_BACK: u64 = RETIME_PLAIN / 2;
/// A step's time counts as at most this factor off its variant's estimate.
const OUTLIER: f64 = 2.0;
pub const PROBE_LAST: u64 = 4096;

/// The policy's state: acceptance evidence, step times per bucket, the current choice.
#[derive(Clone, Debug)]
pub struct AdaptivePolicy {
    /// Draft tokens of each variant, ascending (the variant's index is its position).
    ks: Vec<usize>,
    /// The configured variant (the largest k).
    configured: usize,
    mode: SpecPolicy,
    acceptance: Acceptance,
    /// Seconds per step, by (bucket, variant), at the context [`AdaptivePolicy::reference`].
    times: HashMap<(usize, usize), f64>,
    /// Seconds a step's time grows per token of the bucket's mean context, by (bucket,
    /// variant), where the backend measured it ([`AdaptivePolicy::set_slope`]).
    slopes: HashMap<(usize, usize), f64>,
    /// The mean context per lane of the bucket (dead lanes counting 0) at which `times`
    /// hold: the calibration's.
    reference: f64,
    /// The bucket's mean context now, where the backend says ([`AdaptivePolicy::set_context`]):
    /// times are moved from the reference to it along their slopes.
    context: Option<f64>,
    /// Seconds of draft re-priming per prefill row-token (rows × tokens of the gap), once
    /// measured.
    reprime: Option<f64>,
    /// Prefill row-tokens the next speculative step would re-prime, where the backend
    /// knows them ([`AdaptivePolicy::set_reprime_backlog`]); otherwise every live lane is
    /// taken to be behind by the plain stretch alone.
    backlog: Option<usize>,
    current: Option<usize>,
    /// The variant of the last step (the current one, or a probe).
    last: Option<usize>,
    plain_run: u64,
    probe_after: u64,
    /// Speculative steps since plain decoding last ran (or was re-timed).
    spec_run: u64,
    /// The variant and bucket of the last step whose time was observed.
    timed: Option<(usize, usize)>,
    /// Steps whose time was observed, and the count at each (bucket, variant)'s last one.
    observed: u64,
    last_observed: HashMap<(usize, usize), u64>,
    /// Whether the backend observes every step's time ([`AdaptivePolicy::observe_time`]):
    /// only then does a plain step re-time plain decoding while speculation runs.
    steps_timed: bool,
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
        AdaptivePolicy {
            configured: ks.len() - 1,
            steps: vec![0; ks.len()],
            ks,
            mode,
            acceptance: Acceptance::new(kmax, lanes),
            times: HashMap::new(),
            slopes: HashMap::new(),
            reference: 0.0,
            context: None,
            reprime: None,
            backlog: None,
            current: None,
            last: None,
            plain_run: 0,
            probe_after: PROBE_FIRST,
            spec_run: 0,
            timed: None,
            observed: 0,
            last_observed: HashMap::new(),
            steps_timed: false,
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

    /// Says the backend observes every step's time (the CPU; CUDA would have to sync), so
    /// plain decoding is re-timed now and then while speculation runs.
    pub fn set_steps_timed(&mut self, timed: bool) {
        self.steps_timed = timed;
    }

    /// Whether a variant has no step time at any bucket yet (a backend must measure some).
    pub fn needs_times(&self) -> bool {
        self.switches() && (0..self.ks.len()).any(|v| !self.times.keys().any(|&(_, u)| u == v))
    }

    /// Sets a variant's step time at `bucket` (a measurement at load).
    pub fn set_time(&mut self, bucket: usize, variant: usize, seconds: f64) {
        self.times.insert((bucket, variant), seconds.max(1e-9));
    }

    /// Sets a variant's growth of step time per token of the bucket's mean context (a
    /// measurement at load, at two contexts).
    pub fn set_slope(&mut self, bucket: usize, variant: usize, seconds_per_token: f64) {
        self.slopes
            .insert((bucket, variant), seconds_per_token.max(0.0));
    }

    /// The context the times set by [`AdaptivePolicy::set_time`] were measured at.
    pub fn set_reference_context(&mut self, context: f64) {
        self.reference = context;
    }

    /// The mean context per lane of the bucket the next step runs (the lanes' lengths over
    /// the bucket, dead lanes counting 0): each variant's time is its time at the reference
    /// moved along its slope, and the step's measured time is folded in moved back. So a
    /// variant with more attention rows is compared at the context the lanes are at, not the
    /// one its time was last refined at.
    pub fn set_context(&mut self, context: f64) {
        self.context = Some(context);
    }

    /// Seconds a step of `variant` at `bucket` gains from the reference context to now.
    fn context_shift(&self, bucket: usize, variant: usize) -> f64 {
        match self.context {
            Some(c) => {
                interpolate(&self.slopes, bucket, variant).unwrap_or(0.0) * (c - self.reference)
            }
            None => 0.0,
        }
    }

    /// A variant's step time at `bucket` and the current context: measured or refined at
    /// `bucket`, else interpolated linearly in the bucket between the nearest buckets with a
    /// time below and above it (the nearest one's time where only one side has one), then
    /// moved to the context along the variant's slope (never below a tenth of its time at
    /// the reference).
    pub fn time(&self, bucket: usize, variant: usize) -> Option<f64> {
        let base = interpolate(&self.times, bucket, variant)?;
        Some((base + self.context_shift(bucket, variant)).max(0.1 * base))
    }

    /// Folds the measured time of a step that ran into its variant's average at `bucket`.
    /// A step that continues a run of its variant moves every other variant's time there by
    /// [`DRIFT_SHARE`] of its change; the first after others corrects its own time only,
    /// with more weight ([`RETIME_EMA`]) — unless the variant ran within [`SWITCH_BACK`]
    /// steps, when it is not folded in at all: its estimate is fresh, and the step carries
    /// the switch (caches the other variant's graph took), which, folded in and then decayed
    /// by the steps after it, would move every other variant's time down at each switch.
    pub fn observe_time(&mut self, bucket: usize, variant: usize, seconds: f64) {
        let key = (bucket, variant);
        // The times are kept at the reference context.
        let seconds = (seconds - self.context_shift(bucket, variant)).max(0.1 * seconds);
        let continuing = self.timed == Some(key);
        let recent = self
            .last_observed
            .insert(key, self.observed)
            .is_some_and(|at| self.observed - at <= SWITCH_BACK);
        self.observed += 1;
        if !continuing && recent {
            self.timed = Some(key);
            return;
        }
        let measured_here = self.times.contains_key(&key);
        for v in 0..self.ks.len() {
            if let Some(t) = interpolate(&self.times, bucket, v) {
                self.times.entry((bucket, v)).or_insert(t);
            }
            if let Some(s) = interpolate(&self.slopes, bucket, v) {
                self.slopes.entry((bucket, v)).or_insert(s);
            }
        }
        self.timed = Some(key);
        let t = self
            .times
            .entry((bucket, variant))
            .or_insert(seconds.max(1e-9));
        let before = *t;
        // One step (a burst of load beside it) moves the estimate by a bounded factor; a
        // lasting change gets through over a few steps.
        let seconds = seconds.clamp(before / OUTLIER, before * OUTLIER);
        let weight = if continuing || (measured_here && seconds > before) {
            TIME_EMA
        } else {
            RETIME_EMA
        };
        *t += weight * (seconds - *t);
        if !continuing {
            // The first step after others corrects this variant's own (stale) time.
            return;
        }
        let factor = (*t / before).powf(DRIFT_SHARE);
        for v in (0..self.ks.len()).filter(|&v| v != variant) {
            if let Some(t) = self.times.get_mut(&(bucket, v)) {
                *t *= factor;
            }
        }
    }

    /// Folds a measured re-priming of the draft (`row_tokens` = prefill rows × tokens) into
    /// its cost per row-token.
    pub fn observe_reprime(&mut self, row_tokens: usize, seconds: f64) {
        if row_tokens == 0 {
            return;
        }
        let per = seconds / row_tokens as f64;
        let r = self.reprime.get_or_insert(per);
        *r += TIME_EMA * (per - *r);
    }

    /// The prefill row-tokens a speculative step would re-prime now (rows × the longest
    /// gap, padding included: what the re-priming runs). A lane admitted during plain
    /// decoding is behind by its whole sequence, far more than the plain stretch.
    pub fn set_reprime_backlog(&mut self, row_tokens: usize) {
        self.backlog = Some(row_tokens);
    }

    /// Lane `lane` starts a new sequence: its acceptance is the session's estimate until
    /// it has evidence of its own.
    pub fn admit(&mut self, lane: usize) {
        self.acceptance.admit(lane);
    }

    /// A speculative step of variant `variant` accepted `accepted` draft tokens in `lane`.
    pub fn observe(&mut self, lane: usize, variant: usize, accepted: usize) {
        self.acceptance.observe(lane, self.ks[variant], accepted);
    }

    /// Expected tokens one step of `k` draft tokens emits in `lane`.
    pub fn expected_tokens(&self, lane: usize, k: usize) -> f64 {
        self.acceptance.expected_tokens(lane, k)
    }

    /// Expected tokens per second of `variant` at `bucket` over the lanes in `live`.
    pub fn goodput(&self, bucket: usize, variant: usize, live: &[bool]) -> f64 {
        let t = self.time(bucket, variant).unwrap_or(1.0);
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
        if trace_on() {
            self.trace_choice(bucket, live, v, probe);
        }
        self.steps[v] += 1;
        self.last = Some(v);
        if self.ks[v] == 0 {
            for lane in (0..live.len()).filter(|&l| live[l]) {
                self.acceptance.fade_lane(lane);
            }
        }
        // A probe is not the policy's choice: the next step starts from the current one.
        if !probe {
            self.current = Some(v);
        }
        v
    }

    /// Prints each variant's estimate at `bucket` over `live` and the pick.
    fn trace_choice(&self, bucket: usize, live: &[bool], v: usize, probe: bool) {
        let n = live.iter().filter(|&&l| l).count();
        let est: Vec<String> = (0..self.ks.len())
            .map(|u| {
                let t = self.time(bucket, u).unwrap_or(f64::NAN);
                let tok = self.goodput(bucket, u, live) * t;
                format!(
                    "k={} {:.2}ms {:.1}tok {:.0}tok/s",
                    self.ks[u],
                    t * 1e3,
                    tok,
                    tok / t
                )
            })
            .collect();
        let context = self
            .context
            .map_or(String::new(), |c| format!(" context={c:.0}"));
        trace(format_args!(
            "policy bucket={bucket} live={n}{context} | {} | pick k={}{}",
            est.join(" | "),
            self.ks[v],
            if probe { " (probe)" } else { "" }
        ));
    }

    /// Prints what a step of `variant` did: its measured time, the tokens it emitted, and
    /// the host work before it (draft re-priming).
    pub fn trace_step(
        &self,
        bucket: usize,
        variant: usize,
        step_s: f64,
        tokens: usize,
        host_s: f64,
    ) {
        if trace_on() {
            trace(format_args!(
                "step bucket={bucket} k={} {:.2}ms {tokens}tok {:.0}tok/s host {:.2}ms",
                self.ks[variant],
                step_s * 1e3,
                tokens as f64 / step_s,
                host_s * 1e3
            ));
        }
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
            self.spec_run += 1;
            if self.steps_timed && self.ks[0] == 0 && self.spec_run >= RETIME_PLAIN {
                self.spec_run = 0;
                return (0, true);
            }
            return (keep, false);
        }
        self.spec_run = 0;
        self.plain_run += 1;
        if self.plain_run < self.probe_after {
            return (keep, false);
        }
        // A probe of `v` costs the tokens plain decoding would have emitted in its time
        // (its step and the re-priming of every lane's draft: the backlog, or the plain
        // stretch behind it) less its own; it is worth it when `v`, at the most its drafts
        // plausibly accept (all of them, before any evidence), would gain more than that
        // over a stretch as long again.
        let live_n = live.iter().filter(|&&l| l).count() as f64;
        let run = self.plain_run as f64;
        let plain_t = self.time(bucket, keep).unwrap_or(1.0);
        let backlog = self.backlog.map_or(live_n * run, |b| b as f64);
        let reprime = self.reprime.unwrap_or(0.0) * backlog;
        let fade = acceptance::PLAIN_KEEP.powf(run);
        let worth = |v: usize| {
            let t = self.time(bucket, v).unwrap_or(1.0);
            let best_case = live_n * self.acceptance.plausible_tokens(self.ks[v], fade) / t;
            let gain = (best_case - good[keep]) * run * plain_t;
            let cost = (t + reprime) * good[keep] - good[v] * t;
            gain > cost
        };
        let probe = (0..n)
            .filter(|&v| self.ks[v] > 0 && worth(v))
            .max_by(|&a, &b| good[a].total_cmp(&good[b]));
        if let Some(probe) = probe {
            self.plain_run = 0;
            self.probe_after = (self.probe_after * 2).min(PROBE_LAST);
            return (probe, true);
        }
        (keep, false)
    }
}

/// The mean context per lane of a bucket of `rows` lanes, what
/// [`AdaptivePolicy::set_context`] takes: the lengths of the lanes live in `live` summed over
/// `rows` (dead lanes and negative lengths count 0).
pub fn mean_context(lengths: impl IntoIterator<Item = i64>, live: &[bool], rows: usize) -> f64 {
    let total: i64 = lengths
        .into_iter()
        .zip(live)
        .filter(|&(_, &l)| l)
        .map(|(n, _)| n.max(0))
        .sum();
    total as f64 / rows.max(1) as f64
}

/// `map`'s value at `(bucket, variant)`, else interpolated linearly in the bucket between
/// the nearest buckets of the variant with a value below and above it (the nearest one's
/// where only one side has one).
fn interpolate(map: &HashMap<(usize, usize), f64>, bucket: usize, variant: usize) -> Option<f64> {
    if let Some(&t) = map.get(&(bucket, variant)) {
        return Some(t);
    }
    let known = map.iter().filter(|((_, v), _)| *v == variant);
    let below = known
        .clone()
        .filter(|((b, _), _)| *b < bucket)
        .max_by_key(|((b, _), _)| *b);
    let above = known
        .filter(|((b, _), _)| *b > bucket)
        .min_by_key(|((b, _), _)| *b);
    match (below, above) {
        (Some((&(b0, _), &t0)), Some((&(b1, _), &t1))) => {
            let f = (bucket - b0) as f64 / (b1 - b0) as f64;
            Some(t0 + f * (t1 - t0))
        }
        (Some((_, &t)), None) | (None, Some((_, &t))) => Some(t),
        (None, None) => None,
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
        // Every position hit 50 times: the session's counts weigh 64·(1 - (63/64)^50) =
        // 34.88 hits, so π_1 = (34.88 + 2·0.7) / (34.88 + 2) = 0.9837 and along the chain
        // π_2 = (34.88 + 2·0.9837) / 36.88 = 0.9991, π_3..5 ≈ 1; the lane's weigh 5.00, so
        // α_1 = (5.00 + 2·0.9837) / 7.00 = 0.9954, α_2 = 0.9997, α_3..5 ≈ 1, and a step of
        // k = 5 is expected to emit 5.976 tokens (the first prior keeps it short of 6).
        assert!((p.expected_tokens(0, 5) - 5.976).abs() < 1e-3);
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
        p.acceptance.set_lane(0, &[0.6; 5]);
        assert_eq!(p.choose(1, &[true]), 2);
    }

    #[test]
    fn hysteresis_keeps_the_current_variant_on_a_small_edge() {
        let mut p = policy(SpecPolicy::Adaptive);
        p.acceptance.set_lane(0, &[0.6; 5]);
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

    /// Probes back off, and weigh what the session has seen: before any evidence a probe
    /// assumes full acceptance; after 50 rejections the plausible rate is ≈ 0.1 and nothing
    /// is probed until plain steps have faded that evidence (a few thousand); speculation
    /// that cannot win even fully accepted is never probed.
    #[test]
    fn plain_probes_speculation_with_backoff_only_while_it_could_win() {
        // Plain 1 ms; k = 1, 3, 5 at 2.5, 3.5, 4 ms: at the prior's 0.7 plain decoding wins
        // (0.68, 0.72, 0.74 tokens a ms), fully accepted k = 5 would not (1.5).
        let mut p = AdaptivePolicy::new(vec![0, 1, 3, 5], 1, SpecPolicy::Adaptive);
        for (v, t) in [1.0, 2.5, 3.5, 4.0].into_iter().enumerate() {
            p.set_time(1, v, t * 1e-3);
        }
        let probes =
            |p: &mut AdaptivePolicy, n: u64| (0..n).filter(|_| p.choose(1, &[true]) != 0).count();
        assert_eq!(probes(&mut p, PROBE_FIRST), 1);
        assert_eq!(probes(&mut p, PROBE_FIRST), 0, "the interval doubled");
        assert_eq!(probes(&mut p, PROBE_FIRST), 1);
        feed(&mut p, 3, 0, 50);
        assert_eq!(probes(&mut p, 1024), 0, "the evidence says ≈ 0.04");
        // Then one each time it has faded (the probes here observe nothing): ≈ 3,000 steps.
        let faded = probes(&mut p, 4 * PROBE_LAST);
        assert!(
            (3..=6).contains(&faded),
            "{faded} probes in {} steps",
            4 * PROBE_LAST
        );
        for v in 1..4 {
            p.set_time(1, v, 1.0);
        }
        assert_eq!(probes(&mut p, 10 * PROBE_LAST), 0);
    }

    #[test]
    fn a_new_lane_starts_from_the_session_estimate() {
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

    /// Per-position acceptance of the embedded default's lanes at 16 lanes: what forced runs
    /// measured (22.7 / 28.2 tokens a step over 16 lanes at k = 1 / 3).
    const SIXTEEN_LANES_ALPHAS: [f64; 5] = [0.42, 0.55, 0.47, 0.35, 0.3];

    /// The embedded default at 16 lanes on the 2-core EPYC (bench/NOTES.md): variants k = 0,
    /// 1, 3, 5 timed at load (`calibrated`, ms), every lane at [`SIXTEEN_LANES_ALPHAS`].
    fn sixteen_lanes(calibrated: [f64; 4]) -> (AdaptivePolicy, Vec<bool>) {
        let mut p = AdaptivePolicy::new(vec![0, 1, 3, 5], 16, SpecPolicy::Adaptive);
        for (v, t) in calibrated.into_iter().enumerate() {
            p.set_time(16, v, t * 1e-3);
        }
        for lane in 0..16 {
            p.acceptance.set_lane(lane, &SIXTEEN_LANES_ALPHAS);
        }
        (p, vec![true; 16])
    }

    #[test]
    fn sixteen_lanes_at_the_measured_step_times_pick_plain_decoding() {
        // Forced-variant step times at realistic contexts: 5.8 / 14.4 / 23.5 / 30.1 ms.
        let (mut p, live) = sixteen_lanes([5.8, 14.4, 23.5, 30.1]);
        let tokens = |p: &AdaptivePolicy, v| (0..16).map(|l| p.expected_tokens(l, v)).sum::<f64>();
        assert!((tokens(&p, 1) - 22.7).abs() < 0.1 && (tokens(&p, 3) - 28.2).abs() < 0.1);
        assert_eq!(p.choose(16, &live), 0);
    }

    /// The failure at c = 16: variants timed at context 0 at load, then plain steps ran
    /// while the contexts grew (5.8 → 9 ms a step). Only the running variant's time used
    /// to follow, so k = 1's context-0 time soon looked cheaper than it was and the policy
    /// switched to it. (The session's evidence is the lanes': plain steps fade the lanes'
    /// own towards it.)
    #[test]
    fn a_growing_context_does_not_make_an_idle_variant_look_cheaper() {
        let (mut p, live) = sixteen_lanes([4.56, 9.92, 22.71, 29.13]);
        p.acceptance.set_session(&SIXTEEN_LANES_ALPHAS);
        assert_eq!(p.choose(16, &live), 0);
        for step in 0..130 {
            let ms = 5.8 + 3.2 * step as f64 / 130.0;
            p.observe_time(16, 0, ms * 1e-3);
            let v = p.choose(16, &live);
            assert_eq!(p.current(), Some(0), "step {step}: ran k = {}", p.ks()[v]);
        }
        // k = 1 followed half of plain's (logarithmic) growth.
        let grown = p.time(16, 1).unwrap() / 9.92e-3;
        assert!(grown > 1.15 && grown < 1.5, "{grown}");
    }

    /// A variant whose time was misjudged at load (too cheap) is corrected by running it:
    /// the others follow only part of its change.
    #[test]
    fn a_variant_timed_too_cheap_at_load_is_corrected_by_running_it() {
        let (mut p, live) = sixteen_lanes([5.8, 6.0, 23.5, 30.1]);
        assert_eq!(p.choose(16, &live), 1);
        for _ in 0..60 {
            p.observe_time(16, 1, 14.4e-3);
            p.choose(16, &live);
        }
        assert_eq!(p.current(), Some(0));
    }

    #[test]
    fn one_lane_accepting_three_and_a_half_tokens_picks_a_long_draft() {
        // Times at load at batch 1 on the EPYC: 2.0 / 2.3 / 3.1 / 3.9 ms.
        let mut p = AdaptivePolicy::new(vec![0, 1, 3, 5], 1, SpecPolicy::Adaptive);
        for (v, t) in [2.0, 2.3, 3.1, 3.9].into_iter().enumerate() {
            p.set_time(1, v, t * 1e-3);
        }
        p.acceptance.set_lane(0, &[0.78; 5]);
        assert!((p.expected_tokens(0, 5) - 3.5).abs() < 0.1);
        let v = p.choose(1, &[true]);
        assert!(p.ks()[v] >= 3, "picked k = {}", p.ks()[v]);
    }

    #[test]
    fn buckets_between_timed_ones_are_interpolated_and_refined_where_they_run() {
        let mut p = AdaptivePolicy::new(vec![0, 1], 16, SpecPolicy::Adaptive);
        p.set_time(1, 0, 2e-3);
        p.set_time(16, 0, 5e-3);
        p.set_time(1, 1, 2e-3);
        p.set_time(16, 1, 14e-3);
        assert!(!p.needs_times());
        assert!((p.time(6, 0).unwrap() - 3e-3).abs() < 1e-9);
        assert!((p.time(6, 1).unwrap() - 6e-3).abs() < 1e-9);
        // The first step at bucket 6 corrects plain's time alone, by half the error.
        p.observe_time(6, 0, 4e-3);
        assert!((p.time(6, 0).unwrap() - 3.5e-3).abs() < 1e-9);
        assert!((p.time(6, 1).unwrap() - 6e-3).abs() < 1e-9);
        // The next refines it by a tenth, and k = 1 follows a share of that.
        p.observe_time(6, 0, 4e-3);
        assert!((p.time(6, 0).unwrap() - 3.55e-3).abs() < 1e-9);
        let followed = (p.time(6, 1).unwrap() / 6e-3).ln() / (3.55f64 / 3.5).ln();
        assert!((followed - DRIFT_SHARE).abs() < 1e-9, "{followed}");
        assert_eq!(p.time(16, 0), Some(5e-3), "other buckets keep theirs");
    }

    /// Speculative steps (probes, from plain decoding) among `steps` choices at 16 lanes.
    fn probes(p: &mut AdaptivePolicy, steps: u64) -> usize {
        (0..steps)
            .filter(|_| p.choose(16, &[true; 16]) != 0)
            .count()
    }

    /// c = 16 on the idle EPYC (session 44): after k = 1 accepted about half its drafts at
    /// one lane, a probe of k = 5 at 16 lanes could only pay nearly fully accepted; the
    /// session's evidence bounds it well below that, so a phase of 512 plain steps (64
    /// requests of 128 tokens) runs no probe and re-primes nothing.
    #[test]
    fn sixteen_lanes_after_half_accepted_drafts_probe_nothing() {
        let (mut p, _) = sixteen_lanes([5.8, 14.4, 23.5, 30.1]);
        for step in 0..200 {
            p.observe(0, 1, step % 2);
        }
        assert_eq!(probes(&mut p, 512), 0);
        // With no evidence the same phase probes (a fully accepted k = 5 would pay).
        let (mut p, _) = sixteen_lanes([5.8, 14.4, 23.5, 30.1]);
        assert!(probes(&mut p, 512) > 0);
    }

    /// A probe must be worth its re-priming: a plain step leaves every lane's draft one more
    /// token behind, and a probe re-primes the whole stretch.
    #[test]
    fn speculation_that_cannot_pay_for_re_priming_is_not_probed() {
        // Re-priming unknown: k = 5 fully accepted (96 tokens / 30.1 ms against plain's
        // 16 / 5.8 ms) would gain 160 tokens over 64 plain steps; its step costs 53.
        let (mut p, _) = sixteen_lanes([5.8, 14.4, 23.5, 30.1]);
        assert_eq!(probes(&mut p, PROBE_FIRST), 1);
        // Re-priming at 50 µs per row-token (measured on the idle EPYC): after 64 plain
        // steps the probe costs 195 tokens for 160 to gain, after 128 336 for 319. Each
        // plain step adds 2.2 tokens of re-priming to the cost and 2.5 to the gain, so a
        // longer stretch would pay: not within the 128 steps of a 128-token request.
        let (mut p, _) = sixteen_lanes([5.8, 14.4, 23.5, 30.1]);
        p.observe_reprime(16 * 40, 16.0 * 40.0 * 50e-6);
        assert_eq!(probes(&mut p, 2 * PROBE_FIRST), 0);
        // At 112 µs (measured with builds running beside it) a stretch never pays.
        let (mut p, _) = sixteen_lanes([5.8, 14.4, 23.5, 30.1]);
        p.observe_reprime(16 * 40, 16.0 * 40.0 * 112e-6);
        assert_eq!(probes(&mut p, 2 * PROBE_LAST), 0);
    }

    /// The re-priming a probe pays is the backlog the backend reports when it knows it:
    /// lanes admitted during plain decoding are behind by their whole sequences.
    #[test]
    fn a_probe_pays_for_the_whole_backlog_of_unprimed_lanes() {
        // At 20 µs per row-token, 64 plain steps behind every lane cost 20.5 ms of
        // re-priming: the probe (110 tokens) is worth k = 5's best case (160).
        let (mut p, _) = sixteen_lanes([5.8, 14.4, 23.5, 30.1]);
        p.observe_reprime(16 * 40, 16.0 * 40.0 * 20e-6);
        assert_eq!(probes(&mut p, PROBE_FIRST), 1);
        // Lanes 150 tokens behind (admitted unprimed): 48 ms, 186 tokens, not worth it.
        let (mut p, _) = sixteen_lanes([5.8, 14.4, 23.5, 30.1]);
        p.observe_reprime(16 * 40, 16.0 * 40.0 * 20e-6);
        p.set_reprime_backlog(16 * 150);
        assert_eq!(probes(&mut p, PROBE_FIRST), 0);
    }

    /// Switching back and forth between two variants whose first step after a switch is
    /// slower (caches the other variant's graph took) leaves a third variant's time alone:
    /// the switch steps are not folded in, so their decay does not drag the others down.
    #[test]
    fn switch_steps_do_not_drift_the_variants_that_do_not_run() {
        let mut p = policy(SpecPolicy::Adaptive);
        p.set_steps_timed(true);
        let before = p.time(1, 2).unwrap();
        for cycle in 0..50 {
            for (v, steady) in [(0, 1.0e-3), (1, 1.5e-3)] {
                let first = if cycle == 0 { 1.0 } else { 1.3 };
                p.observe_time(1, v, steady * first);
                for _ in 0..20 {
                    p.observe_time(1, v, steady);
                }
            }
        }
        let after = p.time(1, 2).unwrap();
        assert!((after / before - 1.0).abs() < 0.02, "{before} -> {after}");
        assert!((p.time(1, 0).unwrap() / 1.0e-3 - 1.0).abs() < 0.02);
    }

    /// Plain decoding timed too slow at load (a build running beside the calibration) is
    /// re-timed by an occasional plain step while speculation runs.
    #[test]
    fn plain_timed_too_slow_at_load_is_re_timed_while_speculation_runs() {
        let (mut p, live) = sixteen_lanes([15.3, 21.5, 29.5, 42.2]);
        p.set_steps_timed(true);
        assert_eq!(p.choose(16, &live), 1);
        p.observe_time(16, 1, 14.4e-3);
        let mut ran = Vec::new();
        for _ in 0..3 * RETIME_PLAIN {
            let v = p.choose(16, &live);
            p.observe_time(16, v, [5.8, 14.4, 23.5, 30.1][v] * 1e-3);
            ran.push(v);
        }
        assert_eq!(p.current(), Some(0), "{ran:?}");
        assert!(ran[..RETIME_PLAIN as usize].contains(&0));
    }

    /// A step slowed by a burst of load beside it (10× its time) moves its variant's time
    /// by a bounded factor, so the variant is not priced out of every later comparison.
    #[test]
    fn one_slow_step_moves_its_variant_by_a_bounded_factor() {
        let mut p = policy(SpecPolicy::Adaptive);
        p.observe_time(1, 1, 15e-3);
        assert!((p.time(1, 1).unwrap() - 1.65e-3).abs() < 1e-12);
    }

    /// Step times move with the context along each variant's slope, and a step measured at
    /// one context is folded in at the reference: a k = 1 step of the embedded default on
    /// the Xeon VM grows 2.25 µs a token of context, a plain one 1.32 (twice the attention
    /// rows), so they are compared at the context the lanes are at.
    #[test]
    fn times_follow_the_context_along_each_variants_slope() {
        let mut p = AdaptivePolicy::new(vec![0, 1], 1, SpecPolicy::Adaptive);
        p.set_reference_context(128.0);
        p.set_time(1, 0, 0.90e-3);
        p.set_time(1, 1, 1.22e-3);
        p.set_slope(1, 0, 1.32e-6);
        p.set_slope(1, 1, 2.25e-6);
        p.set_context(328.0);
        assert!((p.time(1, 0).unwrap() - 1.164e-3).abs() < 1e-9);
        assert!((p.time(1, 1).unwrap() - 1.670e-3).abs() < 1e-9);
        // A step that took what the slope predicts leaves the time at the reference alone.
        p.observe_time(1, 1, 1.670e-3);
        p.observe_time(1, 1, 1.670e-3);
        p.set_context(28.0);
        assert!((p.time(1, 1).unwrap() - 0.995e-3).abs() < 1e-9);
        assert!((p.time(1, 0).unwrap() - 0.768e-3).abs() < 1e-9);
    }

    /// A request that ends at a long context in plain decoding, then one at a short context
    /// (the served trace of session 50: k = 1 priced 1.45× plain at an admission, ≈ 1.28× at
    /// short context, so the new request opened with plain decoding until a probe 64 steps
    /// later): with the times moved to the new context the new lane speculates from its
    /// first step.
    #[test]
    fn a_short_request_after_a_long_one_is_compared_at_its_own_context() {
        let mut p = AdaptivePolicy::new(vec![0, 1], 1, SpecPolicy::Adaptive);
        p.set_steps_timed(true);
        p.set_reference_context(128.0);
        for (v, t, slope) in [(0, 0.90e-3, 1.32e-6), (1, 1.22e-3, 2.25e-6)] {
            p.set_time(1, v, t);
            p.set_slope(1, v, slope);
        }
        p.acceptance.set_session(&[0.42]);
        p.admit(0);
        // Plain decoding at context 400: 1.26 against 1.83 ms for 1.42 tokens.
        p.set_context(400.0);
        assert_eq!(p.choose(1, &[true]), 0);
        for _ in 0..20 {
            p.observe_time(1, 0, 1.26e-3);
            p.choose(1, &[true]);
        }
        p.admit(0);
        p.set_context(30.0);
        assert_eq!(p.choose(1, &[true]), 1, "k = 1 at its own context");
    }

    /// The first step of a server (embedded default, the Xeon VM, session 50): k = 1 timed
    /// at 1.34 ms at load, its first served step took 2.41 ms (the first request's cold
    /// caches), and folded in at half weight it priced k = 1 at 1.88 ms. k = 5 then looked
    /// the best draft, lost to plain decoding, and k = 1 never ran again to correct its
    /// time: 1722 of 1853 steps ran plain, 0.93× plain's tokens a second. A slower first
    /// step after a switch counts as a continuing step does, so k = 1 keeps running, and
    /// its next steps correct its time.
    #[test]
    fn a_slow_first_step_does_not_price_a_variant_out() {
        let mut p = AdaptivePolicy::new(vec![0, 1, 3, 5], 1, SpecPolicy::Adaptive);
        p.set_steps_timed(true);
        for (v, ms) in [0.99, 1.34, 2.06, 2.87].into_iter().enumerate() {
            p.set_time(1, v, ms * 1e-3);
        }
        p.acceptance.set_lane(0, &[0.55; 5]);
        assert_eq!(p.choose(1, &[true]), 1);
        p.observe_time(1, 1, 2.41e-3);
        for _ in 0..50 {
            let v = p.choose(1, &[true]);
            assert_ne!(p.ks()[v], 5, "k = 1 priced out");
            p.observe_time(1, v, [0.99, 1.30, 2.06, 2.87][v] * 1e-3);
        }
        assert_eq!(p.current(), Some(1));
        assert!(p.time(1, 1).unwrap() < 1.36e-3, "{:?}", p.time(1, 1));
    }

    /// The mean context counts a dead lane as 0 and divides by the bucket's rows, not the
    /// live lanes: a step's attention reads the live lanes' contexts only, over every row.
    #[test]
    fn the_mean_context_is_over_the_buckets_rows() {
        let live = [true, false, true, true];
        assert_eq!(mean_context([300, 900, 100, -1], &live, 4), 100.0);
        assert_eq!(
            mean_context([300, 900], &live, 2),
            150.0,
            "lanes past the bucket"
        );
        assert_eq!(mean_context([], &live, 0), 0.0);
    }
}
