//! The engine loop: one thread owns the session (the interpreter and the CUDA stream are
//! synchronous). Between steps it admits queued requests into free lanes (the lanes'
//! prefill at the smallest batch bucket the backend can, the other lanes' states kept; with
//! chunked prefill, one chunk between two steps), then runs one step over the armed lanes,
//! drains every lane's tokens, detokenizes them incrementally, ends lanes at EOS, a stop
//! string, `max_tokens`, the end of the context or a client that went away, and frees them
//! for the next request. Nothing inside a step waits on the host.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use specc_runtime::admission::{Admit, LaneSampling};
use specc_runtime::Speculator;
use tokio::sync::mpsc::UnboundedSender;

use super::errors::ApiError;
use super::metrics::{Finish, Metrics};
use crate::text::{StopScan, Streamer, TextCodec};

/// What a handler hears about its request.
#[derive(Debug)]
pub enum Event {
    /// Newly completed text (never inside a stop string).
    Text(String),
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    Failed(String),
}

/// A request ready to run: tokenized and checked against the context.
pub struct Job {
    pub ids: Vec<u32>,
    /// At most what fits after the prompt (checked by the handler).
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// How the lane draws its tokens (knobs and RNG stream) under sampled acceptance.
    pub sampling: LaneSampling,
    pub arrived: Instant,
    pub events: UnboundedSender<Event>,
}

/// The handlers' end of the bounded queue.
#[derive(Clone)]
pub struct Queue {
    tx: SyncSender<Job>,
    waiting: Arc<AtomicUsize>,
    capacity: usize,
}

impl Queue {
    pub fn new(capacity: usize) -> (Queue, Receiver<Job>, Arc<AtomicUsize>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
        let waiting = Arc::new(AtomicUsize::new(0));
        let q = Queue {
            tx,
            waiting: waiting.clone(),
            capacity,
        };
        (q, rx, waiting)
    }

    /// Queues `job`, or says the queue is full (a 503 with Retry-After).
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    TrySendError::Full(_) => ApiError::overloaded(self.capacity),
                    TrySendError::Disconnected(_) => {
                        ApiError::internal("the engine loop has stopped")
                    }
                })
            }
        }
    }
}

/// What the loop needs besides the session.
pub struct LoopCtx<'a> {
    pub codec: &'a TextCodec,
    pub eos: &'a [u32],
    pub max_context: u64,
    pub metrics: &'a Metrics,
    pub waiting: &'a AtomicUsize,
    /// Whether prompts are prefilled in chunks: then one chunk runs between two steps,
    /// else every queued admission's whole prefill does.
    pub chunked: bool,
}

/// One request in a lane.
struct Lane<'a> {
    job: Job,
    streamer: Streamer<'a>,
    stops: StopScan,
    generated: usize,
    /// A stop string ended it (what the scan held back is not text of the reply).
    stopped: bool,
    last: Instant,
}

impl<'a> Lane<'a> {
    fn new(job: Job, codec: &'a TextCodec) -> Self {
        let stops = StopScan::new(&job.stop);
        Lane {
            job,
            streamer: Streamer::new(codec),
            stops,
            generated: 0,
            stopped: false,
            last: Instant::now(),
        }
    }

    /// Takes the lane's new tokens; the reason it ends, if it does.
    fn push(&mut self, tokens: &[u32], eos: &[u32]) -> Result<Option<Finish>, String> {
        for &tok in tokens {
            if !self.job.ignore_eos && eos.contains(&tok) {
                return Ok(Some(Finish::Stop));
            }
            if self.generated == self.job.max_tokens {
                return Ok(Some(Finish::Length));
            }
            self.generated += 1;
            let delta = self.streamer.push(tok).map_err(|e| e.to_string())?;
            let (text, stopped) = self.stops.push(&delta);
            if !text.is_empty() {
                // A handler that went away is noticed before the next step.
                let _ = self.job.events.send(Event::Text(text));
            }
            if stopped {
                self.stopped = true;
                return Ok(Some(Finish::Stop));
            }
        }
        Ok((self.generated == self.job.max_tokens).then_some(Finish::Length))
    }

    fn end(mut self, finish: Finish, metrics: &Metrics) {
        if !self.stopped {
            let rest = self.stops.flush();
            if !rest.is_empty() {
                let _ = self.job.events.send(Event::Text(rest));
            }
        }
        // Counted before the reply ends, so /metrics read after it includes it.
        metrics.finished(finish, self.job.arrived.elapsed().as_secs_f64());
        let _ = self.job.events.send(Event::Done {
            finish,
            prompt_tokens: self.job.ids.len(),
            completion_tokens: self.generated,
        });
    }
}

