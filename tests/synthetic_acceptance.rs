//! `--random-weights --synthetic-acceptance P` on the interpreter: the planted target's
//! greedy stream follows its permutation π exactly, with a logit margin that grows as √H;
//! a planted `draft_model` draft (k = 4) accepts `Σ_{i=1..k} P^i` drafts per step on
//! average; speculation stays exact; and models or methods that cannot carry the plant are
//! refused with one clear line.

use std::path::{Path, PathBuf};

use specc_models::checkpoint::planted::expected_accepted;
use specc_models::checkpoint::{Plant, PlantRole};
use specc_models::{Model, RandomWeights, SpecBundle, SpecConfig};

mod cli_common;
mod common;
mod spec_common;

use cli_common::{assert_mentions, command, fails, s};
use spec_common::check_exact;

const SEED: u64 = 0x5eed;
const EOS: u32 = 1;
/// Drafts per step.
const K: usize = 4;

/// A Llama config of these shapes (untied head unless `tied`), written as `dir/config.json`.
fn config(dir: &Path, hidden: usize, layers: usize, vocab: usize, tied: bool) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let heads = hidden / 64;
    let text = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": {hidden},
  "intermediate_size": {}, "num_attention_heads": {heads}, "num_key_value_heads": {},
  "head_dim": 64, "num_hidden_layers": {layers}, "vocab_size": {vocab}, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "max_position_embeddings": 1024, "tie_word_embeddings": {tied},
  "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": {EOS}}}"#,
        2 * hidden,
        (heads / 2).max(1)
    );
    let file = dir.join("config.json");
    std::fs::write(&file, text).unwrap();
    file
}

fn planted(p: f64) -> RandomWeights {
    RandomWeights {
        seed: SEED,
        synthetic_acceptance: Some(p),
    }
}

/// π of a target with `vocab` tokens, as the plant defines it.
fn successor(vocab: usize) -> Vec<u32> {
    Plant {
        seed: SEED,
        acceptance: 0.0,
        fixed: vec![EOS],
        role: PlantRole::Target,
    }
    .successor(vocab)
}

/// Prompts of different lengths, ids spread over the vocabulary (none is EOS).
fn prompts(lanes: usize, vocab: usize) -> Vec<Vec<u32>> {
    (0..lanes)
        .map(|i| {
            (0..3 + 2 * i)
                .map(|j| (2 + (j * 977 + i * 1531) % (vocab - 2)) as u32)
                .collect()
        })
        .collect()
}

/// The smallest gap, over every position of a greedy stream, between the logit of π(t) and
/// the largest other logit; asserts π(t) is the argmax everywhere.
fn stream_margin(hidden: usize, layers: usize, vocab: usize) -> f32 {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), hidden, layers, vocab, false);
    let model = Model::open_synthetic(&cfg, planted(0.5), None).unwrap();
    let next = successor(vocab);
    let mut ids = vec![5u32, 900, 17];
    while ids.len() < 48 {
        ids.push(next[*ids.last().unwrap() as usize]);
    }
    let w = model.load_weights_f32();
    let (_, logits) = model.logits(&w, &ids).unwrap();
    let mut margin = f32::INFINITY;
    for (pos, row) in logits.chunks_exact(vocab).enumerate() {
        let want = next[ids[pos] as usize] as usize;
        let best_other = row
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != want)
            .map(|(_, &v)| v)
            .fold(f32::NEG_INFINITY, f32::max);
        let gap = row[want] - best_other;
        assert!(
            gap > 0.0,
            "H = {hidden}, position {pos}: π({}) = {want} has logit {} below {best_other}",
            ids[pos],
            row[want]
        );
        margin = margin.min(gap);
    }
    eprintln!(
        "H = {hidden}, {layers} layers, vocab {vocab}: smallest margin {margin:.2} (√H = {:.1})",
        (hidden as f32).sqrt()
    );
    margin
}

#[test]
fn a_planted_target_predicts_pi_with_a_margin_of_order_sqrt_h() {
    assert!(stream_margin(256, 4, 4096) > 8.0);
    assert!(stream_margin(512, 12, 8192) > 12.0);
}

