//! Speculative decoding on the CPU backend: the same step graph the CUDA backend captures,
//! executed by the interpreter. The host only admits lanes (prefill + state setup), runs
//! steps, and drains the token ring; every decision inside a step is made by the graph.

use std::collections::HashMap;
use std::time::Instant;

use specc_ir::engine::{Acceptance, CatchUp, Engine, GraphRole, Priming, StepContract};
use specc_ir::interp::{self, Data, Env, Tensor, WeightSource};
use specc_ir::{Bindings, DType, Graph};
use specc_models::methods::{
    BUDGET, DFLASH_HIDDEN, EAGLE_HIDDEN, EMITTED, FIRST_TOKEN, HIDDEN, LEN, RING, SAMPLING, STREAM,
};
use specc_models::SpecBundle;

use crate::admission::{self, Admit, ChunkRows, LaneSampling};
use crate::draft_sync::DraftSync;
use crate::policy::{AdaptivePolicy, SpecPolicy};

use crate::RuntimeError;

mod chunked;
mod timing;

use chunked::PendingLane;

pub use specc_ir::engine::DraftKind;

/// The graphs of one method and its contract: prefill of target and draft, and the step.
pub struct SpecGraphs<'a> {
    pub contract: StepContract,
    /// Outputs `next_token` (and `taps` when the draft reads them).
    pub target_prefill: &'a Graph,
    /// The target prefill again for plain decoding (no draft prefill runs).
    pub draft_prefill: &'a Graph,
    pub step: &'a Graph,
    /// The contract's step variants (other k over the same states), ascending by k.
    pub variants: Vec<(usize, &'a Graph)>,
    /// Under sampled acceptance, the greedy twin of the step at each k, ascending by k:
    /// run in its place while no live lane samples.
    pub greedy: Vec<(usize, &'a Graph)>,
    /// The contract's catch-up of the rows the plain variant queues, and its graph.
    pub catch_up: Option<(CatchUp, &'a Graph)>,
    /// How the graphs choose tokens; under sampled acceptance its knobs are those of lanes
    /// admitted without their own ([`SpecCpuSession::admit`]).
    pub acceptance: Acceptance,
}

impl<'a> SpecGraphs<'a> {
    /// The graphs of a speculative bundle.
    pub fn of(b: &'a SpecBundle) -> SpecGraphs<'a> {
        SpecGraphs {
            contract: b.contract(),
            target_prefill: &b.target_prefill,
            draft_prefill: &b.draft_prefill,
            step: &b.step,
            variants: b.variants.iter().map(|(k, g)| (*k as usize, g)).collect(),
            greedy: b.greedy.iter().map(|(k, g)| (*k as usize, g)).collect(),
            catch_up: b.contract.catch_up.zip(b.catch_up.as_ref()),
            acceptance: b.shape.acceptance.clone(),
        }
    }

    /// Plain decoding (k = 0): `prefill` and the decode `step`, no draft, greedy.
    pub fn plain(prefill: &'a Graph, step: &'a Graph, ring: usize) -> SpecGraphs<'a> {
        SpecGraphs {
            contract: StepContract::plain(ring),
            target_prefill: prefill,
            draft_prefill: prefill,
            step,
            variants: Vec::new(),
            greedy: Vec::new(),
            catch_up: None,
            acceptance: Acceptance::Greedy,
        }
    }

    /// The same graphs built for `acceptance`.
    pub fn with_acceptance(self, acceptance: Acceptance) -> SpecGraphs<'a> {
        SpecGraphs { acceptance, ..self }
    }

    /// The graphs of `contract` among `graphs` (parsed from an engine).
    pub fn from_engine(
        contract: &StepContract,
        graphs: &'a EngineGraphs,
    ) -> Result<SpecGraphs<'a>, RuntimeError> {
        let target_prefill = graphs.get(contract.target_prefill)?;
        Ok(SpecGraphs {
            contract: contract.clone(),
            target_prefill,
            draft_prefill: match contract.draft_prefill {
                Some(r) => graphs.get(r)?,
                None => target_prefill,
            },
            step: graphs.get(contract.step)?,
            variants: contract
                .variants
                .iter()
                .map(|v| Ok((v.k, graphs.get(v.role)?)))
                .collect::<Result<_, RuntimeError>>()?,
            greedy: contract
                .greedy
                .iter()
                .map(|v| Ok((v.k, graphs.get(v.role)?)))
                .collect::<Result<_, RuntimeError>>()?,
            catch_up: match contract.catch_up {
                Some(c) => Some((c, graphs.get(c.role)?)),
                None => None,
            },
            acceptance: graphs.acceptance.clone(),
        })
    }
}