/// Serves jobs from `rx` until every handler is gone. A failing step fails the requests in
/// flight and the loop goes on with the next ones. Between two steps it runs at most one
/// prefill chunk ([`LoopCtx::chunked`]), so a live lane waits one step and one chunk for its
/// next tokens however long the prompts joining are; a lane is stepped from its last chunk
/// on.
pub fn run(s: &mut dyn Speculator, rx: Receiver<Job>, c: &LoopCtx) {
    let lanes = s.lanes();
    let mut slots: Vec<Option<Lane>> = (0..lanes).map(|_| None).collect();
    // The jobs whose lane is prefilling (admission begun, not armed yet).
    let mut joining: Vec<Option<Job>> = (0..lanes).map(|_| None).collect();
    let mut hist = s.stats().histogram.clone();
    let mut ready: VecDeque<Job> = VecDeque::new();
    let mut ended = Vec::new();
    // Whether a step queued is not read yet ([`Speculator::drain_behind`]).
    let mut unread = false;
    loop {
        let busy = slots.iter().any(Option::is_some) || joining.iter().any(Option::is_some);
        if !busy && ready.is_empty() {
            match rx.recv() {
                Ok(job) => ready.push_back(job),
                Err(_) => return,
            }
        }
        // Admit into the lowest free lanes, so the bucket that holds them stays small; the
        // jobs that arrived together are admitted together (the backend may prefill them
        // in one graph).
        let mut arriving = Vec::new();
        for b in 0..lanes {
            if slots[b].is_some() || joining[b].is_some() {
                continue;
            }
            let Some(job) = next_job(&mut ready, &rx, c) else {
                break;
            };
            arriving.push((b, job));
        }
        if !arriving.is_empty() {
            begin(s, arriving, &mut joining, c);
        }
        drop_gone(s, &mut joining, c);
        loop {
            prefill_chunk(s, &mut slots, &mut joining, c);
            if c.chunked || joining.iter().all(Option::is_none) {
                break;
            }
        }
        let upto = slots.iter().rposition(Option::is_some).map_or(0, |b| b + 1);
        publish(&slots, &joining, c);
        if upto == 0 {
            // No lane in use: a step not read yet holds nothing anyone waits for.
            unread = false;
            continue;
        }
        // The step just queued runs while the tokens of the one before are handled (the
        // GPU reads them from its token ring without waiting for the new step); a lane that
        // ended in the step before has one more masked or discarded step. Where the step
        // not read yet may end every lane (each has at most the most tokens a step emits to
        // go), it is read instead: no step that no lane needs delays the next request.
        let most = s.policy().ks().iter().max().map_or(1, |k| k + 1);
        let finishing = unread
            && slots
                .iter()
                .flatten()
                .all(|l| l.job.max_tokens.saturating_sub(l.generated) <= most);
        let res = match finishing {
            true => s.drain_all(),
            false => s.step_upto(upto).and_then(|()| s.drain_behind()),
        };
        let (toks, live) = match res {
            Ok(b) => {
                unread = b.unread;
                (b.tokens, b.live)
            }
            Err(e) => {
                unread = false;
                for (b, slot) in slots.iter_mut().enumerate() {
                    if let Some(lane) = slot.take() {
                        let _ = lane
                            .job
                            .events
                            .send(Event::Failed(format!("step failed: {e}")));
                        c.metrics
                            .finished(Finish::Abort, lane.job.arrived.elapsed().as_secs_f64());
                        let _ = s.finish(b);
                    }
                }
                continue;
            }
        };
        let now = s.stats().histogram.clone();
        let delta: Vec<usize> = now
            .iter()
            .zip(hist.iter().chain(std::iter::repeat(&0)))
            .map(|(a, b)| a - b)
            .collect();
        let p = s.policy();
        c.metrics.step(&delta, p.last().map_or(0, |v| p.ks()[v]));
        c.metrics.greedy_steps(s.stats().greedy_steps as u64);
        if p.ks().len() > 1 {
            let steps = p.ks().iter().zip(p.steps());
            let label = |k: &usize| format!("k={k}");
            c.metrics.variants(
                steps.map(|(k, &n)| (label(k), n)).collect(),
                p.current().map(|v| label(&p.ks()[v])),
            );
        }
        hist = now;
        for b in 0..lanes {
            let Some(lane) = slots[b].as_mut() else {
                continue;
            };
            let before = lane.generated;
            let finish = if lane.job.events.is_closed() {
                Some(Finish::Abort)
            } else {
                match lane.push(&toks[b], c.eos) {
                    Ok(f) => f.or_else(|| (!live[b]).then_some(Finish::Length)),
                    Err(e) => {
                        let _ = lane.job.events.send(Event::Failed(e));
                        Some(Finish::Abort)
                    }
                }
            };
            let n = lane.generated - before;
            if n > 0 {
                c.metrics.tokens(n, lane.last.elapsed().as_secs_f64());
                lane.last = Instant::now();
            }
            if let Some(f) = finish {
                ended.push((slots[b].take().expect("checked above"), f));
                let _ = s.finish(b);
            }
        }
        // The load is published before the replies end, so a client that reads /metrics
        // after its reply sees its lane free.
        publish(&slots, &joining, c);
        for (lane, f) in ended.drain(..) {
            lane.end(f, c.metrics);
        }
    }
}

