//! Continuous batching as `specc serve` drives a session, for the interpreter and the
//! device tests alike: requests arrive at given steps, join the lowest free lanes
//! (`admit_lanes`: those due at one step together, the other lanes' states kept), every step runs over the lanes in use
//! (`step_upto`), and a lane whose request is done is finished and reused.

#![allow(dead_code)]

use specc_runtime::admission::{Admit, LaneSampling};
use specc_runtime::Speculator;

/// One request: its prompt, its token budget, the step at which it arrives and its own
/// sampling knobs (`None`: the engine's; the stream is always the request's index).
pub struct Arrival {
    pub prompt: Vec<u32>,
    pub max_new: usize,
    pub at_step: usize,
    pub knobs: Option<LaneSampling>,
}

/// Request `r`'s lane sampling: its knobs or the session's defaults, on stream `r`.
fn sampling_of(s: &dyn Speculator, a: &Arrival, r: usize) -> LaneSampling {
    let stream = r as u32;
    match a.knobs {
        Some(k) => LaneSampling { stream, ..k },
        None => s.default_sampling(stream),
    }
}

/// Six requests over `prompts` (at least 4): staggered arrivals, different budgets; on a
/// 3-lane session a lane is reused twice and steps run over 1, 2 and 3 lanes.
pub fn staggered(prompts: &[Vec<u32>]) -> Vec<Arrival> {
    [
        (0, 20, 0),
        (2, 12, 0),
        (1, 24, 3),
        (3, 9, 4),
        (0, 16, 5),
        (2, 18, 9),
    ]
    .iter()
    .map(|&(p, max_new, at_step)| Arrival {
        prompt: prompts[p].clone(),
        max_new,
        at_step,
        knobs: None,
    })
    .collect()
}

/// Five requests over `prompts` (4) concatenated into longer ones (up to all four): a
/// long prompt joins while a short one decodes, another later, lanes reused (3 lanes).
pub fn long_staggered(prompts: &[Vec<u32>]) -> Vec<Arrival> {
    let cat = |ix: &[usize]| -> Vec<u32> { ix.iter().flat_map(|&i| prompts[i].clone()).collect() };
    let long = [
        cat(&[2]),
        cat(&[0, 1, 2, 3]),
        cat(&[1, 3]),
        cat(&[3, 0, 1]),
        cat(&[0]),
    ];
    [(0, 30, 0), (1, 16, 2), (2, 12, 3), (3, 10, 6), (4, 8, 9)]
        .iter()
        .map(|&(p, max_new, at_step)| Arrival {
            prompt: long[p].clone(),
            max_new,
            at_step,
            knobs: None,
        })
        .collect()
}

/// Places the requests due by `step` (from `*next` on) in free lanes, as `specc serve`
/// admits them together; each placed (lane, request).
fn join_due(
    arrivals: &[Arrival],
    next: &mut usize,
    step: usize,
    lane_of: &mut [Option<usize>],
) -> Vec<(usize, usize)> {
    let mut joining = Vec::new();
    while *next < arrivals.len() && arrivals[*next].at_step <= step {
        let Some(free) = lane_of.iter().position(Option::is_none) else {
            break;
        };
        lane_of[free] = Some(*next);
        joining.push((free, *next));
        *next += 1;
    }
    joining
}

/// The admissions of `joining`; request r draws from stream r wherever it runs.
fn admits<'a>(
    s: &dyn Speculator,
    arrivals: &'a [Arrival],
    joining: &[(usize, usize)],
) -> Vec<Admit<'a>> {
    joining
        .iter()
        .map(|&(lane, r)| Admit {
            lane,
            prompt: &arrivals[r].prompt,
            max_new: arrivals[r].max_new,
            sampling: sampling_of(s, &arrivals[r], r),
        })
        .collect()
}

/// Serves `arrivals` on `s`; each request's tokens (first + emitted, truncated).
pub fn serve(s: &mut dyn Speculator, arrivals: &[Arrival]) -> Vec<Vec<u32>> {
    serve_reading(s, arrivals, false)
}

/// [`serve`] as `specc serve` runs it: each step is queued before the tokens of the step
/// before it are read ([`Speculator::drain_behind`]), so a request's tokens come one step
/// late and a lane that ended is stepped once more (masked or discarded) before it is
/// freed and may be admitted again.
pub fn serve_behind(s: &mut dyn Speculator, arrivals: &[Arrival]) -> Vec<Vec<u32>> {
    serve_reading(s, arrivals, true)
}