/// An engine's graphs, parsed from their IR text once (what the CPU backend executes).
pub struct EngineGraphs {
    graphs: Vec<(GraphRole, Graph)>,
    acceptance: Acceptance,
}

impl EngineGraphs {
    pub fn parse(engine: &Engine) -> Result<EngineGraphs, RuntimeError> {
        let mut graphs = Vec::new();
        for g in &engine.graphs {
            let parsed = specc_ir::text::parse(&g.ir)
                .map_err(|e| RuntimeError::Engine(format!("graph `{}`: {e}", g.role)))?;
            graphs.push((g.role, parsed));
        }
        Ok(EngineGraphs {
            graphs,
            acceptance: engine.acceptance.clone(),
        })
    }

    pub fn get(&self, role: GraphRole) -> Result<&Graph, RuntimeError> {
        self.graphs
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, g)| g)
            .ok_or_else(|| RuntimeError::Engine(format!("the engine has no `{role}` graph")))
    }
}

/// Per-step statistics the host can see without reading anything inside a step.
#[derive(Clone, Debug, Default)]
pub struct SpecStats {
    pub steps: usize,
    /// Steps that ran a greedy twin (a sampling engine's step while no live lane sampled).
    pub greedy_steps: usize,
    /// histogram[a] = steps (per live lane) that accepted a draft tokens, a in 0..=k.
    pub histogram: Vec<usize>,
    /// The most rows one target prefill of an admission took: lanes × prompt rows, padding
    /// included (on the GPU the window's lanes × its prompt bucket).
    pub widest_prefill: usize,
}

impl SpecStats {
    /// Mean tokens emitted per lane-step (accepted + 1).
    pub fn mean_accept_len(&self) -> f64 {
        let n: usize = self.histogram.iter().sum();
        let tot: usize = self
            .histogram
            .iter()
            .enumerate()
            .map(|(a, c)| (a + 1) * c)
            .sum();
        tot as f64 / n.max(1) as f64
    }
}

/// B lanes of speculative decoding over interpreter states.
pub struct SpecCpuSession<'a> {
    graphs: SpecGraphs<'a>,
    weights: &'a dyn WeightSource,
    states: HashMap<String, Tensor>,
    /// Lanes the states hold now, the batch graphs run at: `lanes` unless a step ran over
    /// fewer ([`SpecCpuSession::step_upto`]).
    rows: usize,
    lanes: usize,
    max_context: u64,
    /// Tokens drained from each lane's ring so far.
    drained: Vec<usize>,
    /// The graphs verified so far (by address: the session borrows them unchanged), so
    /// each is verified once, not at every step.
    verified: Vec<usize>,
    /// Tokens read from the rings but not yet drained, per lane.
    undrained: Vec<Vec<u32>>,
    /// Which step variant runs next.
    policy: AdaptivePolicy,
    /// Each lane's tokens and draft-cache gap across plain steps.
    sync: DraftSync,
    /// Plain steps since the last catch-up of their queued draft rows ([`CatchUp`]).
    plain_run: usize,
    /// Catch-ups run so far.
    catch_ups: u64,
    /// The last step's `accepted` output, per lane of the states.
    accepted: Vec<i64>,
    /// The admission running now skips the draft prefill ([`SpecCpuSession::admit_lane`]
    /// while plain decoding runs).
    skip_priming: bool,
    /// Most prompt rows one prefill takes (0: a whole prompt).
    prefill_chunk: usize,
    /// Lane admissions begun and not yet armed, in the order their chunks run.
    pending: std::collections::VecDeque<PendingLane>,
    pub stats: SpecStats,
}

fn ints(t: &Tensor) -> Result<&[i64], RuntimeError> {
    match &t.data {
        Data::I64(v) => Ok(v),
        Data::F32(_) => Err(RuntimeError::MissingOutput("integer tensor")),
    }
}

