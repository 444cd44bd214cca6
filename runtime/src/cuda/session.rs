//! Speculative decoding (or plain decoding, k = 0) on the GPU: the CUDA counterpart of
//! [`crate::SpecCpuSession`], driven by the same step contract and the same admission math
//! over an engine's plans. The step is one captured graph; the host only admits lanes,
//! replays, and reads the token ring.

use std::sync::Arc;
use std::time::Instant;

use specc_ir::engine::{BucketPlan, Engine, GraphRole, Priming, StepContract};
use specc_models::methods::{BUDGET, EMITTED, RING, SAMPLING};

use super::prefills::{DeviceSpan, Input, PrefillAt, PrefillGraphs};
use super::{
    CudaEngine, DeviceBuffer, LoadedGraph, StepGraph, TokenRing, WeightSources, DEFAULT_RING_DEPTH,
};
use crate::admission::{self, LaneSampling, PrefillInputs, StateInit};
use crate::draft_sync::DraftSync;
use crate::memory::Footprint;
use crate::policy::{AdaptivePolicy, SpecPolicy};
use crate::windows::{lane_major, AdmissionWindows};
use crate::{RuntimeError, SpecStats};

mod admit;
mod lazy_priming;

use admit::PendingGroup;

pub use crate::admission::prefill_bucket;
pub use specc_models::spec_bundle::MIN_PREFILL_T;

/// Context every lane sits at while the step variants are timed at start-up (the policy's
/// reference context): requests are not known yet, and a serving request's context (prompt
/// and reply) is typically a few hundred tokens.
const CALIBRATION_CONTEXT: usize = 256;
/// The second context the variants are timed at, for each one's growth per token of
/// context: attention reads each lane's KV once per query row, so a speculative variant's
/// step grows faster with the context than a plain one.
const CALIBRATION_CONTEXT_FAR: usize = 1024;
/// Timed replays of each variant at each context (after one untimed).
const CALIBRATION_REPLAYS: u32 = 5;

pub struct CudaSpecSession<'a> {
    contract: StepContract,
    pub engine: CudaEngine<'a>,
    step: LoadedGraph,
    pub step_graph: StepGraph,
    /// The step captured at each smaller batch bucket of the engine, ascending: a step over
    /// lanes `0..n` replays the smallest that holds them ([`CudaSpecSession::step_upto`]).
    /// States are lane-major and sized for the largest bucket, so a bucket-`b` graph reads
    /// and writes lanes `0..b` of the same buffers.
    smaller: Vec<(usize, LoadedGraph, StepGraph)>,
    /// The contract's other step variants captured at every bucket above: `(bucket,
    /// variant index, graph)` (adaptive speculation; the index is the policy's).
    variants: Vec<(usize, usize, LoadedGraph, StepGraph)>,
    /// The contract's greedy twins captured at every bucket above: `(bucket, k, graph)`;
    /// a step replays its variant's twin while no live lane samples.
    greedy: Vec<(usize, usize, LoadedGraph, StepGraph)>,
    /// The contract's catch-up of the draft rows plain steps queue
    /// ([`specc_ir::engine::CatchUp`]) captured at every bucket above: `(bucket, graph)`.
    catch_up: Vec<(usize, LoadedGraph, StepGraph)>,
    /// Plain steps queued since the last catch-up.
    plain_run: usize,
    /// Catch-ups replayed so far.
    catch_ups: u64,
    /// Lanes admitted with a temperature above 0 (drawing from a distribution).
    sampled: Vec<bool>,
    /// Which variant each step replays.
    policy: AdaptivePolicy,
    /// Whether every variant's step time is measured ([`CudaSpecSession::set_policy`]).
    calibrated: bool,
    /// Each lane's tokens and draft-cache gap across plain steps.
    sync: DraftSync,
    /// Lanes admitted and not finished by the host (the lanes a step's choice counts).
    admitted: Vec<bool>,
    /// Variants of the steps whose tokens are not read from the ring yet.
    unread: Vec<usize>,
    /// Tokens read from the ring but not yet drained, per lane.
    undrained: Vec<Vec<u32>>,
    /// Whether [`CudaSpecSession::step_upto`] replays a smaller bucket (off: every step
    /// replays the session's bucket, whose tokens do not depend on how many lanes are in
    /// use; kernels tile by bucket, so another bucket may round differently).
    shrink: bool,
    ring: TokenRing,
    /// Prefill graphs by role and place, captured on first use.
    prefills: PrefillGraphs,
    /// Where admissions prefill (the session's own bucket only where the states are not
    /// all lane-major).
    windows: AdmissionWindows,
    /// Most prompt rows one prefill takes (0: a whole prompt).
    prefill_chunk: usize,
    /// Admissions begun and not yet armed, in the order their chunks run.
    pending: std::collections::VecDeque<PendingGroup>,
    /// EAGLE-3: each lane's `eagle.hidden` bytes from the chunk that ends its prompt to its
    /// arming ([`admit::staged_slots`]).
    staged_slots: Option<Arc<DeviceBuffer>>,
    lanes: usize,
    max_context: u64,
    pub stats: SpecStats,
}

