//! Parsing of `/v1/completions` and `/v1/chat/completions` bodies into what the batcher
//! serves. Every field is checked for its type and range here, and every rejection is a
//! 400 naming the field; unknown fields are ignored (clients send extras). Nothing here
//! tokenizes: the prompt's length is checked against the context once it is tokenized.

use serde_json::{Map, Value};

use super::errors::ApiError;

/// Which endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    /// Token ids, used as given (no BOS is added).
    Ids(Vec<u32>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Prompt(Prompt),
    Chat(Vec<Message>),
}

/// The sampling fields as sent (absent: the server's own).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// `Some(0)` for the "disabled" values −1 and 0 (every token).
    pub top_k: Option<u64>,
    pub seed: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    pub model: Option<String>,
    pub input: Input,
    pub max_tokens: Option<u64>,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
}

/// What the parser checks ids against.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub vocab: usize,
}

/// The most stop strings a request may carry.
pub const MAX_STOPS: usize = 16;
/// The most chat messages a request may carry.
pub const MAX_MESSAGES: usize = 4096;

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn expected(param: &str, what: &str, found: &Value) -> ApiError {
    ApiError::field(
        param,
        format!("expected {what}, found {}", type_name(found)),
    )
}

/// The field's value, with JSON `null` read as absent.
fn get<'a>(o: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

fn opt_bool(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(expected(key, "a boolean", v)),
    }
}

fn opt_number(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(ApiError::field(key, "expected a finite number")),
        },
        Some(v) => Err(expected(key, "a number", v)),
    }
}

fn opt_int(o: &Map<String, Value>, key: &str) -> Result<Option<i64>, ApiError> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Ok(Some(i)),
            (None, Some(_)) => Ok(Some(i64::MAX)),
            _ => Err(ApiError::field(
                key,
                format!("expected an integer, found {n}"),
            )),
        },
        Some(v) => Err(expected(key, "an integer", v)),
    }
}

fn opt_string(o: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(expected(key, "a string", v)),
    }
}

/// A field this server does not implement: absent, null, or its no-op value.
fn unsupported(
    o: &Map<String, Value>,
    key: &str,
    no_op: impl Fn(&Value) -> bool,
    why: &str,
) -> Result<(), ApiError> {
    match get(o, key) {
        Some(v) if !no_op(v) => Err(ApiError::field(key, why.to_string())),
        _ => Ok(()),
    }
}

fn is_number(v: &Value, x: f64) -> bool {
    v.as_f64() == Some(x)
}

