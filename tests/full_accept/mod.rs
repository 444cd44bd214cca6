//! Full acceptance: a "target-derived" family built from the tiny fixtures (target
//! `llama3_scaled_untied`, drafters `dflash_random` and `eagle3_random`) by overriding a few
//! tensors, in which the target's greedy token AND every drafter's top-1 token are the same
//! constant [`TOKEN`], whatever the context. Every speculative step must then accept its
//! deepest draft path (k drafts + the bonus); the tests assert that per step, that the
//! emitted tokens equal the target's plain greedy decode and, on the interpreter, that the
//! committed target K/V rows equal plain decoding's.
//!
//! Why the top-1 is [`TOKEN`] everywhere, through the real forward paths:
//! - hidden dim 0 of every token embedding is `SHARED` (the other dims have RMS ≈ 1; the
//!   decoder layers add O(1) to the residual stream: they only see RMS-normed inputs through
//!   small weights), so every residual stream is ≈ `SHARED · e0` and its RMS-normed value is
//!   ≈ `√H · e0` (the final norms' dim-0 gains are set to 1);
//! - the target's lm_head (shared by the DFlash drafter, which has no head of its own) has
//!   column 0 zeroed except `GAIN` at row [`TOKEN`]: [`TOKEN`]'s logit is ≈ `GAIN · √H` = 16
//!   above a floor of |logits| ≲ 0.5 from the other dims;
//! - the EAGLE-3 head's residual stream is `fc(taps)` (taps = raw target layer outputs, each
//!   ≈ `SHARED · e0`): `fc` row 0 averages the three taps' dim 0 and no other row reads
//!   them, its own lm_head's column 0 is zeroed except `GAIN` at the draft id that `d2t`
//!   maps to [`TOKEN`]; later chained steps read the head's own pre-norm output, still
//!   ≈ `SHARED · e0`.
//!
//! Both margins are measured on the interpreter ([`target_margin`], [`draft_margin`]) along
//! every lane's sequence, must exceed 4, and are printed with every check. [`TOKEN`] is
//! neither 0 nor the DFlash mask token and most ids lie below it, so an argmax tie (first
//! index wins) would not pick it: it must win by value.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use specc_ir::interp::{self, Env, Tensor};
use specc_ir::op::B;
use specc_ir::{Bindings, DType, Dim, Graph, TensorType};
use specc_models::lower::{embed, kv_state_names};
use specc_models::methods::dflash;
use specc_models::methods::eagle3::{self, EAGLE_PREFIX};
use specc_models::methods::{lower_plain_greedy, HIDDEN, LEN};
use specc_models::{DraftSide, Model, SpecBundle, SpecConfig};
use specc_runtime::{SpecCpuSession, SpecGraphs, Speculator};

/// The token every member of the family predicts (draft id 200 of the EAGLE-3 fixture).
pub const TOKEN: u32 = 297;
/// Added to hidden dim 0 of every token embedding.
const SHARED: f32 = 100.0;
/// The lm_head weight that reads dim 0 into [`TOKEN`]'s logit.
const GAIN: f32 = 2.0;
/// Block size written into the DFlash drafter's config: 7 drafts per step (the fixture's
/// weights do not depend on it).
pub const BLOCK_SIZE: usize = 8;

fn fixtures() -> PathBuf {
    crate::common::repo_path("tests/fixtures")
}

/// The family in a temporary directory: `target/`, `dflash/`, `eagle3/`.
pub struct Family {
    dir: tempfile::TempDir,
}

/// One checkpoint's tensors, editable as f32 rows.
struct Tensors(Vec<(String, Dtype, Vec<usize>, Vec<u8>)>);

impl Tensors {
    fn read(file: &Path) -> Tensors {
        let bytes = std::fs::read(file).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut v: Vec<_> = st
            .tensors()
            .into_iter()
            .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Tensors(v)
    }

    fn entry(&mut self, name: &str) -> &mut (String, Dtype, Vec<usize>, Vec<u8>) {
        self.0.iter_mut().find(|e| e.0 == name).unwrap()
    }

