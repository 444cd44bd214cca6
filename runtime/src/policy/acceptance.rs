//! Acceptance estimates of adaptive speculation: per lane and draft position `j`, the rate
//! `α_j` at which position `j` is accepted given positions `1..j` were.
//!
//! Evidence is counted twice, as discounted hits and trials of each position: over the
//! whole session (every lane) and per lane. A speculative step that accepted `a` of `k`
//! draft tokens is a hit at positions `1..=a` and, when `a < k`, a miss at `a + 1`; later
//! positions were not tried, and their counts are weighed down all the same (old evidence of
//! a position only shorter drafts have run since fades). Every estimate is a ratio of counts
//! with pseudo-counts on top:
//!
//! - the session's `π_j = (hits_j + m0·π_{j−1}) / (trials_j + m0)`, the previous position's
//!   estimate worth `m0` = [`SESSION_PRIOR_WEIGHT`] observations (`π_0` = [`PRIOR_ALPHA`]):
//!   a position little tried is expected to accept about as its predecessor does, as
//!   drafts' conditional rates along a draft are close to flat, rather than at a fixed
//!   guess that a draft accepting 99 % at position 1 would make look poor at position 2;
//! - a lane's `α_j = (a_j + n0·π_j) / (n_j + n0)`, its own counts on top of `n0` =
//!   [`LANE_PRIOR_WEIGHT`] observations at the session's *current* `π_j`.
//!
//! So a lane with little evidence of its own follows the session, which learns from every
//! lane at once (one step of 16 lanes rejecting position 1 is 16 trials), and a lane's own
//! evidence outweighs the session's after a few steps. An admitted lane has no evidence yet.

/// Acceptance assumed before any observation.
const PRIOR_ALPHA: f64 = 0.7;
/// Observations the prior is worth in the session estimate: little, so that the first
/// steps of a session (a drafter that never matches, or always does) move it at once.
const SESSION_PRIOR_WEIGHT: f64 = 2.0;
/// Share of a position's session counts kept at each new observation of that position: the
/// counts weigh about the last 64 observations (1 / (1 - keep)), a few steps at many lanes
/// and a request or two at one, so a session whose prompts change (or whose first lanes
/// were unrepresentative) relearns within that many observations.
const SESSION_KEEP: f64 = 1.0 - 1.0 / 64.0;
/// Observations the session estimate is worth in a lane's: a lane's first two observations
/// weigh about as much as the session's estimate, so a lane whose drafts match unlike the
/// others' is told apart within a few steps, yet one unlucky step does not override the
/// session.
const LANE_PRIOR_WEIGHT: f64 = 2.0;
/// Share of a lane's counts kept at each new observation of a position: the counts weigh
/// about the last 5 observations, so a lane follows the text it is in (code, prose).
const LANE_KEEP: f64 = 0.8;

/// Discounted counts of one position's observations.
#[derive(Clone, Copy, Debug, Default)]
struct Evidence {
    hits: f64,
    trials: f64,
}

impl Evidence {
    /// Weighs the observations down by `keep`, adding none (a step that did not try the
    /// position).
    fn fade(&mut self, keep: f64) {
        self.hits *= keep;
        self.trials *= keep;
    }

    /// Folds one observation in, the older ones weighed down by `keep`.
    fn add(&mut self, hit: bool, keep: f64) {
        self.fade(keep);
        self.hits += if hit { 1.0 } else { 0.0 };
        self.trials += 1.0;
    }

    /// The rate the counts give on top of `weight` observations at `prior`.
    fn rate(&self, prior: f64, weight: f64) -> f64 {
        (self.hits + weight * prior) / (self.trials + weight)
    }
}

/// Standard deviations above the estimate at which a probe's acceptance is taken
/// ([`Acceptance::plausible_tokens`]): about a 1-in-40 chance that the true rate is higher.
const PROBE_Z: f64 = 2.0;

/// Share of the session's evidence a plain step keeps for the probe's bound: plain steps
/// observe nothing, so what was learnt loses weight towards the prior over about a
/// thousand of them — a draft that did not match is tried again after a few thousand plain
/// steps, in case the text has changed.
pub(super) const PLAIN_KEEP: f64 = 1.0 - 1.0 / 1024.0;

