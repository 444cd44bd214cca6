//! Top-k and top-p sampling on the interpreter: every sampled token (the prefill's first
//! draw, plain decoding's and speculative steps' tokens) lies in the filtered support of the
//! target's distribution after its context, and the draws follow the filtered distribution
//! (chi-square over its support), with the draft filtered the same way and different from
//! the target, so rejections happen. The reference filter is computed here in f64 from the
//! target's own logits.

use std::collections::HashMap;

use specc_ir::engine::Phase;
use specc_ir::interp::Tensor;
use specc_ir::Graph;
use specc_models::methods::{lower_draft_model_step, lower_plain, StepShape, DRAFT_PREFIX};
use specc_models::{lower_dense, lower_dense_prefixed, Acceptance, ModelSpec};
use specc_runtime::admission::LaneSampling;
use specc_runtime::{DraftKind, SpecCpuSession, SpecGraphs};

mod common;
mod sampling_common;

use common::spec_contract;
use sampling_common::{
    chi_square, fill_weights, target_probs, tiny_spec, CRITICAL_7DF, TEMPERATURE, VOCAB,
};

const PROMPT: [u32; 4] = [1, 5, 2, 7];

fn sample(top_k: Option<u64>, top_p: f64, seed: u64) -> Acceptance {
    Acceptance::Sample {
        temperature: TEMPERATURE,
        top_k,
        top_p,
        seed,
    }
}

/// `probs` filtered as the step graphs filter them: the `top_k` largest (ties with the k-th
/// kept), renormalised, then the nucleus of mass `top_p` (the least probability whose
/// strictly larger ones weigh less than `top_p`, and everything at least as likely),
/// renormalised.
fn filtered(probs: &[f64], top_k: Option<u64>, top_p: f64) -> Vec<f64> {
    let norm = |q: Vec<f64>| {
        let s: f64 = q.iter().sum();
        q.into_iter().map(|x| x / s).collect::<Vec<f64>>()
    };
    let mut desc = probs.to_vec();
    desc.sort_by(|a, b| b.total_cmp(a));
    let kth = top_k.map_or(0.0, |k| desc[k as usize - 1]);
    let q = norm(
        probs
            .iter()
            .map(|&x| if x < kth { 0.0 } else { x })
            .collect(),
    );
    if top_p >= 1.0 {
        return q;
    }
    let mut desc = q.clone();
    desc.sort_by(|a, b| b.total_cmp(a));
    let (mut above, mut tau) = (0.0, 0.0);
    for &x in &desc {
        if above >= top_p {
            break;
        }
        tau = x;
        above += x;
    }
    norm(q.iter().map(|&x| if x < tau { 0.0 } else { x }).collect())
}

/// chi-square critical values at p = 0.001 by degrees of freedom (1..=7).
const CRITICAL: [f64; 8] = [0.0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, CRITICAL_7DF];

/// Asserts that no count falls outside `want`'s support and that the counts pass a
/// chi-square test against it over the support.
#[track_caller]
fn assert_follows(counts: &[usize], want: &[f64], what: &str) {
    let support: Vec<usize> = (0..VOCAB).filter(|&t| want[t] > 0.0).collect();
    for t in 0..VOCAB {
        assert!(
            want[t] > 0.0 || counts[t] == 0,
            "{what}: token {t} drawn {} times outside the support {support:?} of {want:.3?}",
            counts[t]
        );
    }
    assert!(
        support.len() >= 2,
        "{what}: a one-token support tests nothing"
    );
    let c: Vec<usize> = support.iter().map(|&t| counts[t]).collect();
    let p: Vec<f64> = support.iter().map(|&t| want[t]).collect();
    let x2 = chi_square(&c, &p);
    eprintln!("{what}: chi2 {x2:.2} counts {counts:?} want {want:.3?}");
    assert!(
        x2 < CRITICAL[support.len() - 1],
        "{what}: chi2 {x2:.2}: counts {counts:?} vs {want:?}"
    );
}

/// The target's (and draft's) graphs and weights: the draft is a different random model.
struct Models {
    spec: ModelSpec,
    target: Graph,
    draft: Graph,
    weights: HashMap<String, Tensor>,
}

fn models() -> Models {
    let spec = tiny_spec();
    let target = lower_dense(&spec).unwrap();
    let draft = lower_dense_prefixed(&spec, DRAFT_PREFIX, Phase::Draft).unwrap();
    let mut weights = HashMap::new();
    fill_weights(&target, 7, &mut weights);
    let mut dw = HashMap::new();
    fill_weights(&target, 99, &mut dw);
    weights.extend(
        dw.into_iter()
            .map(|(n, t)| (format!("{DRAFT_PREFIX}{n}"), t)),
    );
    Models {
        spec,
        target,
        draft,
        weights,
    }
}

