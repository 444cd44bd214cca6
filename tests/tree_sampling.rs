//! Sampled acceptance over draft trees reproduces the target's distribution. A tree step
//! draws the target's token at every tree node (softmax(logits / T), one uniform per node),
//! walks down while a child carries the current node's draw and emits the draw where none
//! does. On a tiny-vocab target, over many lanes and seeds, the first emitted token must follow
//! the target's softmax after the prompt, and the second one — drawn at a child node when the
//! walk descended, in the next step when it did not — the target's softmax after the prompt
//! and the first token: chi-square tests of both, for DDTree at budgets of one and two
//! ancestor words and for an EAGLE-3 draft tree.

use std::collections::HashMap;

use specc_ir::engine::StepContract;
use specc_ir::interp::Tensor;
use specc_ir::Graph;
use specc_models::methods::{
    lower_ddtree_step, lower_dflash_prefill, lower_eagle3_prefill, lower_eagle3_tree_step,
    lower_target_prefill, StepShape,
};
use specc_models::{lower_dense, Acceptance, Method, TreeKnobs};
use specc_runtime::admission::LaneSampling;
use specc_runtime::{DraftKind, SpecCpuSession, SpecGraphs};

mod common;
mod sampling_common;

use common::spec_contract;

use sampling_common::{
    chi_square, fill_weights, target_probs, tiny_dflash, tiny_dflash_target, tiny_eagle3,
    CRITICAL_7DF, TEMPERATURE, VOCAB,
};

const PROMPT: [u32; 5] = [1, 5, 2, 7, 3];

#[derive(Clone, Copy, Debug)]
enum TreeMethod {
    DDTree(TreeKnobs),
    /// Depth, then the tree knobs (`budget` = num_draft_tokens).
    Eagle3(u64, TreeKnobs),
}

/// A method's graphs for one seed: (its step contract, draft prefill, step).
fn graphs(m: TreeMethod, shape_seed: u64) -> (StepContract, Graph, Graph) {
    let spec = tiny_dflash_target();
    let sample = |depth| StepShape {
        num_steps: depth,
        ring: 16,
        acceptance: Acceptance::Sample {
            temperature: TEMPERATURE,
            top_k: None,
            top_p: 1.0,
            seed: shape_seed,
        },
    };
    match m {
        TreeMethod::DDTree(tree) => {
            let d = tiny_dflash(&spec);
            let depth = d.num_steps() as u64;
            let step = lower_ddtree_step(&spec, &d, &sample(depth), tree).unwrap();
            let kind = DraftKind::DDTree {
                taps_width: d.taps_width(),
                depth: depth as usize,
            };
            let margin = Method::DDTree.verify_margin(Some(tree), depth as u32);
            let contract = spec_contract(kind, margin, 16);
            (contract, lower_dflash_prefill(&spec, &d).unwrap(), step)
        }
        TreeMethod::Eagle3(depth, tree) => {
            let e = tiny_eagle3(&spec);
            let step = lower_eagle3_tree_step(&spec, &e, &sample(depth), tree).unwrap();
            let kind = DraftKind::Eagle3Tree {
                taps_width: 3 * e.hidden(),
                depth: depth as usize,
            };
            let margin = Method::Eagle3.verify_margin(Some(tree), depth as u32);
            let contract = spec_contract(kind, margin, 16);
            (contract, lower_eagle3_prefill(&spec, &e).unwrap(), step)
        }
    }
}

/// The taps a method's drafter reads from the target prefill.
fn taps(m: TreeMethod) -> Vec<usize> {
    let spec = tiny_dflash_target();
    match m {
        TreeMethod::DDTree(_) => tiny_dflash(&spec).taps,
        TreeMethod::Eagle3(..) => tiny_eagle3(&spec).taps,
    }
}

/// First and second emitted tokens of every lane over the seeds, the bonus token the
/// prefill produced, and the drafts accepted in the first step.
struct Draws {
    /// (first token, second token, whether the first step accepted a draft).
    pairs: Vec<(usize, usize, bool)>,
    first_bonus: u32,
    accepted: usize,
    /// Tokens of the two steps of every greedy lane (mixed lanes only).
    greedy: Vec<Vec<u32>>,
}

