//! Speculative decoding on the CPU backend: the same step graph the CUDA backend captures,
//! executed by the interpreter. The host only admits lanes (prefill + state setup), runs
//! steps, and drains the token ring; every decision inside a step is made by the graph.

use std::collections::HashMap;

use specc_ir::interp::{self, Data, Env, Tensor, WeightSource};
use specc_ir::{Bindings, DType, Graph};
use specc_models::spec_step::{
    BUDGET, EAGLE_BASE, EAGLE_COUNT, EAGLE_HIDDEN, EAGLE_TOKENS, EMITTED, HIDDEN, LEN, PENDING,
    RING, STEP,
};

use crate::RuntimeError;

/// How the draft is primed at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftKind {
    /// No draft (k = 0): the step graph is plain decoding; `draft_prefill` is not run.
    None,
    /// A standalone model: its prefill reads the prompt like the target's.
    Model,
    /// An EAGLE-3 head: its prefill reads (target taps, next token) pairs; `taps_width`
    /// is 3 × hidden.
    Eagle3 { taps_width: usize },
}

/// The graphs of one method: prefill of target and draft, and the step.
pub struct SpecGraphs<'a> {
    pub kind: DraftKind,
    /// Outputs `next_token` (and `taps` for EAGLE-3).
    pub target_prefill: &'a Graph,
    pub draft_prefill: &'a Graph,
    pub step: &'a Graph,
    /// k: draft tokens per step.
    pub num_steps: usize,
    /// Ring capacity per lane, in tokens.
    pub ring: usize,
}

/// Per-step statistics the host can see without reading anything inside a step.
#[derive(Clone, Debug, Default)]
pub struct SpecStats {
    pub steps: usize,
    /// histogram[a] = steps (per live lane) that accepted a draft tokens, a in 0..=k.
    pub histogram: Vec<usize>,
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
    lanes: usize,
    max_context: u64,
    /// Tokens drained from each lane's ring so far.
    drained: Vec<usize>,
    pub stats: SpecStats,
}

