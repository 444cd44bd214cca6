//! `specc run`'s sampling flags, prompt sources, stop strings and context-end message, end
//! to end on the CPU backend with the embedded default (plain and speculative).

use std::io::Write;
use std::process::Stdio;

mod cli_common;
mod common;

use cli_common::{assert_mentions, command, fails, s as path_str, specc, tmp};

const PROMPT: &str = "def f";

/// stdout and stderr of `specc run --prompt PROMPT --max-tokens 16 extra...`.
fn run(extra: &[&str]) -> (String, String) {
    let mut args = vec!["run", "--prompt", PROMPT, "--max-tokens", "16"];
    args.extend(extra);
    let out = specc(&args);
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn text(extra: &[&str]) -> String {
    run(extra).0
}

/// With and without speculation (the embedded default's spec, or `--no-spec`).
const MODES: [&[&str]; 2] = [&[], &["--no-spec"]];

#[test]
fn a_seeded_run_samples_reproducibly() {
    for mode in MODES {
        let greedy = text(mode);
        let flags = [mode, &["--temperature", "1", "--seed", "7"]].concat();
        let (a, err) = run(&flags);
        assert_eq!(
            a,
            text(&flags),
            "{mode:?}: the same seed gives the same text"
        );
        assert_ne!(
            a, greedy,
            "{mode:?}: sampling at temperature 1 is not greedy"
        );
        assert!(err.contains("sample temperature=1 seed=7"), "{err}");
    }
}

#[test]
fn temperature_zero_and_top_k_one_decode_greedily() {
    for mode in MODES {
        let (greedy, err) = run(mode);
        assert!(err.contains(", greedy]"), "{err}");
        for flags in [
            &["--temperature", "0"][..],
            &["--top-k", "1", "--seed", "5"],
        ] {
            let flags = [mode, flags].concat();
            assert_eq!(text(&flags), greedy, "{flags:?}");
        }
    }
}

#[test]
fn method_none_with_sampled_acceptance_samples() {
    let spec = tmp("none-sample.toml");
    std::fs::write(
        &spec,
        "method = \"none\"\n[acceptance]\nmode = \"sample\"\ntemperature = 1.0\nseed = 7\n",
    )
    .unwrap();
    let (out, err) = run(&["--spec", path_str(&spec)]);
    assert!(
        err.contains("plain decoding, sample temperature=1 seed=7"),
        "{err}"
    );
    assert_eq!(
        out,
        text(&["--no-spec", "--temperature", "1", "--seed", "7"])
    );
    // Flags override the spec's acceptance.
    let (_, err) = run(&["--spec", path_str(&spec), "--top-k", "3"]);
    assert!(err.contains("sample temperature=1 top_k=3 seed=7"), "{err}");
    std::fs::remove_file(&spec).ok();
}

#[test]
fn bad_sampling_flags_name_the_flag() {
    for (flag, value, expected) in [
        ("--temperature", "-0.5", "a finite number > 0"),
        ("--temperature", "inf", "a finite number > 0"),
        ("--top-k", "0", ">= 1"),
        ("--top-p", "0", "(0, 1]"),
        ("--top-p", "1.01", "(0, 1]"),
    ] {
        let err = fails(&["run", "--prompt", PROMPT, flag, value]);
        assert_mentions(&err, &[&format!("{flag} {value}"), expected]);
    }
}

#[test]
fn a_compiled_engine_keeps_its_sampling() {
    let engine = tmp("engine-sampled");
    let flags = ["--max-context", "64", "--temperature", "0.8", "--seed", "3"];
    let mut args = vec!["compile", "-o", path_str(&engine)];
    args.extend(flags);
    let out = specc(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("acceptance: sample temperature=0.8 seed=3"),
        "{stdout}"
    );
    let (via_engine, err) = run(&[path_str(&engine)]);
    assert!(err.contains("sample temperature=0.8 seed=3"), "{err}");
    assert_eq!(via_engine, text(&flags));
    // The knobs are each lane's device state: other values need no rebuild ...
    let (top_k, err) = run(&[path_str(&engine), "--top-k", "5"]);
    assert!(
        err.contains("sample temperature=0.8 top_k=5 seed=3"),
        "{err}"
    );
    assert_eq!(top_k, text(&[&flags[..], &["--top-k", "5"]].concat()));
    let (greedy, _) = run(&[path_str(&engine), "--temperature", "0"]);
    assert_eq!(greedy, text(&[]), "temperature 0: greedy lanes");
    // ... but the seed is compiled into the draws.
    let err = fails(&["run", path_str(&engine), "--prompt", PROMPT, "--seed", "4"]);
    assert_mentions(
        &err,
        &["--seed 4", path_str(&engine), "compiled with seed 3"],
    );
    std::fs::remove_dir_all(&engine).ok();
}

#[test]
fn prompts_come_from_a_file_or_stdin() {
    let want = text(&[]);
    let file = tmp("prompt.txt");
    std::fs::write(&file, PROMPT).unwrap();
    let out = specc(&[
        "run",
        "--prompt-file",
        path_str(&file),
        "--max-tokens",
        "16",
    ]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);

    let mut child = command(&["run", "--prompt", "-", "--max-tokens", "16"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(PROMPT.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);

    std::fs::write(&file, b"def \xff").unwrap();
    let err = fails(&["run", "--prompt-file", path_str(&file)]);
    assert_mentions(&err, &["--prompt-file", path_str(&file), "UTF-8"]);
    let mut child = command(&["run", "--prompt", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"\xfe\xfe").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_mentions(&err, &["--prompt -", "standard input", "UTF-8"]);
    std::fs::remove_file(&file).ok();
}

#[test]
fn a_stop_string_ends_generation_before_it() {
    for mode in MODES {
        let full = text(mode);
        let generated = &full[PROMPT.len()..full.len() - 1];
        // A stop string from the middle of the generated text (at char boundaries).
        let chars: Vec<(usize, char)> = generated.char_indices().collect();
        let (a, b) = (chars[chars.len() / 2].0, chars[chars.len() / 2 + 3].0);
        let stop = &generated[a..b];
        let before = &generated[..generated.find(stop).unwrap()];
        let flags = [mode, &["--stop", "never appears", "--stop", stop]].concat();
        assert_eq!(
            text(&flags),
            format!("{PROMPT}{before}\n"),
            "{mode:?} stop {stop:?}"
        );
    }
}

#[test]
fn the_end_of_the_context_is_reported() {
    for mode in MODES {
        let flags = [mode, &["--max-context", "32", "--max-tokens", "100"]].concat();
        let mut args = vec!["run", "--prompt", PROMPT];
        args.extend(&flags);
        let err = String::from_utf8(specc(&args).stderr).unwrap();
        assert_mentions(&err, &["end of the context", "32 tokens", "--max-context"]);
        // Not when --max-tokens ends it first.
        let (_, err) = run(mode);
        assert!(!err.contains("end of the context"), "{err}");
    }
}