impl<'a> SpecCpuSession<'a> {
    pub fn new(
        graphs: SpecGraphs<'a>,
        weights: &'a dyn WeightSource,
        lanes: usize,
        max_context: u64,
    ) -> Self {
        let k = graphs.contract.max_accept();
        let mut ks: Vec<usize> = graphs.variants.iter().map(|v| v.0).collect();
        ks.push(k);
        let mut policy = AdaptivePolicy::new(ks, lanes, SpecPolicy::Fixed);
        policy.set_steps_timed(true);
        let sync = DraftSync::new(graphs.contract.priming(), lanes);
        SpecCpuSession {
            graphs,
            weights,
            states: HashMap::new(),
            rows: lanes,
            lanes,
            max_context,
            drained: vec![0; lanes],
            verified: Vec::new(),
            undrained: vec![Vec::new(); lanes],
            policy,
            sync,
            plain_run: 0,
            catch_ups: 0,
            accepted: Vec::new(),
            skip_priming: false,
            prefill_chunk: 0,
            pending: Default::default(),
            stats: SpecStats {
                steps: 0,
                greedy_steps: 0,
                histogram: vec![0; k + 1],
                widest_prefill: 0,
            },
        }
    }

    fn run(
        &mut self,
        g: &Graph,
        t: u64,
        inputs: HashMap<String, Tensor>,
    ) -> Result<HashMap<String, Tensor>, RuntimeError> {
        let mut states = std::mem::take(&mut self.states);
        let out = self.run_on(g, t, inputs, &mut states);
        self.states = states;
        out
    }

    /// [`SpecCpuSession::run`] over `states` instead of the session's.
    fn run_on(
        &mut self,
        g: &Graph,
        t: u64,
        inputs: HashMap<String, Tensor>,
        states: &mut HashMap<String, Tensor>,
    ) -> Result<HashMap<String, Tensor>, RuntimeError> {
        let at = g as *const Graph as usize;
        if !self.verified.contains(&at) {
            specc_ir::verify(g)?;
            self.verified.push(at);
        }
        let mut env = Env {
            bind: Bindings::new(self.rows as u64, t, self.max_context),
            inputs,
            weights: self.weights,
            states,
        };
        Ok(interp::run_verified(g, &mut env)?)
    }

    /// Prefills every lane with its prompt (lengths may differ: shorter prompts are padded
    /// with masked lanes) and arms the step states. Returns each lane's first token. Under
    /// sampled acceptance lane `b` draws on stream `b` with the graphs' default knobs.
    pub fn admit(
        &mut self,
        prompts: &[Vec<u32>],
        max_new: usize,
    ) -> Result<Vec<u32>, RuntimeError> {
        let lanes: Vec<LaneSampling> = (0..prompts.len() as u32)
            .map(|b| LaneSampling::defaults(&self.graphs.acceptance, b))
            .collect();
        let first = self.admit_with(prompts, max_new, &lanes)?;
        for (lane, (p, &f)) in prompts.iter().zip(&first).enumerate() {
            self.admitted(lane, p, f);
        }
        Ok(first)
    }

    /// A lane starts a sequence: nothing of its previous one is pending, its acceptance
    /// starts from the session's, its draft is whole.
    fn admitted(&mut self, lane: usize, prompt: &[u32], first: u32) {
        if lane >= self.undrained.len() {
            self.undrained.resize(lane + 1, Vec::new());
        }
        self.undrained[lane].clear();
        self.sync.admit(lane, prompt, first);
        self.policy.admit(lane);
    }

    /// Admissions that skipped the draft prefill because plain decoding was running.
    pub fn unprimed_admissions(&self) -> u64 {
        self.sync.unprimed_admissions()
    }

    /// Which step variant runs next (adaptive speculation; [`SpecPolicy::Fixed`] unless
    /// set).
    pub fn policy(&self) -> &AdaptivePolicy {
        &self.policy
    }

    pub fn policy_mut(&mut self) -> &mut AdaptivePolicy {
        &mut self.policy
    }

    /// [`SpecCpuSession::admit`] with each lane's sampling knobs and RNG stream. The lanes
    /// are prefilled together, chunk by chunk within the prefill chunk's budget of rows
    /// across them ([`SpecCpuSession::set_prefill_chunk`], [`admission::lane_chunk`]).
    pub fn admit_with(
        &mut self,
        prompts: &[Vec<u32>],
        max_new: usize,
        sampling: &[LaneSampling],
    ) -> Result<Vec<u32>, RuntimeError> {
        assert_eq!(prompts.len(), self.rows, "one prompt per lane");
        assert_eq!(sampling.len(), prompts.len(), "one sampling per lane");
        self.pending.clear();
        let prompts: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        self.begin_states(&prompts, sampling)?;
        let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        let mut first = vec![None; prompts.len()];
        let per_lane = admission::lane_chunk(self.prefill_chunk, prompts.len());
        let mut start = 0;
        while start < longest {
            let rows = admission::chunk_rows(&prompts, start, per_lane);
            self.run_chunk(&rows, &mut first)?;
            start += rows.iter().map(|r| r.len).max().unwrap_or(0);
        }
        let first: Vec<u32> = first
            .into_iter()
            .map(|f| f.expect("every prompt ends in a chunk"))
            .collect();
        self.arm(&prompts, &first, max_new)?;
        Ok(first)
    }

