//! A tiny OpenAI-style server for testing `specc bench-serve`: plain threads on
//! 127.0.0.1 (port 0), HTTP/1.1 written by hand. It streams a known number of chunks with
//! known delays and records what it was sent.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How the mock answers `POST /v1/completions`.
#[derive(Clone, Debug)]
pub struct Behaviour {
    /// Delay before the first chunk, and between chunks.
    pub first_delay: Duration,
    pub gap: Duration,
    /// Tokens each chunk stands for: a request of max_tokens M gets ⌈M / this⌉ chunks.
    pub tokens_per_chunk: usize,
    /// Send the final `usage` chunk (completion_tokens = M).
    pub usage: bool,
    /// Chunked transfer encoding with keep-alive; otherwise `Connection: close` and the
    /// body runs to the end of the connection.
    pub chunked: bool,
    /// Answer every completion request with this status and body instead.
    pub fail: Option<(u16, &'static str)>,
    /// Stream this text as one event payload instead of the token chunks.
    pub malformed: Option<&'static str>,
    /// Send headers, then nothing (for timeouts).
    pub stall: bool,
    /// The `GET /v1/models` answer.
    pub models: &'static str,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            first_delay: Duration::from_millis(40),
            gap: Duration::from_millis(10),
            tokens_per_chunk: 1,
            usage: true,
            chunked: true,
            fail: None,
            malformed: None,
            stall: false,
            models: r#"{"object":"list","data":[{"id":"mock-model","object":"model"}]}"#,
        }
    }
}

/// One request the mock received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Header names lower-cased.
    pub headers: HashMap<String, String>,
    pub body: serde_json::Value,
}

pub struct Mock {
    pub url: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub connections: Arc<AtomicUsize>,
    pub max_in_flight: Arc<AtomicUsize>,
}

impl Mock {
    pub fn start(behaviour: Behaviour) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let mock = Mock {
            url,
            seen: Arc::default(),
            connections: Arc::default(),
            max_in_flight: Arc::default(),
        };
        let shared = Shared {
            behaviour,
            seen: mock.seen.clone(),
            in_flight: Arc::default(),
            max_in_flight: mock.max_in_flight.clone(),
        };
        let connections = mock.connections.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                connections.fetch_add(1, Ordering::SeqCst);
                let shared = shared.clone();
                thread::spawn(move || {
                    // A client that hangs up mid-stream is not the mock's failure.
                    let _ = serve_connection(stream, &shared);
                });
            }
        });
        mock
    }

    pub fn completions(&self) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.path == "/v1/completions")
            .cloned()
            .collect()
    }

    pub fn model_lists(&self) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|s| s.path == "/v1/models").count()
    }
}

#[derive(Clone)]
struct Shared {
    behaviour: Behaviour,
    seen: Arc<Mutex<Vec<Seen>>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

/// One completion counted in flight from its request until just before its last event: a
/// client may send its next request (on a new connection) as soon as it reads `[DONE]`,
/// before this thread could count the first one out after writing it.
struct InFlight<'a> {
    count: &'a AtomicUsize,
    ended: bool,
}

impl<'a> InFlight<'a> {
    fn start(shared: &'a Shared) -> Self {
        let n = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_in_flight.fetch_max(n, Ordering::SeqCst);
        InFlight {
            count: &shared.in_flight,
            ended: false,
        }
    }

    fn end(&mut self) {
        if !std::mem::replace(&mut self.ended, true) {
            self.count.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.end();
    }
}

fn serve_connection(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = stream;
    loop {
        let Some(req) = read_request(&mut reader)? else {
            return Ok(());
        };
        shared.seen.lock().unwrap().push(req.clone());
        let keep_alive = match req.path.as_str() {
            "/v1/models" => {
                respond(&mut out, 200, "application/json", shared.behaviour.models)?;
                true
            }
            "/v1/completions" => {
                let mut request = InFlight::start(shared);
                stream_completion(&mut out, &req, &shared.behaviour, &mut request)?
            }
            _ => {
                respond(
                    &mut out,
                    404,
                    "application/json",
                    r#"{"detail":"Not Found"}"#,
                )?;
                true
            }
        };
        if !keep_alive {
            return Ok(());
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Seen>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let body = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    Ok(Some(Seen {
        method,
        path,
        headers,
        body,
    }))
}

fn respond(out: &mut TcpStream, status: u16, ct: &str, body: &str) -> std::io::Result<()> {
    write!(
        out,
        "HTTP/1.1 {status} X\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Streams the answer; returns whether the connection stays open.
fn stream_completion(
    out: &mut TcpStream,
    req: &Seen,
    b: &Behaviour,
    request: &mut InFlight,
) -> std::io::Result<bool> {
    if let Some((status, body)) = b.fail {
        respond(out, status, "application/json", body)?;
        return Ok(true);
    }
    let head = if b.chunked {
        "Transfer-Encoding: chunked\r\n"
    } else {
        "Connection: close\r\n"
    };
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n{head}\r\n"
    )?;
    out.flush()?;
    if b.stall {
        thread::sleep(Duration::from_secs(30));
        return Ok(false);
    }
    let mut send = |text: &str| -> std::io::Result<()> {
        if b.chunked {
            write!(out, "{:x}\r\n{text}\r\n", text.len())?;
        } else {
            out.write_all(text.as_bytes())?;
        }
        out.flush()
    };
    thread::sleep(b.first_delay);
    if let Some(bad) = b.malformed {
        send(&format!("data: {bad}\n\n"))?;
    } else {
        let max_tokens = req.body["max_tokens"].as_u64().unwrap_or(16) as usize;
        let chunks = max_tokens.div_ceil(b.tokens_per_chunk);
        for i in 0..chunks {
            if i > 0 {
                thread::sleep(b.gap);
            }
            let text = " tok".repeat(b.tokens_per_chunk);
            send(&format!(
                "data: {{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"{text}\",\"finish_reason\":null}}]}}\n\n"
            ))?;
        }
        if b.usage {
            send(&format!(
                "data: {{\"id\":\"cmpl-1\",\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{max_tokens},\"total_tokens\":{}}}}}\n\n",
                max_tokens + 5
            ))?;
        }
    }
    request.end();
    send("data: [DONE]\n\n")?;
    if b.chunked {
        out.write_all(b"0\r\n\r\n")?;
        out.flush()?;
    }
    Ok(b.chunked)
}
