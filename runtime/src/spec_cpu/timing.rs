//! Step times for adaptive speculation on the CPU: every variant timed at load, and the
//! cost of re-priming a standalone draft (what [`crate::AdaptivePolicy`] compares).

use std::collections::HashMap;
use std::time::Instant;

use specc_ir::interp::{Data, Tensor};
use specc_ir::DType;
use specc_models::methods::{BUDGET, LEN};

use super::SpecCpuSession;
use crate::policy::SpecPolicy;
use crate::RuntimeError;

/// Context every scratch lane sits at when variants are timed: a step's time grows with the
/// context its attention reads, and at context 0 the draft's share of a step is largest.
const CALIBRATION_CONTEXT: u64 = 128;
/// The second context the variants are timed at, for each one's growth per context token.
const CALIBRATION_CONTEXT_FAR: u64 = 512;
/// Timed runs of each variant at load (after one untimed).
const CALIBRATION_ROUNDS: usize = 3;
/// The most untimed rounds run first at batch 1 while one-row matmul shapes still time
/// their tiles: a shape called once a step (the lm-head) needs 26 (2 warm-up and 12 timed
/// calls of each tile, `specc_ir::interp::matmul`).
const CALIBRATION_WARMUP_MAX: usize = 32;
/// Tokens per row of the draft re-priming timed at load.
const CALIBRATION_GAP: usize = 16;

