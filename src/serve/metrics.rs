//! `/metrics`: Prometheus text exposition under vLLM's metric names where one exists
//! (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, `vllm:prompt_tokens_total`,
//! `vllm:time_to_first_token_seconds`, `vllm:spec_decode_num_accepted_tokens_total`, ...),
//! and `specc:` names for the rest (lanes in use, steps). A soak checks that
//! `specc:lanes_in_use` and `vllm:kv_cache_usage_perc` return to 0 when it is idle.

use std::fmt::Write;
use std::sync::Mutex;

/// vLLM's bucket bounds, seconds.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

#[derive(Clone, Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    n: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            n: 0,
        }
    }

    fn observe(&mut self, x: f64) {
        for (c, &b) in self.counts.iter_mut().zip(self.bounds) {
            if x <= b {
                *c += 1;
            }
        }
        self.sum += x;
        self.n += 1;
    }
}

/// Why a request ended, as vLLM labels `vllm:request_success_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    Abort,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Abort => "abort",
        }
    }
}

#[derive(Clone, Debug)]
struct Inner {
    running: usize,
    prefilling: usize,
    waiting: usize,
    lanes_in_use: usize,
    kv_usage: f64,
    prompt_tokens: u64,
    generation_tokens: u64,
    finished: [u64; 3],
    rejected: u64,
    steps: u64,
    /// Steps that replayed a greedy twin (no live request sampled).
    greedy_steps: u64,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
    accepted_per_pos: Vec<u64>,
    /// Steps per step variant (`k=3`), and the variant the policy runs now.
    variants: Vec<(String, u64)>,
    current: Option<String>,
}

pub struct Metrics {
    model: String,
    lanes: usize,
    /// Draft tokens per draft (0: no speculation, and no `spec_decode` metrics).
    k: usize,
    inner: Mutex<Inner>,
}

impl Metrics {
    pub fn new(model: &str, lanes: usize, k: usize) -> Metrics {
        Metrics {
            model: model.to_string(),
            lanes,
            k,
            inner: Mutex::new(Inner {
                running: 0,
                prefilling: 0,
                waiting: 0,
                lanes_in_use: 0,
                kv_usage: 0.0,
                prompt_tokens: 0,
                generation_tokens: 0,
                finished: [0; 3],
                rejected: 0,
                steps: 0,
                greedy_steps: 0,
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(E2E_BUCKETS),
                drafts: 0,
                draft_tokens: 0,
                accepted: 0,
                variants: Vec::new(),
                current: None,
                accepted_per_pos: vec![0; k],
            }),
        }
    }

