//! The HTTP side: routes, the API key, request checks that need the tokenizer (prompt
//! and `max_tokens` against the context, sampling against the engine's), and the OpenAI
//! response shapes, whole or as server-sent events ending in `data: [DONE]`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use specc_models::Acceptance;
use specc_runtime::admission::{self, LaneSampling};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::batcher::{Event, Job, Queue};
use super::chat::ChatTemplate;
use super::errors::ApiError;
use super::metrics::Metrics;
use super::request::{self, Endpoint, Input, Limits, Parsed, Prompt, Sampling};
use crate::text::TextCodec;

/// What every handler reads.
pub struct App {
    pub queue: Queue,
    pub codec: Arc<TextCodec>,
    pub template: Option<ChatTemplate>,
    pub served_name: String,
    pub api_key: Option<String>,
    pub vocab: usize,
    pub bos: Option<u32>,
    /// Draft tokens a step writes past a lane's length (0 plain).
    pub k: usize,
    pub max_context: u64,
    pub acceptance: Acceptance,
    pub metrics: Arc<Metrics>,
    pub created: u64,
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|uri: Uri| async move { error(ApiError::not_found(uri.path())) })
        .with_state(app)
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut r = (status, axum::Json(e.to_json())).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn authorized(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &app.api_key else {
        return Ok(());
    };
    let got = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match got {
        Some(g) if g == key => Ok(()),
        _ => Err(ApiError::unauthorized()),
    }
}

async fn health() -> &'static str {
    ""
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorized(&app, &headers) {
        return error(e);
    }
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": app.served_name,
            "object": "model",
            "created": app.created,
            "owned_by": "specc",
            "root": app.served_name,
            "max_model_len": app.max_context,
        }]
    }))
    .into_response()
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(app, Endpoint::Completions, headers, body).await
}

async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    generate(app, Endpoint::Chat, headers, body).await
}

/// A request checked and queued: its event stream.
struct Accepted {
    p: Parsed,
    rx: UnboundedReceiver<Event>,
}

async fn generate(app: Arc<App>, endpoint: Endpoint, headers: HeaderMap, body: Bytes) -> Response {
    let arrived = Instant::now();
    let accepted = authorized(&app, &headers).and_then(|()| accept(&app, endpoint, &body, arrived));
    let Accepted { p, rx } = match accepted {
        Ok(a) => a,
        Err(e) => {
            app.metrics.rejected();
            return error(e);
        }
    };
    let id = format!(
        "{}-{:x}",
        match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        },
        rand_id()
    );
    let shape = Shape {
        endpoint,
        id,
        model: app.served_name.clone(),
        created: now_secs(),
    };
    if p.stream {
        stream(shape, rx, p.include_usage)
    } else {
        whole(shape, rx).await
    }
}

/// A request id: time and a process-wide counter, unique within a server's life.
fn rand_id() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (t << 20) ^ N.fetch_add(1, Ordering::Relaxed) as u128
}

fn accept(
    app: &App,
    endpoint: Endpoint,
    body: &[u8],
    arrived: Instant,
) -> Result<Accepted, ApiError> {
    let p = request::parse(endpoint, body, Limits { vocab: app.vocab })?;
    if let Some(m) = p.model.as_deref().filter(|m| *m != app.served_name) {
        return Err(ApiError::unknown_model(m, &app.served_name));
    }
    let sampling = lane_sampling(&p.sampling, &app.acceptance)?;
    let (ids, param) = tokenize(app, &p.input)?;
    let k = app.k;
    if ids.len() + k + 3 > app.max_context as usize {
        return Err(ApiError::field(
            param,
            format!(
                "{} tokens (+{} for drafting) exceed the max context of {} tokens",
                ids.len(),
                k + 3,
                app.max_context
            ),
        ));
    }
    let fits = admission::max_new_tokens(ids.len(), k, app.max_context);
    let max_tokens = match p.max_tokens {
        Some(m) if m > fits as u64 => {
            return Err(ApiError::field(
                match (endpoint, body_has(body, "max_completion_tokens")) {
                    (Endpoint::Chat, true) => "max_completion_tokens",
                    _ => "max_tokens",
                },
                format!(
                    "{m} exceeds the {fits} tokens that fit after the {}-token prompt in the max context of {} tokens",
                    ids.len(),
                    app.max_context
                ),
            ))
        }
        Some(m) => m as usize,
        None => fits,
    };
    let (tx, rx) = unbounded_channel();
    app.queue.submit(Job {
        ids,
        max_tokens,
        stop: p.stop.clone(),
        ignore_eos: p.ignore_eos,
        sampling,
        arrived,
        events: tx,
    })?;
    Ok(Accepted { p, rx })
}

