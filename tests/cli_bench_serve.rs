//! `specc bench-serve` against an in-test mock server: the JSON's keys, token counts and
//! latencies (the mock's delays are known lower bounds), what the requests carried, and
//! one-line errors for unreachable servers, error answers, malformed streams and timeouts.

use std::time::Duration;

mod bench_serve_mock;
mod cli_common;
mod common;

use bench_serve_mock::{Behaviour, Mock};
use cli_common::{assert_mentions, fails, specc, tmp};

fn bench(mock_url: &str, extra: &[&str]) -> (Vec<serde_json::Value>, String) {
    let port = mock_url.rsplit(':').next().unwrap().trim_end_matches("/v1");
    let json = tmp(&format!("bench-serve-{port}.json"));
    let mut args = vec![
        "bench-serve",
        "--url",
        mock_url,
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = specc(&args);
    let text = std::fs::read_to_string(&json).unwrap();
    let levels: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    (levels, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn num(level: &serde_json::Value, key: &str) -> f64 {
    level[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {level}"))
}

#[test]
fn measures_a_streaming_server() {
    // 40 ms to the first token, then 10 ms per token: 6 tokens take at least 90 ms.
    let mock = Mock::start(Behaviour::default());
    let (levels, stdout) = bench(
        &mock.url,
        &[
            "--concurrency",
            "1,4",
            "--requests",
            "8",
            "--max-tokens",
            "6",
            "--api-key",
            "sekret",
            "--ignore-eos",
        ],
    );
    assert_eq!(levels.len(), 2, "{levels:?}");
    for (level, concurrency) in levels.iter().zip([1.0, 4.0]) {
        for key in [
            "concurrency",
            "output_tok_s",
            "ttft_ms_p50",
            "ttft_ms_p99",
            "itl_ms_p50",
            "itl_ms_p99",
        ] {
            num(level, key);
        }
        assert_eq!(num(level, "concurrency"), concurrency);
        assert_eq!(num(level, "requests"), 8.0);
        assert_eq!(num(level, "output_tokens"), 48.0, "usage counts: {level}");
        let (ttft50, ttft99) = (num(level, "ttft_ms_p50"), num(level, "ttft_ms_p99"));
        assert!((40.0..1000.0).contains(&ttft50), "ttft p50 {ttft50}");
        assert!(ttft99 >= ttft50, "{level}");
        let (itl50, itl99) = (num(level, "itl_ms_p50"), num(level, "itl_ms_p99"));
        // Chunks read in one go share a timestamp, so a few gaps may be shorter than 10 ms.
        assert!((9.0..300.0).contains(&itl50), "itl p50 {itl50}");
        assert!(itl99 >= itl50, "{level}");
        // Each worker finishes at most 6 tokens per 90 ms.
        let ceiling = concurrency * 6.0 / 0.090;
        let tok_s = num(level, "output_tok_s");
        assert!(
            tok_s > 0.0 && tok_s <= ceiling,
            "{tok_s} tok/s vs {ceiling}"
        );
    }
    assert!(stdout.contains("output tok/s"), "{stdout}");
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.trim_start().starts_with('4'))
            .count(),
        1
    );

    // The model came from /v1/models; every request carried the flags.
    assert_eq!(mock.model_lists(), 1);
    let sent = mock.completions();
    assert_eq!(sent.len(), 16);
    for s in &sent {
        assert_eq!(s.method, "POST");
        assert_eq!(s.body["model"], "mock-model");
        assert_eq!(s.body["max_tokens"], 6);
        assert_eq!(s.body["stream"], true);
        assert_eq!(s.body["stream_options"]["include_usage"], true);
        assert_eq!(s.body["temperature"], 0.0);
        assert_eq!(s.body["ignore_eos"], true);
        assert!(s.body["prompt"].as_str().is_some_and(|p| !p.is_empty()));
        assert_eq!(s.headers["authorization"], "Bearer sekret");
    }
    let peak = mock.max_in_flight.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(peak, 4, "at most and at best 4 requests in flight");
    // Workers keep their connection: one for the model list, one at C=1, four at C=4.
    let conns = mock.connections.load(std::sync::atomic::Ordering::SeqCst);
    assert!(conns <= 6, "{conns} connections");
}

#[test]
fn counts_chunks_without_usage_and_reads_prompt_files() {
    // Two tokens per chunk, no usage chunk, a connection per request: tokens are counted
    // from the chunks (3 for max_tokens 6).
    let mock = Mock::start(Behaviour {
        tokens_per_chunk: 2,
        usage: false,
        chunked: false,
        first_delay: Duration::from_millis(5),
        gap: Duration::from_millis(5),
        ..Behaviour::default()
    });
    let prompts = tmp("bench-serve-prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"alpha\"}\n{\"prompt\": \"beta\"}\n",
    )
    .unwrap();
    let (levels, _) = bench(
        &format!("{}/v1", mock.url),
        &[
            "--concurrency",
            "1",
            "--requests",
            "5",
            "--max-tokens",
            "6",
            "--model",
            "chosen",
            "--temperature",
            "0.5",
            "--prompts",
            prompts.to_str().unwrap(),
        ],
    );
    assert_eq!(num(&levels[0], "output_tokens"), 15.0);
    assert_eq!(mock.model_lists(), 0);
    let sent = mock.completions();
    let order: Vec<&str> = sent
        .iter()
        .map(|s| s.body["prompt"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["alpha", "beta", "alpha", "beta", "alpha"]);
    for s in &sent {
        assert_eq!(s.body["model"], "chosen");
        assert_eq!(s.body["temperature"], 0.5);
        assert!(s.body.get("ignore_eos").is_none());
        assert!(!s.headers.contains_key("authorization"));
    }
}

fn fails_against(behaviour: Behaviour, extra: &[&str]) -> String {
    let mock = Mock::start(behaviour);
    let mut args = vec![
        "bench-serve",
        "--url",
        &mock.url,
        "--requests",
        "3",
        "--concurrency",
        "2",
    ];
    args.extend_from_slice(extra);
    fails(&args)
}

#[test]
fn unreachable_server() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let err = fails(&["bench-serve", "--url", &url, "--requests", "2"]);
    assert_mentions(&err, &["cannot connect", &url]);
    let err = fails(&[
        "bench-serve",
        "--url",
        &url,
        "--model",
        "m",
        "--requests",
        "2",
    ]);
    assert_mentions(&err, &["cannot connect", &url]);
}

#[test]
fn error_answers_carry_the_servers_message() {
    let err = fails_against(
        Behaviour {
            fail: Some((
                401,
                r#"{"error":{"message":"Invalid API key","type":"auth"}}"#,
            )),
            ..Behaviour::default()
        },
        &[],
    );
    assert_mentions(&err, &["/v1/completions", "401", "Invalid API key"]);
    let err = fails_against(
        Behaviour {
            fail: Some((
                500,
                r#"{"object":"error","message":"engine died","code":500}"#,
            )),
            ..Behaviour::default()
        },
        &[],
    );
    assert_mentions(&err, &["500", "engine died"]);
    let err = fails_against(
        Behaviour {
            models: r#"{"object":"list","data":[]}"#,
            ..Behaviour::default()
        },
        &[],
    );
    assert_mentions(&err, &["/v1/models", "--model"]);
}

#[test]
fn malformed_streams_and_timeouts() {
    let err = fails_against(
        Behaviour {
            malformed: Some("{not json"),
            ..Behaviour::default()
        },
        &[],
    );
    assert_mentions(&err, &["malformed SSE", "{not json"]);
    let err = fails_against(
        Behaviour {
            malformed: Some(r#"{"object":"text_completion"}"#),
            ..Behaviour::default()
        },
        &[],
    );
    assert_mentions(&err, &["malformed SSE", "choices"]);
    let err = fails_against(
        Behaviour {
            stall: true,
            ..Behaviour::default()
        },
        &["--timeout", "0.5"],
    );
    assert_mentions(&err, &["timed out", "--timeout"]);
}

#[test]
fn bad_flags() {
    let err = fails(&[
        "bench-serve",
        "--url",
        "https://example.com",
        "--model",
        "m",
    ]);
    assert_mentions(&err, &["https", "http://"]);
    let err = fails(&[
        "bench-serve",
        "--url",
        "http://127.0.0.1:9",
        "--concurrency",
        "0",
    ]);
    assert_mentions(&err, &["--concurrency"]);
    let missing = tmp("bench-serve-no-such-prompts");
    let err = fails(&[
        "bench-serve",
        "--url",
        "http://127.0.0.1:9",
        "--prompts",
        missing.to_str().unwrap(),
    ]);
    assert_mentions(&err, &["--prompts", "bench-serve-no-such-prompts"]);
}

#[test]
fn unwritable_json_fails_before_measuring() {
    let mock = Mock::start(Behaviour::default());
    let json = tmp("bench-serve-no-dir").join("out.json");
    let err = fails(&[
        "bench-serve",
        "--url",
        &mock.url,
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_mentions(&err, &["--json", "out.json"]);
    assert!(mock.completions().is_empty());
}