    /// Before a prefill's first chunk: checks the prompts, writes the lanes' RNG streams and
    /// sampling knobs (the prefill's draw of the first token reads them) and zeroes the
    /// draft's slots a chunk fills.
    fn begin_states(
        &mut self,
        prompts: &[&[u32]],
        sampling: &[LaneSampling],
    ) -> Result<(), RuntimeError> {
        let k = self.graphs.contract.num_steps;
        admission::check_prompts(prompts, k, self.max_context)?;
        let graphs = [self.graphs.step, self.graphs.target_prefill];
        if graphs.iter().any(|g| g.find_leaf(STREAM).is_some()) {
            let streams: Vec<u32> = sampling.iter().map(|l| l.stream).collect();
            let s = admission::stream_state(&streams);
            self.states.insert(
                s.name.into(),
                Tensor::from_i64(DType::I32, s.dims, s.values),
            );
        }
        if graphs.iter().any(|g| g.find_leaf(SAMPLING).is_some()) {
            let s = admission::sampling_state(sampling);
            self.states.insert(
                s.name.into(),
                Tensor::from_f32(DType::F32, s.dims, s.values),
            );
        }
        let lanes = self.rows;
        match self.graphs.contract.priming() {
            Priming::Pairs {
                taps_width,
                depth: k,
            } => {
                let dtype = self.state_dtype(EAGLE_HIDDEN);
                self.states.insert(
                    EAGLE_HIDDEN.into(),
                    Tensor::zeros(dtype, vec![lanes, k + 1, taps_width]),
                );
            }
            Priming::Context { taps_width, rows } => {
                let dtype = self.state_dtype(DFLASH_HIDDEN);
                self.states.insert(
                    DFLASH_HIDDEN.into(),
                    Tensor::zeros(dtype, vec![lanes, rows, taps_width]),
                );
            }
            Priming::None | Priming::Prompt => {}
        }
        Ok(())
    }

    /// The dtype of the step graph's state `name` (f32 where the step has none).
    fn state_dtype(&self, name: &str) -> DType {
        self.graphs
            .step
            .states()
            .find(|(_, n, _)| *n == name)
            .map_or(DType::F32, |(_, _, ty)| ty.dtype)
    }

    /// Runs one prefill chunk over every lane of the states (`rows[b]`: lane `b`'s rows,
    /// none for a lane whose prompt ended) and the method's draft priming of the same
    /// rows; `first[b]` gets lane `b`'s first token when its prompt ends in this chunk
    /// (and, for EAGLE-3, the `eagle.hidden` slot its last row's taps).
    fn run_chunk(
        &mut self,
        rows: &[ChunkRows],
        first: &mut [Option<u32>],
    ) -> Result<(), RuntimeError> {
        let pre = admission::chunk_inputs(rows);
        let t = pre.t;
        let lanes = self.rows;
        self.stats.widest_prefill = self.stats.widest_prefill.max(lanes * t);
        let ids = |v: &[i64], t: usize| Tensor::from_i64(DType::I32, vec![lanes, t], v.to_vec());
        let inputs = HashMap::from([
            ("tokens".to_string(), ids(&pre.tokens, t)),
            ("positions".to_string(), ids(&pre.positions, t)),
        ]);
        let out = self.run(self.graphs.target_prefill, t as u64, inputs.clone())?;
        let next = ints(
            out.get("next_token")
                .ok_or(RuntimeError::MissingOutput("next_token"))?,
        )?;
        let drawn = out.get(FIRST_TOKEN).map(ints).transpose()?;
        let chosen = drawn.unwrap_or(next);
        for (b, r) in rows.iter().enumerate() {
            if r.ends() {
                first[b] = Some(chosen[b] as u32);
            }
        }
        match self.graphs.contract.priming() {
            Priming::None => {}
            Priming::Prompt if self.skip_priming => {}
            Priming::Prompt => {
                self.run(self.graphs.draft_prefill, t as u64, inputs)?;
            }
            Priming::Pairs {
                taps_width: w,
                depth: k,
            } => {
                let taps = out.get("taps").ok_or(RuntimeError::MissingOutput("taps"))?;
                let taps = taps.as_f32()?.to_vec();
                if let Some(pairs) = admission::eagle_pairs(rows, t) {
                    let tp = pairs.inputs.t;
                    let mut hidden = vec![0f32; lanes * tp * w];
                    for &(dst, src) in &pairs.hidden_rows {
                        hidden[dst * w..][..w].copy_from_slice(&taps[src * w..][..w]);
                    }
                    let dtype = self
                        .graphs
                        .draft_prefill
                        .inputs()
                        .find(|(_, n, _)| *n == HIDDEN)
                        .map(|(_, _, ty)| ty.dtype)
                        .unwrap_or(DType::F32);
                    let head_inputs = HashMap::from([
                        (
                            HIDDEN.to_string(),
                            Tensor::from_f32(dtype, vec![lanes, tp, w], hidden),
                        ),
                        ("tokens".to_string(), ids(&pairs.inputs.tokens, tp)),
                        ("positions".to_string(), ids(&pairs.inputs.positions, tp)),
                    ]);
                    self.run(self.graphs.draft_prefill, tp as u64, head_inputs)?;
                }
                let slots = self
                    .states
                    .get_mut(EAGLE_HIDDEN)
                    .ok_or(RuntimeError::MissingOutput(EAGLE_HIDDEN))?;
                let Data::F32(slots) = &mut slots.data else {
                    return Err(RuntimeError::MissingOutput(EAGLE_HIDDEN));
                };
                for b in 0..rows.len() {
                    if let Some(src) = admission::eagle_slot_row(rows, b, t) {
                        let dst = b * (k + 1);
                        slots[dst * w..][..w].copy_from_slice(&taps[src * w..][..w]);
                    }
                }
            }
            Priming::Context { .. } => {
                let taps = out.get("taps").ok_or(RuntimeError::MissingOutput("taps"))?;
                let head_inputs = HashMap::from([
                    (HIDDEN.to_string(), taps.clone()),
                    ("positions".to_string(), ids(&pre.positions, t)),
                ]);
                self.run(self.graphs.draft_prefill, t as u64, head_inputs)?;
            }
        }
        Ok(())
    }