/// Each lane's tokens after `steps` steps of a draft_model chain (k = 3) or, with
/// `plain`, of plain decoding: the first token, then every emitted one.
fn generate(
    m: &Models,
    acc: &Acceptance,
    plain: bool,
    lanes: usize,
    steps: usize,
) -> Vec<Vec<u32>> {
    let shape = StepShape {
        num_steps: 3,
        ring: 16,
        acceptance: acc.clone(),
    };
    let (prefill, decode) = lower_plain(&m.spec, 16, acc).unwrap();
    let step = lower_draft_model_step(&m.spec, &m.spec, &shape).unwrap();
    let graphs = match plain {
        true => SpecGraphs::plain(&prefill, &decode, 16).with_acceptance(acc.clone()),
        false => SpecGraphs {
            contract: spec_contract(DraftKind::Model, 3, 16),
            target_prefill: &prefill,
            draft_prefill: &m.draft,
            step: &step,
            variants: Vec::new(),
            greedy: Vec::new(),
            catch_up: None,
            acceptance: shape.acceptance.clone(),
        },
    };
    let mut s = SpecCpuSession::new(graphs, &m.weights, lanes, 64);
    let first = s.admit(&vec![PROMPT.to_vec(); lanes], 40).unwrap();
    let mut out: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    for _ in 0..steps {
        s.step().unwrap();
        for (o, new) in out.iter_mut().zip(s.drain().unwrap()) {
            o.extend(new);
        }
    }
    out
}

/// Every token of every lane lies in the filtered support after its context.
#[track_caller]
fn assert_in_support(m: &Models, seqs: &[Vec<u32>], top_k: Option<u64>, top_p: f64, what: &str) {
    let mut checked = 0;
    for seq in seqs {
        let mut ctx = PROMPT.to_vec();
        for &t in seq {
            let want = filtered(&target_probs(&m.target, &m.weights, &ctx), top_k, top_p);
            assert!(
                want[t as usize] > 0.0,
                "{what}: token {t} after {ctx:?} is outside the support of {want:.3?}"
            );
            ctx.push(t);
            checked += 1;
        }
    }
    eprintln!("{what}: {checked} tokens inside the filtered support");
}

#[test]
fn every_sampled_token_is_in_the_filtered_support() {
    let m = models();
    for (top_k, top_p) in [(Some(3), 1.0), (None, 0.6), (Some(5), 0.8)] {
        for plain in [true, false] {
            let seqs = generate(&m, &sample(top_k, top_p, 11), plain, 16, 5);
            let what = format!("top_k {top_k:?} top_p {top_p} plain {plain}");
            assert_in_support(&m, &seqs, top_k, top_p, &what);
        }
    }
}

#[test]
fn first_tokens_follow_the_filtered_distribution() {
    let m = models();
    let want = filtered(&target_probs(&m.target, &m.weights, &PROMPT), Some(4), 0.9);
    let mut counts = vec![0usize; VOCAB];
    for seed in [1, 2] {
        for seq in generate(&m, &sample(Some(4), 0.9, seed), true, 512, 0) {
            counts[seq[0] as usize] += 1;
        }
    }
    assert_follows(&counts, &want, "prefill draw, top_k 4 top_p 0.9");
}

/// The token a draft_model step emits first, over many lanes: the draft (a different model,
/// filtered alike) proposes, rejection sampling corrects. The prefill's token is greedy so
/// every lane shares the context.
fn first_step_counts(top_k: Option<u64>, top_p: f64) -> (Vec<usize>, Vec<f64>) {
    let m = models();
    let greedy_prefill = lower_plain(&m.spec, 16, &Acceptance::Greedy).unwrap().0;
    let lanes = 512;
    let mut counts = vec![0usize; VOCAB];
    let mut first = 0;
    for seed in [1, 2, 3] {
        let shape = StepShape {
            num_steps: 3,
            ring: 16,
            acceptance: sample(top_k, top_p, seed),
        };
        let step = lower_draft_model_step(&m.spec, &m.spec, &shape).unwrap();
        let graphs = SpecGraphs {
            contract: spec_contract(DraftKind::Model, 3, 16),
            target_prefill: &greedy_prefill,
            draft_prefill: &m.draft,
            step: &step,
            variants: Vec::new(),
            greedy: Vec::new(),
            catch_up: None,
            acceptance: shape.acceptance.clone(),
        };
        let mut s = SpecCpuSession::new(graphs, &m.weights, lanes, 64);
        first = s.admit(&vec![PROMPT.to_vec(); lanes], 8).unwrap()[0];
        s.step().unwrap();
        for lane in s.drain().unwrap() {
            counts[lane[0] as usize] += 1;
        }
    }
    let mut ctx = PROMPT.to_vec();
    ctx.push(first);
    let want = filtered(&target_probs(&m.target, &m.weights, &ctx), top_k, top_p);
    (counts, want)
}

#[test]
fn speculative_top_k_follows_the_filtered_distribution() {
    let (counts, want) = first_step_counts(Some(3), 1.0);
    assert_follows(&counts, &want, "draft_model step, top_k 3");
}

