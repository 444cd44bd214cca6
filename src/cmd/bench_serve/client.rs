//! The HTTP side: plain HTTP/1.1 over one TCP connection per worker (kept alive between its
//! requests), `GET /v1/models` and streamed `POST /v1/completions`.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::sse::SseParser;
use super::stats::RequestRecord;

pub type Sender = SendRequest<Full<Bytes>>;

/// Where the server listens, from `--url`.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The URL as given (for messages).
    pub url: String,
    /// `host:port` to connect to and to send as `Host`.
    authority: String,
    /// Path prefix before `/v1/...`, without a trailing `/` (usually empty).
    prefix: String,
    api_key: Option<String>,
}

impl Endpoint {
    /// `http://host[:port][/prefix]`; a trailing `/v1` is dropped (both `http://h:8000` and
    /// `http://h:8000/v1` name the same server). The scheme defaults to http.
    pub fn parse(url: &str, api_key: Option<String>) -> Result<Self> {
        let with_scheme = if url.contains("://") {
            url.to_string()
        } else {
            format!("http://{url}")
        };
        let uri: Uri = with_scheme
            .parse()
            .map_err(|e| anyhow!("--url {url:?} is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => bail!(
                "--url {url:?}: scheme {other}:// is not supported (bench-serve speaks plain \
                 http://; put a TLS-terminating proxy in front for https)"
            ),
            None => bail!("--url {url:?} has no scheme"),
        }
        let host = uri
            .host()
            .ok_or_else(|| anyhow!("--url {url:?} has no host"))?;
        let port = uri.port_u16().unwrap_or(80);
        let mut prefix = uri.path().trim_end_matches('/').to_string();
        if prefix.ends_with("/v1") {
            prefix.truncate(prefix.len() - 3);
        }
        Ok(Endpoint {
            url: url.to_string(),
            authority: format!("{host}:{port}"),
            prefix,
            api_key,
        })
    }

    fn path(&self, route: &str) -> String {
        format!("{}{route}", self.prefix)
    }

    fn request(&self, method: Method, route: &str, body: Bytes) -> Result<Request<Full<Bytes>>> {
        let mut req = Request::builder()
            .method(method)
            .uri(self.path(route))
            .header(HOST, &self.authority);
        if let Some(key) = &self.api_key {
            req = req.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        if !body.is_empty() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        req.header(ACCEPT, "application/json, text/event-stream")
            .body(Full::new(body))
            .with_context(|| format!("cannot build a request to {}", self.url))
    }

    /// Opens a connection (TCP, no delay, HTTP/1.1 handshake).
    pub async fn connect(&self) -> Result<Sender> {
        let stream = TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("cannot connect to {} ({})", self.url, self.authority))?;
        stream.set_nodelay(true).ok();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("HTTP handshake with {} failed", self.url))?;
        // The connection task ends when the server or the sender closes it; its errors
        // reach the sender's requests, so it has nothing to report itself.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// The first model id `GET /v1/models` lists.
    pub async fn first_model(&self) -> Result<String> {
        let mut sender = self.connect().await?;
        let what = format!("GET {}", self.path("/v1/models"));
        let resp = send(
            &mut sender,
            self.request(Method::GET, "/v1/models", Bytes::new())?,
        )
        .await
        .with_context(|| format!("{what} at {}", self.url))?;
        let resp = check_status(resp, &what).await?;
        let body = resp
            .into_body()
            .collect()
            .await
            .with_context(|| format!("{what}: reading the answer"))?
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body)
            .with_context(|| format!("{what}: the answer is not JSON"))?;
        v["data"][0]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| {
                anyhow!("{what}: the answer lists no model (`data[0].id`); pass --model")
            })
    }

    /// Sends one streamed completion request on `sender` and times its chunks.
    /// `start` is when the caller began (before it obtained the connection).
    pub async fn stream_completion(
        &self,
        sender: &mut Sender,
        body: Bytes,
        start: Instant,
    ) -> Result<RequestRecord> {
        let what = format!("POST {}", self.path("/v1/completions"));
        let resp = send(sender, self.request(Method::POST, "/v1/completions", body)?)
            .await
            .with_context(|| format!("{what} at {}", self.url))?;
        let resp = check_status(resp, &what).await?;
        if let Some(ct) = resp.headers().get(CONTENT_TYPE) {
            let ct = String::from_utf8_lossy(ct.as_bytes());
            if !ct.starts_with("text/event-stream") {
                bail!("{what}: malformed SSE stream: the answer's content type is {ct:?}, not text/event-stream");
            }
        }
        let mut body = resp.into_body();
        let mut parser = SseParser::default();
        let mut stream = StreamState::new(start);
        while let Some(frame) = body.frame().await {
            let frame = frame.with_context(|| format!("{what}: the stream broke off"))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let now = Instant::now();
            for event in parser.push(&data).with_context(|| what.clone())? {
                stream.event(&event, now).with_context(|| what.clone())?;
            }
        }
        if let Some(event) = parser.finish().with_context(|| what.clone())? {
            stream
                .event(&event, Instant::now())
                .with_context(|| what.clone())?;
        }
        if !stream.done {
            bail!("{what}: malformed SSE stream: it ended without `data: [DONE]`");
        }
        Ok(stream.record(Instant::now()))
    }
}