/// A request's RNG stream: its `seed`'s (the same seed draws the same numbers in any lane,
/// next to any other requests), else one no recent request had.
fn stream_of(seed: Option<u64>) -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    match seed {
        Some(s) => specc_ir::interp::splitmix64(s) as u32,
        None => NEXT.fetch_add(1, Ordering::Relaxed),
    }
}

fn body_has(body: &[u8], key: &str) -> bool {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get(key).map(|x| !x.is_null()))
        .unwrap_or(false)
}

/// A request's lane knobs. A sampling engine reads temperature, top-k and top-p per lane
/// from device state, so any request gets its own (the engine's where it sends none;
/// temperature 0 is greedy, exactly the target's argmax, next to sampled lanes); a greedy
/// engine's step graph only takes the argmax, so it refuses a temperature > 0. The seed picks
/// the lane's RNG stream ([`stream_of`]); the engine's compiled seed is mixed into every draw.
fn lane_sampling(s: &Sampling, engine: &Acceptance) -> Result<LaneSampling, ApiError> {
    let stream = stream_of(s.seed);
    match *engine {
        Acceptance::Greedy => {
            // top_k / top_p keep the argmax and a seed draws nothing: only a temperature
            // asks for another distribution.
            if let Some(t) = s.temperature.filter(|&t| t > 0.0) {
                return Err(ApiError::field(
                    "temperature",
                    format!("this server's engine was compiled for greedy decoding only (its step graph takes the argmax): start it on a model directory, or with --temperature {t}, to sample; send 0 or leave it out"),
                ));
            }
            Ok(LaneSampling::greedy(stream))
        }
        Acceptance::Sample { .. } => {
            let d = LaneSampling::defaults(engine, stream);
            Ok(LaneSampling {
                stream,
                temperature: s.temperature.map_or(d.temperature, |t| t as f32),
                top_k: s
                    .top_k
                    .map_or(d.top_k, |k| u32::try_from(k).unwrap_or(u32::MAX)),
                top_p: s.top_p.map_or(d.top_p, |p| p as f32),
            })
        }
    }
}

/// The prompt's token ids, and the field they came from.
fn tokenize(app: &App, input: &Input) -> Result<(Vec<u32>, &'static str), ApiError> {
    let encode = |text: &str, param: &'static str| {
        app.codec
            .encode(text)
            .map_err(|e| ApiError::field(param, e.to_string()))
    };
    let with_bos = |mut ids: Vec<u32>| {
        if let Some(b) = app.bos {
            ids.insert(0, b);
        }
        ids
    };
    let (ids, param) = match input {
        Input::Prompt(Prompt::Ids(ids)) => (ids.clone(), "prompt"),
        Input::Prompt(Prompt::Text(t)) => (with_bos(encode(t, "prompt")?), "prompt"),
        Input::Chat(msgs) => {
            let Some(t) = &app.template else {
                return Err(ApiError::field(
                    "messages",
                    "this model has no chat template (chat_template.jinja, or chat_template in tokenizer_config.json); use /v1/completions",
                ));
            };
            let text = t.render(msgs)?;
            // A template that writes the BOS text itself gets no second one.
            let ids = match text.strip_prefix(&t.bos).filter(|_| !t.bos.is_empty()) {
                Some(rest) => with_bos(encode(rest, "messages")?),
                None => with_bos(encode(&text, "messages")?),
            };
            (ids, "messages")
        }
    };
    if ids.is_empty() {
        return Err(ApiError::field(param, "the prompt has no tokens"));
    }
    Ok((ids, param))
}