/// Acceptance evidence of a session and of each of its lanes, by draft position.
#[derive(Clone, Debug)]
pub(super) struct Acceptance {
    /// Over every lane, by position (0-based: index `j - 1` holds position `j`).
    session: Vec<Evidence>,
    /// Per lane, by position; a lane past the end has no evidence of its own.
    lanes: Vec<Vec<Evidence>>,
}

impl Acceptance {
    /// No evidence for `lanes` lanes over draft positions `1..=kmax`.
    pub(super) fn new(kmax: usize, lanes: usize) -> Acceptance {
        Acceptance {
            session: vec![Evidence::default(); kmax],
            lanes: vec![vec![Evidence::default(); kmax]; lanes],
        }
    }

    /// Lane `lane` starts a new sequence: it forgets its own evidence (the session keeps
    /// it).
    pub(super) fn admit(&mut self, lane: usize) {
        let kmax = self.session.len();
        *self.lane_mut(lane) = vec![Evidence::default(); kmax];
    }

    /// A speculative step of `k` draft tokens accepted `accepted` of them in `lane`. The
    /// positions it did not try (past the first miss, or past `k`) lose weight as the tried
    /// ones do, with nothing added: evidence from before a run of shorter drafts fades
    /// towards the prior instead of deciding, for ever, that longer ones do not pay.
    pub(super) fn observe(&mut self, lane: usize, k: usize, accepted: usize) {
        let tried = k.min(accepted + 1);
        for j in 0..self.session.len() {
            if j < tried {
                let hit = j < accepted;
                self.session[j].add(hit, SESSION_KEEP);
                self.lane_mut(lane)[j].add(hit, LANE_KEEP);
            } else {
                self.session[j].fade(SESSION_KEEP);
                self.lane_mut(lane)[j].fade(LANE_KEEP);
            }
        }
    }

    /// The session's estimate `π` of 0-based position `j`: its counts on top of the
    /// previous position's estimate (position 1: [`PRIOR_ALPHA`]).
    fn session_alpha(&self, j: usize) -> f64 {
        let prior = match j {
            0 => PRIOR_ALPHA,
            _ => self.session_alpha(j - 1),
        };
        self.session[j].rate(prior, SESSION_PRIOR_WEIGHT)
    }

    /// A plain step ran in lane `lane`: it tried no draft position, so the lane's own
    /// evidence ages as if by an observation of none of them and the lane drifts back
    /// towards the session's estimate. A few misses in a row then keep a lane in plain
    /// decoding for a few steps, not until a probe: on the default's python prompts a miss
    /// is followed by a match about as often as a match is (0.52 against 0.58,
    /// `testdata/default_python_matches.txt`), so what a short run of misses says about the
    /// next tokens is soon out of date.
    pub(super) fn fade_lane(&mut self, lane: usize) {
        for e in self.lane_mut(lane) {
            e.fade(LANE_KEEP);
        }
    }

    /// Lane `lane`'s estimate `α` of 0-based position `j`.
    fn alpha(&self, lane: usize, j: usize) -> f64 {
        let own = self.lanes.get(lane).map_or(Evidence::default(), |l| l[j]);
        own.rate(self.session_alpha(j), LANE_PRIOR_WEIGHT)
    }

    /// Expected tokens one step of `k` draft tokens emits in `lane`:
    /// `1 + Σ_{i ≤ k} Π_{j ≤ i} α_j`.
    pub(super) fn expected_tokens(&self, lane: usize, k: usize) -> f64 {
        let mut run = 1.0;
        let mut total = 1.0;
        for j in 0..k {
            run *= self.alpha(lane, j);
            total += run;
        }
        total
    }

    /// Tokens one lane-step of `k` draft tokens could plausibly emit: the session's
    /// evidence, weighed down by `fade` (what plain steps since it leave of it), gives each
    /// position's estimate on top of its prior as in [`Self::session_alpha`]; the rate taken
    /// is [`PROBE_Z`] standard errors above it, at most 1. With no evidence this is a fully
    /// accepted draft; with much evidence of a low rate, close to that rate.
    pub(super) fn plausible_tokens(&self, k: usize, fade: f64) -> f64 {
        let mut prior = PRIOR_ALPHA;
        let mut run = 1.0;
        let mut total = 1.0;
        for e in self.session.iter().take(k) {
            let trials = e.trials * fade + SESSION_PRIOR_WEIGHT;
            let pi = (e.hits * fade + SESSION_PRIOR_WEIGHT * prior) / trials;
            let upper = (pi + PROBE_Z * (pi * (1.0 - pi) / trials).sqrt()).min(1.0);
            run *= upper;
            total += run;
            prior = pi;
        }
        total
    }