fn plan_of(
    engine: &Engine,
    role: GraphRole,
    lanes: usize,
    t: usize,
) -> Result<&BucketPlan, RuntimeError> {
    engine
        .plan(role, lanes as u32, Some(t as u32))
        .ok_or_else(|| {
            let ts = engine.token_buckets(role, lanes as u32);
            RuntimeError::Engine(if ts.is_empty() {
                format!(
                "no `{role}` plan for batch {lanes} (the engine was built for batch buckets {:?})",
                engine.batch_buckets()
            )
            } else {
                format!("no `{role}` plan of {t} tokens at batch {lanes} (built for {ts:?})")
            })
        })
}

fn i32_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect()
}

fn read_i32(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
        .collect()
}

/// `[lanes, tb]` tokens and positions holding row `i` of the `[n, t]` prefill inputs `p` in
/// lane `at[i]`; every other slot is padding (token 0, position −1).
fn place(p: &PrefillInputs, at: &[usize], lanes: usize, tb: usize) -> (Vec<i64>, Vec<i64>) {
    let mut tokens = vec![0i64; lanes * tb];
    let mut pos = vec![-1i64; lanes * tb];
    for (i, &lane) in at.iter().enumerate() {
        tokens[lane * tb..][..p.t].copy_from_slice(&p.tokens[i * p.t..][..p.t]);
        pos[lane * tb..][..p.t].copy_from_slice(&p.positions[i * p.t..][..p.t]);
    }
    (tokens, pos)
}

impl<'a> CudaSpecSession<'a> {
    /// Loads the engine's plans of its speculative method (`speculative`) or of plain
    /// decoding at batch bucket `lanes`, uploads the weights and captures the step.
    pub fn new(
        engine: &'a Engine,
        speculative: bool,
        sources: &WeightSources,
        lanes: usize,
    ) -> Result<Self, RuntimeError> {
        Self::with_buckets(engine, speculative, sources, lanes, false)
    }

    /// [`CudaSpecSession::new`], and with `shrink` the step of every smaller batch bucket of
    /// the engine captured too (their weights and arenas loaded), with
    /// [`CudaSpecSession::shrink_buckets`] on.
    pub fn with_buckets(
        engine: &'a Engine,
        speculative: bool,
        sources: &WeightSources,
        lanes: usize,
        shrink: bool,
    ) -> Result<Self, RuntimeError> {
        Self::with_prefill_chunk(engine, speculative, sources, lanes, shrink, 0)
    }