    /// After a prefill's last chunk: the method's draft states, the step states and an
    /// empty ring for every lane of the states.
    fn arm(
        &mut self,
        prompts: &[&[u32]],
        first: &[u32],
        max_new: usize,
    ) -> Result<(), RuntimeError> {
        let k = self.graphs.contract.num_steps;
        let lanes = self.rows;
        let mut states = Vec::new();
        match self.graphs.contract.priming() {
            Priming::Pairs { depth, .. } => {
                states.extend(admission::eagle_states(prompts, first, depth))
            }
            Priming::Context { .. } => states.extend(admission::dflash_states(prompts)),
            Priming::None | Priming::Prompt => {}
        }
        states.extend(admission::step_states(
            prompts,
            first,
            max_new,
            self.max_context,
            k,
        ));
        for s in states {
            self.states.insert(
                s.name.into(),
                Tensor::from_i64(DType::I32, s.dims, s.values),
            );
        }
        self.states.insert(
            RING.into(),
            Tensor::zeros(DType::I32, vec![lanes, self.graphs.contract.ring, 1, 1]),
        );
        self.drained = vec![0; self.lanes.max(lanes)];
        Ok(())
    }

    /// How the session's graphs choose tokens (under sampling, the default knobs of lanes).
    pub fn acceptance(&self) -> &Acceptance {
        &self.graphs.acceptance
    }

    /// Lanes of the session (the largest batch a step runs at).
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Prefills one lane with `prompt` and arms its step states, leaving every other lane's
    /// states (caches, lengths, budgets, draft state, ring) as they are: continuous batching.
    /// The prefill runs at batch 1 on fresh states and its results are copied into lane
    /// `lane`, so a lane's tokens do not depend on what the other lanes hold (the interpreter
    /// computes every row on its own, in the same order at any batch). Slots past the
    /// prompt in the lane's caches keep stale values, which no step reads before writing.
    /// Under sampled acceptance the lane draws with `sampling`'s knobs from its RNG stream
    /// (taken modulo [`admission::STREAMS`]): the same prompt, budget, knobs and stream give
    /// the same tokens in any lane, next to any others. A prompt longer than the prefill
    /// chunk is prefilled chunk by chunk ([`SpecCpuSession::begin_admission`]), all here.
    pub fn admit_lane(
        &mut self,
        lane: usize,
        prompt: &[u32],
        max_new: usize,
        sampling: LaneSampling,
    ) -> Result<u32, RuntimeError> {
        if !self.pending.is_empty() {
            return Err(RuntimeError::Engine(
                "an admission is prefilling: run its chunks before admitting another lane whole"
                    .into(),
            ));
        }
        self.begin_admission(&Admit {
            lane,
            prompt,
            max_new,
            sampling,
        })?;
        loop {
            if let Some(&(_, first)) = self.prefill_chunk()?.first() {
                return Ok(first);
            }
        }
    }

