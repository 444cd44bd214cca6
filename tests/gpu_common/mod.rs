//! What the device tests share: the driver check, an engine built in memory for the GPU
//! the tests run on (the one build every engine comes from), sessions over it driven to
//! the end, and the target's own greedy tokens under the same kernels (the engine's plain
//! contract: the k = 0 step graph) that speculative output must equal.
//! (A test crate that includes it declares `mod common;` too.)

#![allow(dead_code)]

use std::path::Path;
use std::sync::OnceLock;

use specc_codegen::{build, BuildOptions, Cubins};
use specc_ir::engine::{Arch, Engine, Target};
use specc_models::spec_bundle::{engine_input, EngineExtras};
use specc_models::{Model, RandomWeights, SpecBundle, SpecConfig};
use specc_runtime::cuda::{driver_present, CudaDevice, CudaSpecSession, WeightSources};
use specc_runtime::{SpecCpuSession, SpecGraphs, Speculator};

#[allow(unused_imports)]
pub use crate::common::{default_model, fixture, repo_path};

/// Whether a driver is present (otherwise prints why the test skips).
pub fn gpu() -> bool {
    if !driver_present() {
        specc_ir::testing::skip("no CUDA driver");
        return false;
    }
    true
}

/// The build target of GPU 0, as the driver reports it (arch, SMs, shared memory per
/// block, name): what `specc run --backend cuda` builds for.
pub fn device_target() -> Target {
    static TARGET: OnceLock<Target> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let dev = CudaDevice::open(0).expect("GPU 0 opens");
            let info = dev.info();
            let (major, minor) = info.compute_capability;
            let arch = Arch::of_capability(major, minor).unwrap_or_else(|| {
                panic!(
                    "{} (compute capability {major}.{minor}) is not a GPU specc compiles for",
                    info.name
                )
            });
            Target::for_device(
                arch,
                info.sm_count,
                info.max_smem_per_block_optin,
                &info.name,
            )
        })
        .clone()
}

/// The engine of `model` (plain decoding, and `spec`'s method when given) for the detected
/// GPU with its cubins (`Cubins::Require`), at `batch_buckets` and KV capacity
/// `max_context`, with further target-prefill token counts `verify_tokens`; `random` as
/// `specc --random-weights` (the draft's weights synthesised). Returns the engine and
/// the bundle that opened the draft (its checkpoint feeds the draft's weights).
pub fn build_engine_with(
    model: &Model,
    spec: Option<&SpecConfig>,
    batch_buckets: &[u32],
    max_context: u64,
    verify_tokens: &[u32],
    random: Option<RandomWeights>,
) -> (Engine, Option<SpecBundle>) {
    let extras = EngineExtras {
        batch_buckets: Some(batch_buckets.to_vec()),
        verify_tokens: verify_tokens.to_vec(),
        ..EngineExtras::default()
    };
    build_with_extras(model, spec, max_context, random, &extras)
}

/// Plain decoding of `model` at batch 1 with the all-row forward at every prompt chunk
/// (`GraphRole::Logits`, what `CudaSpecSession::prefill_logits` runs), as `specc logits`
/// builds it.
pub fn build_logits_engine(
    model: &Model,
    max_context: u64,
    random: Option<RandomWeights>,
) -> Engine {
    let extras = EngineExtras {
        batch_buckets: Some(vec![1]),
        all_logits: true,
        ..EngineExtras::default()
    };
    build_with_extras(model, None, max_context, random, &extras).0
}

fn build_with_extras(
    model: &Model,
    spec: Option<&SpecConfig>,
    max_context: u64,
    random: Option<RandomWeights>,
    extras: &EngineExtras,
) -> (Engine, Option<SpecBundle>) {
    let (input, bundle) = engine_input(model, spec, max_context, random, extras, &|p: &Path| {
        p.to_path_buf()
    })
    .unwrap_or_else(|e| panic!("{}: engine input: {e}", model.dir().display()));
    let opts = BuildOptions {
        cubins: Cubins::Require,
        ..BuildOptions::default()
    };
    let built = build(input, &device_target(), &opts)
        .unwrap_or_else(|e| panic!("{}: build: {e}", model.dir().display()));
    (built.engine, bundle)
}