/// With `mixed`, every even lane decodes greedily (temperature 0 in its device state) next
/// to the sampled odd lanes, whose draws alone are counted.
fn draws(
    m: TreeMethod,
    lanes: usize,
    seeds: &[u64],
    mixed: bool,
) -> (Draws, HashMap<String, Tensor>) {
    let spec = tiny_dflash_target();
    let dense = lower_dense(&spec).unwrap();
    let prefill = lower_target_prefill(&spec, &taps(m), &Acceptance::Greedy).unwrap();
    let mut w = HashMap::new();
    let mut out = Draws {
        pairs: Vec::new(),
        first_bonus: 0,
        accepted: 0,
        greedy: Vec::new(),
    };
    for &seed in seeds {
        let (contract, dpre, step) = graphs(m, seed);
        fill_weights(&dense, 7, &mut w);
        fill_weights(&step, 99, &mut w);
        fill_weights(&dpre, 99, &mut w);
        let g = SpecGraphs {
            contract,
            target_prefill: &prefill,
            draft_prefill: &dpre,
            step: &step,
            variants: Vec::new(),
            greedy: Vec::new(),
            catch_up: None,
            acceptance: Acceptance::Sample {
                temperature: TEMPERATURE,
                top_k: None,
                top_p: 1.0,
                seed,
            },
        };
        let knobs: Vec<LaneSampling> = (0..lanes as u32)
            .map(|b| match mixed && b % 2 == 0 {
                true => LaneSampling::greedy(b),
                false => LaneSampling::defaults(&g.acceptance, b),
            })
            .collect();
        let mut s = SpecCpuSession::new(g, &w, lanes, 256);
        let first = s
            .admit_with(&vec![PROMPT.to_vec(); lanes], 8, &knobs)
            .unwrap();
        out.first_bonus = first[0];
        s.step().unwrap();
        let one = s.drain().unwrap();
        s.step().unwrap();
        let two = s.drain().unwrap();
        for (lane, (a, b)) in one.iter().zip(&two).enumerate() {
            if mixed && lane % 2 == 0 {
                out.greedy.push(a.iter().chain(b).copied().collect());
                continue;
            }
            out.accepted += a.len() - 1;
            let both: Vec<u32> = a.iter().chain(b).copied().collect();
            out.pairs
                .push((both[0] as usize, both[1] as usize, a.len() > 1));
        }
    }
    (out, w)
}

fn check_tree_sampling(m: TreeMethod, depth: usize) {
    check_tree_lanes(m, depth, false);
}

