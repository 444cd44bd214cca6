//! Fuzz targets for every file specc reads from a user: config.json, spec.toml, a
//! safetensors header, the shard index, tokenizer.json, Kimi's tiktoken.model with its
//! tokenizer_config.json, the engine manifest and the bodies of `specc serve`'s completion
//! and chat requests. Each target
//! must answer every input with `Ok` or an error, never a panic or a hang (harness:
//! `tests/fuzz_harness/mod.rs`; budget from `SPECC_FUZZ_SECS` / `SPECC_FUZZ_ITERS`), and
//! never hold more heap at once than the harness's bound for its length.

mod common;
mod fuzz_harness;
// The server's request parser, compiled here from its own files (it depends on serde_json
// alone): the binary crate has no library to import it from.
#[allow(dead_code)]
#[path = "../src/serve/errors.rs"]
mod errors;
#[allow(dead_code)]
#[path = "../src/serve/request.rs"]
mod request;

use std::path::Path;

use common::{default_model, fixture, repo_path};
use fuzz_harness::{alloc, fuzz};
use specc_ir::engine::{Engine, Target};
use specc_models::spec_bundle::{engine_input, EngineExtras};
use specc_models::tiktoken::Tiktoken;
use specc_models::{tokenizer, Checkpoint, Model, ModelSpec, SpecConfig};

#[global_allocator]
static HEAP: alloc::Counting = alloc::Counting;

/// The guard itself: an allocation past the bound is seen.
#[test]
fn the_heap_bound_catches_a_large_allocation() {
    let held = alloc::peak_during(|| {
        let v = vec![0u8; 40 << 20];
        std::hint::black_box(&v);
    });
    assert!(held >= 40 << 20, "counted {held} bytes");
    assert!(held > fuzz_harness::heap_bound(1000));
    assert!(alloc::peak_during(|| ()) < 4096);
}

/// A scratch directory, in memory where the machine has one (targets write a file per input).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let in_memory = shm
        .is_dir()
        .then(|| tempfile::tempdir_in(shm).ok())
        .flatten();
    in_memory.unwrap_or_else(|| tempfile::tempdir().unwrap())
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn config_json() {
    let seeds = [
        read(&default_model().join("config.json")),
        read(&fixture("qwen3_headdim").join("config.json")),
        read(&fixture("llama3_scaled_untied").join("config.json")),
    ];
    let file = Path::new("config.json");
    fuzz("config.json", &seeds, |b| {
        let _ = ModelSpec::from_json(file, &String::from_utf8_lossy(b));
    });
}

#[test]
fn spec_toml() {
    let dir = default_model();
    let seeds: Vec<Vec<u8>> = [
        "spec.toml",
        "spec.eagle3.toml",
        "spec.eagle3-tree.toml",
        "spec.dflash.toml",
        "ddtree.toml",
    ]
    .iter()
    .map(|f| read(&dir.join(f)))
    .collect();
    // Named inside the model directory so relative draft paths resolve as in real use.
    let file = dir.join("fuzzed.toml");
    fuzz("spec.toml", &seeds, |b| {
        let _ = SpecConfig::from_toml(&file, &String::from_utf8_lossy(b));
    });
}

/// A small valid safetensors file: two tensors and their data.
fn small_safetensors() -> Vec<u8> {
    let header = r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]},"__metadata__":{"format":"pt"}}"#;
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend(std::iter::repeat_n(0u8, 24));
    v
}

#[test]
fn safetensors_header() {
    let dir = scratch();
    let real = read(&fixture("llama_tied").join("model.safetensors"));
    let head_len = u64::from_le_bytes(real[..8].try_into().unwrap()) as usize;
    // The fixture's header with a data region cut short: offsets past it must be errors.
    let seeds = [
        small_safetensors(),
        real[..(8 + head_len + 64).min(real.len())].to_vec(),
    ];
    let file = dir.path().join("model.safetensors");
    fuzz("safetensors header", &seeds, |b| {
        std::fs::write(&file, b).unwrap();
        let _ = Checkpoint::open(dir.path());
    });
}

#[test]
fn shard_index() {
    let dir = scratch();
    std::fs::write(dir.path().join("s1.safetensors"), small_safetensors()).unwrap();
    std::fs::write(dir.path().join("s2.safetensors"), small_safetensors()).unwrap();
    let seeds = [
        br#"{"metadata":{"total_size":48},"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}}"#.to_vec(),
        br#"{"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}"#.to_vec(),
    ];
    let file = dir.path().join("model.safetensors.index.json");
    fuzz("shard index", &seeds, |b| {
        std::fs::write(&file, b).unwrap();
        let _ = Checkpoint::open(dir.path());
    });
}

