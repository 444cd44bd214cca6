//! `specc serve` end to end: the real binary listening on 127.0.0.1, driven by a real HTTP
//! client (reqwest). Completions and chat, whole and streamed; concurrent requests checked
//! against their lone outputs (continuous batching is exact under greedy decoding); seeded
//! sampling; bad requests; metrics back at idle; a client that disconnects. Every request
//! and every server start is bounded in time.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

const START: Duration = Duration::from_secs(300);
const REQUEST: Duration = Duration::from_secs(300);

/// A server process, killed when dropped.
struct Server {
    child: Child,
    base: String,
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response: status, headers of interest and body.
struct Reply {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of a server-sent event stream, `[DONE]` included.
    fn events(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not an SSE data line: {e:?}"))
                    .to_string()
            })
            .collect()
    }
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_specc"))
            .args(["serve", "--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn specc serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("on http://") {
                    let addr = line[at + "on http://".len()..]
                        .split_whitespace()
                        .next()
                        .unwrap()
                        .to_string();
                    let _ = tx.send(Ok(addr));
                }
                lines.push(line);
            }
            let _ = tx.send(Err(lines.join("\n")));
        });
        let base = match rx.recv_timeout(START) {
            Ok(Ok(addr)) => addr,
            Ok(Err(log)) => panic!("specc serve {args:?} exited before listening:\n{log}"),
            Err(_) => panic!("specc serve {args:?} did not listen within {START:?}"),
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let http = reqwest::Client::builder().timeout(REQUEST).build().unwrap();
        Server {
            child,
            base,
            rt,
            http,
        }
    }

    fn send(&self, method: &str, path: &str, body: Option<String>, key: Option<&str>) -> Reply {
        self.rt.block_on(send(
            self.http.clone(),
            self.base.clone(),
            method.to_string(),
            path.to_string(),
            body,
            key.map(str::to_string),
        ))
    }

    fn post(&self, path: &str, body: &Value) -> Reply {
        self.send("POST", path, Some(body.to_string()), None)
    }

    fn get(&self, path: &str) -> Reply {
        self.send("GET", path, None, None)
    }

    /// Sends every body at once; the replies in order.
    fn post_all(&self, path: &str, bodies: &[Value]) -> Vec<Reply> {
        let futs: Vec<_> = bodies
            .iter()
            .map(|b| {
                self.rt.spawn(send(
                    self.http.clone(),
                    self.base.clone(),
                    "POST".into(),
                    path.into(),
                    Some(b.to_string()),
                    None,
                ))
            })
            .collect();
        self.rt.block_on(async {
            let mut out = Vec::new();
            for f in futs {
                out.push(f.await.unwrap());
            }
            out
        })
    }

    /// One metric's value (the first sample of that name and labels prefix).
    fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").body;
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("metric {name} not in:\n{text}"))
    }
}

async fn send(
    http: reqwest::Client,
    base: String,
    method: String,
    path: String,
    body: Option<String>,
    key: Option<String>,
) -> Reply {
    let url = format!("http://{base}{path}");
    let mut req = match method.as_str() {
        "GET" => http.get(&url),
        _ => http.post(&url),
    };
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let r = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = r.text().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    Reply {
        status,
        retry_after,
        body,
    }
}

fn completion(prompt: &str, max_tokens: u64) -> Value {
    json!({"model": "specc-default", "prompt": prompt, "max_tokens": max_tokens})
}

fn text_of(r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let c = &v["choices"][0];
    c["text"]
        .as_str()
        .or_else(|| c["message"]["content"].as_str())
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_string()
}