async fn send(
    sender: &mut Sender,
    req: Request<Full<Bytes>>,
) -> Result<Response<hyper::body::Incoming>> {
    sender.ready().await?;
    Ok(sender.send_request(req).await?)
}

/// Passes a 2xx answer through; otherwise an error with the status and the server's message.
async fn check_status(
    resp: Response<hyper::body::Incoming>,
    what: &str,
) -> Result<Response<hyper::body::Incoming>> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let msg = server_message(&body);
    if msg.is_empty() {
        bail!("{what}: HTTP {status}");
    }
    bail!("{what}: HTTP {status}: {msg}")
}

/// The message of an error answer: OpenAI's `{"error": {"message"}}`, vLLM / SGLang's
/// `{"message"}`, FastAPI's `{"detail"}`, else the text itself; on one line, at most 300
/// characters.
pub fn server_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let from_json = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            let pick = |v: &serde_json::Value| -> Option<String> {
                match v {
                    serde_json::Value::String(s) => Some(s.clone()),
                    serde_json::Value::Null => None,
                    other => Some(other.to_string()),
                }
            };
            [
                &v["error"]["message"],
                &v["message"],
                &v["detail"],
                &v["error"],
            ]
            .into_iter()
            .find_map(pick)
        });
    let msg = from_json.unwrap_or_else(|| text.into_owned());
    let one_line = msg.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    }
}

/// What the events of one stream have shown so far.
struct StreamState {
    /// When the caller began the request (TTFT counts from here).
    start: Instant,
    first_text: Option<Instant>,
    last_text: Option<Instant>,
    gaps: Vec<Duration>,
    text_chunks: u64,
    usage_tokens: Option<u64>,
    done: bool,
}

impl StreamState {
    fn new(start: Instant) -> Self {
        StreamState {
            start,
            first_text: None,
            last_text: None,
            gaps: Vec::new(),
            text_chunks: 0,
            usage_tokens: None,
            done: false,
        }
    }

    /// One event's payload, received at `now`. A chunk whose `choices[0].text` is not
    /// empty counts as a token chunk (the usage-only final chunk has `choices: []`).
    fn event(&mut self, data: &str, now: Instant) -> Result<()> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let shown = || data.chars().take(80).collect::<String>();
        if self.done {
            bail!(
                "malformed SSE stream: event {:?} after `data: [DONE]`",
                shown()
            );
        }
        let v: serde_json::Value = serde_json::from_str(data)
            .map_err(|e| anyhow!("malformed SSE event {:?}: {e}", shown()))?;
        if !v["error"].is_null() {
            bail!(
                "the server sent an error in the stream: {}",
                server_message(data.as_bytes())
            );
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            self.usage_tokens = Some(n);
        }
        let Some(choices) = v.get("choices").and_then(|c| c.as_array()) else {
            bail!("malformed SSE event {:?}: no `choices` list", shown());
        };
        let text = choices
            .first()
            .and_then(|c| c["text"].as_str())
            .unwrap_or("");
        if !text.is_empty() {
            match self.last_text {
                Some(last) => self.gaps.push(now - last),
                None => self.first_text = Some(now),
            }
            self.last_text = Some(now);
            self.text_chunks += 1;
        }
        Ok(())
    }

    fn record(self, end: Instant) -> RequestRecord {
        RequestRecord {
            ttft: self.first_text.map(|t| t - self.start),
            chunk_gaps: self.gaps,
            output_tokens: self.usage_tokens.unwrap_or(self.text_chunks),
            latency: end - self.start,
        }
    }
}