/// Spec output equals target greedy, the target's stream follows π, and the mean number of
/// accepted drafts per step lies within 3 standard errors of `Σ P^i` (the steps' accepted
/// counts are independent: every drafted position is a fresh token on π's one cycle).
#[test]
fn a_planted_draft_model_accepts_p_per_draft_and_stays_exact() {
    let (vocab, lanes, n) = (4096, 6, 120);
    let dir = tempfile::tempdir().unwrap();
    let target_cfg = config(&dir.path().join("target"), 256, 4, vocab, false);
    let draft_cfg = config(&dir.path().join("draft"), 128, 2, vocab, false);
    let next = successor(vocab);
    let prompts = prompts(lanes, vocab);
    for p in [0.3, 0.6, 0.9] {
        let toml = dir.path().join(format!("spec-{p}.toml"));
        std::fs::write(
            &toml,
            format!(
                "method = \"draft_model\"\ndraft = \"{}\"\nnum_steps = {K}\n",
                draft_cfg.parent().unwrap().display()
            ),
        )
        .unwrap();
        let cfg = SpecConfig::from_file(&toml).unwrap();
        let target = Model::open_synthetic(&target_cfg, planted(p), None).unwrap();
        let bundle = SpecBundle::open_with(&target, &cfg, Some(planted(p))).unwrap();
        let out = check_exact(&target, &bundle, &prompts, n, 256);
        for (lane, (prompt, toks)) in prompts.iter().zip(&out.tokens).enumerate() {
            let mut prev = *prompt.last().unwrap();
            for (i, &t) in toks.iter().enumerate() {
                assert_eq!(t, next[prev as usize], "P = {p}, lane {lane}, token {i}");
                prev = t;
            }
        }
        let h = &out.histogram;
        let steps: usize = h.iter().sum();
        let mean = h.iter().enumerate().map(|(i, c)| i * c).sum::<usize>() as f64 / steps as f64;
        let want = expected_accepted(p, K);
        let second: f64 = (1..=K as i32).map(|i| (2 * i - 1) as f64 * p.powi(i)).sum();
        let stderr = ((second - want * want) / steps as f64).sqrt();
        eprintln!(
            "P = {p}: {mean:.3} accepted drafts per step over {steps} steps (expected {want:.3}, {:+.1}%, standard error {stderr:.3}); histogram {h:?}",
            100.0 * (mean / want - 1.0)
        );
        assert!(
            (mean - want).abs() <= 3.0 * stderr,
            "P = {p}: {mean:.3} accepted per step, expected {want:.3} ± {:.3}",
            3.0 * stderr
        );
    }
}

#[test]
fn a_tied_head_or_a_hidden_state_drafter_cannot_carry_the_plant() {
    let dir = tempfile::tempdir().unwrap();
    let tied = config(&dir.path().join("tied"), 128, 1, 512, true);
    let err = Model::open_synthetic(&tied, planted(0.5), None)
        .err()
        .expect("a tied head is refused")
        .to_string();
    assert_mentions(
        &err,
        &[
            "--synthetic-acceptance",
            "tie_word_embeddings",
            "config.json",
        ],
    );

    let target_cfg = config(&dir.path().join("target"), 128, 1, 512, false);
    let toml = dir.path().join("eagle.toml");
    std::fs::write(
        &toml,
        "method = \"eagle3\"\ndraft = \"nowhere\"\nnum_steps = 3\n",
    )
    .unwrap();
    let cfg = SpecConfig::from_file(&toml).unwrap();
    let target = Model::open_synthetic(&target_cfg, planted(0.5), None).unwrap();
    let err = SpecBundle::open_with(&target, &cfg, Some(planted(0.5)))
        .err()
        .expect("EAGLE-3 is refused")
        .to_string();
    assert_mentions(&err, &["eagle.toml", "eagle3", "draft_model"]);

    let out = command(&[
        "run",
        s(&target_cfg),
        "--synthetic-acceptance",
        "0.5",
        "--prompt",
        "x",
    ])
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--random-weights"),
        "{stderr}"
    );
    let err = fails(&[
        "compile",
        s(&tied),
        "--random-weights",
        "--synthetic-acceptance",
        "0.5",
        "--out",
        s(&dir.path().join("engine")),
    ]);
    assert_mentions(&err, &["tie_word_embeddings"]);
}

/// `specc compile` records the plant in the engine, for `run` / `serve` to synthesise the
/// same weights again.
#[test]
fn a_compiled_engine_records_the_synthetic_acceptance() {
    let dir = tempfile::tempdir().unwrap();
    let target_cfg = config(&dir.path().join("target"), 128, 1, 512, false);
    let draft_cfg = config(&dir.path().join("draft"), 64, 1, 512, false);
    let toml = dir.path().join("spec.toml");
    std::fs::write(
        &toml,
        format!(
            "method = \"draft_model\"\ndraft = \"{}\"\nnum_steps = 3\nmax_context = 64\n",
            draft_cfg.parent().unwrap().display()
        ),
    )
    .unwrap();
    let out = dir.path().join("engine");
    cli_common::specc(&[
        "compile",
        s(&target_cfg),
        "--random-weights",
        "--synthetic-acceptance",
        "0.6",
        "--spec",
        s(&toml),
        "--out",
        s(&out),
    ]);
    let engine: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("engine.json")).unwrap()).unwrap();
    assert_eq!(engine["synthetic_acceptance"], serde_json::json!(0.6));
    assert_eq!(engine["random_seed"], serde_json::json!(SEED));
}