    /// [`CudaSpecSession::with_buckets`] prefilling prompts in chunks of at most
    /// `prefill_chunk` rows across the lanes admitted together
    /// ([`CudaSpecSession::set_prefill_chunk`]; 0: whole prompts): the memory it checks for
    /// counts the arenas of the prefills those chunks run only.
    pub fn with_prefill_chunk(
        engine: &'a Engine,
        speculative: bool,
        sources: &WeightSources,
        lanes: usize,
        shrink: bool,
        prefill_chunk: usize,
    ) -> Result<Self, RuntimeError> {
        admission::check_chunk(prefill_chunk, engine.max_context)?;
        let prefill_chunk =
            admission::chunk_within_launch(prefill_chunk, lanes, engine.max_context);
        let contract = engine.contract(speculative).clone();
        let need =
            Footprint::of_cuda_engine(engine, &contract, lanes as u32, prefill_chunk, &|n| {
                sources.stored_bytes(n)
            });
        let mut dev = CudaEngine::new(engine, &need)?;
        let step_plan = plan_of(engine, contract.step, lanes, 1)?;
        // Every plan of the method at this batch, so a prefill of any length finds its
        // weights uploaded, and the steps of the smaller buckets.
        let lane_major = lane_major(engine, &contract)?;
        let smaller_buckets: Vec<usize> = match shrink && lane_major {
            true => engine
                .batch_buckets()
                .into_iter()
                .map(|b| b as usize)
                .filter(|&b| b < lanes && engine.plan(contract.step, b as u32, Some(1)).is_some())
                .collect(),
            false => Vec::new(),
        };
        let plans: Vec<&BucketPlan> = engine
            .plans
            .iter()
            .filter(|p| {
                let b = p.bucket.b as usize;
                let a_step = p.role == contract.step
                    || contract.variants.iter().any(|v| v.role == p.role)
                    || contract.greedy.iter().any(|v| v.role == p.role)
                    || contract.catch_up.is_some_and(|c| c.role == p.role);
                let a_prefill =
                    Some(p.role) == contract.draft_prefill || p.role == contract.target_prefill;
                let ours = contract.roles().contains(&p.role) || p.role == GraphRole::Logits;
                ours && (b == lanes
                    || (a_step && smaller_buckets.contains(&b))
                    || (a_prefill && lane_major && b < lanes))
            })
            .collect();
        dev.upload(&plans, sources)?;
        let step = dev.load(step_plan)?;
        let step_graph = dev.capture(&step)?;
        let mut smaller = Vec::new();
        for b in smaller_buckets {
            let loaded = dev.load(plan_of(engine, contract.step, b, 1)?)?;
            let captured = dev.capture(&loaded)?;
            smaller.push((b, loaded, captured));
        }
        smaller.sort_by_key(|s| s.0);
        let mut variants = Vec::new();
        let mut greedy = Vec::new();
        let mut catch_up = Vec::new();
        let buckets = std::iter::once(lanes).chain(smaller.iter().map(|s| s.0));
        for b in buckets.collect::<Vec<_>>() {
            for (i, v) in contract.variants.iter().enumerate() {
                let loaded = dev.load(plan_of(engine, v.role, b, 1)?)?;
                let captured = dev.capture(&loaded)?;
                variants.push((b, i, loaded, captured));
            }
            for v in &contract.greedy {
                let loaded = dev.load(plan_of(engine, v.role, b, 1)?)?;
                let captured = dev.capture(&loaded)?;
                greedy.push((b, v.k, loaded, captured));
            }
            if let Some(c) = contract.catch_up {
                let loaded = dev.load(plan_of(engine, c.role, b, 1)?)?;
                let captured = dev.capture(&loaded)?;
                catch_up.push((b, loaded, captured));
            }
        }
        let windows = AdmissionWindows::of_engine(engine, &contract, lanes, lane_major);
        let mut ring = TokenRing::from_states(
            &dev.dev,
            dev.state(RING)?.clone(),
            dev.state(EMITTED)?.clone(),
            lanes,
            contract.ring,
            DEFAULT_RING_DEPTH,
        )?;
        ring.track_budget(dev.state(BUDGET)?.clone())?;
        let k = contract.max_accept();
        let ks = contract.step_variants().iter().map(|v| v.k).collect();
        let sync = DraftSync::new(contract.priming(), lanes);
        let staged_slots = admit::staged_slots(&dev, &contract, lanes)?;
        let s = CudaSpecSession {
            contract,
            engine: dev,
            step,
            step_graph,
            smaller,
            variants,
            greedy,
            catch_up,
            plain_run: 0,
            catch_ups: 0,
            sampled: vec![false; lanes],
            policy: AdaptivePolicy::new(ks, lanes, SpecPolicy::Fixed),
            calibrated: false,
            sync,
            admitted: vec![false; lanes],
            unread: Vec::new(),
            undrained: vec![Vec::new(); lanes],
            shrink,
            ring,
            prefills: PrefillGraphs::default(),
            windows,
            prefill_chunk,
            pending: Default::default(),
            staged_slots,
            lanes,
            max_context: engine.max_context,
            stats: SpecStats {
                steps: 0,
                greedy_steps: 0,
                histogram: vec![0; k + 1],
                widest_prefill: 0,
            },
        };
        Ok(s)
    }

    /// Sets how each step's variant is chosen. Adaptive speculation needs every variant's
    /// step time and growth per token of context at every captured bucket: timed here,
    /// once, before any lane is admitted (on synthetic lanes whose states are zeroed
    /// afterwards). A fixed policy replays nothing.
    pub fn set_policy(&mut self, mode: SpecPolicy) -> Result<(), RuntimeError> {
        self.policy.set_mode(mode);
        if mode == SpecPolicy::Adaptive && !self.calibrated {
            if self.admitted.iter().any(|&a| a) {
                return Err(RuntimeError::Engine(
                    "adaptive speculation must be chosen before lanes are admitted (its step times are measured on idle lanes)".into(),
                ));
            }
            self.calibrate()?;
            self.calibrated = true;
        }
        Ok(())
    }