fn serve_reading(s: &mut dyn Speculator, arrivals: &[Arrival], behind: bool) -> Vec<Vec<u32>> {
    let lanes = s.lanes();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); arrivals.len()];
    let mut lane_of: Vec<Option<usize>> = vec![None; lanes];
    let mut next = 0;
    let mut step = 0;
    while next < arrivals.len() || lane_of.iter().any(Option::is_some) {
        // The requests due by this step join together, as `specc serve` admits them.
        let joining = join_due(arrivals, &mut next, step, &mut lane_of);
        let rows = admits(&*s, arrivals, &joining);
        if !rows.is_empty() {
            let firsts = s.admit_lanes(&rows).unwrap();
            for (&(_, r), first) in joining.iter().zip(firsts) {
                out[r].push(first);
            }
        }
        let upto = lane_of
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |l| l + 1);
        if upto > 0 {
            s.step_upto(upto).unwrap();
            let (toks, live) = match behind {
                true => {
                    let b = s.drain_behind().unwrap();
                    (b.tokens, b.live)
                }
                false => (s.drain().unwrap(), s.live().unwrap()),
            };
            for (l, slot) in lane_of.iter_mut().enumerate() {
                if let Some(r) = *slot {
                    out[r].extend(&toks[l]);
                    if !live[l] || out[r].len() >= arrivals[r].max_new {
                        s.finish(l).unwrap();
                        *slot = None;
                    }
                }
            }
        }
        step += 1;
        assert!(step < 10_000, "requests never finished");
    }
    for (o, a) in out.iter_mut().zip(arrivals) {
        o.truncate(a.max_new);
    }
    out
}

/// Each request served alone: lane 0 of `s`, no other lane in use, with the stream it has
/// in [`serve`] (its index).
pub fn alone(s: &mut dyn Speculator, arrivals: &[Arrival]) -> Vec<Vec<u32>> {
    arrivals
        .iter()
        .enumerate()
        .map(|(r, a)| {
            let knobs = sampling_of(s, a, r);
            let mut out = vec![s.admit_lane(0, &a.prompt, a.max_new, knobs).unwrap()];
            while out.len() < a.max_new && s.live().unwrap()[0] {
                s.step_upto(1).unwrap();
                out.extend(&s.drain().unwrap()[0]);
            }
            s.finish(0).unwrap();
            out.truncate(a.max_new);
            out
        })
        .collect()
}

/// What [`serve_interleaved`] saw of each request: its tokens, and the steps of the other
/// lanes that ran between its first and its last prefill chunk.
pub struct Interleaved {
    pub tokens: Vec<Vec<u32>>,
    pub steps_during_prefill: Vec<usize>,
}

/// [`serve`] with the admissions' prefills interleaved with the steps as `specc serve`
/// runs them: the requests due join together (`begin_admission`), one prefill chunk runs
/// before each step, and a lane is stepped only from its last chunk on.
pub fn serve_interleaved(s: &mut dyn Speculator, arrivals: &[Arrival]) -> Interleaved {
    let lanes = s.lanes();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); arrivals.len()];
    let mut lane_of: Vec<Option<usize>> = vec![None; lanes];
    let mut armed = vec![false; lanes];
    let mut began: Vec<Option<usize>> = vec![None; arrivals.len()];
    let mut during = vec![0; arrivals.len()];
    let mut next = 0;
    let mut step = 0;
    let mut steps_run = 0;
    while next < arrivals.len() || lane_of.iter().any(Option::is_some) {
        let joining = join_due(arrivals, &mut next, step, &mut lane_of);
        let rows = admits(&*s, arrivals, &joining);
        if !rows.is_empty() {
            s.begin_admission(&rows).unwrap();
        }
        if let Some(&lane) = s.prefilling().first() {
            let r = lane_of[lane].expect("a prefilling lane holds a request");
            began[r].get_or_insert(steps_run);
        }
        for (lane, first) in s.prefill_chunk().unwrap() {
            let r = lane_of[lane].expect("an armed lane holds a request");
            out[r].push(first);
            during[r] = steps_run - began[r].unwrap_or(steps_run);
            armed[lane] = true;
        }
        let upto = armed.iter().rposition(|&a| a).map_or(0, |l| l + 1);
        if upto > 0 {
            s.step_upto(upto).unwrap();
            steps_run += 1;
            let toks = s.drain().unwrap();
            let live = s.live().unwrap();
            for l in 0..lanes {
                let Some(r) = lane_of[l].filter(|_| armed[l]) else {
                    assert!(toks[l].is_empty(), "lane {l} emitted before it was armed");
                    continue;
                };
                out[r].extend(&toks[l]);
                if !live[l] || out[r].len() >= arrivals[r].max_new {
                    s.finish(l).unwrap();
                    lane_of[l] = None;
                    armed[l] = false;
                }
            }
        }
        step += 1;
        assert!(step < 10_000, "requests never finished");
    }
    for (o, a) in out.iter_mut().zip(arrivals) {
        o.truncate(a.max_new);
    }
    Interleaved {
        tokens: out,
        steps_during_prefill: during,
    }
}
