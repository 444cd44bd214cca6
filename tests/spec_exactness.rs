//! Speculative decoding on the interpreter: with greedy acceptance the emitted tokens must
//! equal the target's own greedy tokens exactly, whatever the draft proposes.

use std::collections::HashMap;
use std::path::Path;

use specc_ir::engine::Phase;
use specc_ir::interp::{Data, Tensor};
use specc_models::methods::eagle3::{Eagle3Spec, EAGLE_PREFIX};
use specc_models::methods::{lower_draft_model_step, StepShape, DRAFT_PREFIX};
use specc_models::methods::{lower_eagle3_prefill, lower_eagle3_step, lower_target_prefill};
use specc_models::Checkpoint;
use specc_models::{lower_dense_prefixed, Acceptance, Model};
use specc_runtime::{DraftKind, SpecCpuSession, SpecGraphs};

mod common;

use common::{default_model, fixture, spec_contract};

/// Draft weights under the step graph's draft prefix, optionally perturbed.
fn draft_weights(draft: &Model, noise: f32) -> HashMap<String, Tensor> {
    let mut out = HashMap::new();
    for (name, mut t) in draft.load_weights_f32() {
        if noise > 0.0 && name.contains("mlp") {
            if let Data::F32(v) = &mut t.data {
                // Deterministic perturbation: a fixed pseudo-random pattern.
                for (i, x) in v.iter_mut().enumerate() {
                    let h = (i as u32).wrapping_mul(2_654_435_761) >> 16;
                    *x += noise * ((h % 2001) as f32 / 1000.0 - 1.0);
                }
            }
        }
        out.insert(format!("{DRAFT_PREFIX}{name}"), t);
    }
    out
}

struct Outcome {
    tokens: Vec<Vec<u32>>,
    mean_accept: f64,
}

fn speculate(
    target: &Model,
    draft: &Model,
    noise: f32,
    k: u64,
    prompts: &[Vec<u32>],
    max_new: usize,
) -> Outcome {
    let ctx = 128u64;
    let shape = StepShape {
        num_steps: k,
        ring: 64,
        acceptance: Acceptance::Greedy,
    };
    let step = lower_draft_model_step(target.spec(), draft.spec(), &shape).unwrap();
    let target_prefill = lower_target_prefill(target.spec(), &[], &Acceptance::Greedy).unwrap();
    let draft_prefill = lower_dense_prefixed(draft.spec(), DRAFT_PREFIX, Phase::Draft).unwrap();
    let mut weights = target.load_weights_f32();
    weights.extend(draft_weights(draft, noise));
    let graphs = SpecGraphs {
        contract: spec_contract(DraftKind::Model, k as usize, 64),
        target_prefill: &target_prefill,
        draft_prefill: &draft_prefill,
        step: &step,
        variants: Vec::new(),
        greedy: Vec::new(),
        catch_up: None,
        acceptance: shape.acceptance.clone(),
    };
    run_session(graphs, &weights, prompts, max_new, ctx)
}

fn run_session(
    graphs: SpecGraphs,
    weights: &HashMap<String, Tensor>,
    prompts: &[Vec<u32>],
    max_new: usize,
    ctx: u64,
) -> Outcome {
    let mut s = SpecCpuSession::new(graphs, weights, prompts.len(), ctx);
    let first = s.admit(prompts, max_new).unwrap();
    let mut tokens: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    while s.live().iter().any(|&l| l) {
        s.step().unwrap();
        for (b, new) in s.drain().unwrap().into_iter().enumerate() {
            tokens[b].extend(new);
        }
    }
    for t in &mut tokens {
        t.truncate(max_new);
    }
    Outcome {
        tokens,
        mean_accept: s.stats.mean_accept_len(),
    }
}

fn greedy(target: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let w = target.load_weights_f32();
    target.greedy_generate(&w, prompt, n, 128).unwrap()
}

fn prompts(b: usize) -> Vec<Vec<u32>> {
    (0..b)
        .map(|i| {
            (0..(5 + 3 * i))
                .map(|j| ((j * 37 + i * 11 + 3) % 300) as u32)
                .collect()
        })
        .collect()
}