    /// Times every step variant at every captured bucket, before any lane is admitted, with
    /// every lane live at [`CALIBRATION_CONTEXT`] and at [`CALIBRATION_CONTEXT_FAR`] (each
    /// within what the engine's context leaves room for): the policy's time at the first
    /// (its reference context) and its growth per token of context from the pair, so steps
    /// are compared at the lanes' own mean context ([`CudaSpecSession::step_at`]). Lanes
    /// are live because a step's attention reads each lane's context, and with lanes masked
    /// (budget 0, as before admission) it reads none: every variant would be timed at
    /// context 0, where speculation's extra query rows cost the most against a plain step.
    /// Afterwards every state goes back to the zeros it was allocated with (nothing was
    /// admitted, and the step graphs keep nothing else). Nothing to time for a contract
    /// without variants.
    fn calibrate(&mut self) -> Result<(), RuntimeError> {
        if self.contract.variants.is_empty() {
            return Ok(());
        }
        // Each replay moves a lane on by at most k + 1 tokens; arming needs k + 3 beyond.
        let k = self.contract.num_steps;
        let room = (self.max_context as usize)
            .saturating_sub((CALIBRATION_REPLAYS as usize + 2) * (k + 1) + 3);
        let near = CALIBRATION_CONTEXT.min(room);
        let far = CALIBRATION_CONTEXT_FAR.min(room);
        self.policy.set_reference_context(near as f64);
        let mut buckets = vec![self.lanes];
        buckets.extend(self.smaller.iter().map(|s| s.0));
        for b in buckets {
            for v in 0..self.policy.ks().len() {
                let t = self.time_step(b, v, near)?;
                let slope = if far > near {
                    (self.time_step(b, v, far)? - t) / (far - near) as f64
                } else {
                    0.0
                };
                self.policy.set_time(b, v, t);
                self.policy.set_slope(b, v, slope);
                if crate::policy::trace_on() {
                    crate::policy::trace(format_args!(
                        "calibrate bucket={b} k={} {:.3}ms at context {near}, {:+.3} µs a token of context (from contexts {near} and {far})",
                        self.policy.ks()[v],
                        t * 1e3,
                        slope.max(0.0) * 1e6
                    ));
                }
            }
        }
        self.engine.states.zero_all()?;
        self.engine.synchronize()
    }

    /// Seconds a step of variant `v` at bucket `b` takes with every lane live at `context`
    /// (freshly armed, [`CudaSpecSession::arm_synthetic`]; masked at 0): the mean of
    /// [`CALIBRATION_REPLAYS`] replays after one untimed. The policy chooses only while no
    /// live lane samples (a sampled lane pins the configured k): the greedy twins' times
    /// where there are twins.
    fn time_step(&mut self, b: usize, v: usize, context: usize) -> Result<f64, RuntimeError> {
        if context > 0 {
            self.arm_synthetic(context)?;
        }
        self.replayed(b, v, true).replay()?;
        self.engine.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..CALIBRATION_REPLAYS {
            self.replayed(b, v, true).replay()?;
        }
        self.engine.synchronize()?;
        Ok(t0.elapsed().as_secs_f64() / f64::from(CALIBRATION_REPLAYS))
    }

    /// The captured step of variant `v` (indexed like [`AdaptivePolicy::ks`]) at bucket
    /// `b` (the session's own where `b` has none).
    fn graph_of(&self, b: usize, v: usize) -> &StepGraph {
        if v + 1 < self.policy.ks().len() {
            if let Some(g) = self
                .variants
                .iter()
                .find(|g| g.0 == b && g.1 == v)
                .or_else(|| self.variants.iter().find(|g| g.0 == self.lanes && g.1 == v))
            {
                return &g.3;
            }
        }
        match self.smaller.iter().find(|s| s.0 == b) {
            Some((_, _, g)) => g,
            None => &self.step_graph,
        }
    }

    /// What a step of variant `v` at bucket `b` replays: its greedy twin where `greedy`
    /// (no live lane samples) and the contract has one, else [`CudaSpecSession::graph_of`].
    fn replayed(&self, b: usize, v: usize, greedy: bool) -> &StepGraph {
        let k = self.policy.ks()[v];
        let twin = |at: usize| self.greedy.iter().find(|g| g.0 == at && g.1 == k);
        match greedy
            .then(|| twin(b).or_else(|| twin(self.lanes)))
            .flatten()
        {
            Some(g) => &g.3,
            None => self.graph_of(b, v),
        }
    }

    /// Whether no lane of `live` samples (its steps may replay greedy twins).
    fn all_greedy(&self, live: &[bool]) -> bool {
        !live.iter().zip(&self.sampled).any(|(&l, &s)| l && s)
    }

    /// Which variant each step replays (adaptive speculation; [`SpecPolicy::Fixed`] unless
    /// set).
    pub fn policy(&self) -> &AdaptivePolicy {
        &self.policy
    }

    pub fn policy_mut(&mut self) -> &mut AdaptivePolicy {
        &mut self.policy
    }

    /// The loaded step graph (its plan lists every launch the captured graph holds).
    pub fn step_plan(&self) -> &LoadedGraph {
        &self.step
    }

    pub fn contract(&self) -> &StepContract {
        &self.contract
    }