/// [`build_engine_with`] without extra verify widths or random weights.
pub fn build_engine(
    model: &Model,
    spec: Option<&SpecConfig>,
    batch_buckets: &[u32],
    max_context: u64,
) -> (Engine, Option<SpecBundle>) {
    build_engine_with(model, spec, batch_buckets, max_context, &[], None)
}

/// The checkpoints of `target` and (when speculating) the bundle's draft, by graph prefix.
pub fn weight_sources<'a>(target: &'a Model, bundle: Option<&'a SpecBundle>) -> WeightSources<'a> {
    let mut sources = vec![("", target.checkpoint())];
    if let Some(b) = bundle {
        sources.push((b.prefix, &b.draft_checkpoint));
    }
    WeightSources { sources }
}

/// A session over `engine` at batch `lanes`: its speculative method when `bundle` is given
/// (whose draft checkpoint it reads), else plain decoding.
pub fn session<'a>(
    engine: &'a Engine,
    target: &Model,
    bundle: Option<&SpecBundle>,
    lanes: usize,
) -> CudaSpecSession<'a> {
    let sources = weight_sources(target, bundle);
    CudaSpecSession::new(engine, bundle.is_some(), &sources, lanes)
        .unwrap_or_else(|e| panic!("{}: session: {e}", target.dir().display()))
}

/// Admits `prompts` and steps until every lane finished; each lane's tokens (first +
/// emitted), truncated to `n`.
pub fn drive(s: &mut dyn Speculator, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let first = s.admit(prompts, n).unwrap();
    let mut out: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
    let mut guard = 0;
    while s.live().unwrap().iter().any(|&l| l) {
        s.step().unwrap();
        for (i, new) in s.drain().unwrap().into_iter().enumerate() {
            out[i].extend(new);
        }
        guard += 1;
        assert!(guard < 4 * n + 8, "lanes never finished");
    }
    for t in &mut out {
        t.truncate(n);
    }
    out
}

/// The engine of `cfg` (batch = `prompts.len()`, KV capacity `ctx`), its speculative step
/// on the device over `prompts`: tokens, the mean acceptance length, the engine and the
/// bundle (the plain contract of the same engine is the reference).
pub fn run_spec(
    target: &Model,
    cfg: &SpecConfig,
    prompts: &[Vec<u32>],
    n: usize,
    ctx: u64,
) -> (Vec<Vec<u32>>, f64, Engine, SpecBundle) {
    let (engine, bundle) = build_engine(target, Some(cfg), &[prompts.len() as u32], ctx);
    let bundle = bundle.expect("a speculative spec opens its draft");
    let (out, mean) = {
        let mut s = session(&engine, target, Some(&bundle), prompts.len());
        assert_eq!(s.contract(), &bundle.contract(), "the engine's contract");
        let out = drive(&mut s, prompts, n);
        (out, s.stats.mean_accept_len())
    };
    (out, mean, engine, bundle)
}

/// Target-only greedy decoding on the device: the plain contract of `engine` (the k = 0
/// step graph) at batch `prompts.len()`.
pub fn plain_of(engine: &Engine, target: &Model, prompts: &[Vec<u32>], n: usize) -> Vec<Vec<u32>> {
    let mut s = session(engine, target, None, prompts.len());
    drive(&mut s, prompts, n)
}

/// Target-only greedy decoding on the device: a plain engine of KV capacity `ctx`.
pub fn plain_cuda(target: &Model, prompts: &[Vec<u32>], n: usize, ctx: u64) -> Vec<Vec<u32>> {
    let (engine, _) = build_engine(target, None, &[prompts.len() as u32], ctx);
    plain_of(&engine, target, prompts, n)
}

/// `b` prompts of different lengths over the first 300 token ids.
pub fn random_prompts(b: usize) -> Vec<Vec<u32>> {
    (0..b)
        .map(|i| {
            (0..(5 + 3 * i))
                .map(|j| ((j * 37 + i * 11 + 3) % 300) as u32)
                .collect()
        })
        .collect()
}