    fn ints(&mut self, name: &str) -> Vec<i64> {
        let e = self.entry(name);
        assert_eq!(e.1, Dtype::I64, "{name}");
        e.3.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Applies `f(row, col, value)` to every element of the 2-D (or 1-D: row 0) f32 `name`.
    fn edit(&mut self, name: &str, f: impl Fn(usize, usize, f32) -> f32) {
        let e = self.entry(name);
        assert_eq!(e.1, Dtype::F32, "{name}");
        let cols = *e.2.last().unwrap();
        for (i, c) in e.3.chunks_exact_mut(4).enumerate() {
            let x = f(
                i / cols,
                i % cols,
                f32::from_le_bytes((*c).try_into().unwrap()),
            );
            c.copy_from_slice(&x.to_le_bytes());
        }
    }

    fn write(&self, file: &Path) {
        let views = self
            .0
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()));
        std::fs::write(file, safetensors::serialize(views, &None).unwrap()).unwrap();
    }
}

/// An edit for [`Tensors::edit`]: column 0 (element 0 of a vector) set to `v`.
fn column0(v: f32) -> impl Fn(usize, usize, f32) -> f32 {
    move |_, c, x| if c == 0 { v } else { x }
}

fn copy_config(from: &str, to: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let text = std::fs::read_to_string(fixtures().join(from).join("config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    std::fs::create_dir_all(to).unwrap();
    std::fs::write(to.join("config.json"), v.to_string()).unwrap();
}

impl Family {
    pub fn new() -> Family {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();

        copy_config("llama3_scaled_untied", &root.join("target"), |_| {});
        let mut t = Tensors::read(&fixtures().join("llama3_scaled_untied/model.safetensors"));
        t.edit("model.embed_tokens.weight", column0(SHARED));
        t.edit("model.norm.weight", column0(1.0));
        t.edit("lm_head.weight", |r, c, x| match (r as u32 == TOKEN, c) {
            (true, 0) => GAIN,
            (false, 0) => 0.0,
            _ => x,
        });
        t.write(&root.join("target/model.safetensors"));

        copy_config("dflash_random", &root.join("dflash"), |v| {
            v["block_size"] = BLOCK_SIZE.into();
        });
        let mut d = Tensors::read(&fixtures().join("dflash_random/model.safetensors"));
        d.edit("norm.weight", column0(1.0));
        d.write(&root.join("dflash/model.safetensors"));

        copy_config("eagle3_random", &root.join("eagle3"), |_| {});
        let mut e = Tensors::read(&fixtures().join("eagle3_random/model.safetensors"));
        let d2t = e.ints("d2t");
        let draft_id = (0..d2t.len())
            .find(|&i| i as i64 + d2t[i] == TOKEN as i64)
            .expect("TOKEN is in the head's draft vocabulary");
        let h = e.entry("fc.weight").2[0];
        e.edit("fc.weight", |r, c, x| match (r, c % h) {
            (0, 0) => 1.0 / 3.0,
            (_, 0) => 0.0,
            _ => x,
        });
        e.edit("norm.weight", column0(1.0));
        e.edit("lm_head.weight", |r, c, x| match (r == draft_id, c) {
            (true, 0) => GAIN,
            (false, 0) => 0.0,
            _ => x,
        });
        e.write(&root.join("eagle3/model.safetensors"));
        Family { dir }
    }

    pub fn target_dir(&self) -> PathBuf {
        self.dir.path().join("target")
    }

    pub fn target(&self) -> Model {
        Model::open(self.target_dir()).unwrap()
    }

    /// The spec.toml `body` (drafts are `../dflash` and `../eagle3`), as if next to the
    /// target.
    pub fn config(&self, body: &str) -> SpecConfig {
        SpecConfig::from_toml(&self.target_dir().join("spec.full-accept.toml"), body).unwrap()
    }

    /// A bundle from spec.toml `body` ([`Family::config`]).
    pub fn bundle(&self, target: &Model, body: &str) -> SpecBundle {
        SpecBundle::open(target, &self.config(body)).unwrap()
    }
}

/// `token`'s margin over the best other entry of each `width`-wide row of `logits`.
fn row_margins(logits: &[f32], width: usize, token: usize) -> impl Iterator<Item = f32> + '_ {
    logits.chunks_exact(width).map(move |row| {
        let other = row
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != token)
            .map(|(_, &x)| x)
            .fold(f32::NEG_INFINITY, f32::max);
        row[token] - other
    })
}