    /// The loaded plan of prefill `role` at `at` (captured on first use).
    fn prefill(&mut self, role: GraphRole, at: PrefillAt) -> Result<&LoadedGraph, RuntimeError> {
        self.capture_prefill(role, at)?;
        Ok(&self.prefills.get(role, at).expect("captured above").loaded)
    }

    /// Loads and captures the prefill of `role` at `at` unless it was already.
    fn capture_prefill(&mut self, role: GraphRole, at: PrefillAt) -> Result<(), RuntimeError> {
        let plan = plan_of(self.engine.engine, role, at.b, at.t)?;
        self.prefills
            .get_or_capture(&mut self.engine, role, at, plan)?;
        Ok(())
    }

    /// Runs the prefill graph of `role` at `at` over `[at.b, at.t]` tokens/positions (+
    /// extra inputs, from the host or the device) and returns the bytes of the requested
    /// outputs (with none, the prefill is only queued: [`PrefillGraph::run`]).
    ///
    /// [`PrefillGraph::run`]: super::prefills::PrefillGraph::run
    fn run_role(
        &mut self,
        role: GraphRole,
        at: PrefillAt,
        tokens: &[i64],
        positions: &[i64],
        extra: &[(&str, Input)],
        outputs: &[&str],
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        self.capture_prefill(role, at)?;
        let g = self.prefills.get(role, at).expect("captured above");
        let (tokens, positions) = (i32_bytes(tokens), i32_bytes(positions));
        let mut inputs: Vec<(&str, Input)> = vec![("positions", Input::Host(&positions))];
        // A DFlash drafter's prefill reads taps and positions only.
        if g.loaded.io("tokens").is_ok() {
            inputs.push(("tokens", Input::Host(&tokens)));
        }
        inputs.extend(extra.iter().map(|(n, i)| (*n, *i)));
        g.run(&self.engine, &inputs, outputs)
    }

    /// The prefill role of the target (`target`) or the draft.
    fn prefill_role(&self, target: bool) -> GraphRole {
        match target {
            true => self.contract.target_prefill,
            false => self
                .contract
                .draft_prefill
                .unwrap_or(self.contract.target_prefill),
        }
    }

    /// Runs the target's (`target`) or the draft's prefill graph at `at` over
    /// `[at.b, at.t]` tokens and positions (+ extra inputs) and returns the bytes of the
    /// requested outputs.
    fn run_prefill(
        &mut self,
        target: bool,
        at: PrefillAt,
        tokens: &[i64],
        positions: &[i64],
        extra: &[(&str, Input)],
        outputs: &[&str],
    ) -> Result<Vec<Vec<u8>>, RuntimeError> {
        let role = self.prefill_role(target);
        self.run_role(role, at, tokens, positions, extra, outputs)
    }

    /// Where input or output `name` of the target's (`target`) or the draft's prefill at
    /// `at` lies: in the arena of that role and buckets, until its next prefill.
    fn prefill_io(
        &mut self,
        target: bool,
        at: PrefillAt,
        name: &str,
    ) -> Result<DeviceSpan, RuntimeError> {
        let role = self.prefill_role(target);
        let g = self.prefill(role, at)?;
        DeviceSpan::of_io(g, name, format!("`{role}` prefill `{name}`"))
    }

    /// The session's own bucket from lane 0 at prompt bucket `t`.
    fn every_lane(&self, t: usize) -> PrefillAt {
        PrefillAt {
            b: self.lanes,
            t,
            lane: 0,
        }
    }

    /// Where a prefill admitting the lanes `at` together runs at prompt bucket `t`
    /// ([`AdmissionWindows::covering`]).
    pub fn admission_window(&self, at: &[usize], t: usize) -> PrefillAt {
        let (b, lane) = self.windows.covering(at);
        PrefillAt { b, t, lane }
    }

    /// Where lane `lane` is prefilled when admitted alone at prompt bucket `t`
    /// ([`AdmissionWindows::lone`]: the same plan whatever the lane and the load).
    pub fn lone_window(&self, lane: usize, t: usize) -> PrefillAt {
        let (b, lane) = self.windows.lone(lane);
        PrefillAt { b, t, lane }
    }

    /// Prefill graphs captured so far (each role and place once; later prefills of the
    /// same place replay them).
    pub fn captured_prefills(&self) -> usize {
        self.prefills.captured()
    }

    /// The role and place of every prefill graph captured so far.
    pub fn prefill_places(&self) -> Vec<(GraphRole, PrefillAt)> {
        self.prefills.places()
    }

    /// Replays of every prefill graph (target, draft, all-row) so far: the graph launches
    /// that are not steps.
    pub fn prefill_replays(&self) -> u64 {
        self.prefills.replays()
    }

    /// Replays of the target prefill at prompt bucket `t` so far (any bucket and lane).
    pub fn target_prefill_replays(&self, t: usize) -> u64 {
        self.prefills.replays_of(self.contract.target_prefill, t)
    }