fn check(target_name: &str, draft_name: &str, noise: f32, lanes: usize, k: u64) -> f64 {
    let target = Model::open(fixture(target_name)).unwrap();
    let draft = Model::open(fixture(draft_name)).unwrap();
    let ps = prompts(lanes);
    let n = 20;
    let out = speculate(&target, &draft, noise, k, &ps, n);
    for (b, p) in ps.iter().enumerate() {
        let want = greedy(&target, p, n);
        assert_eq!(
            out.tokens[b],
            want,
            "lane {b} (prompt len {}) differs from target greedy",
            p.len()
        );
    }
    out.mean_accept
}

#[test]
fn identical_draft_accepts_everything() {
    let k = 4;
    let mean = check("llama3_scaled_untied", "llama3_scaled_untied", 0.0, 1, k);
    assert!((mean - (k + 1) as f64).abs() < 1e-9, "mean accept {mean}");
}

#[test]
fn identical_draft_batch4_different_prompt_lengths() {
    let k = 3;
    let mean = check("llama3_scaled_untied", "llama3_scaled_untied", 0.0, 4, k);
    assert!((mean - (k + 1) as f64).abs() < 1e-9, "mean accept {mean}");
}

#[test]
fn unrelated_draft_accepts_almost_nothing() {
    let mean = check("llama3_scaled_untied", "qwen3_headdim", 0.0, 1, 4);
    assert!(mean < 1.6, "mean accept {mean}");
}

#[test]
fn unrelated_draft_batch4() {
    let mean = check("llama3_scaled_untied", "qwen3_headdim", 0.0, 4, 3);
    assert!(mean < 1.6, "mean accept {mean}");
}

#[test]
fn perturbed_draft_accepts_partially() {
    let mean = check("llama3_scaled_untied", "llama3_scaled_untied", 0.05, 1, 4);
    assert!(mean > 1.2 && mean < 4.9, "mean accept {mean}");
}

#[test]
fn perturbed_draft_batch4() {
    let mean = check("llama3_scaled_untied", "llama3_scaled_untied", 0.05, 4, 5);
    assert!(mean > 1.2 && mean < 5.9, "mean accept {mean}");
}

fn eagle_weights(dir: &Path, step: &specc_ir::Graph) -> HashMap<String, Tensor> {
    let ck = Checkpoint::open(dir).unwrap();
    ck.validate_prefixed(step, EAGLE_PREFIX).unwrap();
    step.weights()
        .filter_map(|(_, name, _)| name.strip_prefix(EAGLE_PREFIX).map(|n| (name, n)))
        .map(|(full, n)| (full.to_string(), ck.load_f32(n).unwrap()))
        .collect()
}

fn check_eagle(lanes: usize, k: u64) -> f64 {
    let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
    let eagle = Eagle3Spec::from_dir(&fixture("eagle3_random"), target.spec()).unwrap();
    let shape = StepShape {
        num_steps: k,
        ring: 64,
        acceptance: Acceptance::Greedy,
    };
    let step = lower_eagle3_step(target.spec(), &eagle, &shape).unwrap();
    let prefill = lower_target_prefill(target.spec(), &eagle.taps, &Acceptance::Greedy).unwrap();
    let head_prefill = lower_eagle3_prefill(target.spec(), &eagle).unwrap();
    let mut weights = target.load_weights_f32();
    weights.extend(eagle_weights(&fixture("eagle3_random"), &step));
    let kind = DraftKind::Eagle3 {
        taps_width: 3 * eagle.hidden(),
    };
    let graphs = SpecGraphs {
        contract: spec_contract(kind, k as usize, 64),
        target_prefill: &prefill,
        draft_prefill: &head_prefill,
        step: &step,
        variants: Vec::new(),
        greedy: Vec::new(),
        catch_up: None,
        acceptance: shape.acceptance.clone(),
    };
    let ps = prompts(lanes);
    let n = 20;
    let out = run_session(graphs, &weights, &ps, n, 128);
    for (b, p) in ps.iter().enumerate() {
        assert_eq!(out.tokens[b], greedy(&target, p, n), "eagle lane {b}");
    }
    out.mean_accept
}