    /// Copies a batch-1 tensor into lane `lane` of state `name` (created as zeros of
    /// the session's rows when absent).
    fn put_lane(&mut self, name: &str, lane: usize, one: &Tensor) -> Result<(), RuntimeError> {
        let lanes = self.rows;
        let full = self.states.entry(name.to_string()).or_insert_with(|| {
            let mut shape = one.shape.clone();
            shape[0] = lanes;
            Tensor::zeros(one.dtype, shape)
        });
        if one.shape.first() != Some(&1)
            || full.shape.first() != Some(&lanes)
            || full.shape[1..] != one.shape[1..]
            || full.dtype != one.dtype
        {
            return Err(RuntimeError::Engine(format!(
                "state `{name}`: a lane of shape {:?} does not fit the session's {:?}",
                one.shape, full.shape
            )));
        }
        let row = one.shape[1..].iter().product::<usize>();
        match (&mut full.data, &one.data) {
            (Data::F32(f), Data::F32(o)) => f[lane * row..][..row].copy_from_slice(o),
            (Data::I64(f), Data::I64(o)) => f[lane * row..][..row].copy_from_slice(o),
            _ => {
                return Err(RuntimeError::Engine(format!(
                    "state `{name}`: a lane's storage differs from the session's"
                )))
            }
        }
        Ok(())
    }

    /// Whether every state has the lane axis first (so the first `n` lanes of each state
    /// are a prefix of its storage, and the session can run at batch `n`).
    fn lane_major(&self) -> bool {
        let graphs = [
            self.graphs.step,
            self.graphs.target_prefill,
            self.graphs.draft_prefill,
        ];
        graphs.iter().all(|g| {
            g.states()
                .all(|(_, _, ty)| ty.shape.dims().first() == Some(&specc_ir::op::B))
        }) && self
            .states
            .values()
            .all(|t| t.shape.first() == Some(&self.rows))
    }

    /// Makes the states hold `n` lanes: lanes past `n` are dropped (they are free or
    /// finished: nothing of them is read again), new lanes are zeros (budget 0: masked).
    fn resize(&mut self, n: usize) -> Result<(), RuntimeError> {
        if n == self.rows {
            return Ok(());
        }
        if !self.lane_major() {
            return Err(RuntimeError::Engine(format!(
                "a state of the engine does not lead with the lane axis: the session runs at {} lanes only",
                self.rows
            )));
        }
        for t in self.states.values_mut() {
            let row = t.shape[1..].iter().product::<usize>();
            match &mut t.data {
                Data::F32(v) => v.resize(n * row, 0.0),
                Data::I64(v) => v.resize(n * row, 0),
            }
            t.shape[0] = n;
        }
        for d in &mut self.drained[n.min(self.rows)..] {
            *d = 0;
        }
        self.rows = n;
        Ok(())
    }

    /// Creates, as zeros, every state of the step graphs not yet present (a session whose
    /// lanes were admitted one at a time has only the states admission wrote; the plain
    /// variant's queue ring is in no other step).
    fn ensure_step_states(&mut self) -> Result<(), RuntimeError> {
        let mut states = std::mem::take(&mut self.states);
        let mut graphs = std::iter::once(self.graphs.step)
            .chain(self.graphs.variants.iter().map(|v| v.1))
            .chain(self.graphs.greedy.iter().map(|v| v.1))
            .chain(self.graphs.catch_up.map(|c| c.1));
        let r = graphs.try_for_each(|g| self.zero_states(g, &mut states));
        self.states = states;
        r
    }

    /// Replays the catch-up of the draft rows queued by plain steps
    /// ([`CatchUp`]) if any plain step ran since the last one: before a speculative step,
    /// the host calls it through [`SpecCpuSession::step`]; tests call it to read the states
    /// a speculative step would start from.
    pub fn catch_up(&mut self) -> Result<(), RuntimeError> {
        let Some((_, g)) = self.graphs.catch_up else {
            return Ok(());
        };
        if self.plain_run == 0 {
            return Ok(());
        }
        self.ensure_step_states()?;
        self.run(g, 1, HashMap::new())?;
        self.plain_run = 0;
        self.catch_ups += 1;
        Ok(())
    }

    /// Catch-ups of queued draft rows run so far ([`SpecCpuSession::catch_up`]).
    pub fn catch_ups(&self) -> u64 {
        self.catch_ups
    }