/// The smallest margin, over every position of `ids`, by which [`TOKEN`]'s target logit
/// beats every other token's (interpreter forward).
pub fn target_margin(target: &Model, ids: &[u32]) -> f32 {
    let w = target.load_weights_f32();
    let (shape, logits) = target.logits(&w, ids).unwrap();
    row_margins(&logits, shape[1], TOKEN as usize).fold(f32::INFINITY, f32::min)
}

/// The smallest margin of [`TOKEN`] in the drafter's own logits after the context `ids`
/// (interpreter forward of the bundle's pieces, from the target's taps over `ids`):
/// - DFlash: the block `[TOKEN, MASK × (block_size − 1)]` after the context, draft rows;
/// - EAGLE-3: the head at every position from `fc(taps)` (a step's first draft), and again
///   from its own output (a chained draft), in draft ids.
pub fn draft_margin(target: &Model, b: &SpecBundle, ids: &[u32]) -> f32 {
    let weights = b.load_weights_f32(target).unwrap();
    let n = ids.len();
    let ctx = n as u64 + 16;
    let i32s = |v: Vec<i64>| Tensor::from_i64(DType::I32, vec![1, v.len()], v);
    let ids_in = i32s(ids.iter().map(|&t| t as i64).collect());
    let pos_in = i32s((0..n as i64).collect());
    let mut states = HashMap::new();
    let mut run = |g: &Graph, t: usize, inputs: HashMap<String, Tensor>| {
        let mut env = Env {
            bind: Bindings::new(1, t as u64, ctx),
            inputs,
            weights: &weights,
            states: &mut states,
        };
        interp::run(g, &mut env).unwrap()
    };
    let spec = target.spec();
    let prefill_inputs = HashMap::from([
        ("tokens".to_string(), ids_in.clone()),
        ("positions".to_string(), pos_in.clone()),
    ]);
    let taps = run(&b.target_prefill, n, prefill_inputs)["taps"].clone();
    let ty = |n: usize| TensorType::new(DType::I32, [B, Dim::Static(n as u64)]);
    let mut g = Graph::new("draft margins");
    match &b.draft {
        DraftSide::DFlash(d) => {
            run(
                &b.draft_prefill,
                n,
                HashMap::from([
                    (HIDDEN.to_string(), taps),
                    ("positions".to_string(), pos_in.clone()),
                ]),
            );
            let bs = d.block_size;
            let tokens = g.input("tokens", ty(bs)).unwrap();
            let positions = g.input("positions", ty(bs)).unwrap();
            let prefix = g
                .input("prefix_len", TensorType::new(DType::I32, [B]))
                .unwrap();
            let logits =
                dflash::block_logits(&mut g, spec, d, None, tokens, positions, prefix).unwrap();
            g.set_output("logits", logits);
            let mut block = vec![TOKEN as i64];
            block.extend(vec![d.mask_token as i64; bs - 1]);
            let out = run(
                &g,
                1,
                HashMap::from([
                    ("tokens".to_string(), i32s(block)),
                    (
                        "positions".to_string(),
                        i32s((n as i64..(n + bs) as i64).collect()),
                    ),
                    (
                        "prefix_len".to_string(),
                        Tensor::from_i64(DType::I32, vec![1], vec![n as i64]),
                    ),
                ]),
            );
            let logits = out["logits"].as_f32().unwrap();
            row_margins(&logits[spec.vocab..], spec.vocab, TOKEN as usize)
                .fold(f32::INFINITY, f32::min)
        }
        DraftSide::Eagle3(e) => {
            let hidden = g
                .input(
                    HIDDEN,
                    TensorType::new(
                        spec.dtype,
                        [B, Dim::Static(n as u64), Dim::from(3 * e.hidden())],
                    ),
                )
                .unwrap();
            let tokens = g.input("tokens", ty(n)).unwrap();
            let positions = g.input("positions", ty(n)).unwrap();
            let (emb, _) = embed(&mut g, spec, "", tokens).unwrap();
            let g0 = eagle3::fc(&mut g, e, hidden).unwrap();
            let first = eagle3::midlayer(&mut g, e, emb, g0, positions).unwrap();
            let chained = eagle3::midlayer(&mut g, e, emb, first, positions).unwrap();
            for (name, out) in [("first", first), ("chained", chained)] {
                let logits = eagle3::draft_logits(&mut g, e, out).unwrap();
                g.set_output(name, logits);
            }
            let out = run(
                &g,
                n,
                HashMap::from([
                    (HIDDEN.to_string(), taps),
                    ("tokens".to_string(), ids_in.clone()),
                    ("positions".to_string(), pos_in.clone()),
                ]),
            );
            let d2t = weights[&format!("{EAGLE_PREFIX}d2t")].as_i64().unwrap();
            let draft_id = (0..d2t.len())
                .find(|&i| i as i64 + d2t[i] == TOKEN as i64)
                .unwrap();
            ["first", "chained"]
                .iter()
                .flat_map(|k| {
                    row_margins(out[*k].as_f32().unwrap(), e.draft_vocab, draft_id)
                        .collect::<Vec<_>>()
                })
                .fold(f32::INFINITY, f32::min)
        }
        DraftSide::Model(_) => panic!("the family has no standalone draft"),
    }
}