#[test]
fn eagle3_random_head_is_exact_batch1() {
    let mean = check_eagle(1, 4);
    assert!(mean < 1.6, "mean accept {mean}");
}

#[test]
fn eagle3_random_head_is_exact_batch4() {
    check_eagle(4, 3);
}

#[test]
fn eagle3_taps_follow_the_config_order() {
    let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
    let eagle = Eagle3Spec::from_dir(&fixture("eagle3_random"), target.spec()).unwrap();
    // eagle_aux_hidden_state_layer_ids = [1, 0, 1]: outputs of layers 1, 0, 1 in that order.
    assert_eq!(eagle.taps, vec![1, 0, 1]);
    assert_eq!(eagle.draft_vocab, 256);
}

#[test]
fn decode_step_graph_equals_target_greedy() {
    use specc_models::methods::lower_plain_greedy;
    let target = Model::open(fixture("qwen3_headdim")).unwrap();
    let (prefill, step) = lower_plain_greedy(target.spec(), 8).unwrap();
    let weights = target.load_weights_f32();
    let graphs = SpecGraphs::plain(&prefill, &step, 8);
    let ps = prompts(3);
    let out = run_session(graphs, &weights, &ps, 12, 128);
    for (b, p) in ps.iter().enumerate() {
        assert_eq!(out.tokens[b], greedy(&target, p, 12), "lane {b}");
    }
    assert!((out.mean_accept - 1.0).abs() < 1e-9);
}

/// The trained family (models/default): real partial acceptance, still exact.
fn trained_eagle(lanes: usize, k: u64) -> f64 {
    let root = default_model();
    let target = Model::open(&root).unwrap();
    let eagle = Eagle3Spec::from_dir(&root.join("eagle3"), target.spec()).unwrap();
    let shape = StepShape {
        num_steps: k,
        ring: 64,
        acceptance: Acceptance::Greedy,
    };
    let step = lower_eagle3_step(target.spec(), &eagle, &shape).unwrap();
    let prefill = lower_target_prefill(target.spec(), &eagle.taps, &Acceptance::Greedy).unwrap();
    let head_prefill = lower_eagle3_prefill(target.spec(), &eagle).unwrap();
    let mut weights = target.load_weights_f32();
    weights.extend(eagle_weights(&root.join("eagle3"), &step));
    let kind = DraftKind::Eagle3 {
        taps_width: 3 * eagle.hidden(),
    };
    let graphs = SpecGraphs {
        contract: spec_contract(kind, k as usize, 64),
        target_prefill: &prefill,
        draft_prefill: &head_prefill,
        step: &step,
        variants: Vec::new(),
        greedy: Vec::new(),
        catch_up: None,
        acceptance: shape.acceptance.clone(),
    };
    // Python-like prompts in the tokenizer's id space (BOS + a few common tokens).
    let ps: Vec<Vec<u32>> = (0..lanes)
        .map(|i| {
            let mut p = vec![0u32];
            p.extend((0..(4 + 3 * i)).map(|j| (100 + 17 * j + 5 * i) as u32 % 500));
            p
        })
        .collect();
    let n = 40;
    let out = run_session(graphs, &weights, &ps, n, 256);
    for (b, p) in ps.iter().enumerate() {
        let w = target.load_weights_f32();
        let want = target.greedy_generate(&w, p, n, 256).unwrap();
        assert_eq!(out.tokens[b], want, "trained eagle lane {b}");
    }
    out.mean_accept
}

#[test]
fn trained_eagle3_head_partial_acceptance_is_exact() {
    let m1 = trained_eagle(1, 5);
    let m4 = trained_eagle(4, 4);
    eprintln!("trained EAGLE-3: mean acceptance {m1:.2} (B=1, k=5), {m4:.2} (B=4, k=4)");
    assert!(m1 > 1.2 && m4 > 1.2, "{m1} {m4}");
}
