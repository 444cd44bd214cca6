//! Kimi's tiktoken tokenizer against the Python reference: `tests/fixtures/tiktoken_small/`
//! holds a small ranks file in Kimi's layout and the ids / texts Python `tiktoken` (with
//! Kimi's pattern and special tokens) gives for mixed Chinese / English / digit / whitespace /
//! special-token strings (`scripts/make_tiktoken_fixture.py`). Encode and decode must agree
//! exactly.

use std::path::{Path, PathBuf};

use specc_models::tiktoken::{split_runs, Tiktoken, KIMI_PATTERN};
use specc_models::tokenizer::Tokenizer;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiktoken_small")
}

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn the_fixture_was_made_with_this_pattern() {
    assert_eq!(expected()["pattern"], KIMI_PATTERN);
}

#[test]
fn encode_and_decode_match_python_tiktoken() {
    let want = expected();
    let tok = Tiktoken::load(&fixture()).unwrap();
    let base = want["num_base_tokens"].as_u64().unwrap() as u32;
    assert_eq!(tok.num_ids(), base + 256);
    assert_eq!(tok.special_id("[BOS]"), Some(base));
    assert_eq!(tok.special_id("[PAD]"), Some(base + 255));
    let cases = want["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want_ids = ids(&case["ids"]);
        let got = tok.encode(text).unwrap();
        assert_eq!(got, want_ids, "encode {text:?}");
        assert_eq!(tok.decode(&got, false).unwrap(), text, "decode of {text:?}");
    }
    for case in want["decodes"].as_array().unwrap() {
        let case_ids = ids(&case["ids"]);
        assert_eq!(
            tok.decode(&case_ids, false).unwrap(),
            case["text"].as_str().unwrap(),
            "decode {case_ids:?}"
        );
    }
}

#[test]
fn long_runs_are_cut_like_kimi_cuts_them() {
    let want = expected();
    let tok = Tiktoken::load(&fixture()).unwrap();
    for case in want["run_cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let max_run = case["max_run"].as_u64().unwrap() as usize;
        let parts: Vec<&str> = case["parts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        assert_eq!(split_runs(text, max_run), parts, "parts of {text:?}");
        assert_eq!(
            tok.encode_with_max_run(text, max_run).unwrap(),
            ids(&case["ids"]),
            "encode {text:?} with runs of at most {max_run}"
        );
    }
}

#[test]
fn a_directory_without_tokenizer_json_uses_tiktoken() {
    let tok = Tokenizer::from_dir(&fixture()).unwrap().unwrap();
    assert!(tok.file().ends_with("tiktoken.model"));
    let text = "<|im_user|>user<|im_middle|>你好 world 42<|im_end|>";
    let ids = tok.encode(text).unwrap();
    // Skipping special tokens drops the chat markers, not the text.
    assert_eq!(tok.decode(&ids, true).unwrap(), "user你好 world 42");
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let (max, _, count) = tok.max_id().unwrap();
    assert_eq!((max as usize + 1, count), (count, count));
}

#[test]
fn tokenizer_json_wins_over_tiktoken_model() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["tiktoken.model", "tokenizer_config.json"] {
        std::fs::copy(fixture().join(f), dir.path().join(f)).unwrap();
    }
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("default/tokenizer.json");
    std::fs::copy(hf, dir.path().join("tokenizer.json")).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap().unwrap();
    assert!(tok.file().ends_with("tokenizer.json"));
    let empty = tempfile::tempdir().unwrap();
    assert!(Tokenizer::from_dir(empty.path()).unwrap().is_none());
}

#[test]
fn a_malformed_ranks_file_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(fixture().join("tiktoken.model")).unwrap();
    let mut lines: Vec<&str> = good.lines().collect();
    lines[299] = "not*base64 299";
    std::fs::write(dir.path().join("tiktoken.model"), lines.join("\n")).unwrap();
    let err = Tokenizer::from_dir(dir.path()).err().unwrap().to_string();
    let file = dir.path().join("tiktoken.model");
    assert!(
        err.starts_with(&format!(
            "{}: cannot load tokenizer: line 300: token \"not*base64\" is not base64",
            file.display()
        )),
        "{err}"
    );
    std::fs::write(dir.path().join("tiktoken.model"), &good).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        "{ \"added_tokens_decoder\": 3",
    )
    .unwrap();
    let err = Tokenizer::from_dir(dir.path()).err().unwrap().to_string();
    assert!(
        err.contains("tokenizer_config.json: cannot load tokenizer: not JSON"),
        "{err}"
    );
}