/// Parses one request body for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8], limits: Limits) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::body(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::body(format!(
            "the request body must be a JSON object, found {}",
            type_name(&v)
        )));
    };
    let model = opt_string(&o, "model")?;
    let input = match endpoint {
        Endpoint::Completions => Input::Prompt(prompt(&o, limits)?),
        Endpoint::Chat => Input::Chat(messages(&o)?),
    };
    let mut max_tokens = opt_int(&o, "max_tokens")?.map(|n| (n, "max_tokens"));
    if endpoint == Endpoint::Chat {
        if let Some(n) = opt_int(&o, "max_completion_tokens")? {
            max_tokens = Some((n, "max_completion_tokens"));
        }
    }
    let max_tokens = match max_tokens {
        Some((n, key)) if n <= 0 => {
            return Err(ApiError::field(
                key,
                format!("expected an integer >= 1, found {n}"),
            ))
        }
        Some((n, _)) => Some(n as u64),
        None => None,
    };
    let sampling = sampling(&o)?;
    let stop = stops(&o)?;
    let ignore_eos = opt_bool(&o, "ignore_eos")?.unwrap_or(false);
    let stream = opt_bool(&o, "stream")?.unwrap_or(false);
    let include_usage = match get(&o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => {
            let u = opt_bool(so, "include_usage").map_err(|_| {
                expected(
                    "stream_options.include_usage",
                    "a boolean",
                    &so["include_usage"],
                )
            })?;
            u.unwrap_or(false)
        }
        Some(v) => return Err(expected("stream_options", "an object", v)),
    };
    match opt_int(&o, "n")? {
        None | Some(1) => {}
        Some(n) => {
            return Err(ApiError::field(
                "n",
                format!("only n = 1 is supported, found {n}"),
            ))
        }
    }
    match opt_int(&o, "best_of")? {
        None | Some(1) => {}
        Some(n) => {
            return Err(ApiError::field(
                "best_of",
                format!("only best_of = 1 is supported, found {n}"),
            ))
        }
    }
    let no_logprobs = "log-probabilities are not returned by this server (the step graph emits tokens only); leave it out";
    unsupported(&o, "logprobs", |v| *v == Value::Bool(false), no_logprobs)?;
    unsupported(&o, "top_logprobs", |v| is_number(v, 0.0), no_logprobs)?;
    unsupported(
        &o,
        "echo",
        |v| *v == Value::Bool(false),
        "echo is not supported",
    )?;
    unsupported(&o, "suffix", |_| false, "suffix is not supported")?;
    for key in ["presence_penalty", "frequency_penalty"] {
        unsupported(
            &o,
            key,
            |v| is_number(v, 0.0),
            "penalties are not supported (only 0)",
        )?;
    }
    unsupported(
        &o,
        "repetition_penalty",
        |v| is_number(v, 1.0),
        "penalties are not supported (only 1)",
    )?;
    unsupported(
        &o,
        "tools",
        |v| v.as_array().is_some_and(|a| a.is_empty()),
        "tool calls are not supported",
    )?;
    Ok(Parsed {
        model,
        input,
        max_tokens,
        sampling,
        stop,
        ignore_eos,
        stream,
        include_usage,
    })
}

fn ids(param: &str, a: &[Value], limits: Limits) -> Result<Vec<u32>, ApiError> {
    if a.is_empty() {
        return Err(ApiError::field(param, "expected at least one token id"));
    }
    a.iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(id) if (id as usize) < limits.vocab && id <= u32::MAX as u64 => Ok(id as u32),
            _ => Err(ApiError::field(
                format!("{param}[{i}]"),
                format!(
                    "expected a token id in 0..{}, found {}",
                    limits.vocab,
                    match v {
                        Value::Number(n) => n.to_string(),
                        other => type_name(other).to_string(),
                    }
                ),
            )),
        })
        .collect()
}

fn prompt(o: &Map<String, Value>, limits: Limits) -> Result<Prompt, ApiError> {
    let one = "one prompt per request is supported (n = 1)";
    let text = |s: &str| {
        if s.is_empty() {
            Err(ApiError::field("prompt", "expected a non-empty string"))
        } else {
            Ok(Prompt::Text(s.to_string()))
        }
    };
    match get(o, "prompt") {
        None => Err(ApiError::field("prompt", "required")),
        Some(Value::String(s)) => text(s),
        Some(Value::Array(a)) => match a.first() {
            None => Err(ApiError::field("prompt", "expected a non-empty array")),
            Some(Value::Number(_)) => Ok(Prompt::Ids(ids("prompt", a, limits)?)),
            Some(Value::String(s)) if a.len() == 1 => text(s),
            Some(Value::Array(inner)) if a.len() == 1 => {
                Ok(Prompt::Ids(ids("prompt[0]", inner, limits)?))
            }
            Some(Value::String(_) | Value::Array(_)) => Err(ApiError::field(
                "prompt",
                format!("{one}, found a list of {}", a.len()),
            )),
            Some(v) => Err(expected(
                "prompt[0]",
                "a token id, a string or an array of token ids",
                v,
            )),
        },
        Some(v) => Err(expected("prompt", "a string or an array of token ids", v)),
    }
}