fn ids_tensor(rows: &[Vec<i64>], t: usize) -> Tensor {
    let data = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_i64(DType::I32, vec![rows.len(), t], data)
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
        let k = graphs.num_steps;
        SpecCpuSession {
            graphs,
            weights,
            states: HashMap::new(),
            lanes,
            max_context,
            drained: vec![0; lanes],
            stats: SpecStats {
                steps: 0,
                histogram: vec![0; k + 1],
            },
        }
    }

    fn run(
        &mut self,
        g: &Graph,
        t: u64,
        inputs: HashMap<String, Tensor>,
    ) -> Result<HashMap<String, Tensor>, RuntimeError> {
        let mut env = Env {
            bind: Bindings::new(self.lanes as u64, t, self.max_context),
            inputs,
            weights: self.weights,
            states: &mut self.states,
        };
        Ok(interp::run(g, &mut env)?)
    }

    /// Prefills every lane with its prompt (lengths may differ: shorter prompts are padded
    /// with masked lanes) and arms the step states. Returns each lane's first token.
    pub fn admit(
        &mut self,
        prompts: &[Vec<u32>],
        max_new: usize,
    ) -> Result<Vec<u32>, RuntimeError> {
        assert_eq!(prompts.len(), self.lanes, "one prompt per lane");
        let k = self.graphs.num_steps;
        let t = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        if t == 0 {
            return Err(RuntimeError::EmptyStep);
        }
        let needed = t + k + 3;
        if needed as u64 > self.max_context {
            return Err(RuntimeError::ContextOverflow {
                needed,
                max_context: self.max_context,
            });
        }
        let tokens: Vec<Vec<i64>> = prompts
            .iter()
            .map(|p| (0..t).map(|i| p.get(i).map_or(0, |&x| x as i64)).collect())
            .collect();
        let positions: Vec<Vec<i64>> = prompts
            .iter()
            .map(|p| {
                (0..t)
                    .map(|i| if i < p.len() { i as i64 } else { -1 })
                    .collect()
            })
            .collect();
        let inputs = || {
            HashMap::from([
                ("tokens".to_string(), ids_tensor(&tokens, t)),
                ("positions".to_string(), ids_tensor(&positions, t)),
            ])
        };
        let out = self.run(self.graphs.target_prefill, t as u64, inputs())?;
        let next = out
            .get("next_token")
            .ok_or(RuntimeError::MissingOutput("next_token"))?;
        let next = ints(next)?;
        let first: Vec<u32> = prompts
            .iter()
            .enumerate()
            .map(|(b, p)| next[b * t + p.len() - 1] as u32)
            .collect();
        match self.graphs.kind {
            DraftKind::None => {}
            DraftKind::Model => {
                self.run(self.graphs.draft_prefill, t as u64, inputs())?;
            }
            DraftKind::Eagle3 { taps_width } => {
                let taps = out.get("taps").ok_or(RuntimeError::MissingOutput("taps"))?;
                self.prime_eagle(prompts, &first, taps, t, taps_width)?;
            }
        }
        let lanes = self.lanes;
        let vec = |f: &dyn Fn(usize) -> i64| {
            Tensor::from_i64(DType::I32, vec![lanes], (0..lanes).map(f).collect())
        };
        let ctx = self.max_context as i64;
        self.states
            .insert(LEN.into(), vec(&|b| prompts[b].len() as i64));
        self.states.insert(
            PENDING.into(),
            Tensor::from_i64(
                DType::I32,
                vec![lanes, 2],
                (0..lanes)
                    .flat_map(|b| {
                        [
                            *prompts[b].last().expect("non-empty prompt") as i64,
                            first[b] as i64,
                        ]
                    })
                    .collect(),
            ),
        );
        self.states.insert(
            BUDGET.into(),
            vec(&|b| (max_new as i64).min(ctx - prompts[b].len() as i64 - k as i64 - 2)),
        );
        self.states.insert(EMITTED.into(), vec(&|_| 0));
        self.states.insert(STEP.into(), vec(&|_| 0));
        self.states.insert(
            RING.into(),
            Tensor::zeros(DType::I32, vec![lanes, self.graphs.ring, 1, 1]),
        );
        self.drained = vec![0; lanes];
        Ok(first)
    }

    /// EAGLE-3 admission: the head reads pairs (taps at t, x(t+1)) for t < P − 1; the pair
    /// at P − 1 (with the first generated token) is left for the first step's catch-up.
    fn prime_eagle(
        &mut self,
        prompts: &[Vec<u32>],
        first: &[u32],
        taps: &Tensor,
        t: usize,
        width: usize,
    ) -> Result<(), RuntimeError> {
        let lanes = self.lanes;
        let k = self.graphs.num_steps;
        let taps = taps.as_f32()?;
        let tp = (t - 1).max(1);
        let mut hidden = vec![0f32; lanes * tp * width];
        let mut tokens = vec![vec![0i64; tp]; lanes];
        let mut positions = vec![vec![-1i64; tp]; lanes];
        for (b, p) in prompts.iter().enumerate() {
            for i in 0..p.len() - 1 {
                let src = (b * t + i) * width;
                hidden[(b * tp + i) * width..][..width].copy_from_slice(&taps[src..src + width]);
                tokens[b][i] = p[i + 1] as i64;
                positions[b][i] = i as i64;
            }
        }
        let dtype = self
            .graphs
            .draft_prefill
            .inputs()
            .find(|(_, n, _)| *n == HIDDEN)
            .map(|(_, _, ty)| ty.dtype)
            .unwrap_or(DType::F32);
        let inputs = HashMap::from([
            (
                HIDDEN.to_string(),
                Tensor::from_f32(dtype, vec![lanes, tp, width], hidden),
            ),
            ("tokens".to_string(), ids_tensor(&tokens, tp)),
            ("positions".to_string(), ids_tensor(&positions, tp)),
        ]);
        self.run(self.graphs.draft_prefill, tp as u64, inputs)?;
        let mut slot_hidden = vec![0f32; lanes * (k + 1) * width];
        let mut slot_tokens = vec![0i64; lanes * (k + 1)];
        for (b, p) in prompts.iter().enumerate() {
            let src = (b * t + p.len() - 1) * width;
            slot_hidden[b * (k + 1) * width..][..width].copy_from_slice(&taps[src..src + width]);
            slot_tokens[b * (k + 1)] = first[b] as i64;
        }
        let lane_vec = |f: &dyn Fn(usize) -> i64| {
            Tensor::from_i64(DType::I32, vec![lanes], (0..lanes).map(f).collect())
        };
        self.states.insert(
            EAGLE_HIDDEN.into(),
            Tensor::from_f32(dtype, vec![lanes, k + 1, width], slot_hidden),
        );
        self.states.insert(
            EAGLE_TOKENS.into(),
            Tensor::from_i64(DType::I32, vec![lanes, k + 1], slot_tokens),
        );
        self.states.insert(EAGLE_COUNT.into(), lane_vec(&|_| 1));
        self.states.insert(
            EAGLE_BASE.into(),
            lane_vec(&|b| prompts[b].len() as i64 - 1),
        );
        Ok(())
    }

    /// Marks lane `b` finished: the device masks it from the next step on.
    pub fn finish(&mut self, b: usize) {
        if let Some(Data::I64(v)) = self.states.get_mut(BUDGET).map(|t| &mut t.data) {
            v[b] = 0;
        }
    }

    /// Lanes still live (budget > 0).
    pub fn live(&self) -> Vec<bool> {
        match self.states.get(BUDGET).map(|t| &t.data) {
            Some(Data::I64(v)) => v.iter().map(|&x| x > 0).collect(),
            _ => vec![false; self.lanes],
        }
    }

    /// Runs one step graph over all lanes.
    pub fn step(&mut self) -> Result<(), RuntimeError> {
        let live = self.live();
        let out = self.run(self.graphs.step, 1, HashMap::new())?;
        let acc = ints(
            out.get("accepted")
                .ok_or(RuntimeError::MissingOutput("accepted"))?,
        )?;
        for (b, &a) in acc.iter().enumerate() {
            if live[b] {
                self.stats.histogram[(a as usize).min(self.graphs.num_steps)] += 1;
            }
        }
        self.stats.steps += 1;
        Ok(())
    }

    /// Tokens emitted since the last drain, per lane (read from the ring, as the CUDA
    /// backend's host does from its pinned mirror).
    pub fn drain(&mut self) -> Result<Vec<Vec<u32>>, RuntimeError> {
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
        let r = self.graphs.ring;
        let mut out = Vec::with_capacity(self.lanes);
        for b in 0..self.lanes {
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
        Ok(out)
    }
}