    /// Test hook: lane `lane`'s estimates become `alphas` (by 0-based position), as if it
    /// had seen so many steps that the session's estimate no longer counts.
    #[cfg(test)]
    pub(super) fn set_lane(&mut self, lane: usize, alphas: &[f64]) {
        const OVERWHELMING: f64 = 1e12;
        for (e, &a) in self.lane_mut(lane).iter_mut().zip(alphas) {
            *e = Evidence {
                hits: a * OVERWHELMING,
                trials: OVERWHELMING,
            };
        }
    }

    /// Test hook: the session's estimates become `alphas` (by 0-based position), as if
    /// every lane had seen so many steps that the priors no longer count.
    #[cfg(test)]
    pub(super) fn set_session(&mut self, alphas: &[f64]) {
        const OVERWHELMING: f64 = 1e12;
        for (e, &a) in self.session.iter_mut().zip(alphas) {
            *e = Evidence {
                hits: a * OVERWHELMING,
                trials: OVERWHELMING,
            };
        }
    }

    fn lane_mut(&mut self, lane: usize) -> &mut Vec<Evidence> {
        if lane >= self.lanes.len() {
            let kmax = self.session.len();
            self.lanes.resize(lane + 1, vec![Evidence::default(); kmax]);
        }
        &mut self.lanes[lane]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{AdaptivePolicy, SpecPolicy, PROBE_LAST};

    /// Variants plain (1.0 ms a step) and k = 7 (1.3 ms) at bucket `lanes`: a speculative
    /// step barely dearer than a plain one, where plain decoding wins last.
    fn plain_or_seven(lanes: usize) -> AdaptivePolicy {
        let mut p = AdaptivePolicy::new(vec![0, 7], lanes, SpecPolicy::Adaptive);
        p.set_time(lanes, 0, 1.0e-3);
        p.set_time(lanes, 1, 1.3e-3);
        p
    }

    /// Runs the lanes `live` through the policy's choices for `steps` steps, every lane
    /// accepting `accepted(step)` draft tokens of each speculative step; returns how many
    /// steps were speculative.
    fn run(
        p: &mut AdaptivePolicy,
        live: &[bool],
        steps: usize,
        accepted: impl Fn(usize) -> usize,
    ) -> usize {
        let mut speculative = 0;
        for step in 0..steps {
            let v = p.choose(live.len(), live);
            if p.ks()[v] == 0 {
                continue;
            }
            speculative += 1;
            for lane in (0..live.len()).filter(|&l| live[l]) {
                p.observe(lane, v, accepted(step));
            }
        }
        speculative
    }

    /// With k = 7 running, plain decoding wins by [`crate::policy::HYSTERESIS`] once
    /// 1 / 1.0 > 1.05 · (1 + α_1 · S) / 1.3, S = 1 + π_1 + … + π_1^6 (a rejection tries
    /// position 1 alone; positions 2..7, untried, follow the chain of priors, `π_j = π_{j−1}`).
    ///
    /// This estimator, after n rejections: the session weighs 64 · (1 - (63/64)^n) trials,
    /// π_1 = 1.4 / (that + 2); the lane weighs 5 · (1 - 0.8^n), α_1 = 2 π_1 / (that + 2).
    /// n = 2: 1.98 trials, π_1 = 0.3514, 1.8, α_1 = 0.1849, 1.285 tokens (1.05 · 1.285 / 1.3
    /// = 1.038 tokens a ms: speculation stays); n = 3: 2.95, π_1 = 0.2826, 2.44, α_1 =
    /// 0.1273, 1.177 tokens (0.951: plain): 3 speculative steps.
    ///
    /// With the fixed prior 0.7 at every position (S = 3.059) it took 5; the per-lane moving
    /// average before that (weight 0.2 from 0.7, α_1 = 0.7 · 0.8^n) 10. (The CUDA backend
    /// reads tokens a step late, so each count is one more there.)
    #[test]
    fn one_lane_whose_drafts_never_match_leaves_speculation_after_three_steps() {
        const OLD_ESTIMATOR_STEPS: usize = 10;
        let mut p = plain_or_seven(1);
        p.admit(0);
        let mut speculative = 0;
        while p.choose(1, &[true]) == 1 {
            p.observe(0, 1, 0);
            speculative += 1;
            assert!(speculative < 100, "speculation never stopped");
        }
        assert_eq!(speculative, 3);
        assert!(speculative < OLD_ESTIMATOR_STEPS);
    }

    /// One step of 16 rejections is 16 trials of position 1 for the session: 64 · (1 -
    /// (63/64)^16) = 14.26, π_1 = 1.4 / 16.26 = 0.0861, and every lane's α_1 = 2 · 0.0861 /
    /// (1 + 2) = 0.0574; positions 2..7 follow at π_1, so a step of 7 is expected to emit
    /// 1 + 0.0574 · (1 + 0.0861 + … + 0.0861^6) = 1.0628 tokens: 0.82 a ms against plain's 1.
    #[test]
    fn sixteen_lanes_whose_drafts_never_match_leave_speculation_after_one_step() {
        let mut p = plain_or_seven(16);
        let live = [true; 16];
        (0..16).for_each(|lane| p.admit(lane));
        assert_eq!(p.choose(16, &live), 1, "the prior favours speculation");
        (0..16).for_each(|lane| p.observe(lane, 1, 0));
        assert!((p.expected_tokens(15, 7) - 1.0628).abs() < 1e-3);
        assert_eq!(p.choose(16, &live), 0);
    }

    /// A lane accepting 9 drafts in 10 at position 1 (and 6 or 7 of 7 when it does), its
    /// first step a rejection, speculates throughout.
    #[test]
    fn a_lane_accepting_nine_in_ten_keeps_speculating() {
        let mut p = plain_or_seven(1);
        let accepted = |step: usize| [0, 7, 6, 7, 7, 6, 7, 7, 6, 7][step % 10];
        assert_eq!(run(&mut p, &[true], 200, accepted), 200);
    }

    /// Four rounds of 16 lanes whose drafts never match teach the session so (π_1 ≈ 0.04)
    /// that only the first step and a probe speculate; a lane then admitted alone whose
    /// drafts all match starts at plain decoding, and the next probe (once plain steps have
    /// faded the session's evidence, within [`PROBE_LAST`]) is evidence enough of its own to switch back:
    /// its one hit at every position lifts the lane's α_j to (1 + 2 π_j) / 3 ≥ 1/3 and the
    /// session's π_j along the chain, more tokens a ms than plain's with every later step.
    #[test]
    fn a_lane_whose_drafts_match_wins_speculation_back_by_a_probe() {
        let mut p = plain_or_seven(16);
        let all = [true; 16];
        let mut speculative = 0;
        for _ in 0..4 {
            (0..16).for_each(|lane| p.admit(lane));
            speculative += run(&mut p, &all, 64, |_| 0);
        }
        // The first step, then a probe after 64 plain steps; after 128 more, 30 trials at
        // π_1 ≈ 0.05 bound the plausible rate at ≈ 0.13, not worth another.
        assert_eq!(speculative, 2);
        assert_eq!(p.current(), Some(0));
        p.admit(0);
        let alone: Vec<bool> = (0..16).map(|lane| lane == 0).collect();
        let mut waited = 0;
        while p.current() != Some(1) {
            run(&mut p, &alone, 1, |_| 7);
            waited += 1;
            assert!(waited <= PROBE_LAST, "no probe won speculation back");
        }
        assert!(waited > 1, "won back by a probe, not at admission");
        assert_eq!(run(&mut p, &alone, 100, |_| 7), 100);
    }

    /// After 320 rejections the session weighs 64 · (1 - (63/64)^320) = 63.59 trials of
    /// position 1 and π_1 = 1.4 / 65.59 = 0.021. After m hits it weighs 64 · (1 -
    /// (63/64)^m) hits of about 63.9 trials: π_1 = (hits + 1.4) / (trials + 2) passes 0.5
    /// at m = 44 (31.48 hits, 0.499, at m = 43; 32.08, 0.508, at m = 44).
    #[test]
    fn the_session_estimate_forgets_old_evidence() {
        let mut a = Acceptance::new(7, 1);
        (0..320).for_each(|_| a.observe(0, 7, 0));
        assert!((a.session_alpha(0) - 0.0213).abs() < 1e-3);
        let mut hits = 0;
        while a.session_alpha(0) <= 0.5 {
            a.observe(0, 7, 7);
            hits += 1;
            assert!(hits < 1000, "π_1 stuck at {}", a.session_alpha(0));
        }
        assert_eq!(hits, 44);
    }

    /// Two misses in a row pull a lane's α₁ well under the session's; plain steps, which
    /// observe nothing, age that evidence (×0.8 each) until the lane follows the session
    /// again: the lane's 1.8 trials weigh 1.8 · 0.8ⁿ after n plain steps against the
    /// session's prior weight of 2, so α₁ trails π₁ by π₁ · 1.8 · 0.8ⁿ / (2 + 1.8 · 0.8ⁿ):
    /// 0.14 after 5, under 0.01 after 18.
    #[test]
    fn plain_steps_age_a_lanes_evidence_towards_the_session() {
        let mut a = Acceptance::new(3, 2);
        (0..40).for_each(|i| a.observe(1, 3, i % 3));
        a.observe(0, 1, 0);
        a.observe(0, 1, 0);
        let session = a.session_alpha(0);
        assert!(
            a.alpha(0, 0) < session - 0.15,
            "{} against {session}",
            a.alpha(0, 0)
        );
        (0..5).for_each(|_| a.fade_lane(0));
        assert!(
            (session - a.alpha(0, 0) - 0.140).abs() < 1e-3,
            "{}",
            a.alpha(0, 0)
        );
        (5..18).for_each(|_| a.fade_lane(0));
        assert!(session - a.alpha(0, 0) < 0.01);
        assert_eq!(
            a.session_alpha(0),
            session,
            "plain steps leave the session's evidence"
        );
    }

    /// A lane's estimate shrinks towards the session's current estimate, not one taken at
    /// admission: lanes admitted before other lanes' evidence arrives still follow it.
    #[test]
    fn a_lane_follows_the_session_estimate_as_it_moves() {
        let mut a = Acceptance::new(3, 2);
        a.admit(1);
        let before = a.alpha(1, 0);
        (0..10).for_each(|_| a.observe(0, 3, 0));
        assert_eq!(a.alpha(1, 0), a.session_alpha(0));
        assert!(
            a.alpha(1, 0) < before / 4.0,
            "{} of {before}",
            a.alpha(1, 0)
        );
    }

    /// The `specc run` trace of session 43 (embedded default, the Xeon VM's step times at
    /// load: plain 0.87 ms, k = 1 1.09, k = 3 1.61, k = 5 2.23): the first step, k = 3,
    /// accepted 1 (a miss at position 2); every later draft is accepted whole. k = 1 runs
    /// next, and were the miss kept until position 2 is tried again it would run for ever
    /// (k = 3 never looks better). Positions a step does not try lose weight like the ones
    /// it does, and an untried position is expected to accept as its predecessor does, so
    /// the miss fades: k = 3 runs from the 14th step after it, k = 5 from the 19th, and
    /// stays.
    #[test]
    fn a_stale_miss_at_a_deeper_position_fades() {
        let mut p = AdaptivePolicy::new(vec![0, 1, 3, 5], 1, SpecPolicy::Adaptive);
        for (v, ms) in [0.87, 1.09, 1.61, 2.23].into_iter().enumerate() {
            p.set_time(1, v, ms * 1e-3);
        }
        p.admit(0);
        assert_eq!(p.choose(1, &[true]), 2, "the prior picks k = 3 first");
        p.observe(0, 2, 1);
        let mut first_long = None;
        for step in 0..200 {
            let v = p.choose(1, &[true]);
            let k = p.ks()[v];
            if k >= 3 && first_long.is_none() {
                first_long = Some(step);
            }
            if k > 0 {
                p.observe(0, v, k);
            }
        }
        let first = first_long.expect("k = 1 ran for ever: the stale miss never faded");
        assert_eq!(first, 13, "a longer draft first tried at step {first}");
        assert_eq!(
            p.ks()[p.current().unwrap()],
            5,
            "then the longest one stays"
        );
    }
}