#[test]
fn speculative_top_p_follows_the_filtered_distribution() {
    // Four tokens here (top-k 3 keeps three of them).
    let (counts, want) = first_step_counts(None, 0.85);
    assert_follows(&counts, &want, "draft_model step, top_p 0.85");
}

#[test]
fn the_reference_filter_by_hand() {
    let close = |got: Vec<f64>, want: [f64; 4]| {
        let ok = got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-12);
        assert!(ok, "got {got:?}, want {want:?}");
    };
    let p = [0.1, 0.4, 0.2, 0.3];
    close(filtered(&p, Some(2), 1.0), [0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0]);
    // Nucleus 0.5: 0.4 alone weighs less, 0.4 + 0.3 reaches it.
    close(filtered(&p, None, 0.5), [0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0]);
    close(filtered(&p, None, 0.4), [0.0, 1.0, 0.0, 0.0]);
    close(filtered(&p, Some(4), 1.0), p);
    // Top-k first, then the nucleus of what is left: 0.5 of {0.4, 0.3, 0.2}.
    close(filtered(&p, Some(3), 0.5), [0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0]);
}

/// One step graph, lanes with their own knobs side by side (the knobs are device state):
/// greedy lanes (temperature 0) emit exactly the target's argmax, top-k lanes and top-p
/// lanes each follow their own filtered distribution, in the same steps.
#[test]
fn mixed_lanes_each_follow_their_own_knobs() {
    let m = models();
    let greedy_prefill = lower_plain(&m.spec, 16, &Acceptance::Greedy).unwrap().0;
    let lanes = 768;
    let knobs = |b: usize, seed: u64| -> LaneSampling {
        let stream = b as u32;
        match b % 3 {
            0 => LaneSampling::greedy(stream),
            1 => LaneSampling {
                stream,
                temperature: TEMPERATURE as f32,
                top_k: 3,
                top_p: 1.0,
            },
            _ => LaneSampling {
                stream: stream + 1000 * seed as u32,
                temperature: TEMPERATURE as f32,
                top_k: 0,
                top_p: 0.85,
            },
        }
    };
    let (mut top_k, mut top_p) = (vec![0usize; VOCAB], vec![0usize; VOCAB]);
    let mut greedy_tokens = Vec::new();
    let mut first = 0;
    for seed in [1, 2, 3] {
        // The compiled knobs (temperature 2, top-k 2) are only the defaults: no lane uses them.
        let shape = StepShape {
            num_steps: 3,
            ring: 16,
            acceptance: Acceptance::Sample {
                temperature: 2.0,
                top_k: Some(2),
                top_p: 1.0,
                seed,
            },
        };
        let step = lower_draft_model_step(&m.spec, &m.spec, &shape).unwrap();
        let graphs = SpecGraphs {
            contract: spec_contract(DraftKind::Model, 3, 16),
            target_prefill: &greedy_prefill,
            draft_prefill: &m.draft,
            step: &step,
            variants: Vec::new(),
            greedy: Vec::new(),
            catch_up: None,
            acceptance: shape.acceptance.clone(),
        };
        let mut s = SpecCpuSession::new(graphs, &m.weights, lanes, 64);
        let ks: Vec<LaneSampling> = (0..lanes).map(|b| knobs(b, seed)).collect();
        first = s.admit_with(&vec![PROMPT.to_vec(); lanes], 8, &ks).unwrap()[0];
        s.step().unwrap();
        for (b, lane) in s.drain().unwrap().into_iter().enumerate() {
            match b % 3 {
                0 => greedy_tokens.push(lane),
                1 => top_k[lane[0] as usize] += 1,
                _ => top_p[lane[0] as usize] += 1,
            }
        }
    }
    let mut ctx = PROMPT.to_vec();
    ctx.push(first);
    let probs = target_probs(&m.target, &m.weights, &ctx);
    assert_follows(
        &top_k,
        &filtered(&probs, Some(3), 1.0),
        "mixed lanes, top_k 3",
    );
    assert_follows(
        &top_p,
        &filtered(&probs, None, 0.85),
        "mixed lanes, top_p 0.85",
    );
    // Greedy lanes: the target's greedy continuation, token for token.
    let mut want = Vec::new();
    let mut ctx = ctx.clone();
    for _ in 0..greedy_tokens.iter().map(Vec::len).max().unwrap() {
        let p = target_probs(&m.target, &m.weights, &ctx);
        let best = (0..VOCAB).max_by(|&a, &b| p[a].total_cmp(&p[b]).then(b.cmp(&a)));
        want.push(best.unwrap() as u32);
        ctx.push(*want.last().unwrap());
    }
    for (i, got) in greedy_tokens.iter().enumerate() {
        assert!(!got.is_empty(), "greedy lane {i} emitted nothing");
        assert_eq!(got[..], want[..got.len()], "greedy lane {i}");
    }
}