/// [`check_tree_sampling`]; with `mixed`, next to as many greedy lanes, each of which must
/// emit the target's greedy tokens.
fn check_tree_lanes(m: TreeMethod, depth: usize, mixed: bool) {
    let lanes = if mixed { 1024 } else { 512 };
    let seeds = [1u64, 2, 3, 4];
    let (d, w) = draws(m, lanes, &seeds, mixed);
    let dense = lower_dense(&tiny_dflash_target()).unwrap();
    let mut ctx: Vec<u32> = PROMPT.to_vec();
    ctx.push(d.first_bonus);
    let mut first = vec![0usize; VOCAB];
    for &(a, _, _) in &d.pairs {
        first[a] += 1;
    }
    let p1 = target_probs(&dense, &w, &ctx);
    let x1 = chi_square(&first, &p1);
    // The second token given a first one: `top` (the most frequent; mostly drawn at the next
    // step's root) and `child` (the most frequent among walks that descended: a first token
    // that is a child of the root always descends, so every such second token was drawn at
    // a child node).
    let top = (0..VOCAB).max_by_key(|&t| first[t]).unwrap();
    let descended = |t: usize| d.pairs.iter().filter(|p| p.0 == t && p.2).count();
    let child = (0..VOCAB).max_by_key(|&t| descended(t)).unwrap();
    assert!(descended(child) >= 100, "too few descents after {child}");
    let second = |t: usize| {
        let mut c = vec![0usize; VOCAB];
        for &(a, b, _) in &d.pairs {
            if a == t {
                c[b] += 1;
            }
        }
        c
    };
    let after = |t: usize| {
        let mut c = ctx.clone();
        c.push(t as u32);
        target_probs(&dense, &w, &c)
    };
    let (s_top, p_top) = (second(top), after(top));
    let (s_child, p_child) = (second(child), after(child));
    let (x2, x3) = (chi_square(&s_top, &p_top), chi_square(&s_child, &p_child));
    let steps = d.pairs.len();
    if mixed {
        // The greedy lanes: the target's argmax continuation, token for token.
        let mut want = Vec::new();
        let mut c = PROMPT.to_vec();
        let longest = d.greedy.iter().map(Vec::len).max().unwrap();
        for _ in 0..=longest {
            let p = target_probs(&dense, &w, &c);
            let best = (0..VOCAB).max_by(|&a, &b| p[a].total_cmp(&p[b]).then(b.cmp(&a)));
            want.push(best.unwrap() as u32);
            c.push(*want.last().unwrap());
        }
        for (i, got) in d.greedy.iter().enumerate() {
            assert_eq!(got[..], want[1..=got.len()], "{m:?}: greedy lane {i}");
        }
    }
    eprintln!(
        "{m:?} sampling: first chi2 {x1:.2} {first:?}; second | {top}: chi2 {x2:.2} \
         {s_top:?}; second | {child} (descended {}): chi2 {x3:.2} {s_child:?}; {:.2} drafts \
         accepted per lane-step",
        descended(child),
        d.accepted as f64 / steps as f64
    );
    assert!(
        x1 < CRITICAL_7DF,
        "first token: chi2 {x1:.2}: {first:?} vs {p1:?}"
    );
    assert!(
        x2 < CRITICAL_7DF,
        "second | {top}: chi2 {x2:.2}: {s_top:?} vs {p_top:?}"
    );
    assert!(
        x3 < CRITICAL_7DF,
        "second | {child}: chi2 {x3:.2}: {s_child:?} vs {p_child:?}"
    );
    // The walk really descends, and really stops.
    assert!(
        d.accepted > 0 && d.accepted < steps * depth,
        "{} drafts accepted",
        d.accepted
    );
    // Power: the first draws are far from uniform, and the second ones far from the first
    // token's distribution (a walk that drew every node after the prompt alone would fail).
    let uniform = vec![1.0 / VOCAB as f64; VOCAB];
    assert!(chi_square(&first, &uniform) > CRITICAL_7DF, "power check");
    assert!(
        chi_square(&s_child, &p1) > CRITICAL_7DF,
        "power check (second)"
    );
}

#[test]
fn ddtree_mixed_greedy_and_sampled_lanes() {
    // Half the lanes greedy in the same steps: the sampled half still follows the target's
    // distribution, the greedy half emits its argmax.
    let tree = TreeKnobs {
        budget: 16,
        topk: 8,
    };
    check_tree_lanes(TreeMethod::DDTree(tree), 3, true);
}

#[test]
fn ddtree_sampling_matches_target_distribution_one_word() {
    // All 8 tokens are candidates at every depth: descents after a frequent first token.
    let tree = TreeKnobs {
        budget: 16,
        topk: 8,
    };
    check_tree_sampling(TreeMethod::DDTree(tree), 3);
}

#[test]
fn ddtree_sampling_matches_target_distribution_two_words() {
    // 80 nodes: two ancestor words, and node uniforms past column 64.
    let tree = TreeKnobs {
        budget: 80,
        topk: 5,
    };
    check_tree_sampling(TreeMethod::DDTree(tree), 3);
}

#[test]
fn eagle3_tree_sampling_matches_target_distribution() {
    let tree = TreeKnobs { budget: 8, topk: 2 };
    check_tree_sampling(TreeMethod::Eagle3(3, tree), 3);
}