/// The next queued job whose client is still there (those gone are counted as aborted).
fn next_job(ready: &mut VecDeque<Job>, rx: &Receiver<Job>, c: &LoopCtx) -> Option<Job> {
    loop {
        let job = ready.pop_front().or_else(|| rx.try_recv().ok())?;
        c.waiting.fetch_sub(1, Ordering::SeqCst);
        if !job.events.is_closed() {
            return Some(job);
        }
        c.metrics
            .finished(Finish::Abort, job.arrived.elapsed().as_secs_f64());
    }
}

/// Queues the admission of each lane `b` with its job (nothing is prefilled yet); the jobs
/// wait in `joining` for their lanes' last chunk.
fn begin(
    s: &mut dyn Speculator,
    jobs: Vec<(usize, Job)>,
    joining: &mut [Option<Job>],
    c: &LoopCtx,
) {
    // A sampled lane's draws depend on each step's k: the policy holds the configured k
    // while it is live, so a seeded request gets the same tokens whatever the load.
    for (b, job) in &jobs {
        s.policy_mut().pin(*b, job.sampling.temperature > 0.0);
    }
    let rows: Vec<Admit> = jobs
        .iter()
        .map(|(b, job)| Admit {
            lane: *b,
            prompt: &job.ids,
            max_new: job.max_tokens,
            sampling: job.sampling,
        })
        .collect();
    let begun = s.begin_admission(&rows);
    drop(rows);
    match begun {
        Ok(()) => {
            for (b, job) in jobs {
                joining[b] = Some(job);
            }
        }
        Err(e) => {
            for (b, job) in jobs {
                s.cancel_admission(b);
                fail(s, b, job, &format!("admission failed: {e}"), c);
            }
        }
    }
}

/// Ends `job` (in lane `b`, which stays free) with `why`.
fn fail(s: &mut dyn Speculator, b: usize, job: Job, why: &str, c: &LoopCtx) {
    let _ = job.events.send(Event::Failed(why.to_string()));
    c.metrics
        .finished(Finish::Abort, job.arrived.elapsed().as_secs_f64());
    let _ = s.finish(b);
}

/// Frees the lanes whose client went away while their prompt was prefilling.
fn drop_gone(s: &mut dyn Speculator, joining: &mut [Option<Job>], c: &LoopCtx) {
    for (b, slot) in joining.iter_mut().enumerate() {
        if slot.as_ref().is_some_and(|j| j.events.is_closed()) {
            let job = slot.take().expect("checked above");
            s.cancel_admission(b);
            c.metrics
                .finished(Finish::Abort, job.arrived.elapsed().as_secs_f64());
            let _ = s.finish(b);
        }
    }
}

/// Runs the next prefill chunk of the queued admissions; the lanes it armed start with
/// their first token. A failing chunk fails the requests of its admission.
fn prefill_chunk<'a>(
    s: &mut dyn Speculator,
    slots: &mut [Option<Lane<'a>>],
    joining: &mut [Option<Job>],
    c: &LoopCtx<'a>,
) {
    if joining.iter().all(Option::is_none) {
        return;
    }
    let why = match s.prefill_chunk() {
        Ok(armed) => {
            for (b, first) in armed {
                if let Some(job) = joining[b].take() {
                    slots[b] = start(s, b, job, first, c);
                }
            }
            "admission failed: the session dropped it".to_string()
        }
        Err(e) => format!("admission failed: {e}"),
    };
    // A job whose lane the session no longer prefills (its admission failed) ends here.
    let still = s.prefilling();
    for (b, slot) in joining.iter_mut().enumerate() {
        if slot.is_some() && !still.contains(&b) {
            let job = slot.take().expect("checked above");
            fail(s, b, job, &why, c);
        }
    }
}

/// The lane of `job`, admitted into lane `b` with first token `first`, unless the request
/// already ended.
fn start<'a>(
    s: &mut dyn Speculator,
    b: usize,
    job: Job,
    first: u32,
    c: &LoopCtx<'a>,
) -> Option<Lane<'a>> {
    c.metrics.prompt(job.ids.len());
    c.metrics.first_token(job.arrived.elapsed().as_secs_f64());
    let mut lane = Lane::new(job, c.codec);
    let finish = match lane.push(&[first], c.eos) {
        Ok(f) => f,
        Err(e) => {
            let _ = lane.job.events.send(Event::Failed(e));
            Some(Finish::Abort)
        }
    };
    if lane.generated > 0 {
        c.metrics.first_generated();
    }
    match finish {
        Some(f) => {
            lane.end(f, c.metrics);
            let _ = s.finish(b);
            None
        }
        None => Some(lane),
    }
}

/// Lanes in use (prefilling ones too), queue length and KV-cache use for `/metrics`.
fn publish(slots: &[Option<Lane>], joining: &[Option<Job>], c: &LoopCtx) {
    let prefilling = joining.iter().flatten().count();
    let running = slots.iter().flatten().count() + prefilling;
    let used: usize = slots
        .iter()
        .flatten()
        .map(|l| l.job.ids.len() + l.generated)
        .sum();
    let total = slots.len() as f64 * c.max_context as f64;
    c.metrics.set_load(
        running,
        prefilling,
        c.waiting.load(Ordering::SeqCst),
        used as f64 / total.max(1.0),
    );
}