    fn with(&self, f: impl FnOnce(&mut Inner)) {
        // A poisoned lock means a panic elsewhere already; the counts are still usable.
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// The batcher's view after admitting and stepping: `running` requests hold a lane
    /// (`prefilling` of them still in their prompt's chunks, counted as running as vLLM
    /// counts a request in chunked prefill), `waiting` are queued.
    pub fn set_load(&self, running: usize, prefilling: usize, waiting: usize, kv_usage: f64) {
        self.with(|m| {
            m.running = running;
            m.prefilling = prefilling;
            m.lanes_in_use = running;
            m.waiting = waiting;
            m.kv_usage = kv_usage;
        })
    }

    pub fn prompt(&self, tokens: usize) {
        self.with(|m| m.prompt_tokens += tokens as u64)
    }

    pub fn first_token(&self, seconds: f64) {
        self.with(|m| m.ttft.observe(seconds))
    }

    /// `n` tokens that arrived together `seconds` after the previous ones (each counts
    /// `seconds / n`, as a step's tokens are spread over it).
    pub fn tokens(&self, n: usize, seconds: f64) {
        self.with(|m| {
            m.generation_tokens += n as u64;
            for _ in 0..n {
                m.itl.observe(seconds / n as f64);
            }
        })
    }

    /// The first token (from the prefill), which has no inter-token latency.
    pub fn first_generated(&self) {
        self.with(|m| m.generation_tokens += 1)
    }

    pub fn finished(&self, why: Finish, seconds: f64) {
        self.with(|m| {
            m.finished[why as usize] += 1;
            m.e2e.observe(seconds);
        })
    }

    pub fn rejected(&self) {
        self.with(|m| m.rejected += 1)
    }

    /// One step's acceptance: `hist[a]` lane-steps accepted `a` of the step's `k` draft
    /// tokens (a plain step of a speculative session: `k` = 0, no drafts).
    pub fn step(&self, hist: &[usize], k: usize) {
        self.with(|m| {
            m.steps += 1;
            if self.k == 0 || k == 0 {
                return;
            }
            for (a, &c) in hist.iter().enumerate() {
                let c = c as u64;
                m.drafts += c;
                m.draft_tokens += c * k as u64;
                m.accepted += c * a as u64;
                for p in m.accepted_per_pos.iter_mut().take(a) {
                    *p += c;
                }
            }
        })
    }

    /// The session's steps so far that replayed a greedy twin.
    pub fn greedy_steps(&self, n: u64) {
        self.with(|m| m.greedy_steps = n)
    }

    /// Steps run per step variant (labels `k=…`) and the variant the policy runs now.
    pub fn variants(&self, steps: Vec<(String, u64)>, current: Option<String>) {
        self.with(|m| {
            m.variants = steps;
            m.current = current;
        })
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let l = format!("model_name=\"{}\"", self.model.replace('"', "\\\""));
        let mut o = String::new();
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{l}}} {value}"
            );
        };
        one(
            "vllm:num_requests_running",
            "gauge",
            "Requests in a lane (decoding, or prefilling their prompt chunk by chunk).",
            m.running.to_string(),
        );
        one(
            "specc:num_requests_prefilling",
            "gauge",
            "Running requests whose prompt is still being prefilled (chunked prefill).",
            m.prefilling.to_string(),
        );
        one(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests queued for a free lane.",
            m.waiting.to_string(),
        );
        one("vllm:kv_cache_usage_perc", "gauge", "Fraction of the KV-cache slots of all lanes holding a live sequence's tokens (1 = full).", format!("{:.6}", m.kv_usage));
        one(
            "specc:lanes_in_use",
            "gauge",
            "Lanes holding a request.",
            m.lanes_in_use.to_string(),
        );
        one(
            "specc:lanes_total",
            "gauge",
            "Lanes of the session.",
            self.lanes.to_string(),
        );
        one(
            "specc:steps_total",
            "counter",
            "Step graphs run.",
            m.steps.to_string(),
        );
        one(
            "specc:greedy_steps_total",
            "counter",
            "Steps that replayed a greedy twin: a sampling engine's step lowered for greedy acceptance, run while no live request samples.",
            m.greedy_steps.to_string(),
        );
        one(
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens prefilled.",
            m.prompt_tokens.to_string(),
        );
        one(
            "vllm:generation_tokens_total",
            "counter",
            "Tokens generated.",
            m.generation_tokens.to_string(),
        );
        one(
            "specc:requests_rejected_total",
            "counter",
            "Requests answered with a 4xx/5xx error before generating.",
            m.rejected.to_string(),
        );
        let name = "vllm:request_success_total";
        let _ = writeln!(
            o,
            "# HELP {name} Requests finished, by reason.\n# TYPE {name} counter"
        );
        for why in [Finish::Stop, Finish::Length, Finish::Abort] {
            let _ = writeln!(
                o,
                "{name}{{{l},finished_reason=\"{}\"}} {}",
                why.as_str(),
                m.finished[why as usize]
            );
        }
        for (name, help, h) in [
            (
                "vllm:time_to_first_token_seconds",
                "Time from a request's arrival to its first token.",
                &m.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Time between tokens of a request (a step's tokens share its time).",
                &m.itl,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Time from a request's arrival to its end.",
                &m.e2e,
            ),
        ] {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (b, c) in h.bounds.iter().zip(&h.counts) {
                let _ = writeln!(o, "{name}_bucket{{{l},le=\"{b}\"}} {c}");
            }
            let _ = writeln!(
                o,
                "{name}_bucket{{{l},le=\"+Inf\"}} {}\n{name}_sum{{{l}}} {}\n{name}_count{{{l}}} {}",
                h.n, h.sum, h.n
            );
        }
        if self.k > 0 {
            let mut spec = |name: &str, help: &str, v: u64| {
                let _ = writeln!(
                    o,
                    "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {v}"
                );
            };
            spec(
                "vllm:spec_decode_num_drafts_total",
                "Drafts verified (one per live lane and step).",
                m.drafts,
            );
            spec(
                "vllm:spec_decode_num_draft_tokens_total",
                "Draft tokens proposed.",
                m.draft_tokens,
            );
            spec(
                "vllm:spec_decode_num_accepted_tokens_total",
                "Draft tokens accepted.",
                m.accepted,
            );
            let name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
            let _ = writeln!(o, "# HELP {name} Draft tokens accepted at each position of the draft.\n# TYPE {name} counter");
            for (p, c) in m.accepted_per_pos.iter().enumerate() {
                let _ = writeln!(o, "{name}{{{l},position=\"{p}\"}} {c}");
            }
        }
        if !m.variants.is_empty() {
            let name = "specc:spec_variant_steps_total";
            let _ = writeln!(o, "# HELP {name} Steps run per step variant (k draft tokens; k=0: plain decoding), as adaptive speculation chose them.\n# TYPE {name} counter");
            for (v, c) in &m.variants {
                let _ = writeln!(o, "{name}{{{l},variant=\"{v}\"}} {c}");
            }
            let name = "specc:spec_variant_current";
            let _ = writeln!(
                o,
                "# HELP {name} 1 for the step variant the policy runs now.\n# TYPE {name} gauge"
            );
            for (v, _) in &m.variants {
                let on = u8::from(m.current.as_deref() == Some(v.as_str()));
                let _ = writeln!(o, "{name}{{{l},variant=\"{v}\"}} {on}");
            }
        }
        o
    }
}