/// The text of a streamed reply, its finish reason and its usage chunk, if any.
fn streamed(r: &Reply) -> (String, String, Option<Value>) {
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.body
    );
    let mut text = String::new();
    let mut finish = String::new();
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(u) = v.get("usage") {
            usage = Some(u.clone());
        }
        for c in v["choices"].as_array().unwrap() {
            if let Some(t) = c["text"].as_str().or(c["delta"]["content"].as_str()) {
                text.push_str(t);
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    (text, finish, usage)
}

/// What `specc run` prints for `prompt` (the generated text only), and its prompt ids.
fn run_text(prompt: &str, max_tokens: u64) -> (String, Vec<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.json");
    let out = Command::new(env!("CARGO_BIN_EXE_specc"))
        .args([
            "run",
            "--prompt",
            prompt,
            "--max-tokens",
            &max_tokens.to_string(),
            "--prefill-chunk",
            "0",
        ])
        .arg("--ids-out")
        .arg(&ids)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8(out.stdout).unwrap();
    let text = s
        .strip_prefix(prompt)
        .and_then(|s| s.strip_suffix('\n'))
        .unwrap()
        .to_string();
    let v: Value = serde_json::from_slice(&std::fs::read(&ids).unwrap()).unwrap();
    let prompt_ids = v["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    (text, prompt_ids)
}

#[test]
fn completions_and_chat_whole_and_streamed() {
    let s = Server::start(&[]);
    assert_eq!(s.get("/health").status, 200);
    let models = s.get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], "specc-default");

    let prompt = "def __init__(self";
    let whole = s.post("/v1/completions", &completion(prompt, 40));
    let v = whole.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 40);
    assert_eq!(v["usage"]["prompt_tokens"], 8, "BOS + 7 prompt tokens");
    assert_eq!(v["usage"]["total_tokens"], 48);
    let text = text_of(&whole);
    let (run, prompt_ids) = run_text(prompt, 40);
    assert_eq!(text, run, "the server generates what `specc run` does");

    let mut body = completion(prompt, 40);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (st, finish, usage) = streamed(&s.post("/v1/completions", &body));
    assert_eq!((st.as_str(), finish.as_str()), (text.as_str(), "length"));
    assert_eq!(usage.unwrap()["completion_tokens"], 40);

    // A stop string: the text before it, finish "stop".
    let cut = text.find('\n').expect("the reply has a newline");
    let mut body = completion(prompt, 40);
    body["stop"] = json!(["\n"]);
    let r = s.post("/v1/completions", &body);
    assert_eq!(text_of(&r), text[..cut]);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");

    // Token-id prompts are used as given: the ids of BOS + prompt give the same text.
    let ids_prompt = json!({"prompt": [prompt_ids], "max_tokens": 40});
    assert_eq!(text_of(&s.post("/v1/completions", &ids_prompt)), text);

    let chat = json!({
        "model": "specc-default",
        "messages": [{"role": "system", "content": "python"}, {"role": "user", "content": "sort a list"}],
        "max_tokens": 24,
    });
    let r = s.post("/v1/chat/completions", &chat);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 24);
    let chat_text = text_of(&r);
    let mut body = chat.clone();
    body["stream"] = json!(true);
    let r = s.post("/v1/chat/completions", &body);
    let events = r.events();
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let (st, finish, usage) = streamed(&r);
    assert_eq!((st, finish.as_str(), usage), (chat_text, "length", None));
}

#[test]
fn concurrent_requests_match_their_lone_outputs() {
    let s = Server::start(&["--lanes", "4", "--max-queue", "32"]);
    let prompts = [
        "def __init__(self",
        "import os\n",
        "class Queue:",
        "    return ",
        "for i in range(",
        "def parse(",
        "\"\"\"Return the",
        "if __name__ ==",
        "raise ValueError(",
        "with open(",
        "try:\n    ",
        "self.",
    ];
    let bodies: Vec<Value> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut b = completion(p, 8 + 5 * i as u64);
            // Half of them streamed: both paths read the same lanes.
            b["stream"] = json!(i % 2 == 1);
            b
        })
        .collect();
    let text = |r: &Reply, i: usize| {
        if i % 2 == 1 {
            streamed(r).0
        } else {
            text_of(r)
        }
    };
    let alone: Vec<String> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| text(&s.post("/v1/completions", b), i))
        .collect();
    let together = s.post_all("/v1/completions", &bodies);
    for (i, r) in together.iter().enumerate() {
        assert_eq!(
            text(r, i),
            alone[i],
            "request {i} ({:?}) differs batched",
            prompts[i]
        );
    }
    // Twice more, in another order (other lanes, other neighbours).
    let rev: Vec<Value> = bodies.iter().rev().cloned().collect();
    for (j, r) in s.post_all("/v1/completions", &rev).iter().enumerate() {
        let i = bodies.len() - 1 - j;
        assert_eq!(
            text(r, i),
            alone[i],
            "request {i} differs batched in reverse"
        );
    }
    assert_eq!(s.metric("specc:lanes_in_use"), 0.0);
    assert_eq!(s.metric("vllm:num_requests_waiting"), 0.0);
}