    /// The last step's accepted draft tokens per lane of the states (0 for a plain step).
    pub fn last_accepted(&self) -> &[i64] {
        &self.accepted
    }

    /// Adds, as zeros at the session's rows, every state of `g` that `states` lacks.
    fn zero_states(
        &self,
        g: &Graph,
        states: &mut HashMap<String, Tensor>,
    ) -> Result<(), RuntimeError> {
        let bind = Bindings::new(self.rows as u64, 1, self.max_context);
        for (_, name, ty) in g.states() {
            if !states.contains_key(name) {
                let shape = ty.shape.resolve(&bind).ok_or_else(|| {
                    RuntimeError::Engine(format!("state `{name}` has an unresolved shape"))
                })?;
                states.insert(name.to_string(), Tensor::zeros(ty.dtype, shape));
            }
        }
        Ok(())
    }

    /// Runs one step over lanes `0..n` only, when every lane from `n` on is free or
    /// finished: the states shrink to (or grow to) `n` lanes first, so the interpreter
    /// computes no rows of idle lanes. Where the states cannot be resized the step runs
    /// over the lanes they hold.
    pub fn step_upto(&mut self, n: usize) -> Result<(), RuntimeError> {
        let n = n.clamp(1, self.lanes);
        if self.lane_major() {
            self.resize(n)?;
        }
        self.step()
    }

    /// The interpreter states between steps (caches, step states), for inspection.
    pub fn states(&self) -> &HashMap<String, Tensor> {
        &self.states
    }

    /// Marks lane `b` finished: the device masks it from the next step on.
    pub fn finish(&mut self, b: usize) {
        // A lane past the states' rows is already out of every step.
        if let Some(Data::I64(v)) = self.states.get_mut(BUDGET).map(|t| &mut t.data) {
            if let Some(x) = v.get_mut(b) {
                *x = 0;
            }
        }
    }

    /// Lanes still live (budget > 0).
    pub fn live(&self) -> Vec<bool> {
        match self.states.get(BUDGET).map(|t| &t.data) {
            Some(Data::I64(v)) => v.iter().map(|&x| x > 0).collect(),
            _ => vec![false; self.rows],
        }
        .into_iter()
        .chain(std::iter::repeat(false))
        .take(self.lanes)
        .collect()
    }

    /// The live lanes' lengths summed over the session's rows (a dead lane counts 0): the
    /// mean context a step's attention reads per lane, as the calibration's lanes all sit at
    /// one.
    fn mean_context(&self, live: &[bool]) -> f64 {
        let Some(Data::I64(len)) = self.states.get(LEN).map(|t| &t.data) else {
            return 0.0;
        };
        crate::policy::mean_context(len.iter().copied(), live, self.rows)
    }