/// Prompts from the trained default's corpus (Python source), BOS + its tokenizer's ids.
pub fn corpus_prompts() -> Vec<Vec<u32>> {
    let dir = default_model();
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let texts = [
        "import os\n\ndef main(argv):\n    ",
        "class Parser:\n    def __init__(self, text):\n        self.",
        "for i in range(",
        "    if not isinstance(value, str):\n        raise TypeError(",
    ];
    texts
        .iter()
        .map(|t| {
            let mut ids = vec![0u32];
            ids.extend(tok.encode(*t, false).unwrap().get_ids());
            ids
        })
        .collect()
}

/// Runs the method of `cfg` and plain decoding of the same engine on the device and
/// asserts every lane's tokens are equal (`what` labels failures); notes where CUDA greedy
/// differs from the CPU interpreter's. Returns the mean acceptance length.
pub fn assert_exact(
    target: &Model,
    cfg: &SpecConfig,
    prompts: &[Vec<u32>],
    n: usize,
    ctx: u64,
    what: &str,
) -> f64 {
    let (got, mean, engine, _) = run_spec(target, cfg, prompts, n, ctx);
    let plain = plain_of(&engine, target, prompts, n);
    let w = target.load_weights_f32();
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(
            got[i],
            plain[i],
            "{what}: lane {i} (prompt len {}) vs CUDA greedy",
            p.len()
        );
        if target.greedy_generate(&w, p, n, ctx as usize).ok().as_ref() != Some(&plain[i]) {
            eprintln!("note: lane {i}: CUDA greedy differs from the CPU interpreter's (numerics)");
        }
    }
    mean
}

/// Sampled acceptance: the method of `cfg` on the device draws the interpreter's tokens
/// (the same counter-based uniforms; on f32 fixtures the logits agree to ~5e-7, so a draw
/// falls on the other side of a CDF boundary with negligible probability). Returns the
/// device's mean acceptance length.
pub fn assert_draws_match_interpreter(
    target: &Model,
    cfg: &SpecConfig,
    prompts: &[Vec<u32>],
    n: usize,
    ctx: u64,
    what: &str,
) -> f64 {
    let (cuda, mean, _, b) = run_spec(target, cfg, prompts, n, ctx);
    let weights = b.load_weights_f32(target).unwrap();
    let mut cpu = SpecCpuSession::new(SpecGraphs::of(&b), &weights, prompts.len(), ctx);
    let cpu = drive(&mut cpu, prompts, n);
    for (i, (g, c)) in cuda.iter().zip(&cpu).enumerate() {
        assert_eq!(g, c, "{what}: lane {i}: CUDA vs interpreter draws");
    }
    mean
}

/// A fixture's HF transformers reference (`reference.safetensors`, from the fixture scripts):
/// the prompt followed by HF's greedy continuation, and HF's f32 logits at every position.
pub fn hf_reference(dir: &Path) -> (Vec<u32>, Vec<f64>) {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ids = |name: &str| -> Vec<u32> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect()
    };
    let mut all = ids("prompt_ids");
    all.extend(ids("greedy_ids"));
    let logits = st
        .tensor("logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
        .collect();
    (all, logits)
}

/// `‖got − want‖ / ‖want‖`.
pub fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - b).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    (num / den).sqrt()
}

/// [`rel_l2`] against the interpreter's f32 logits.
pub fn rel_l2_f32(got: &[f32], want: &[f32]) -> f64 {
    rel_l2(got, &want.iter().map(|&x| x as f64).collect::<Vec<_>>())
}

/// The interpreter's greedy tokens for `prompt` (f32 weights, context 256): the reference
/// the device's plain decoding must equal.
pub fn greedy_cpu(target: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let w = target.load_weights_f32();
    target.greedy_generate(&w, prompt, n, 256).unwrap()
}

/// `b` prompts of lengths `len0 + 3·i`: token `j` of prompt `i` is
/// `(j·mj + i·mi + add) % vocab`.
pub fn spread_prompts(
    b: usize,
    len0: usize,
    (mj, mi, add): (usize, usize, usize),
    vocab: usize,
) -> Vec<Vec<u32>> {
    (0..b)
        .map(|i| {
            (0..(len0 + 3 * i))
                .map(|j| ((j * mj + i * mi + add) % vocab) as u32)
                .collect()
        })
        .collect()
}
