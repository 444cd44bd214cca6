//! `specc run` on a model directory with Kimi's `tiktoken.model` (and
//! `tokenizer_config.json`) but no `tokenizer.json`: the prompt is encoded by the tiktoken
//! backend exactly as the Python reference encodes it (`tests/fixtures/tiktoken_small`).

use std::fs;
use std::path::{Path, PathBuf};

mod cli_common;
mod common;

use cli_common::{assert_mentions, fails, s, set_json, specc, tmp};
use common::{default_model, repo_path};

/// The embedded model's config (and weights) with the tiktoken fixture as its tokenizer.
fn tiktoken_model(name: &str, weights: bool) -> PathBuf {
    let dir = tmp(name);
    fs::create_dir_all(&dir).unwrap();
    fs::copy(default_model().join("config.json"), dir.join("config.json")).unwrap();
    if weights {
        let w = "model.safetensors";
        fs::copy(default_model().join(w), dir.join(w)).unwrap();
    }
    let fixture = repo_path("tests/fixtures/tiktoken_small");
    for f in ["tiktoken.model", "tokenizer_config.json"] {
        fs::copy(fixture.join(f), dir.join(f)).unwrap();
    }
    dir
}

fn expected_case(text: &str) -> Vec<u64> {
    let path = repo_path("tests/fixtures/tiktoken_small/expected.json");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
    let case = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["text"] == text)
        .unwrap_or_else(|| panic!("no fixture case {text:?}"));
    case["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn run_encodes_the_prompt_with_tiktoken() {
    // 912 ids: 656 ranks and the 256 reserved above them.
    let dir = tiktoken_model("tiktoken-run", false);
    set_json(&dir.join("config.json"), "vocab_size", "912");
    let ids = dir.join("ids.json");
    let prompt = "Hello, world! 你好，世界。";
    specc(&[
        "run",
        s(&dir),
        "--random-weights",
        "--prompt",
        prompt,
        "--max-tokens",
        "4",
        "--ids-out",
        s(&ids),
    ]);
    let j: serde_json::Value = serde_json::from_str(&fs::read_to_string(&ids).unwrap()).unwrap();
    let got: Vec<u64> = j["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let mut want = vec![0]; // config.json's bos_token_id
    want.extend(expected_case(prompt));
    assert_eq!(got, want);
    assert_eq!(j["generated_ids"].as_array().unwrap().len(), 4);
}

#[test]
fn tiktoken_ids_past_the_vocabulary_are_an_error() {
    // The embedded model has 512 ids; the fixture tokenizer's reach 911.
    let dir = tiktoken_model("tiktoken-vocab", true);
    let err = fails(&["run", s(&dir), "--prompt", "hi", "--max-tokens", "1"]);
    assert_mentions(
        &err,
        &[
            "tiktoken.model",
            "vocab_size (512",
            "found id 911",
            "912 ids in all",
        ],
    );
}

#[test]
fn a_malformed_ranks_file_is_a_one_line_error() {
    let dir = tiktoken_model("tiktoken-bad", false);
    set_json(&dir.join("config.json"), "vocab_size", "912");
    let ranks = dir.join("tiktoken.model");
    let text = fs::read_to_string(&ranks)
        .unwrap()
        .replacen(" 3\n", " x\n", 1);
    fs::write(&ranks, text).unwrap();
    let err = fails(&["run", s(&dir), "--random-weights", "--prompt", "hi"]);
    assert_mentions(&err, &[s(Path::new(&ranks)), "line 4", "rank \"x\""]);
}
