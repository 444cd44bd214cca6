//! The engine loop with chunked prefill, on the embedded default (CPU backend): a long
//! prompt joins in several chunks while a lane already decoding keeps producing tokens
//! between them, and every reply equals its lone reply.

use std::time::{Duration, Instant};

use specc_models::{Model, SpecBundle, SpecConfig};
use specc_runtime::admission::{Admit, LaneSampling};
use specc_runtime::{
    AdaptivePolicy, RuntimeError, SpecCpuSession, SpecGraphs, SpecStats, Speculator,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::batcher::{run, Event, Job, LoopCtx, Queue};
use super::metrics::Metrics;
use crate::embedded;
use crate::text::TextCodec;

const CTX: u64 = 1024;
const LANES: usize = 2;

/// What the loop asked of the session, in order.
#[derive(Debug)]
enum Call {
    /// A prefill chunk while `prefilling` lanes were queued; the lanes it armed.
    Chunk {
        prefilling: Vec<usize>,
        armed: Vec<usize>,
    },
    Step,
}

/// A session that logs the chunks and steps the loop runs.
struct Recorder<'s, 'a> {
    inner: &'s mut SpecCpuSession<'a>,
    calls: Vec<Call>,
    /// A client that hangs up once its lane's first prefill chunk has run.
    hang_up: Option<(usize, UnboundedReceiver<Event>)>,
}

impl Speculator for Recorder<'_, '_> {
    fn admit(&mut self, prompts: &[Vec<u32>], max_new: usize) -> Result<Vec<u32>, RuntimeError> {
        self.inner.admit(prompts, max_new)
    }
    fn lanes(&self) -> usize {
        self.inner.lanes()
    }
    fn admit_lane(
        &mut self,
        lane: usize,
        prompt: &[u32],
        max_new: usize,
        sampling: LaneSampling,
    ) -> Result<u32, RuntimeError> {
        self.inner.admit_lane(lane, prompt, max_new, sampling)
    }
    fn set_prefill_chunk(&mut self, chunk: usize) -> Result<(), RuntimeError> {
        self.inner.set_prefill_chunk(chunk)
    }
    fn begin_admission(&mut self, rows: &[Admit]) -> Result<(), RuntimeError> {
        Speculator::begin_admission(self.inner, rows)
    }
    fn prefill_chunk(&mut self) -> Result<Vec<(usize, u32)>, RuntimeError> {
        let prefilling = self.inner.prefilling();
        let armed = self.inner.prefill_chunk()?;
        if self
            .hang_up
            .as_ref()
            .is_some_and(|(lane, _)| prefilling.first() == Some(lane))
        {
            self.hang_up = None;
        }
        self.calls.push(Call::Chunk {
            prefilling,
            armed: armed.iter().map(|a| a.0).collect(),
        });
        Ok(armed)
    }
    fn prefilling(&self) -> Vec<usize> {
        self.inner.prefilling()
    }
    fn cancel_admission(&mut self, lane: usize) {
        self.inner.cancel_admission(lane)
    }
    fn default_sampling(&self, stream: u32) -> LaneSampling {
        Speculator::default_sampling(self.inner, stream)
    }
    fn step(&mut self) -> Result<(), RuntimeError> {
        self.calls.push(Call::Step);
        self.inner.step()
    }
    fn step_upto(&mut self, n: usize) -> Result<(), RuntimeError> {
        self.calls.push(Call::Step);
        self.inner.step_upto(n)
    }
    fn drain(&mut self) -> Result<Vec<Vec<u32>>, RuntimeError> {
        self.inner.drain()
    }
    fn live(&self) -> Result<Vec<bool>, RuntimeError> {
        Ok(self.inner.live())
    }
    fn finish(&mut self, b: usize) -> Result<(), RuntimeError> {
        self.inner.finish(b);
        Ok(())
    }
    fn stats(&self) -> &SpecStats {
        &self.inner.stats
    }
    fn stats_mut(&mut self) -> &mut SpecStats {
        &mut self.inner.stats
    }
    fn policy(&self) -> &AdaptivePolicy {
        self.inner.policy()
    }
    fn policy_mut(&mut self) -> &mut AdaptivePolicy {
        self.inner.policy_mut()
    }
}

/// One request's reply: its text and the longest wait between two of its text events
/// after the first.
struct Reply {
    text: String,
    max_gap: Duration,
}

fn collect(mut rx: UnboundedReceiver<Event>) -> Reply {
    let mut text = String::new();
    let mut last: Option<Instant> = None;
    let mut max_gap = Duration::ZERO;
    while let Some(e) = rx.blocking_recv() {
        match e {
            Event::Text(t) => {
                if let Some(l) = last {
                    max_gap = max_gap.max(l.elapsed());
                }
                last = Some(Instant::now());
                text.push_str(&t);
            }
            Event::Done { .. } => break,
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
    Reply { text, max_gap }
}

fn job(ids: Vec<u32>, max_tokens: usize, stream: u32) -> (Job, UnboundedReceiver<Event>) {
    let (tx, rx) = unbounded_channel();
    let job = Job {
        ids,
        max_tokens,
        stop: Vec::new(),
        ignore_eos: true,
        sampling: LaneSampling::greedy(stream),
        arrived: Instant::now(),
        events: tx,
    };
    (job, rx)
}

/// Serves a short request and, once it has produced text, a long one, on the loop with
/// prefill chunk `chunk` (0: whole prompts); their replies and the loop's calls. With
/// `long_only` only the long request is served (its lone reply).
fn serve(
    s: &mut SpecCpuSession,
    chunk: usize,
    short: &[u32],
    long: &[u32],
    long_only: bool,
) -> (Vec<Reply>, Vec<Call>) {
    s.set_prefill_chunk(chunk).unwrap();
    let codec = TextCodec::ids_only();
    let metrics = Metrics::new("test", LANES, 5);
    let (queue, rx, waiting) = Queue::new(8);
    let ctx = LoopCtx {
        codec: &codec,
        eos: &[],
        max_context: CTX,
        metrics: &metrics,
        waiting: &waiting,
        chunked: chunk > 0,
    };
    let mut rec = Recorder {
        inner: s,
        calls: Vec::new(),
        hang_up: None,
    };
    // The session stays on this thread (its weights are not `Sync`); the client runs
    // beside it and hangs up when done, which ends the loop.
    let (short, long) = (short.to_vec(), long.to_vec());
    let client = std::thread::spawn(move || {
        let mut replies = Vec::new();
        if !long_only {
            let (a, mut a_rx) = job(short, 400, 0);
            queue.submit(a).unwrap();
            // The long prompt joins once the short one decodes.
            let Some(Event::Text(first)) = a_rx.blocking_recv() else {
                panic!("the short request produced no text");
            };
            let (b, b_rx) = job(long, 8, 1);
            queue.submit(b).unwrap();
            let mut a = collect(a_rx);
            a.text.insert_str(0, &first);
            replies.push(a);
            replies.push(collect(b_rx));
        } else {
            let (b, b_rx) = job(long, 8, 1);
            queue.submit(b).unwrap();
            replies.push(collect(b_rx));
        }
        replies
    });
    run(&mut rec, rx, &ctx);
    let replies = client.join().unwrap();
    (replies, rec.calls)
}

/// Steps that ran between lane `lane`'s first prefill chunk and the chunk that armed it,
/// and the number of its chunks.
fn steps_during_prefill(calls: &[Call], lane: usize) -> (usize, usize) {
    let (mut steps, mut chunks, mut on) = (0, 0, false);
    for c in calls {
        match c {
            Call::Chunk { prefilling, armed } if prefilling.first() == Some(&lane) => {
                on = true;
                chunks += 1;
                if armed.contains(&lane) {
                    return (steps, chunks);
                }
            }
            Call::Step if on => steps += 1,
            _ => {}
        }
    }
    panic!("lane {lane} was never armed: {calls:?}");
}

#[test]
fn a_long_prompt_joins_in_chunks_between_the_steps_of_a_live_lane() {
    let dir = embedded::default_model_dir().unwrap();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(embedded::SPEC_FILE)).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    // The long prompt's length and the chunk: SPECC_CHUNK_TEST_PROMPT (default 200) and
    // SPECC_CHUNK_TEST_CHUNK (default 32), for timings at other sizes.
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let n = env("SPECC_CHUNK_TEST_PROMPT", 200);
    let chunk = env("SPECC_CHUNK_TEST_CHUNK", 32);
    let short: Vec<u32> = (0..8).map(|i| 1 + (i * 37) % 500).collect();
    let long: Vec<u32> = (0..n as u32).map(|i| 1 + (i * 13 + i / 7) % 500).collect();
    let mut s = SpecCpuSession::new(SpecGraphs::of(&b), &weights, LANES, CTX);
    let (lone_long, _) = serve(&mut s, 0, &short, &long, true);
    let (whole, _) = serve(&mut s, 0, &short, &long, false);
    let (chunked, calls) = serve(&mut s, chunk, &short, &long, false);
    let (steps, chunks) = steps_during_prefill(&calls, 1);
    println!(
        "{n}-token prompt joining: the live lane's longest wait between tokens {:.1} ms whole, \
         {:.1} ms in chunks of {chunk} ({chunks} chunks, {steps} steps of the live lane between them)",
        whole[0].max_gap.as_secs_f64() * 1e3,
        chunked[0].max_gap.as_secs_f64() * 1e3,
    );
    assert_eq!(chunks, n.div_ceil(chunk), "{calls:?}");
    assert_eq!(steps, chunks - 1, "one step between two chunks: {calls:?}");
    // No two chunks run back to back while a lane decodes.
    assert!(
        !calls
            .windows(2)
            .any(|w| matches!(w, [Call::Chunk { .. }, Call::Chunk { .. }])),
        "{calls:?}"
    );
    assert_eq!(
        chunked[1].text, lone_long[0].text,
        "the long reply, chunked vs alone"
    );
    assert_eq!(
        chunked[0].text, whole[0].text,
        "the short reply, beside a chunked vs a whole prefill"
    );
    assert_eq!(
        chunked[1].text, whole[1].text,
        "the long reply, chunked vs whole"
    );
}

/// A client that hangs up while its long prompt is prefilling frees its lane: no more of its
/// chunks run, and the next request is admitted into that lane while the other lane decodes.
#[test]
fn a_client_gone_mid_prefill_frees_its_lane() {
    let dir = embedded::default_model_dir().unwrap();
    let target = Model::open(&dir).unwrap();
    let cfg = SpecConfig::from_file(&dir.join(embedded::SPEC_FILE)).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    let weights = b.load_weights_f32(&target).unwrap();
    let mut s = SpecCpuSession::new(SpecGraphs::of(&b), &weights, LANES, CTX);
    const CHUNK: usize = 16;
    s.set_prefill_chunk(CHUNK).unwrap();
    let short: Vec<u32> = (0..8).map(|i| 1 + (i * 37) % 500).collect();
    let long: Vec<u32> = (0..200u32).map(|i| 1 + (i * 13 + i / 7) % 500).collect();
    let codec = TextCodec::ids_only();
    let metrics = Metrics::new("test", LANES, 5);
    let (queue, rx, waiting) = Queue::new(8);
    let ctx = LoopCtx {
        codec: &codec,
        eos: &[],
        max_context: CTX,
        metrics: &metrics,
        waiting: &waiting,
        chunked: true,
    };
    let (gone, gone_rx) = job(long, 8, 1);
    let mut rec = Recorder {
        inner: &mut s,
        calls: Vec::new(),
        hang_up: Some((1, gone_rx)),
    };
    let client = std::thread::spawn(move || {
        let (a, mut a_rx) = job(short.clone(), 400, 0);
        queue.submit(a).unwrap();
        let Some(Event::Text(_)) = a_rx.blocking_recv() else {
            panic!("the short request produced no text");
        };
        queue.submit(gone).unwrap();
        let (next, next_rx) = job(short, 8, 2);
        queue.submit(next).unwrap();
        let next = collect(next_rx);
        let a = collect(a_rx);
        (a, next)
    });
    run(&mut rec, rx, &ctx);
    let (a, next) = client.join().unwrap();
    assert!(!a.text.is_empty() && !next.text.is_empty());
    let calls = &rec.calls;
    let gone_chunks = calls
        .iter()
        .take_while(|c| !matches!(c, Call::Chunk { armed, .. } if armed.contains(&1)))
        .filter(|c| matches!(c, Call::Chunk { prefilling, .. } if prefilling.first() == Some(&1)))
        .count();
    assert!(
        (1..200usize.div_ceil(CHUNK)).contains(&gone_chunks),
        "the request that hung up ran {gone_chunks} chunks: {calls:?}"
    );
    // The next request was armed in lane 1 while lane 0 still decoded (steps follow).
    let armed_at = calls
        .iter()
        .position(|c| matches!(c, Call::Chunk { armed, .. } if armed.contains(&1)))
        .expect("the next request was armed in the freed lane");
    assert!(calls[armed_at..].iter().any(|c| matches!(c, Call::Step)));
    assert!(rec.inner.prefilling().is_empty());
    assert!(metrics
        .render()
        .contains("specc:num_requests_prefilling{model_name=\"test\"} 0"));
}