impl SpecCpuSession<'_> {
    /// Sets how each step's variant is chosen. Adaptive speculation times every variant
    /// here, at load, at batch 1 and at the session's lanes (buckets in between are
    /// interpolated, [`AdaptivePolicy::time`]), so no step pays for timing.
    pub fn set_policy(&mut self, mode: SpecPolicy) -> Result<(), RuntimeError> {
        self.policy.set_mode(mode);
        if self.policy.switches() {
            self.calibrate(1)?;
            if self.lanes > 1 {
                self.calibrate(self.lanes)?;
            }
        }
        Ok(())
    }

    /// Times every variant's step at batch `rows` at two contexts, [`CALIBRATION_CONTEXT`]
    /// and [`CALIBRATION_CONTEXT_FAR`] (within the engine's context): the policy's time at
    /// the first and its growth per context token from the pair (a variant with more
    /// attention rows grows faster), so steps at other contexts are compared at their own.
    /// The session's states are not touched.
    pub(super) fn calibrate(&mut self, rows: usize) -> Result<(), RuntimeError> {
        let k = self.graphs.contract.max_accept() as u64;
        // Lanes stay inside the context through every timed run (each moves them on by at
        // most k + 1 tokens).
        let room = self
            .max_context
            .saturating_sub((CALIBRATION_ROUNDS as u64 + 2) * (k + 1) + 2);
        let near = CALIBRATION_CONTEXT.min(room);
        let far = CALIBRATION_CONTEXT_FAR.min(room);
        let session_rows = std::mem::replace(&mut self.rows, rows);
        let res = (|| {
            let (at_near, warmups) = self.time_variants(rows, near, true)?;
            let at_far = if far > near {
                Some(self.time_variants(rows, far, false)?.0)
            } else {
                None
            };
            self.policy.set_reference_context(near as f64);
            for (v, &t) in at_near.iter().enumerate() {
                self.policy.set_time(rows, v, t);
                let slope = at_far
                    .as_ref()
                    .map_or(0.0, |f| (f[v] - t) / (far - near) as f64);
                self.policy.set_slope(rows, v, slope);
                if crate::policy::trace_on() {
                    crate::policy::trace(format_args!(
                        "calibrate bucket={rows} k={} {:.2}ms at context {near}, {:+.2} µs a token of context (after {warmups} warm-up rounds)",
                        self.policy.ks()[v],
                        t * 1e3,
                        slope.max(0.0) * 1e6
                    ));
                }
            }
            if self.sync.can_reprime() {
                self.time_reprime(near)?;
            }
            Ok(())
        })();
        self.rows = session_rows;
        res
    }

    /// The best of [`CALIBRATION_ROUNDS`] interpreter runs of every variant at batch `rows`
    /// (after one untimed; the variants take turns in each round, so a burst of load on the
    /// machine slows all of them, not one), on scratch states whose lanes are live from
    /// `context` on (attention reads the slots below a lane's position, so the time is a
    /// step's at that context; each run moves the lanes on by the tokens it accepts), and the
    /// warm-up rounds run first (`warm`: while one-row matmul shapes still time their tiles).
    fn time_variants(
        &mut self,
        rows: usize,
        context: u64,
        warm: bool,
    ) -> Result<(Vec<f64>, usize), RuntimeError> {
        let k = self.graphs.contract.max_accept() as u64;
        let n = self.policy.ks().len();
        let mut scratch = Vec::with_capacity(n);
        for v in 0..n {
            let mut states = HashMap::new();
            self.zero_states(self.step_graph_of(v, true), &mut states)?;
            if let Some(Data::I64(len)) = states.get_mut(LEN).map(|t| &mut t.data) {
                len.fill(context as i64);
            }
            // Live lanes: a finished lane's positions are −1, so its attention reads no
            // slot and the variants with more attention rows would time too cheap. The
            // budget keeps every lane inside the context through all timed runs.
            if let Some(Data::I64(budget)) = states.get_mut(BUDGET).map(|t| &mut t.data) {
                let room = self.max_context.saturating_sub(context + k + 2);
                budget.fill(room.max(1) as i64);
            }
            scratch.push(states);
        }
        // The first calls of each one-row matmul shape alternate two tiles (one up to
        // twice as slow) before keeping the faster: steps timed then would carry what
        // no later step does (bench/NOTES.md, session 46).
        // Only one-row steps (batch 1) run them; a shape is known once called.
        let mut warmups = 0;
        while warm
            && rows == 1
            && warmups < CALIBRATION_WARMUP_MAX
            && (warmups == 0 || specc_ir::interp::one_row_tiles_pending() > 0)
        {
            for (v, states) in scratch.iter_mut().enumerate() {
                self.run_on(self.step_graph_of(v, true), 1, HashMap::new(), states)?;
            }
            warmups += 1;
        }
        let mut best = vec![f64::INFINITY; n];
        for round in 0..=CALIBRATION_ROUNDS {
            for (v, states) in scratch.iter_mut().enumerate() {
                let t0 = Instant::now();
                self.run_on(self.step_graph_of(v, true), 1, HashMap::new(), states)?;
                if round > 0 {
                    best[v] = best[v].min(t0.elapsed().as_secs_f64());
                }
            }
        }
        Ok((best, warmups))
    }

    /// Times a draft re-priming of [`CALIBRATION_GAP`] tokens in every row up to `context`
    /// (the best of two runs on scratch states) for the policy's cost of switching back
    /// from plain decoding.
    fn time_reprime(&mut self, context: u64) -> Result<(), RuntimeError> {
        let g = self.graphs.draft_prefill;
        let (rows, t) = (self.rows, CALIBRATION_GAP);
        let mut scratch = HashMap::new();
        self.zero_states(g, &mut scratch)?;
        // The gap ends at `context` (below the context the engine holds).
        let from = (context as usize).saturating_sub(t);
        let positions: Vec<i64> = (0..rows)
            .flat_map(|_| (0..t).map(|j| (from + j) as i64))
            .collect();
        let inputs = HashMap::from([
            (
                "tokens".to_string(),
                Tensor::from_i64(DType::I32, vec![rows, t], vec![0; rows * t]),
            ),
            (
                "positions".to_string(),
                Tensor::from_i64(DType::I32, vec![rows, t], positions),
            ),
        ]);
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let t0 = Instant::now();
            self.run_on(g, t as u64, inputs.clone(), &mut scratch)?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        self.policy.observe_reprime(rows * t, best);
        if crate::policy::trace_on() {
            crate::policy::trace(format_args!(
                "calibrate bucket={rows} reprime of {t} tokens {:.2}ms",
                best * 1e3
            ));
        }
        Ok(())
    }
}