    /// Logits `[t, V]` (f32) of one forward over `ids` (in every lane): the engine's
    /// all-row forward ([`GraphRole::Logits`]), which only engines built for it plan.
    pub fn prefill_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        let prompts = vec![ids.to_vec(); self.lanes];
        let pre = admission::prefill_inputs(&prompts, 0, self.max_context)?;
        let tb = prefill_bucket(pre.t);
        let all: Vec<usize> = (0..self.lanes).collect();
        let (tokens, pos) = place(&pre, &all, self.lanes, tb);
        let at = self.every_lane(tb);
        let out = self.run_role(GraphRole::Logits, at, &tokens, &pos, &[], &["logits"])?;
        let all: Vec<f32> = out[0]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let v = all.len() / (self.lanes * tb);
        Ok(all[..ids.len() * v].to_vec())
    }

    /// Writes row `i` of the i32 state value `s` (`[n, ...]`) into lane `at[i]`.
    fn write_rows(&self, s: &StateInit, at: &[usize]) -> Result<(), RuntimeError> {
        let bytes = s.i32_bytes();
        let per = bytes.len() / at.len().max(1);
        for (i, &lane) in at.iter().enumerate() {
            self.write_lane(s.name, lane, &bytes[i * per..][..per])?;
        }
        Ok(())
    }

    /// Bytes of one lane of a lane-major state (`[B, ...]`).
    fn lane_bytes(&self, name: &str) -> Result<u64, RuntimeError> {
        self.engine.state_lane_bytes(name)
    }

    /// Writes one lane's bytes of a lane-major state.
    fn write_lane(&self, name: &str, lane: usize, bytes: &[u8]) -> Result<(), RuntimeError> {
        let per = self.lane_bytes(name)?;
        let buf = self.engine.state(name)?;
        if bytes.len() as u64 != per {
            return Err(RuntimeError::Engine(format!(
                "state `{name}`: a lane holds {per} bytes, admission wrote {}",
                bytes.len()
            )));
        }
        buf.write(lane as u64 * per, bytes)
    }

    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// The target forward over `t` tokens per lane at positions `len..len + t` with every
    /// row's logits (a verify of `t` tokens), loaded from the engine's `t`-token all-row
    /// forward ([`GraphRole::Logits`]) and captured as its own graph, for timing.
    pub fn verify_graph(
        &mut self,
        t: usize,
        len: usize,
    ) -> Result<(LoadedGraph, StepGraph), RuntimeError> {
        let plan = plan_of(self.engine.engine, GraphRole::Logits, self.lanes, t)?;
        let g = self.engine.load(plan)?;
        let tokens: Vec<i64> = (0..self.lanes * t).map(|i| (i % 7) as i64 + 1).collect();
        let pos: Vec<i64> = (0..self.lanes)
            .flat_map(|_| (len..len + t).map(|p| p as i64))
            .collect();
        g.write("tokens", &i32_bytes(&tokens))?;
        g.write("positions", &i32_bytes(&pos))?;
        let captured = self.engine.capture(&g)?;
        Ok((g, captured))
    }

    /// Puts every lane in a steady state at sequence length `len` without a prefill (the KV
    /// cache holds zeros): for timing steps at a given context. Tokens are meaningless.
    pub fn arm_synthetic(&mut self, len: usize) -> Result<(), RuntimeError> {
        let lanes = self.lanes;
        let k = self.contract.num_steps;
        if (len + k + 3) as u64 > self.max_context {
            return Err(RuntimeError::ContextOverflow {
                needed: len + k + 3,
                max_context: self.max_context,
            });
        }
        let per = |v: i64| i32_bytes(&vec![v; lanes]);
        self.engine
            .write_state(specc_models::methods::LEN, &per(len as i64))?;
        self.engine.write_state(
            specc_models::methods::PENDING,
            &i32_bytes(&[1, 2].repeat(lanes)),
        )?;
        self.engine.write_state(BUDGET, &per(i32::MAX as i64 / 2))?;
        if self.engine.state(SAMPLING).is_ok() {
            // Every lane draws with the engine's knobs, as a sampled run does.
            let acceptance = &self.engine.engine.acceptance;
            let knobs: Vec<LaneSampling> = (0..lanes as u32)
                .map(|b| LaneSampling::defaults(acceptance, b))
                .collect();
            let s = admission::sampling_state(&knobs);
            self.engine.write_state(s.name, &s.f32_bytes())?;
        }
        match self.contract.priming() {
            Priming::Pairs { .. } => {
                self.engine
                    .write_state(specc_models::methods::EAGLE_COUNT, &per(1))?;
                self.engine
                    .write_state(specc_models::methods::EAGLE_BASE, &per(len as i64 - 1))?;
            }
            Priming::Context { .. } => {
                self.engine
                    .write_state(specc_models::methods::DFLASH_COUNT, &per(0))?;
                self.engine
                    .write_state(specc_models::methods::DFLASH_BASE, &per(len as i64))?;
            }
            Priming::None | Priming::Prompt => {}
        }
        self.engine.synchronize()
    }

    /// Queues one replay of the step graph (one `cuGraphLaunch`) and the ring copy after it.
    pub fn step(&mut self) -> Result<(), RuntimeError> {
        let lanes = self.lanes;
        self.step_at(lanes)
    }

    /// Queues the step the policy picks for bucket `b` (whose graphs hold lanes `0..b`).
    /// Nothing waits on the device unless the step switches a standalone draft in or out
    /// of plain decoding: then every ring is read first (between steps), so each lane's
    /// draft gap is known, and re-priming runs the draft prefill.
    fn step_at(&mut self, b: usize) -> Result<(), RuntimeError> {
        let live: Vec<bool> = (0..self.lanes).map(|l| l < b && self.admitted[l]).collect();
        if self.policy.switches() {
            // The lengths as of the last ring read (no device read inside a step): the steps
            // queued since are not counted, at most k + 1 tokens a lane each.
            let context = crate::policy::mean_context(self.sync.lengths(), &live, b);
            self.policy.set_context(context);
        }
        let v = self.policy.choose(b, &live);
        let k = self.policy.ks()[v];
        if self.policy.ks().len() > 1 {
            self.sync_draft(k, &live)?;
        }
        if let Some(c) = self.contract.catch_up {
            if c.needed(k, self.plain_run) {
                self.catch_up_at(b)?;
            }
            if k == 0 {
                self.plain_run += 1;
            }
        }
        let greedy = self.all_greedy(&live);
        self.replayed(b, v, greedy).replay()?;
        self.ring.after_replay()?;
        self.unread.push(v);
        self.stats.steps += 1;
        if greedy && !self.greedy.is_empty() {
            self.stats.greedy_steps += 1;
        }
        Ok(())
    }

    /// Queues the catch-up of the draft rows the plain steps since the last one queued
    /// ([`specc_ir::engine::CatchUp`]), at bucket `b` (the session's own where `b` has none): lanes past `b`
    /// are free or finished, their rows never read. Nothing waits on the device.
    fn catch_up_at(&mut self, b: usize) -> Result<(), RuntimeError> {
        let g = self
            .catch_up
            .iter()
            .find(|g| g.0 == b)
            .or_else(|| self.catch_up.iter().find(|g| g.0 == self.lanes))
            .ok_or_else(|| RuntimeError::Engine("the draft catch-up was not captured".into()))?;
        g.2.replay()?;
        self.plain_run = 0;
        self.catch_ups += 1;
        Ok(())
    }

    /// Catch-ups of queued draft rows replayed so far.
    pub fn catch_ups(&self) -> u64 {
        self.catch_ups
    }

    /// Keeps each lane's draft whole for a step of `k` draft tokens over `live`
    /// ([`DraftSync`]).
    fn sync_draft(&mut self, k: usize, live: &[bool]) -> Result<(), RuntimeError> {
        if k == 0 {
            if self.sync.needs_tokens_before_plain(live) {
                self.collect()?;
            }
            self.sync.plain_step(live);
            return Ok(());
        }
        if !self.sync.behind(live) {
            return Ok(());
        }
        self.collect()?;
        let lanes = self.lanes;
        let Some(r) = self.sync.reprime(live, lanes) else {
            return Ok(());
        };
        // In windows within the prefill chunk's budget over every lane.
        let per_lane = admission::lane_chunk(self.prefill_chunk, lanes);
        for w in admission::column_chunks(&r, per_lane) {
            let tb = prefill_bucket(w.t);
            if tb as u64 > self.max_context {
                return Err(RuntimeError::ContextOverflow {
                    needed: tb,
                    max_context: self.max_context,
                });
            }
            let all: Vec<usize> = (0..lanes).collect();
            let (tokens, pos) = place(&w, &all, lanes, tb);
            let every = self.every_lane(tb);
            self.run_prefill(false, every, &tokens, &pos, &[], &[])?;
        }
        Ok(())
    }

    /// Reads every lane's new ring tokens (waiting for the queued steps) into its
    /// undrained tokens, the draft bookkeeping, the acceptance histogram and the policy's
    /// acceptance (a lane's tokens of one step are its accepted count + 1; when several
    /// steps were queued between reads, only the histogram of a one-variant session
    /// learns from them).
    fn collect(&mut self) -> Result<(), RuntimeError> {
        let got = self.ring.wait_steps()?;
        self.take_tokens(got)
    }

    /// [`CudaSpecSession::collect`] of every queued step but the newest, which may still
    /// run.
    fn collect_behind(&mut self) -> Result<(), RuntimeError> {
        let got = self.ring.wait_behind()?;
        self.take_tokens(got)
    }

    /// Takes the ring's tokens `got` of its `n` oldest unread steps (see
    /// [`CudaSpecSession::collect`]).
    fn take_tokens(&mut self, (got, n): (Vec<Vec<i32>>, usize)) -> Result<(), RuntimeError> {
        let steps: Vec<usize> = self.unread.drain(..n.min(self.unread.len())).collect();
        let single = self.policy.ks().len() == 1;
        for (lane, toks) in got.into_iter().enumerate() {
            let toks: Vec<u32> = toks.into_iter().map(|x| x as u32).collect();
            let n = toks.len();
            if n > 0 {
                match steps.as_slice() {
                    [v] if self.policy.ks()[*v] > 0 || single => {
                        let a = (n - 1).min(self.policy.ks()[*v]);
                        self.stats.histogram[a] += 1;
                        self.policy.observe(lane, *v, a);
                    }
                    _ if single => self.record(n),
                    _ => {}
                }
            }
            self.sync.emitted(lane, &toks);
            self.undrained[lane].extend(toks);
        }
        Ok(())
    }

    /// Lets [`CudaSpecSession::step_upto`] replay the smallest captured bucket that holds
    /// the lanes in use (fewer rows at low load; buckets are captured by
    /// [`CudaSpecSession::with_buckets`]). Greedy tokens then stay the target's up to
    /// rounding, but a request's tokens may depend on the load: the kernels of another
    /// bucket may sum in another order, which can flip a near-tie.
    pub fn shrink_buckets(&mut self, on: bool) {
        self.shrink = on;
    }

    /// The batch buckets smaller than the session's whose steps are captured, ascending.
    pub fn smaller_buckets(&self) -> Vec<usize> {
        self.smaller.iter().map(|s| s.0).collect()
    }

    /// Queues one step of a batch whose lanes from `n` on are all free or finished: with
    /// [`CudaSpecSession::shrink_buckets`] on, the replay of the smallest captured bucket
    /// holding lanes `0..n`, else (or when none is smaller) of the session's own. Lanes past
    /// the bucket keep their states untouched, as a masked lane of the full bucket would.
    pub fn step_upto(&mut self, n: usize) -> Result<(), RuntimeError> {
        let b = self.bucket_for(n);
        self.step_at(b)
    }

    /// The batch bucket [`CudaSpecSession::step_upto`] replays for lanes `0..n`.
    pub fn bucket_for(&self, n: usize) -> usize {
        if !self.shrink {
            return self.lanes;
        }
        self.smaller
            .iter()
            .find(|s| s.0 >= n.max(1))
            .map_or(self.lanes, |s| s.0)
    }

    /// Replays of the step captured at batch bucket `b` so far.
    pub fn replays_at(&self, b: usize) -> u64 {
        match self.smaller.iter().find(|s| s.0 == b) {
            Some((_, _, g)) => g.replays(),
            None if b == self.lanes => self.step_graph.replays(),
            None => 0,
        }
    }

    /// Tokens emitted since the last drain (blocks until queued steps finished).
    pub fn drain(&mut self) -> Result<Vec<Vec<u32>>, RuntimeError> {
        self.collect()?;
        Ok(self.undrained.iter_mut().map(std::mem::take).collect())
    }

    /// The tokens of every queued step but the newest, per lane, and which lanes were live
    /// after the last of them (a lane admitted since counts as live): what a host that
    /// queues its next step before reading the last one reads, so the device does not wait
    /// on the host between steps. Reads nothing on the device but the token ring.
    pub fn drain_behind(&mut self) -> Result<crate::session::Behind, RuntimeError> {
        self.collect_behind()?;
        Ok(crate::session::Behind {
            tokens: self.undrained.iter_mut().map(std::mem::take).collect(),
            live: self.ring.live().to_vec(),
            unread: !self.unread.is_empty(),
        })
    }

    /// Records, per lane, a step that emitted `n` tokens (for the histogram).
    pub fn record(&mut self, n: usize) {
        if n > 0 {
            let a = (n - 1).min(self.contract.max_accept());
            self.stats.histogram[a] += 1;
        }
    }

    pub fn live(&self) -> Result<Vec<bool>, RuntimeError> {
        let b = self.engine.read_state(BUDGET)?;
        Ok(read_i32(&b).into_iter().map(|x| x > 0).collect())
    }

    pub fn finish(&mut self, lane: usize) -> Result<(), RuntimeError> {
        if let Some(a) = self.admitted.get_mut(lane) {
            *a = false;
        }
        self.engine
            .state(BUDGET)?
            .write((lane * 4) as u64, &0i32.to_le_bytes())
    }
}
