//! DFlash as a method: the drafter's lowering against the PyTorch reference of the trained
//! drafter (models/default/dflash/reference.safetensors), config resolution, and greedy
//! exactness of the whole step graph on the interpreter (trained drafter on the embedded
//! default target; a random drafter on tests/fixtures/llama3_scaled_untied; a
//! target-derived drafter that must accept every draft, tests/full_accept).

use std::collections::HashMap;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use specc_ir::interp::{self, Data, Env, Tensor};
use specc_ir::op::B;
use specc_ir::{Bindings, DType, Dim, Graph, TensorType};
use specc_models::methods::dflash::{self, DFlashSpec, DFLASH_PREFIX};
use specc_models::methods::{lower_dflash_prefill, lower_target_prefill, HIDDEN};
use specc_models::{Acceptance, Method, Model, SpecBundle, SpecConfig};

mod common;
mod full_accept;
mod spec_common;

use full_accept::{Family, BLOCK_SIZE};
use spec_common::{default_model, fixture, python_prompts, random_prompts, Outcome};

/// KV slots per sequence in these tests.
const CTX: u64 = 256;

fn speculate(target: &Model, b: &SpecBundle, prompts: &[Vec<u32>], n: usize) -> Outcome {
    spec_common::speculate(target, b, prompts, n, CTX)
}

fn check_exact(target: &Model, b: &SpecBundle, prompts: &[Vec<u32>], n: usize) -> Outcome {
    spec_common::check_exact(target, b, prompts, n, CTX)
}

/// A spec file next to `target_dir` naming `draft` (relative to it); nothing is written.
fn spec_cfg(target_dir: &Path, body: &str) -> SpecConfig {
    SpecConfig::from_toml(&target_dir.join("spec.dflash-test.toml"), body).unwrap()
}

struct Reference {
    st: Vec<u8>,
}

impl Reference {
    fn open(dir: &Path) -> Reference {
        Reference {
            st: std::fs::read(dir.join("reference.safetensors")).unwrap(),
        }
    }

    fn ids(&self, name: &str) -> Vec<i64> {
        let st = SafeTensors::deserialize(&self.st).unwrap();
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), Dtype::I64, "{name}");
        t.data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn f32s(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let st = SafeTensors::deserialize(&self.st).unwrap();
        let t = st.tensor(name).unwrap();
        assert_eq!(t.dtype(), Dtype::F32, "{name}");
        let v = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (v, t.shape().to_vec())
    }
}

fn f32_of(t: &Tensor) -> Vec<f32> {
    match &t.data {
        Data::F32(v) => v.clone(),
        Data::I64(_) => panic!("float tensor expected"),
    }
}