    /// The step graph of variant `v` (indexed like [`AdaptivePolicy::ks`]).
    fn variant_graph(&self, v: usize) -> &'a Graph {
        match self.graphs.variants.get(v) {
            Some((_, g)) => g,
            None => self.graphs.step,
        }
    }

    /// What a step of variant `v` runs: its greedy twin where `greedy` (no live lane
    /// samples) and the contract has one, else [`SpecCpuSession::variant_graph`].
    pub(super) fn step_graph_of(&self, v: usize, greedy: bool) -> &'a Graph {
        let k = self.policy.ks()[v];
        let twin = self.graphs.greedy.iter().find(|(tk, _)| *tk == k);
        match twin.filter(|_| greedy) {
            Some((_, g)) => g,
            None => self.variant_graph(v),
        }
    }

    /// Whether no lane of `live` samples: its temperature (column 0 of [`SAMPLING`]) is
    /// not above 0.
    fn all_greedy(&self, live: &[bool]) -> bool {
        match self.states.get(SAMPLING).map(|t| &t.data) {
            Some(Data::F32(knobs)) => live
                .iter()
                .enumerate()
                .all(|(b, &l)| !l || knobs.get(b * 3).is_none_or(|&t| t.is_nan() || t <= 0.0)),
            _ => true,
        }
    }

    /// Keeps each lane's draft whole for a step of `k` draft tokens over `live`: before a
    /// plain step every lane's tokens must be read (so its gap starts where it is known),
    /// before a speculative one every lane behind is re-primed by the draft prefill.
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
        if let Some(r) = self.sync.reprime(live, self.rows) {
            let ids = |v: Vec<i64>| Tensor::from_i64(DType::I32, vec![self.rows, r.t], v);
            let inputs = HashMap::from([
                ("tokens".to_string(), ids(r.tokens)),
                ("positions".to_string(), ids(r.positions)),
            ]);
            let t0 = Instant::now();
            self.run(self.graphs.draft_prefill, r.t as u64, inputs)?;
            self.policy
                .observe_reprime(self.rows * r.t, t0.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Runs one step graph over all lanes: the variant the policy picks.
    pub fn step(&mut self) -> Result<(), RuntimeError> {
        self.ensure_step_states()?;
        let live = self.live();
        let bucket = self.rows;
        if self.policy.needs_times() {
            self.calibrate(bucket)?;
        }
        if self.sync.can_reprime() {
            let backlog = self.sync.backlog(&live, self.rows);
            self.policy.set_reprime_backlog(backlog);
        }
        if self.policy.switches() {
            let context = self.mean_context(&live);
            self.policy.set_context(context);
        }
        let v = self.policy.choose(bucket, &live);
        let k = self.policy.ks()[v];
        let single = self.policy.ks().len() == 1;
        let t_sync = Instant::now();
        if !single {
            self.sync_draft(k, &live)?;
        }
        if let Some((c, _)) = self.graphs.catch_up {
            if c.needed(k, self.plain_run) {
                self.catch_up()?;
            }
            if k == 0 {
                self.plain_run += 1;
            }
        }
        let host_s = t_sync.elapsed().as_secs_f64();
        let greedy = self.all_greedy(&live);
        let twin = greedy && !self.graphs.greedy.is_empty();
        let t0 = Instant::now();
        let out = self.run(self.step_graph_of(v, greedy), 1, HashMap::new())?;
        let step_s = t0.elapsed().as_secs_f64();
        // The policy's times are the twins' where there are twins (it chooses only while
        // no live lane samples).
        if self.policy.switches() && (twin || self.graphs.greedy.is_empty()) {
            self.policy.observe_time(bucket, v, step_s);
        }
        if twin {
            self.stats.greedy_steps += 1;
        }
        let acc = ints(
            out.get("accepted")
                .ok_or(RuntimeError::MissingOutput("accepted"))?,
        )?
        .to_vec();
        self.accepted.clone_from(&acc);
        for (b, &a) in acc.iter().enumerate() {
            // Plain steps of a speculative session say nothing about acceptance.
            if live[b] && (k > 0 || single) {
                let a = (a as usize).min(k);
                self.stats.histogram[a] += 1;
                self.policy.observe(b, v, a);
            }
        }
        let tokens = acc
            .iter()
            .zip(&live)
            .filter(|(_, &l)| l)
            .map(|(&a, _)| (a as usize).min(k) + 1)
            .sum();
        self.policy.trace_step(bucket, v, step_s, tokens, host_s);
        self.stats.steps += 1;
        Ok(())
    }

    /// Tokens emitted since the last drain, per lane (read from the ring, as the CUDA
    /// backend's host does from its pinned mirror).
    pub fn drain(&mut self) -> Result<Vec<Vec<u32>>, RuntimeError> {
        self.collect()?;
        let lanes = self.lanes;
        let mut out: Vec<Vec<u32>> = self.undrained.iter_mut().map(std::mem::take).collect();
        out.resize(lanes, Vec::new());
        Ok(out)
    }

    /// Reads every lane's new ring tokens into its undrained tokens (and the draft
    /// bookkeeping).
    fn collect(&mut self) -> Result<(), RuntimeError> {
        let emitted = ints(
            self.states
                .get(EMITTED)
                .ok_or(RuntimeError::MissingOutput(EMITTED))?,
        )?
        .to_vec();
        let ring = ints(
            self.states
                .get(RING)
                .ok_or(RuntimeError::MissingOutput(RING))?,
        )?;
        let r = self.graphs.contract.ring;
        let mut out = Vec::with_capacity(self.lanes);
        for b in 0..self.lanes {
            if b >= self.rows {
                out.push(Vec::new());
                continue;
            }
            let upto = emitted[b] as usize;
            if upto - self.drained[b] > r {
                return Err(RuntimeError::RingOverrun {
                    lane: b,
                    capacity: r,
                });
            }
            out.push(
                (self.drained[b]..upto)
                    .map(|e| ring[b * r + e % r] as u32)
                    .collect(),
            );
            self.drained[b] = upto;
        }
        for (b, new) in out.into_iter().enumerate() {
            self.sync.emitted(b, &new);
            if b >= self.undrained.len() {
                self.undrained.resize(b + 1, Vec::new());
            }
            self.undrained[b].extend(new);
        }
        Ok(())
    }
}