fn messages(o: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let list = match get(o, "messages") {
        None => return Err(ApiError::field("messages", "required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::field("messages", "expected at least one message"))
        }
        Some(Value::Array(a)) if a.len() > MAX_MESSAGES => {
            return Err(ApiError::field(
                "messages",
                format!("at most {MAX_MESSAGES} messages, found {}", a.len()),
            ))
        }
        Some(Value::Array(a)) => a,
        Some(v) => return Err(expected("messages", "an array of messages", v)),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("messages[{i}]");
            let Value::Object(m) = m else {
                return Err(expected(&at, "an object", m));
            };
            let role = match get(m, "role") {
                Some(Value::String(r)) => match r.as_str() {
                    "system" | "user" | "assistant" | "developer" | "tool" => r.clone(),
                    _ => {
                        return Err(ApiError::field(
                            format!("{at}.role"),
                            format!(
                            "expected one of system, developer, user, assistant, tool; found {r:?}"
                        ),
                        ))
                    }
                },
                None => return Err(ApiError::field(format!("{at}.role"), "required")),
                Some(v) => return Err(expected(&format!("{at}.role"), "a string", v)),
            };
            let content = match get(m, "content") {
                None if role == "assistant" => String::new(),
                None => return Err(ApiError::field(format!("{at}.content"), "required")),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => text_parts(&at, parts)?,
                Some(v) => {
                    return Err(expected(
                        &format!("{at}.content"),
                        "a string or an array of text parts",
                        v,
                    ))
                }
            };
            Ok(Message { role, content })
        })
        .collect()
}

/// The text of `[{"type": "text", "text": ...}, ...]` content, concatenated.
fn text_parts(at: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut out = String::new();
    for (j, p) in parts.iter().enumerate() {
        let here = format!("{at}.content[{j}]");
        let Value::Object(p) = p else {
            return Err(expected(&here, "an object", p));
        };
        match get(p, "type") {
            Some(Value::String(t)) if t == "text" => {}
            Some(Value::String(t)) => {
                return Err(ApiError::field(
                    format!("{here}.type"),
                    format!("only text parts are supported, found {t:?}"),
                ))
            }
            Some(v) => return Err(expected(&format!("{here}.type"), "a string", v)),
            None => return Err(ApiError::field(format!("{here}.type"), "required")),
        }
        match get(p, "text") {
            Some(Value::String(s)) => out.push_str(s),
            Some(v) => return Err(expected(&format!("{here}.text"), "a string", v)),
            None => return Err(ApiError::field(format!("{here}.text"), "required")),
        }
    }
    Ok(out)
}

fn sampling(o: &Map<String, Value>) -> Result<Sampling, ApiError> {
    let temperature = opt_number(o, "temperature")?;
    if let Some(t) = temperature.filter(|&t| t < 0.0) {
        return Err(ApiError::field(
            "temperature",
            format!("expected a number >= 0, found {t}"),
        ));
    }
    let top_p = opt_number(o, "top_p")?;
    if let Some(p) = top_p.filter(|&p| !(p > 0.0 && p <= 1.0)) {
        return Err(ApiError::field(
            "top_p",
            format!("expected a number in (0, 1], found {p}"),
        ));
    }
    let top_k = match opt_int(o, "top_k")? {
        None => None,
        // Every token, whatever the server's default.
        Some(-1) | Some(0) => Some(0),
        Some(k) if k < -1 => {
            return Err(ApiError::field(
                "top_k",
                format!("expected an integer >= 1 (or -1 / 0: all tokens), found {k}"),
            ))
        }
        Some(k) => Some(k as u64),
    };
    let seed = match get(o, "seed") {
        None => None,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(s), _) => Some(s),
            // A negative seed keeps its bits (OpenAI's are signed 64-bit).
            (None, Some(s)) => Some(s as u64),
            _ => {
                return Err(ApiError::field(
                    "seed",
                    format!("expected an integer, found {n}"),
                ))
            }
        },
        Some(v) => return Err(expected("seed", "an integer", v)),
    };
    Ok(Sampling {
        temperature,
        top_p,
        top_k,
        seed,
    })
}