/// max |got − want| / max |want|.
fn rel_max(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let diff = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w as f64).abs())
        .fold(0.0, f64::max);
    let scale = want.iter().map(|&w| (w as f64).abs()).fold(0.0, f64::max);
    diff / scale.max(f64::MIN_POSITIVE)
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// The trained drafter's lowering against PyTorch: the target's taps over the reference
/// context, then the drafter's block logits from the REFERENCE taps (so the two checks are
/// independent), through the same public pieces the step graph uses.
#[test]
fn trained_drafter_matches_the_pytorch_reference() {
    let target = Model::open(default_model()).unwrap();
    let dir = default_model().join("dflash");
    let d = DFlashSpec::from_dir(&dir, target.spec()).unwrap();
    assert_eq!(d.taps, vec![1, 3, 5]);
    assert_eq!(d.block_size, 8);
    assert_eq!(d.mask_token, 189);
    let r = Reference::open(&dir);
    let ctx_ids = r.ids("context_ids");
    let block_ids = r.ids("block_ids");
    let (want_taps, taps_shape) = r.f32s("target_taps");
    let (want_logits, logits_shape) = r.f32s("block_logits");
    let want_draft = r.ids("draft_ids");
    let l = ctx_ids.len();
    let bsz = block_ids.len();
    assert_eq!(taps_shape, vec![l, d.taps_width()]);
    assert_eq!(logits_shape, vec![bsz - 1, target.spec().vocab]);
    assert_eq!(block_ids[1..], vec![189; bsz - 1][..]);

    let ck = specc_models::Checkpoint::open(&dir).unwrap();
    let mut weights = target.load_weights_f32();
    let ctx = 64u64;

    // 1. taps of the target prefill (raw layer outputs; the last tap is layer 5 = L − 1).
    let prefill = lower_target_prefill(target.spec(), &d.taps, &Acceptance::Greedy).unwrap();
    let ids = |v: Vec<i64>| Tensor::from_i64(DType::I32, vec![1, v.len()], v);
    let mut states = HashMap::new();
    let mut env = Env {
        bind: Bindings::new(1, l as u64, ctx),
        inputs: HashMap::from([
            ("tokens".to_string(), ids(ctx_ids.clone())),
            ("positions".to_string(), ids((0..l as i64).collect())),
        ]),
        weights: &weights,
        states: &mut states,
    };
    let out = interp::run(&prefill, &mut env).unwrap();
    let got_taps = f32_of(&out["taps"]);
    let taps_err = rel_max(&got_taps, &want_taps);
    eprintln!("target taps: max rel error {taps_err:.2e}");
    assert!(taps_err < 2e-2, "taps differ: {taps_err}");

    // 2. drafter prefill: context of positions 0..L−3 into its KV; the last 3 context rows
    // (plus one masked row holding garbage) are pending and written by the block forward
    // itself, as in the step graph.
    let pre_n = l - 3;
    let dpre = lower_dflash_prefill(target.spec(), &d).unwrap();
    let mut g = Graph::new("dflash block");
    let i32t = |n: u64| TensorType::new(DType::I32, [B, Dim::Static(n)]);
    let w = d.taps_width();
    let pend = g
        .input(
            "pending",
            TensorType::new(target.spec().dtype, [B, Dim::Static(4), Dim::from(w)]),
        )
        .unwrap();
    let pend_pos = g.input("pending_positions", i32t(4)).unwrap();
    let tokens = g.input("tokens", i32t(bsz as u64)).unwrap();
    let positions = g.input("positions", i32t(bsz as u64)).unwrap();
    let prefix = g
        .input("prefix_len", TensorType::new(DType::I32, [B]))
        .unwrap();
    let ctx_rows = dflash::context(&mut g, &d, pend).unwrap();
    let logits = dflash::block_logits(
        &mut g,
        target.spec(),
        &d,
        Some((ctx_rows, pend_pos)),
        tokens,
        positions,
        prefix,
    )
    .unwrap();
    g.set_output("logits", logits);
    specc_ir::verify(&g).unwrap();
    for gr in [&dpre, &g] {
        for (_, name, _) in gr.weights() {
            if let Some(n) = name.strip_prefix(DFLASH_PREFIX) {
                weights.insert(name.to_string(), ck.load_f32(n).unwrap());
            }
        }
    }
    let mut states = HashMap::new();
    let dtype = target.spec().dtype;
    let mut env = Env {
        bind: Bindings::new(1, pre_n as u64, ctx),
        inputs: HashMap::from([
            (
                HIDDEN.to_string(),
                Tensor::from_f32(dtype, vec![1, pre_n, w], want_taps[..pre_n * w].to_vec()),
            ),
            ("positions".to_string(), ids((0..pre_n as i64).collect())),
        ]),
        weights: &weights,
        states: &mut states,
    };
    interp::run(&dpre, &mut env).unwrap();
    let mut pending = want_taps[pre_n * w..].to_vec();
    pending.extend_from_slice(&want_taps[..w]); // masked row: must not be written
    let mut env = Env {
        bind: Bindings::new(1, 1, ctx),
        inputs: HashMap::from([
            (
                "pending".to_string(),
                Tensor::from_f32(dtype, vec![1, 4, w], pending),
            ),
            (
                "pending_positions".to_string(),
                ids(vec![pre_n as i64, pre_n as i64 + 1, pre_n as i64 + 2, -1]),
            ),
            ("tokens".to_string(), ids(block_ids.clone())),
            (
                "positions".to_string(),
                ids((l as i64..(l + bsz) as i64).collect()),
            ),
            (
                "prefix_len".to_string(),
                Tensor::from_i64(DType::I32, vec![1], vec![l as i64]),
            ),
        ]),
        weights: &weights,
        states: &mut states,
    };
    let out = interp::run(&g, &mut env).unwrap();
    let all = f32_of(&out["logits"]);
    let v = target.spec().vocab;
    let got = &all[v..]; // rows 1..B
    let err = rel_max(got, &want_logits);
    eprintln!("dflash block logits: max rel error {err:.2e} (bf16 activations)");
    assert!(err < 2e-2, "block logits differ: {err}");
    let mut agree = 0;
    for i in 0..bsz - 1 {
        let row = &got[i * v..(i + 1) * v];
        let want_row = &want_logits[i * v..(i + 1) * v];
        let gi = argmax(row);
        if gi as i64 == want_draft[i] {
            agree += 1;
        } else {
            // Only a near-tie may flip under bf16 rounding.
            let margin = want_row[want_draft[i] as usize] - want_row[gi];
            assert!(
                margin < 0.05,
                "row {i}: {gi} vs {} (margin {margin})",
                want_draft[i]
            );
        }
    }
    eprintln!("draft ids agree on {agree}/{} rows", bsz - 1);
    assert!(agree >= bsz - 2, "{agree} rows agree");
}