#[test]
fn tokenizer_json() {
    let seeds = [read(&default_model().join("tokenizer.json"))];
    let path = Path::new("tokenizer.json");
    // As `run` uses it: parse, encode a prompt, decode the ids.
    fuzz("tokenizer.json", &seeds, |b| {
        if let Ok(tok) = tokenizer::parse(path, b) {
            if let Ok(ids) = tokenizer::encode(&tok, "def __init__(self): 12 ü") {
                let _ = tokenizer::decode(&tok, &ids, false);
            }
        }
    });
}

#[test]
fn tiktoken_model() {
    let dir = repo_path("tests/fixtures/tiktoken_small");
    let ranks = read(&dir.join("tiktoken.model"));
    let config = read(&dir.join("tokenizer_config.json"));
    let (ranks_file, config_file) = (
        Path::new("tiktoken.model"),
        Path::new("tokenizer_config.json"),
    );
    // One input is a ranks file and a config, cut apart at a 0xff byte (absent from both
    // seeds' text), so the fuzzer varies either; as `run` uses them: build, encode, decode.
    let seed = [ranks.as_slice(), &[0xff], config.as_slice()].concat();
    fuzz("tiktoken.model", &[seed], |b| {
        let cut = b.iter().position(|&x| x == 0xff).unwrap_or(b.len());
        let ranks = String::from_utf8_lossy(&b[..cut]);
        let config = b.get(cut + 1..).map(String::from_utf8_lossy);
        if let Ok(tok) = Tiktoken::from_text(ranks_file, &ranks, config_file, config.as_deref()) {
            if let Ok(ids) = tok.encode("def 你好(self): 12 ü <|im_end|>") {
                let _ = tok.decode(&ids, true);
            }
        }
    });
}

#[test]
fn engine_manifest() {
    // A small engine (plain decoding, 32 positions) planned for sm_90a without cubins.
    let model = Model::open(default_model()).unwrap();
    let (input, _) = engine_input(
        &model,
        None,
        32,
        None,
        &EngineExtras::default(),
        &|p: &Path| p.to_path_buf(),
    )
    .unwrap();
    let target = Target::for_archs(&[specc_ir::engine::Arch::Sm90a]);
    let opts = specc_codegen::BuildOptions {
        cubins: specc_codegen::Cubins::IfAvailable,
        threads: 1,
        ..Default::default()
    };
    let mut engine = specc_codegen::build(input, &target, &opts).unwrap().engine;
    engine.modules.iter_mut().for_each(|m| m.cubins.clear());
    engine.cubins.clear();
    engine.uncompiled = Some("fuzz seed".into());
    let seed = serde_json::to_vec(&engine).unwrap();
    let path = repo_path("engine.json");
    fuzz("engine.json", &[seed], |b| {
        let _ = Engine::from_json(&String::from_utf8_lossy(b), &path, |_| Ok(Vec::new()));
    });
}

#[test]
fn serve_request_bodies() {
    let seeds: Vec<Vec<u8>> = [
        r#"{"model":"specc-default","prompt":"def f(x):","max_tokens":16,"temperature":0,"top_p":1,"top_k":-1,"seed":7,"stop":["\n\n","return"],"stream":true,"stream_options":{"include_usage":true},"n":1,"ignore_eos":false,"logprobs":null}"#,
        r#"{"prompt":[[0,5,9,511]],"max_tokens":4}"#,
        r#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null}],"max_completion_tokens":8,"stop":"x"}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let limits = request::Limits { vocab: 512 };
    let n = fuzz("serve request", &seeds, |b| {
        for endpoint in [request::Endpoint::Completions, request::Endpoint::Chat] {
            match request::parse(endpoint, b, limits) {
                Ok(p) => {
                    if let request::Input::Prompt(request::Prompt::Ids(ids)) = &p.input {
                        assert!(
                            ids.iter().all(|&i| i < 512),
                            "an id past the vocabulary passed"
                        );
                    }
                    assert!(p.max_tokens != Some(0), "max_tokens 0 passed");
                }
                Err(e) => {
                    assert!((400..500).contains(&e.status), "{e:?}");
                    assert!(!e.message.is_empty() && !e.message.contains('\n'), "{e:?}");
                    if let Some(p) = &e.param {
                        assert!(e.message.starts_with(p.as_str()), "{e:?}");
                    }
                }
            }
        }
    });
    assert!(n >= seeds.len() as u64);
}
