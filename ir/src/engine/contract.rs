//! A method's step contract as data: which graphs it runs, how a lane is primed at
//! admission, and the sizes the host loop relies on. Both backends drive every method
//! through this one description.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The graphs of an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GraphRole {
    /// The target over a prompt chunk: `next_token` after each lane's last prompt row
    /// (plain decoding's prefill).
    Prefill,
    /// Plain decoding's step (k = 0).
    Decode,
    /// The speculative step: draft + verify + accept + commit + emit.
    SpecStep,
    /// The target prefill that also records what the draft reads (taps).
    SpecTargetPrefill,
    /// The draft's prefill.
    DraftPrefill,
    /// The speculative method's step at `k` draft tokens other than its configured k (an
    /// adaptive variant over the same states; `k = 0` is plain decoding over them).
    SpecVariant(u32),
    /// A sampling engine's plain decoding step lowered for greedy acceptance: replayed, in
    /// place of [`GraphRole::Decode`], while no live lane samples (the argmax alone, without
    /// the per-lane distributions over the vocabulary a sampled step builds).
    GreedyDecode,
    /// A sampling engine's speculative step at `k` (its configured step or a variant) lowered
    /// for greedy acceptance, over the same states: replayed in their place while no live
    /// lane samples.
    GreedySpecStep(u32),
    /// The catch-up of a draft that reads the target's hidden states: the rows its plain
    /// steps queued go into the draft's caches at once ([`CatchUp`]).
    DraftCatchUp,
    /// The target over a prompt chunk with every row's `logits` and `next_token` (`specc
    /// logits`, parity tests, verify-width timings): planned only in engines built for them.
    Logits,
}

impl GraphRole {
    pub fn name(self) -> &'static str {
        match self {
            GraphRole::Prefill => "prefill",
            GraphRole::Decode => "decode step",
            GraphRole::SpecStep => "spec step",
            GraphRole::SpecTargetPrefill => "spec target prefill",
            GraphRole::DraftPrefill => "draft prefill",
            GraphRole::SpecVariant(_) => "spec step variant",
            GraphRole::GreedyDecode => "greedy decode step",
            GraphRole::GreedySpecStep(_) => "greedy spec step",
            GraphRole::DraftCatchUp => "draft catch-up",
            GraphRole::Logits => "logits forward",
        }
    }

    /// Whether its token count is a prompt chunk (built at several `T`) rather than one
    /// step per lane.
    pub fn is_prefill(self) -> bool {
        !matches!(
            self,
            GraphRole::Decode
                | GraphRole::SpecStep
                | GraphRole::SpecVariant(_)
                | GraphRole::GreedyDecode
                | GraphRole::GreedySpecStep(_)
                | GraphRole::DraftCatchUp
        )
    }
}

impl fmt::Display for GraphRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraphRole::SpecVariant(k) => write!(f, "spec step k={k}"),
            GraphRole::GreedySpecStep(k) => write!(f, "greedy spec step k={k}"),
            r => f.write_str(r.name()),
        }
    }
}

/// One step graph an adaptive policy may run: the method's step at `k` draft tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepVariant {
    /// Draft tokens per step (0: plain decoding over the method's states).
    pub k: usize,
    pub role: GraphRole,
}

impl StepVariant {
    /// How reports and metrics name it (`k=3`).
    pub fn label(&self) -> String {
        format!("k={}", self.k)
    }
}

/// The deferred catch-up of a draft that reads the target's hidden states (EAGLE-3,
/// DFlash, DDTree). Its plain step (k = 0) reads no draft weight: it only queues its row
/// (taps, and EAGLE-3's token) in a ring of `rows` rows per lane. The host replays `role`
/// (one graph over the step states, at the step's batch bucket) before the first
/// speculative step after plain steps, and before a plain step when `rows` plain steps ran
/// since the last catch-up (every plain step queues at most one row per lane, so the ring
/// never holds more). The catch-up writes every queued row into the draft's caches, weights
/// read once for all of them, and leaves the pending rows a speculative step expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatchUp {
    pub role: GraphRole,
    /// Rows of the queue ring per lane: the most plain steps between two catch-ups.
    pub rows: usize,
}

impl CatchUp {
    /// Whether a step of `k` draft tokens after `plain` plain steps since the last catch-up
    /// must be preceded by one.
    pub fn needed(&self, k: usize, plain: usize) -> bool {
        match k {
            0 => plain >= self.rows,
            _ => plain > 0,
        }
    }
}

/// How the draft is primed at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DraftKind {
    /// No draft (k = 0): the step graph is plain decoding; no draft prefill runs.
    None,
    /// A standalone model: its prefill reads the prompt like the target's.
    Model,
    /// An EAGLE-3 head: its prefill reads (target taps, next token) pairs; `taps_width`
    /// is 3 × hidden.
    Eagle3 { taps_width: usize },
    /// An EAGLE-3 draft tree (topk > 1): primed like `Eagle3`; `depth` = `num_steps`, the
    /// most draft tokens one step accepts (the contract's `num_steps` is then the context
    /// margin).
    Eagle3Tree { taps_width: usize, depth: usize },
    /// A DFlash drafter: its prefill writes the context of every prompt position (target
    /// taps, `taps_width` = n_tap × hidden) into its KV cache.
    DFlash { taps_width: usize },
    /// A DDTree step over a DFlash drafter: primed like `DFlash`; `depth` = the drafter's
    /// `block_size − 1`, the most draft tokens one step accepts (`num_steps` is then the
    /// verify margin, `budget − 1`).
    DDTree { taps_width: usize, depth: usize },
}