/// What every response of one request shares.
struct Shape {
    endpoint: Endpoint,
    id: String,
    model: String,
    created: u64,
}

impl Shape {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn wrap(&self, chunk: bool, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    /// A streamed choice carrying `text` (or, with `finish`, the end).
    fn delta(&self, text: Option<&str>, role: bool, finish: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Completions => json!({
                "index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish,
            }),
            Endpoint::Chat => {
                let mut d = json!({});
                if role {
                    d["role"] = json!("assistant");
                }
                if let Some(t) = text {
                    d["content"] = json!(t);
                }
                json!({"index": 0, "delta": d, "logprobs": null, "finish_reason": finish})
            }
        }
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

async fn whole(shape: Shape, mut rx: UnboundedReceiver<Event>) -> Response {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Failed(e) => return error(ApiError::internal(e)),
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
            } => {
                let choice = match shape.endpoint {
                    Endpoint::Completions => json!({
                        "index": 0, "text": text, "logprobs": null, "finish_reason": finish.as_str(),
                    }),
                    Endpoint::Chat => json!({
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": null,
                        "finish_reason": finish.as_str(),
                    }),
                };
                let body = shape.wrap(
                    false,
                    json!([choice]),
                    Some(usage(prompt_tokens, completion_tokens)),
                );
                return axum::Json(body).into_response();
            }
        }
    }
    error(ApiError::internal("the engine loop dropped the request"))
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Server-sent events: one chunk per text delta, the finish chunk, the usage chunk when
/// asked (`stream_options.include_usage`), then `data: [DONE]`.
fn stream(shape: Shape, rx: UnboundedReceiver<Event>, include_usage: bool) -> Response {
    struct St {
        shape: Shape,
        rx: UnboundedReceiver<Event>,
        include_usage: bool,
        first: bool,
        done: bool,
    }
    let st = St {
        shape,
        rx,
        include_usage,
        first: true,
        done: false,
    };
    let body = futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let mut out = Vec::new();
        if st.first && st.shape.endpoint == Endpoint::Chat {
            let role = st.shape.delta(Some(""), true, None);
            out.extend_from_slice(&sse(&st.shape.wrap(true, json!([role]), None)));
        }
        st.first = false;
        match st.rx.recv().await {
            Some(Event::Text(t)) => {
                let c = st.shape.delta(Some(&t), false, None);
                out.extend_from_slice(&sse(&st.shape.wrap(true, json!([c]), None)));
            }
            Some(Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
            }) => {
                let c = st.shape.delta(None, false, Some(finish.as_str()));
                out.extend_from_slice(&sse(&st.shape.wrap(true, json!([c]), None)));
                if st.include_usage {
                    let u = usage(prompt_tokens, completion_tokens);
                    out.extend_from_slice(&sse(&st.shape.wrap(true, json!([]), Some(u))));
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                st.done = true;
            }
            Some(Event::Failed(e)) => {
                out.extend_from_slice(&sse(&ApiError::internal(e).to_json()));
                out.extend_from_slice(b"data: [DONE]\n\n");
                st.done = true;
            }
            None => {
                let e = ApiError::internal("the engine loop dropped the request");
                out.extend_from_slice(&sse(&e.to_json()));
                out.extend_from_slice(b"data: [DONE]\n\n");
                st.done = true;
            }
        }
        Some((Ok::<_, Infallible>(Bytes::from(out)), st))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| error(ApiError::internal("cannot build the event stream")))
}