/// Every token each lane emitted (first + all of every step, untruncated) and, per lane,
/// how many tokens each step emitted while the lane was live.
pub struct Driven {
    pub tokens: Vec<Vec<u32>>,
    pub per_step: Vec<Vec<usize>>,
}

/// Admits `prompts` and steps until no lane is live, draining after every step (drain
/// waits for the step, so each drain holds exactly that step's tokens).
pub fn drive(s: &mut dyn Speculator, prompts: &[Vec<u32>], max_new: usize) -> Driven {
    let first = s.admit(prompts, max_new).unwrap();
    let mut tokens: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    let mut per_step = vec![Vec::new(); prompts.len()];
    loop {
        let live = s.live().unwrap();
        if !live.iter().any(|&l| l) {
            break;
        }
        s.step().unwrap();
        for (i, new) in s.drain().unwrap().into_iter().enumerate() {
            if live[i] {
                per_step[i].push(new.len());
            } else {
                assert!(new.is_empty(), "finished lane {i} emitted {new:?}");
            }
            tokens[i].extend(new);
        }
        assert!(
            per_step.iter().map(Vec::len).max().unwrap() <= 2 * max_new + 4,
            "lanes never finished"
        );
    }
    Driven { tokens, per_step }
}

/// The lanes, limits and expectations of one full-acceptance run of a bundle.
///
/// Prompt lengths `5 + 14·i` in a cache of `margin + 81` slots give lane `i` room for
/// `ctx − P − margin − 2 = 74 − 14·i` tokens (admission's budget rule). At B = 1 `max_new`
/// is unbounded, so the lane runs to the cache's capacity; at B = 4 `max_new = 67`: lane 0
/// stops at `max_new` (room 74), lanes 1–3 at the capacity (room 60, 46, 32), so lanes
/// finish at different steps and finished lanes ride along masked.
pub struct Plan {
    pub prompts: Vec<Vec<u32>>,
    /// The most draft tokens one step accepts (block_size − 1, or the tree's depth).
    pub depth: usize,
    /// Cache slots one verify writes past `len`, minus one (`SpecBundle::verify_margin`).
    pub margin: usize,
    pub max_new: usize,
    /// KV slots per sequence.
    pub ctx: usize,
    /// Lanes whose budget is the cache's room rather than `max_new`.
    pub at_capacity: usize,
}

