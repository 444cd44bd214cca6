//! OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}` with the
//! HTTP status that goes with them. Every rejected request gets one; none panics.

use serde_json::{json, Value};

/// A request the server will not serve, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, ...
    pub kind: &'static str,
    /// The request field at fault (`max_tokens`, `messages[2].content`), when one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (queue full).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400 for field `param`.
    pub fn field(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        let param = param.into();
        ApiError {
            status: 400,
            message: format!("{param}: {}", message.into()),
            kind: "invalid_request_error",
            param: Some(param),
            code: None,
            retry_after: None,
        }
    }

    /// 400 about the body as a whole (not JSON, not an object).
    pub fn body(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: 401,
            message:
                "invalid API key: pass `Authorization: Bearer KEY` with the server's --api-key"
                    .into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    pub fn unknown_model(asked: &str, served: &str) -> ApiError {
        ApiError {
            status: 404,
            message: format!("model: {asked:?} does not exist; this server serves {served:?}"),
            kind: "not_found_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
            retry_after: None,
        }
    }

    pub fn overloaded(queue: usize) -> ApiError {
        ApiError {
            status: 503,
            message: format!(
                "the server's queue is full ({queue} requests waiting, --max-queue); retry later"
            ),
            kind: "server_overloaded",
            param: None,
            code: Some("queue_full"),
            retry_after: Some(1),
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 500,
            message: message.into(),
            kind: "internal_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn not_found(path: &str) -> ApiError {
        ApiError {
            status: 404,
            message: format!("no route {path}"),
            kind: "not_found_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}