/// The admission recipe of a [`DraftKind`]: what both backends do for the draft when they
/// admit lanes. Methods that prime alike share a recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priming {
    /// No draft: nothing.
    None,
    /// A standalone draft: its prefill reads the prompt as the target's does.
    Prompt,
    /// A head over (target taps, next token) pairs (EAGLE-3): its prefill reads the
    /// prompt's pairs but the last, which is left pending, with its taps, in a state of
    /// `depth + 1` pair slots (`depth`: the chain's k or the tree's depth).
    Pairs { taps_width: usize, depth: usize },
    /// A drafter over the context of committed positions (DFlash, DDTree): its prefill
    /// writes the prompt's context from the target prefill's taps; nothing is left pending
    /// in its `rows`-row pending-context state.
    Context { taps_width: usize, rows: usize },
}

/// Everything the host loop needs to drive one method.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepContract {
    /// `none`, `draft_model`, `eagle3`, `dflash` or `ddtree`.
    pub method: String,
    /// A one-line description for reports (`draft_model k=5`, ...).
    pub label: String,
    pub kind: DraftKind,
    /// Cache slots one step writes past a lane's length, minus one (`k` for chains and
    /// blocks, `budget − 1` for trees): verify writes slots `len ..= len + num_steps`.
    pub num_steps: usize,
    /// Token-ring capacity per lane.
    pub ring: usize,
    pub step: GraphRole,
    pub target_prefill: GraphRole,
    /// Absent for plain decoding.
    pub draft_prefill: Option<GraphRole>,
    /// Further step graphs over the same states (smaller k or tree depth, and k = 0: plain
    /// decoding, after which a standalone draft is re-primed and a draft that reads target
    /// hidden states catches up its queued rows, [`StepContract::catch_up`]), ascending by
    /// k; empty where the method cannot switch.
    #[serde(default)]
    pub variants: Vec<StepVariant>,
    /// Under sampled acceptance, the greedy twin of each step of
    /// [`StepContract::step_variants`] (same k, same states, argmax draws), ascending by k:
    /// what a host replays while no live lane samples. Empty under greedy acceptance.
    #[serde(default)]
    pub greedy: Vec<StepVariant>,
    /// The catch-up of the rows the plain variant (k = 0) queues, where the draft reads the
    /// target's hidden states.
    #[serde(default)]
    pub catch_up: Option<CatchUp>,
}

impl StepContract {
    /// Plain decoding with a ring of `ring` tokens per lane.
    pub fn plain(ring: usize) -> StepContract {
        StepContract {
            method: "none".into(),
            label: "plain decoding".into(),
            kind: DraftKind::None,
            num_steps: 0,
            ring,
            step: GraphRole::Decode,
            target_prefill: GraphRole::Prefill,
            draft_prefill: None,
            variants: Vec::new(),
            greedy: Vec::new(),
            catch_up: None,
        }
    }

    /// A speculative method's contract: its step, the target prefill that taps what the
    /// draft reads, and the draft's prefill.
    pub fn speculative(
        method: &str,
        label: String,
        kind: DraftKind,
        num_steps: usize,
        ring: usize,
    ) -> StepContract {
        StepContract {
            method: method.to_string(),
            label,
            kind,
            num_steps,
            ring,
            step: GraphRole::SpecStep,
            target_prefill: GraphRole::SpecTargetPrefill,
            draft_prefill: Some(GraphRole::DraftPrefill),
            variants: Vec::new(),
            greedy: Vec::new(),
            catch_up: None,
        }
    }

    /// The most draft tokens one step accepts (the acceptance histogram spans `0..=` it).
    pub fn max_accept(&self) -> usize {
        match self.kind {
            DraftKind::DDTree { depth, .. } | DraftKind::Eagle3Tree { depth, .. } => depth,
            _ => self.num_steps,
        }
    }

    /// What admission primes the draft with.
    pub fn priming(&self) -> Priming {
        match self.kind {
            DraftKind::None => Priming::None,
            DraftKind::Model => Priming::Prompt,
            DraftKind::Eagle3 { taps_width } => Priming::Pairs {
                taps_width,
                depth: self.num_steps,
            },
            DraftKind::Eagle3Tree { taps_width, depth } => Priming::Pairs { taps_width, depth },
            DraftKind::DFlash { taps_width } => Priming::Context {
                taps_width,
                rows: self.num_steps + 1,
            },
            DraftKind::DDTree { taps_width, depth } => Priming::Context {
                taps_width,
                rows: depth + 1,
            },
        }
    }

    /// Whether the target prefill's `taps` output feeds the draft's prefill.
    pub fn wants_taps(&self) -> bool {
        !matches!(self.priming(), Priming::None | Priming::Prompt)
    }

    /// Every step the contract can run, ascending by k: its variants and its own step
    /// (`k` = [`StepContract::max_accept`]).
    pub fn step_variants(&self) -> Vec<StepVariant> {
        let mut v = self.variants.clone();
        v.push(StepVariant {
            k: self.max_accept(),
            role: self.step,
        });
        v.sort_by_key(|v| v.k);
        v
    }

    /// Every graph the contract runs.
    pub fn roles(&self) -> Vec<GraphRole> {
        let mut r = vec![self.step, self.target_prefill];
        r.extend(self.draft_prefill);
        r.extend(self.variants.iter().map(|v| v.role));
        r.extend(self.greedy.iter().map(|v| v.role));
        r.extend(self.catch_up.map(|c| c.role));
        r
    }
}