impl Plan {
    pub fn new(b: &SpecBundle, depth: usize, lanes: usize) -> Plan {
        let contract = b.contract();
        assert_eq!(contract.max_accept(), depth, "the bundle's deepest path");
        let prompts: Vec<Vec<u32>> = (0..lanes)
            .map(|i| {
                (0..5 + 14 * i)
                    .map(|j| ((j * 53 + i * 29 + 7) % 380) as u32)
                    .collect()
            })
            .collect();
        let (max_new, at_capacity) = match lanes {
            1 => (usize::MAX / 4, 1),
            4 => (67, 3),
            _ => panic!("plans exist for 1 and 4 lanes"),
        };
        Plan {
            prompts,
            depth,
            margin: contract.num_steps,
            max_new,
            ctx: contract.num_steps + 81,
            at_capacity,
        }
    }

    /// Drives `s` (a session over `ctx` slots) to the end and asserts every live step of
    /// every lane emitted `depth + 1` tokens (all drafts accepted + the bonus) until the
    /// lane's budget `min(max_new, ctx − P − margin − 2)` ran out, and that the tokens
    /// equal `reference(lane, n)` (the target's plain greedy decode, `n` tokens).
    pub fn check(
        &self,
        what: &str,
        target: &Model,
        bundle: &SpecBundle,
        s: &mut dyn Speculator,
        reference: &dyn Fn(usize, usize) -> Vec<u32>,
    ) {
        let run = drive(s, &self.prompts, self.max_new);
        let per = self.depth + 1;
        let mut at_capacity = 0;
        for (i, p) in self.prompts.iter().enumerate() {
            let room = self.ctx - p.len() - self.margin - 2;
            let budget = self.max_new.min(room);
            let steps = budget.div_ceil(per);
            let want = reference(i, 1 + steps * per);
            let mut seq = p.clone();
            seq.extend(&want);
            let margin = target_margin(target, &seq[..seq.len() - 1]);
            let draft = draft_margin(target, bundle, &seq[..seq.len() - 1]);
            let why = format!(
                "{what}: lane {i} (prompt len {}, budget {budget}): logit margin of token \
                 {TOKEN}: target {margin:.2}, drafter {draft:.2}; per-step emitted {:?}",
                p.len(),
                run.per_step[i]
            );
            eprintln!("{why}");
            assert_eq!(
                run.per_step[i],
                vec![per; steps],
                "{why}: not full acceptance"
            );
            assert!(
                want.iter().all(|&t| t == TOKEN),
                "{why}: construction broken, target greedy {want:?}"
            );
            assert_eq!(run.tokens[i], want, "{why}: differs from target greedy");
            if room < self.max_new {
                // The last verify started at len = P + budget − r (r ∈ 1..=per tokens of
                // budget left) and wrote slots up to len + margin = ctx − 2 − r: the run
                // went to within one step of the cache's end.
                let top = p.len() + (steps - 1) * per + self.margin;
                assert!(
                    top < self.ctx && top + per + 3 > self.ctx,
                    "{why}: last verify's top slot {top} vs ctx {}",
                    self.ctx
                );
                at_capacity += 1;
            }
        }
        assert_eq!(at_capacity, self.at_capacity, "{what}: lanes at capacity");
    }
}

/// [`Plan::check`] of `b` (deepest path `depth`) at `lanes` on the CPU interpreter, then
/// [`assert_target_kv_is_plain`] on the session's final states.
pub fn check_cpu(what: &str, target: &Model, b: &SpecBundle, depth: usize, lanes: usize) {
    let plan = Plan::new(b, depth, lanes);
    let weights = b.load_weights_f32(target).unwrap();
    let mut s = SpecCpuSession::new(SpecGraphs::of(b), &weights, lanes, plan.ctx as u64);
    let w = target.load_weights_f32();
    let reference = |i: usize, n: usize| {
        target
            .greedy_generate(&w, &plan.prompts[i], n, 256)
            .unwrap()
    };
    plan.check(what, target, b, &mut s, &reference);
    assert_target_kv_is_plain(what, target, &plan, s.states());
}