#[test]
fn config_resolution_and_errors() {
    let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
    let d = DFlashSpec::from_dir(&fixture("dflash_random"), target.spec()).unwrap();
    // target_layer_ids = [1, 0]: outputs of layers 1 then 0, in that order.
    assert_eq!(d.taps, vec![1, 0]);
    assert_eq!(d.block_size, 4);
    assert_eq!(d.num_steps(), 3);
    assert_eq!(d.mask_token, 383);
    assert_eq!(d.layer.layers, 2);
    assert!(d.layer.qk_norm);
    assert_eq!(d.layer.rms_eps, 1e-6);

    let text = std::fs::read_to_string(fixture("dflash_random/config.json")).unwrap();
    let base: serde_json::Value = serde_json::from_str(&text).unwrap();
    let file = Path::new("/x/dflash/config.json");
    let bad = |edit: &dyn Fn(&mut serde_json::Value), parts: &[&str]| {
        let mut v = base.clone();
        edit(&mut v);
        let e = DFlashSpec::from_json(file, &v.to_string(), target.spec())
            .unwrap_err()
            .to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.contains("/x/dflash/config.json"), "{e}");
        for p in parts {
            assert!(e.contains(p), "`{e}` should mention {p:?}");
        }
    };
    bad(&|v| v["hidden_size"] = 32.into(), &["hidden_size", "64"]);
    bad(
        &|v| v["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]),
        &["architectures", "DFlashDraftModel"],
    );
    bad(&|v| v["block_size"] = 1.into(), &["block_size"]);
    bad(
        &|v| v["num_target_layers"] = 36.into(),
        &["num_target_layers", "2"],
    );
    bad(
        &|v| v["target_layer_ids"] = serde_json::json!([0, 2]),
        &["target_layer_ids", "0..2"],
    );
    bad(
        &|v| v["dflash_config"]["target_layer_ids"] = serde_json::json!([0, 1]),
        &["dflash_config.target_layer_ids", "[1, 0]"],
    );
    bad(
        &|v| v["mask_token_id"] = 384.into(),
        &["mask_token_id", "0..384"],
    );
    bad(
        &|v| v["layer_types"] = serde_json::json!(["full_attention", "sliding_attention"]),
        &["layer_types"],
    );
    bad(
        &|v| {
            v.as_object_mut().unwrap().remove("target_layer_ids");
            v.as_object_mut().unwrap().remove("dflash_config");
        },
        &["target_layer_ids", "absent"],
    );
    bad(
        &|v| {
            v.as_object_mut().unwrap().remove("head_dim");
        },
        &["head_dim"],
    );
    // Fields only under dflash_config (older checkpoints) resolve too.
    let mut v = base.clone();
    v.as_object_mut().unwrap().remove("target_layer_ids");
    v.as_object_mut().unwrap().remove("mask_token_id");
    v["dflash_config"]["block_size"] = 4.into();
    v.as_object_mut().unwrap().remove("block_size");
    let d2 = DFlashSpec::from_json(file, &v.to_string(), target.spec()).unwrap();
    assert_eq!(
        (d2.taps.clone(), d2.mask_token, d2.block_size),
        (vec![1, 0], 383, 4)
    );
}

#[test]
fn spec_toml_takes_k_from_the_block_size() {
    let dir = fixture("llama3_scaled_untied");
    let cfg = spec_cfg(&dir, "method = \"dflash\"\ndraft = \"../dflash_random\"");
    assert_eq!(cfg.method, Method::DFlash);
    assert_eq!(cfg.num_steps, 3);
    let target = Model::open(&dir).unwrap();
    let b = SpecBundle::open(&target, &cfg).unwrap();
    assert_eq!(b.num_steps(), 3);
    assert_eq!(b.dflash_taps_width(), Some(128));
    // An explicit num_steps must agree with the drafter.
    let cfg = spec_cfg(
        &dir,
        "method = \"dflash\"\ndraft = \"../dflash_random\"\nnum_steps = 5",
    );
    let e = SpecBundle::open(&target, &cfg).err().unwrap().to_string();
    assert!(e.contains("num_steps") && e.contains("block_size"), "{e}");
    assert!(e.contains("spec.dflash-test.toml"), "{e}");
}