#[test]
fn bad_requests_get_openai_errors() {
    let s = Server::start(&["--api-key", "sekrit", "--lanes", "1", "--max-queue", "1"]);
    let key = Some("sekrit");
    let post = |body: &str| s.send("POST", "/v1/completions", Some(body.to_string()), key);
    let long = "x = 1\n".repeat(400);
    let cases: Vec<(String, u16, Option<&str>)> = vec![
        ("{\"prompt\": ".into(), 400, None),
        ("[]".into(), 400, None),
        ("{}".into(), 400, Some("prompt")),
        (r#"{"prompt": 3}"#.into(), 400, Some("prompt")),
        (
            r#"{"prompt": "a", "max_tokens": "8"}"#.into(),
            400,
            Some("max_tokens"),
        ),
        (
            r#"{"prompt": "a", "max_tokens": 0}"#.into(),
            400,
            Some("max_tokens"),
        ),
        (
            r#"{"prompt": "a", "max_tokens": -3}"#.into(),
            400,
            Some("max_tokens"),
        ),
        (
            r#"{"prompt": "a", "max_tokens": 5000}"#.into(),
            400,
            Some("max_tokens"),
        ),
        (json!({"prompt": long}).to_string(), 400, Some("prompt")),
        (r#"{"prompt": [1, 99999]}"#.into(), 400, Some("prompt[1]")),
        (r#"{"prompt": "a", "n": 2}"#.into(), 400, Some("n")),
        (
            r#"{"prompt": "a", "logprobs": 1}"#.into(),
            400,
            Some("logprobs"),
        ),
        (
            r#"{"prompt": "a", "temperature": -0.5}"#.into(),
            400,
            Some("temperature"),
        ),
        (r#"{"prompt": "a", "top_p": 0}"#.into(), 400, Some("top_p")),
        (
            r#"{"prompt": "a", "stop": [1]}"#.into(),
            400,
            Some("stop[0]"),
        ),
        (
            r#"{"prompt": "a", "model": "gpt-4"}"#.into(),
            404,
            Some("model"),
        ),
    ];
    for (body, status, param) in &cases {
        let r = post(body);
        assert_eq!(r.status, *status, "{body}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"].as_str(), *param, "{body}: {e}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
        assert!(e["type"].is_string(), "{e}");
        assert!(e.get("code").is_some(), "{e}");
    }
    let chat = |body: &str| s.send("POST", "/v1/chat/completions", Some(body.to_string()), key);
    for (body, param) in [
        (r#"{"messages": "hi"}"#, "messages"),
        (
            r#"{"messages": [{"role": "user", "content": 5}]}"#,
            "messages[0].content",
        ),
        (r#"{"messages": [{"content": "x"}]}"#, "messages[0].role"),
    ] {
        let r = chat(body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    // The API key.
    for k in [None, Some("wrong")] {
        let r = s.send(
            "POST",
            "/v1/completions",
            Some(completion("a", 2).to_string()),
            k,
        );
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(r.json()["error"]["type"], "authentication_error");
    }
    assert_eq!(s.send("GET", "/v1/models", None, None).status, 401);
    assert_eq!(s.get("/health").status, 200, "health needs no key");
    let r = s.get("/v1/nothing");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"].is_string());

    // A full queue: one lane, one waiting request; the rest are turned away with 503.
    let bodies: Vec<Value> = (0..6).map(|_| completion("def ", 300)).collect();
    let replies = s.rt.block_on(async {
        let futs: Vec<_> = bodies
            .iter()
            .map(|b| {
                s.rt.spawn(send(
                    s.http.clone(),
                    s.base.clone(),
                    "POST".into(),
                    "/v1/completions".into(),
                    Some(b.to_string()),
                    Some("sekrit".into()),
                ))
            })
            .collect();
        let mut out = Vec::new();
        for f in futs {
            out.push(f.await.unwrap());
        }
        out
    });
    let busy: Vec<&Reply> = replies.iter().filter(|r| r.status == 503).collect();
    assert!(
        !busy.is_empty(),
        "six requests for one lane and a queue of one"
    );
    assert!(replies.iter().filter(|r| r.status == 200).count() >= 1);
    for r in busy {
        assert_eq!(r.retry_after.as_deref(), Some("1"));
        assert_eq!(r.json()["error"]["code"], "queue_full");
    }
    // Still serving.
    let r = s.send(
        "POST",
        "/v1/completions",
        Some(completion("a", 2).to_string()),
        key,
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn seeded_sampling_is_reproducible() {
    // Temperature 0.8 is the server's default knob here; a request's seed picks the RNG
    // stream its lane draws from, so the same seed, knobs and prompt give the same text in
    // any lane, next to any other requests.
    let s = Server::start(&["--temperature", "0.8", "--seed", "3", "--lanes", "3"]);
    let seeded = |seed: u64| {
        let mut b = completion("def ", 48);
        b["seed"] = json!(seed);
        b
    };
    let a = text_of(&s.post("/v1/completions", &seeded(5)));
    assert_eq!(
        a,
        text_of(&s.post("/v1/completions", &seeded(5))),
        "same seed, same text"
    );
    let mut explicit = seeded(5);
    explicit["temperature"] = json!(0.8);
    assert_eq!(
        text_of(&s.post("/v1/completions", &explicit)),
        a,
        "the default knob is the one sent"
    );
    // Amid other requests (other lanes, other seeds, other prompts).
    let mut bodies: Vec<Value> = (0..5)
        .map(|i| {
            let mut b = seeded(100 + i);
            b["prompt"] =
                json!(["import os\n", "class A:", "for i in", "x = ", "def "][i as usize]);
            b
        })
        .collect();
    bodies.insert(2, seeded(5));
    let replies = s.post_all("/v1/completions", &bodies);
    assert_eq!(
        text_of(&replies[2]),
        a,
        "a seeded request batched equals it alone"
    );
    let other = text_of(&s.post("/v1/completions", &seeded(6)));
    assert_ne!(a, other, "another seed, another draw");
    let mut greedy = completion("def ", 48);
    greedy["temperature"] = json!(0);
    let g = text_of(&s.post("/v1/completions", &greedy));
    assert_ne!(a, g, "sampling at 0.8 left the greedy text");
    assert_eq!(
        g,
        run_text("def ", 48).0,
        "temperature 0 is greedy decoding"
    );
}

#[test]
fn greedy_and_sampled_lanes_share_one_step() {
    // The default server decodes greedily unless a request sends a temperature; its step
    // graph reads every lane's temperature, top-k and top-p from device state, so greedy and
    // sampled requests run side by side in one step.
    let s = Server::start(&["--lanes", "4", "--max-queue", "32"]);
    let prompts = [
        "def __init__(self",
        "import os\n",
        "class Queue:",
        "for i in range(",
    ];
    let greedy = |i: usize| completion(prompts[i], 24);
    let sampled = |i: usize, seed: u64| {
        let mut b = completion(prompts[i], 24);
        b["seed"] = json!(seed);
        match i % 3 {
            0 => b["temperature"] = json!(0.9),
            1 => {
                b["temperature"] = json!(1.2);
                b["top_k"] = json!(5);
            }
            _ => {
                b["temperature"] = json!(0.7);
                b["top_p"] = json!(0.8);
            }
        }
        b
    };
    let greedy_alone: Vec<String> = (0..4)
        .map(|i| text_of(&s.post("/v1/completions", &greedy(i))))
        .collect();
    assert_eq!(
        greedy_alone[0],
        run_text(prompts[0], 24).0,
        "a greedy lane is the target's greedy decoding"
    );
    let sampled_alone: Vec<String> = (0..4)
        .map(|i| text_of(&s.post("/v1/completions", &sampled(i, 40 + i as u64))))
        .collect();
    // Greedy, sampled, greedy, sampled...: every step holds both kinds of lane; then the
    // other way round (other lanes, other neighbours).
    let mut cases = Vec::new();
    for (i, (g, d)) in greedy_alone.iter().zip(&sampled_alone).enumerate() {
        cases.push((greedy(i), g, format!("greedy request {i}")));
        let b = sampled(i, 40 + i as u64);
        cases.push((b, d, format!("seeded sampled request {i}")));
    }
    for round in 0..2 {
        let bodies: Vec<Value> = cases.iter().map(|c| c.0.clone()).collect();
        let replies = s.post_all("/v1/completions", &bodies);
        for (r, (_, want, what)) in replies.iter().zip(&cases) {
            assert_eq!(&text_of(r), *want, "round {round}: {what} differs batched");
        }
        cases.reverse();
    }
    let differ = (0..4)
        .filter(|&i| sampled_alone[i] != greedy_alone[i])
        .count();
    assert!(
        differ >= 3,
        "sampled texts left the greedy ones ({differ} of 4)"
    );
    assert_eq!(s.metric("specc:lanes_in_use"), 0.0);
    // The greedy requests alone replayed greedy twins; the steps with a sampled lane did not.
    let greedy_steps = s.metric("specc:greedy_steps_total");
    assert!(greedy_steps > 0.0 && greedy_steps < s.metric("specc:steps_total"));
}

#[test]
fn metrics_count_requests_and_return_to_idle() {
    // A fixed k = 5 (the adaptive default would draft at several k): every draft is 5 tokens.
    let s = Server::start(&["--lanes", "2", "--spec-policy", "fixed"]);
    let bodies: Vec<Value> = (0..5).map(|i| completion("class A:", 10 + i)).collect();
    let replies = s.post_all("/v1/completions", &bodies);
    let (mut prompt, mut gen) = (0.0, 0.0);
    for r in &replies {
        let u = &r.json()["usage"];
        prompt += u["prompt_tokens"].as_f64().unwrap();
        gen += u["completion_tokens"].as_f64().unwrap();
    }
    assert_eq!(s.metric("vllm:prompt_tokens_total"), prompt);
    assert_eq!(s.metric("vllm:generation_tokens_total"), gen);
    assert_eq!(s.metric("vllm:time_to_first_token_seconds_count"), 5.0);
    assert_eq!(s.metric("vllm:num_requests_running"), 0.0);
    assert_eq!(s.metric("specc:lanes_in_use"), 0.0);
    assert_eq!(s.metric("vllm:kv_cache_usage_perc"), 0.0);
    assert_eq!(s.metric("specc:lanes_total"), 2.0);
    // Greedy requests only: every step replays a greedy twin of the sampling engine's step.
    let steps = s.metric("specc:steps_total");
    assert!(steps > 0.0);
    assert_eq!(s.metric("specc:greedy_steps_total"), steps);
    let drafts = s.metric("vllm:spec_decode_num_drafts_total");
    let accepted = s.metric("vllm:spec_decode_num_accepted_tokens_total");
    assert!(drafts > 0.0);
    assert_eq!(
        s.metric("vllm:spec_decode_num_draft_tokens_total"),
        drafts * 5.0
    );
    assert!(accepted <= drafts * 5.0);
    assert!(s.metric("vllm:spec_decode_num_accepted_tokens_per_pos_total") <= drafts);
    let text = s.get("/metrics").body;
    assert!(
        text.contains(
            "vllm:request_success_total{model_name=\"specc-default\",finished_reason=\"length\"} 5"
        ),
        "{text}"
    );
}

#[test]
fn a_client_that_disconnects_frees_its_lane() {
    let s = Server::start(&["--lanes", "1"]);
    let mut body = completion("def ", 900);
    body["stream"] = json!(true);
    s.rt.block_on(async {
        let mut r = s
            .http
            .post(format!("http://{}/v1/completions", s.base))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        // Read the first event, then hang up.
        let chunk = r.chunk().await.unwrap().unwrap();
        assert!(chunk.starts_with(b"data: "));
    });
    let mut freed = false;
    for _ in 0..600 {
        std::thread::sleep(Duration::from_millis(50));
        if s.metric("specc:lanes_in_use") == 0.0 {
            freed = true;
            break;
        }
    }
    assert!(freed, "the lane stayed in use after the client left");
    let text = s.get("/metrics").body;
    assert!(text.contains("finished_reason=\"abort\"} 1"), "{text}");
    assert!(s.metric("vllm:generation_tokens_total") < 900.0);
    // The next request is served at once in the freed lane.
    assert_eq!(
        s.post("/v1/completions", &completion("def ", 4)).status,
        200
    );
}

/// Over HTTP with 16-token prefill chunks: long prompts (several chunks) joining lanes that
/// decode get the replies `specc run` gives them with one whole prefill, and the server
/// returns to idle (no request left prefilling).
#[test]
fn long_prompts_in_chunks_match_whole_prefills() {
    let s = Server::start(&["--lanes", "2", "--prefill-chunk", "16"]);
    let long = "import os\nimport sys\n\nclass Parser:\n    def __init__(self, text):\n        \
                self.text = text\n        self.pos = 0\n\n    def peek(self):\n        return ";
    let prompts = [
        "def main(argv):\n    ",
        long,
        "for i in range(",
        &long[10..],
    ];
    let bodies: Vec<Value> = prompts.iter().map(|p| completion(p, 24)).collect();
    let together = s.post_all("/v1/completions", &bodies);
    for (i, r) in together.iter().enumerate() {
        let (want, ids) = run_text(prompts[i], 24);
        if i % 2 == 1 {
            assert!(
                ids.len() > 32,
                "prompt {i}: {} ids, want several chunks",
                ids.len()
            );
        }
        assert_eq!(
            text_of(r),
            want,
            "request {i} ({} prompt ids, chunks of 16) differs from `specc run --prefill-chunk 0`",
            ids.len()
        );
    }
    assert_eq!(s.metric("vllm:num_requests_running"), 0.0);
    assert_eq!(s.metric("specc:num_requests_prefilling"), 0.0);
}

#[test]
fn bad_flags_are_one_line_errors() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    for (args, want) in [
        (vec!["--lanes", "0"], "--lanes 0: expected at least 1"),
        (
            vec!["--max-queue", "0"],
            "--max-queue 0: expected at least 1",
        ),
        (vec!["--temperature", "-1"], "--temperature -1: expected"),
        (vec!["--prefill-chunk", "100"], "must be a power of two"),
        (vec!["--port", port.as_str()], "cannot listen"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_specc"))
            .arg("serve")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: ") && last.contains(want),
            "{args:?}: {err}"
        );
    }
}

/// A random-weights model from a bare config has no tokenizer: it is served on token ids
/// (prompts as id arrays, each generated id back as " <id>"), and a text prompt or a chat
/// request is a 400 naming the field.
#[test]
fn random_weights_without_a_tokenizer_serve_token_ids() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::copy(fixture_config("llama_tied"), &config).unwrap();
    let s = Server::start(&[config.to_str().unwrap(), "--random-weights", "--no-spec"]);
    let body = |prompt: Value| json!({"prompt": prompt, "max_tokens": 6, "ignore_eos": true});
    let whole = s.post("/v1/completions", &body(json!([1, 5, 9])));
    let text = text_of(&whole);
    let ids: Vec<u64> = text
        .split_whitespace()
        .map(|t| {
            t.parse()
                .unwrap_or_else(|_| panic!("not an id: {t:?} in {text:?}"))
        })
        .collect();
    assert_eq!(ids.len(), 6, "{text:?}");
    assert!(text.starts_with(' '), "{text:?}");
    assert_eq!(whole.json()["usage"]["completion_tokens"], 6);
    let mut stream = body(json!([1, 5, 9]));
    stream["stream"] = json!(true);
    let (streamed_text, finish, _) = streamed(&s.post("/v1/completions", &stream));
    assert_eq!(streamed_text, text, "streamed and whole replies differ");
    assert_eq!(finish, "length");
    let text_prompt = s.post("/v1/completions", &body(json!("hello")));
    assert_eq!(text_prompt.status, 400, "{}", text_prompt.body);
    assert_eq!(text_prompt.json()["error"]["param"], "prompt");
    assert!(
        text_prompt.body.contains("no tokenizer"),
        "{}",
        text_prompt.body
    );
    let chat = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(chat.status, 400, "{}", chat.body);
    assert_eq!(chat.json()["error"]["param"], "messages");
}

fn fixture_config(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .join("config.json")
}

/// The official `openai` Python client against the server: a completion equal to reqwest's,
/// a chat completion streamed (with `include_usage`) equal to the same chat whole, and an
/// `APIStatusError` with the server's message for a bad request. Skipped, with the reason,
/// where `python3 -c "import openai"` fails (CI installs the package).
#[test]
fn the_openai_python_client_talks_to_the_server() {
    let probe = Command::new("python3")
        .args(["-c", "import openai"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        specc_ir::testing::skip("the openai Python package is not installed (pip install openai)");
        return;
    }
    let s = Server::start(&[]);
    let lone = text_of(&s.post("/v1/completions", &completion("def __init__(self", 24)));
    let chat = json!({"model": "specc-default", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "hello"}]});
    let chat_whole = text_of(&s.post("/v1/chat/completions", &chat));
    let script = r#"
import json, sys
from openai import OpenAI, BadRequestError
client = OpenAI(base_url=sys.argv[1], api_key="unused", timeout=120)
out = {}
r = client.completions.create(model="specc-default", prompt="def __init__(self", max_tokens=24)
out["completion"] = r.choices[0].text
out["completion_tokens"] = r.usage.completion_tokens
msgs = [{"role": "user", "content": "hello"}]
text, usage = "", None
for chunk in client.chat.completions.create(model="specc-default", messages=msgs, max_tokens=16,
                                            stream=True, stream_options={"include_usage": True}):
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
    for c in chunk.choices:
        text += c.delta.content or ""
out["chat_streamed"] = text
out["chat_usage"] = usage
try:
    client.completions.create(model="specc-default", prompt="x", max_tokens=0)
    out["bad"] = "accepted"
except BadRequestError as e:
    out["bad"] = e.body.get("message") if isinstance(e.body, dict) else str(e.body)
print(json.dumps(out))
"#;
    let url = format!("http://{}/v1", s.base);
    let run = Command::new("python3")
        .args(["-c", script, &url])
        .output()
        .expect("python3 runs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let v: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(v["completion"], lone.as_str(), "{v}");
    assert_eq!(v["completion_tokens"], 24, "{v}");
    assert_eq!(v["chat_streamed"], chat_whole.as_str(), "{v}");
    assert!(v["chat_usage"].as_u64().is_some_and(|n| n > 0), "{v}");
    let bad = v["bad"].as_str().unwrap_or_default();
    assert!(bad.contains("max_tokens"), "{v}");
}