/// KV-commit bookkeeping at full acceptance: every lane's committed length is
/// `P + steps · (depth + 1)`, and the target's K/V caches at slots `0..len` equal those of
/// plain greedy decoding (k = 0 step graph) over the same tokens. Every slot's row carries
/// its position's RoPE and its own context, so a row committed to the wrong slot, a stale
/// row, or a row from another tree node (another token) differs.
fn assert_target_kv_is_plain(
    what: &str,
    target: &Model,
    plan: &Plan,
    spec: &HashMap<String, Tensor>,
) {
    let per = plan.depth + 1;
    let lens = spec[LEN].as_i64().unwrap().to_vec();
    for (i, p) in plan.prompts.iter().enumerate() {
        let budget = plan.max_new.min(plan.ctx - p.len() - plan.margin - 2);
        let want = p.len() + budget.div_ceil(per) * per;
        assert_eq!(lens[i] as usize, want, "{what}: lane {i}: committed length");
    }
    let (prefill, step) = lower_plain_greedy(target.spec(), 64).unwrap();
    let w = target.load_weights_f32();
    let lanes = plan.prompts.len();
    let mut plain = SpecCpuSession::new(
        SpecGraphs::plain(&prefill, &step, 64),
        &w,
        lanes,
        plan.ctx as u64,
    );
    let need = (0..lanes)
        .map(|i| lens[i] as usize - plan.prompts[i].len())
        .max()
        .unwrap();
    drive(&mut plain, &plan.prompts, need);
    for l in 0..target.spec().layers {
        let (k, v) = kv_state_names(l);
        for name in [k, v] {
            let (got, want) = (&spec[&name], &plain.states()[&name]);
            let row = got.shape[2..].iter().product::<usize>();
            for (i, &len) in lens.iter().enumerate() {
                let at = |t: &Tensor| {
                    t.as_f32().unwrap()[i * plan.ctx * row..][..len as usize * row].to_vec()
                };
                let err = rel_max(&at(got), &at(want));
                assert!(err < 1e-4, "{what}: lane {i}: {name} slots 0..{len} differ from plain decoding by {err:.2e}");
            }
        }
    }
}

/// max |got − want| / max |want|.
fn rel_max(got: &[f32], want: &[f32]) -> f64 {
    let diff = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (g as f64 - w as f64).abs())
        .fold(0.0, f64::max);
    let scale = want.iter().map(|&w| (w as f64).abs()).fold(0.0, f64::max);
    diff / scale.max(f64::MIN_POSITIVE)
}

/// Target-only greedy decoding on the device (`gpu_common::plain_cuda`): prompts, tokens
/// per lane, KV slots.
#[cfg(feature = "cuda")]
pub type PlainDecode = fn(&Model, &[Vec<u32>], usize, u64) -> Vec<Vec<u32>>;

/// An engine for the detected GPU (`gpu_common::build_engine`): target, spec, batch
/// buckets, KV slots; the engine and the bundle it opened.
#[cfg(feature = "cuda")]
pub type BuildEngine =
    fn(&Model, Option<&SpecConfig>, &[u32], u64) -> (specc_ir::engine::Engine, Option<SpecBundle>);

/// [`Plan::check`] of the method of `cfg` (deepest path `depth`) at `lanes` on the device:
/// an engine built by `build` for the plan's KV capacity at batch `lanes`, against `plain`.
#[cfg(feature = "cuda")]
pub fn check_cuda(
    what: &str,
    target: &Model,
    cfg: &SpecConfig,
    depth: usize,
    lanes: usize,
    build: BuildEngine,
    plain: PlainDecode,
) {
    use specc_runtime::cuda::{CudaSpecSession, WeightSources};
    let b = SpecBundle::open(target, cfg).unwrap();
    let plan = Plan::new(&b, depth, lanes);
    let (engine, bundle) = build(target, Some(cfg), &[lanes as u32], plan.ctx as u64);
    let bundle = bundle.expect("a speculative engine opens its draft");
    assert_eq!(
        engine.contract(true),
        &b.contract(),
        "{what}: the engine's contract"
    );
    let sources = WeightSources {
        sources: vec![
            ("", target.checkpoint()),
            (bundle.prefix, &bundle.draft_checkpoint),
        ],
    };
    let mut s = CudaSpecSession::new(&engine, true, &sources, lanes).unwrap();
    let greedy = plain(target, &plan.prompts, plan.ctx, 256);
    let reference = |i: usize, n: usize| greedy[i][..n].to_vec();
    plan.check(what, target, &b, &mut s, &reference);
}