fn trained_bundle(target: &Model) -> SpecBundle {
    let cfg = spec_cfg(&default_model(), "method = \"dflash\"\ndraft = \"dflash\"");
    assert_eq!(cfg.num_steps, 7);
    SpecBundle::open(target, &cfg).unwrap()
}

#[test]
fn trained_dflash_is_exact_and_accepts_batch1() {
    let target = Model::open(default_model()).unwrap();
    let b = trained_bundle(&target);
    let out = check_exact(&target, &b, &python_prompts(1), 64);
    eprintln!(
        "trained dflash B=1: mean acceptance length {:.2}, histogram {:?}",
        out.mean_accept, out.histogram
    );
    assert!(out.mean_accept > 1.5, "mean accept {}", out.mean_accept);
}

#[test]
fn trained_dflash_is_exact_and_accepts_batch4() {
    let target = Model::open(default_model()).unwrap();
    let b = trained_bundle(&target);
    let prompts = python_prompts(4);
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    assert!(lens.windows(2).any(|w| w[0] != w[1]), "{lens:?}");
    let out = check_exact(&target, &b, &prompts, 48);
    eprintln!(
        "trained dflash B=4 (prompt lengths {lens:?}): mean acceptance length {:.2}, histogram {:?}",
        out.mean_accept, out.histogram
    );
    assert!(out.mean_accept > 1.5, "mean accept {}", out.mean_accept);
}

fn random_bundle(target: &Model) -> SpecBundle {
    let cfg = spec_cfg(
        &fixture("llama3_scaled_untied"),
        "method = \"dflash\"\ndraft = \"../dflash_random\"",
    );
    SpecBundle::open(target, &cfg).unwrap()
}

#[test]
fn random_dflash_is_exact_batch1() {
    let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
    let b = random_bundle(&target);
    let out = check_exact(&target, &b, &random_prompts(1), 24);
    eprintln!(
        "random dflash B=1: mean acceptance length {:.2}",
        out.mean_accept
    );
    assert!(out.mean_accept < 1.6, "mean accept {}", out.mean_accept);
}

#[test]
fn random_dflash_is_exact_batch4() {
    let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
    let b = random_bundle(&target);
    let out = check_exact(&target, &b, &random_prompts(4), 20);
    eprintln!(
        "random dflash B=4: mean acceptance length {:.2}",
        out.mean_accept
    );
    assert!(out.mean_accept < 1.6, "mean accept {}", out.mean_accept);
}

/// Ends of sequences: a lane whose budget runs out while others continue, and a prompt of
/// one token (BOS only), keep every lane exact.
#[test]
fn trained_dflash_budgets_and_short_prompts() {
    let target = Model::open(default_model()).unwrap();
    let b = trained_bundle(&target);
    let mut prompts = python_prompts(2);
    prompts.push(vec![0]);
    let out = speculate(&target, &b, &prompts, 9);
    let w = target.load_weights_f32();
    for (i, p) in prompts.iter().enumerate() {
        let want = target.greedy_generate(&w, p, 9, 256).unwrap();
        assert_eq!(out.tokens[i], want, "lane {i}");
    }
}

/// Full acceptance (tests/full_accept): with the target-derived drafter every step accepts
/// all `BLOCK_SIZE − 1` drafts plus the bonus; the lane runs to the KV capacity.
#[test]
fn target_derived_dflash_accepts_every_draft_batch1() {
    let fam = Family::new();
    let target = fam.target();
    let b = fam.bundle(&target, "method = \"dflash\"\ndraft = \"../dflash\"");
    full_accept::check_cpu("dflash B=1", &target, &b, BLOCK_SIZE - 1, 1);
}

/// [`target_derived_dflash_accepts_every_draft_batch1`] at B = 4: two lanes stop at
/// `max_new`, two at the KV capacity, at different steps.
#[test]
fn target_derived_dflash_accepts_every_draft_batch4() {
    let fam = Family::new();
    let target = fam.target();
    let b = fam.bundle(&target, "method = \"dflash\"\ndraft = \"../dflash\"");
    full_accept::check_cpu("dflash B=4", &target, &b, BLOCK_SIZE - 1, 4);
}

/// The full-acceptance check is not vacuous: the random drafter on the untouched fixture
/// target (near-zero acceptance, tokens still exact) fails it.
#[test]
#[should_panic(expected = "not full acceptance")]
fn full_acceptance_check_rejects_a_random_drafter() {
    let target = Model::open(fixture("llama3_scaled_untied")).unwrap();
    let b = random_bundle(&target);
    full_accept::check_cpu("random dflash", &target, &b, 3, 1);
}