fn stops(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let list = match get(o, "stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, s)| match s {
                Value::String(s) => Ok(s.clone()),
                v => Err(expected(&format!("stop[{i}]"), "a string", v)),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(expected("stop", "a string or an array of strings", v)),
    };
    if list.len() > MAX_STOPS {
        return Err(ApiError::field(
            "stop",
            format!("at most {MAX_STOPS} stop strings, found {}", list.len()),
        ));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits { vocab: 512 };

    fn err(endpoint: Endpoint, body: &str) -> ApiError {
        parse(endpoint, body.as_bytes(), L).unwrap_err()
    }

    #[test]
    fn accepts_the_usual_shapes() {
        let p = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"def ","max_tokens":8,"stop":["\n"],"stream":true,"stream_options":{"include_usage":true},"n":1,"logprobs":null}"#,
            L,
        )
        .unwrap();
        assert_eq!(p.input, Input::Prompt(Prompt::Text("def ".into())));
        assert_eq!(
            (p.max_tokens, p.stream, p.include_usage),
            (Some(8), true, true)
        );
        assert_eq!(p.stop, vec!["\n".to_string()]);
        let p = parse(Endpoint::Completions, br#"{"prompt":[[3,4,5]]}"#, L).unwrap();
        assert_eq!(p.input, Input::Prompt(Prompt::Ids(vec![3, 4, 5])));
        let p = parse(
            Endpoint::Chat,
            br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":4,"top_k":-1}"#,
            L,
        )
        .unwrap();
        assert_eq!(
            p.input,
            Input::Chat(vec![
                Message {
                    role: "system".into(),
                    content: "be brief".into()
                },
                Message {
                    role: "user".into(),
                    content: "hi".into()
                },
            ])
        );
        assert_eq!((p.max_tokens, p.sampling.top_k), (Some(4), Some(0)));
    }

    #[test]
    fn rejections_name_the_field() {
        for (endpoint, body, param) in [
            (Endpoint::Completions, "{", None),
            (Endpoint::Completions, "[1]", None),
            (Endpoint::Completions, "{}", Some("prompt")),
            (Endpoint::Completions, r#"{"prompt":7}"#, Some("prompt")),
            (
                Endpoint::Completions,
                r#"{"prompt":[1,512]}"#,
                Some("prompt[1]"),
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":"a","max_tokens":0}"#,
                Some("max_tokens"),
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":"a","max_tokens":"8"}"#,
                Some("max_tokens"),
            ),
            (Endpoint::Completions, r#"{"prompt":"a","n":2}"#, Some("n")),
            (
                Endpoint::Completions,
                r#"{"prompt":"a","logprobs":2}"#,
                Some("logprobs"),
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":"a","top_p":0}"#,
                Some("top_p"),
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":"a","temperature":-1}"#,
                Some("temperature"),
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":"a","stop":[1]}"#,
                Some("stop[0]"),
            ),
            (
                Endpoint::Completions,
                r#"{"prompt":"a","model":3}"#,
                Some("model"),
            ),
            (Endpoint::Chat, r#"{"messages":[]}"#, Some("messages")),
            (
                Endpoint::Chat,
                r#"{"messages":[{"role":"king","content":"x"}]}"#,
                Some("messages[0].role"),
            ),
            (
                Endpoint::Chat,
                r#"{"messages":[{"role":"user"}]}"#,
                Some("messages[0].content"),
            ),
            (
                Endpoint::Chat,
                r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
                Some("messages[0].content[0].type"),
            ),
            (
                Endpoint::Chat,
                r#"{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}}"#,
                Some("stream_options.include_usage"),
            ),
        ] {
            let e = err(endpoint, body);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
            if let Some(p) = param {
                assert!(e.message.starts_with(p), "{}", e.message);
            }
        }
    }
}
