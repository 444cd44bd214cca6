//! Chat templates: `chat_template.jinja` in the model directory, else `chat_template` in
//! `tokenizer_config.json` (a string, or a list of `{name, template}` of which `default`
//! or the first is used), rendered with minijinja over `messages`, `add_generation_prompt`,
//! `bos_token` and `eos_token` (Python string methods such as `.strip()` work, as in
//! Hugging Face's renderer; `raise_exception(msg)` fails the request with `msg`).

use std::path::Path;

use anyhow::{bail, Context, Result};
use minijinja::{Environment, ErrorKind};
use serde_json::{json, Value};

use super::errors::ApiError;
use super::request::Message;

pub const TEMPLATE_FILE: &str = "chat_template.jinja";
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";

pub struct ChatTemplate {
    source: String,
    /// Where it came from, for messages.
    pub origin: String,
    pub bos: String,
    pub eos: String,
}

/// A special token's text in `tokenizer_config.json`: a string or `{"content": ...}`.
fn token_field(cfg: &Value, key: &str) -> Option<String> {
    match cfg.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// The model directory's template, if it has one. `bos` / `eos` are the vocabulary's
    /// texts of the config's ids, used when `tokenizer_config.json` does not name them.
    pub fn load(model_dir: &Path, bos: String, eos: String) -> Result<Option<ChatTemplate>> {
        let cfg_path = model_dir.join(TOKENIZER_CONFIG);
        let cfg: Option<Value> = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => Some(
                serde_json::from_str(&text)
                    .with_context(|| format!("{}: not valid JSON", cfg_path.display()))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", cfg_path.display())),
        };
        let bos = cfg
            .as_ref()
            .and_then(|c| token_field(c, "bos_token"))
            .unwrap_or(bos);
        let eos = cfg
            .as_ref()
            .and_then(|c| token_field(c, "eos_token"))
            .unwrap_or(eos);
        let file = model_dir.join(TEMPLATE_FILE);
        let (source, origin) = if file.is_file() {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            (text, file.display().to_string())
        } else {
            let Some(t) = cfg.as_ref().and_then(|c| c.get("chat_template")) else {
                return Ok(None);
            };
            let origin = format!("{} (chat_template)", cfg_path.display());
            match t {
                Value::String(s) => (s.clone(), origin),
                Value::Array(list) => {
                    let named = |n: &str| {
                        list.iter()
                            .find(|e| e.get("name").and_then(Value::as_str) == Some(n))
                    };
                    let entry = named("default").or(list.first());
                    match entry.and_then(|e| e.get("template")).and_then(Value::as_str) {
                        Some(s) => (s.to_string(), origin),
                        None => bail!(
                            "{origin}: expected a list of {{\"name\", \"template\"}} objects with a template string"
                        ),
                    }
                }
                _ => bail!("{origin}: expected a string or a list of named templates"),
            }
        };
        let t = ChatTemplate {
            source,
            origin,
            bos,
            eos,
        };
        // A template that does not parse is a startup error, not one per request.
        t.env()
            .template_from_str(&t.source)
            .with_context(|| format!("{}: the chat template does not parse", t.origin))?;
        Ok(Some(t))
    }

    fn env(&self) -> Environment<'_> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env
    }

    /// The prompt text of `messages`, ending with the assistant's turn opened.
    pub fn render(&self, messages: &[Message]) -> Result<String, ApiError> {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        let ctx = json!({
            "messages": msgs,
            "add_generation_prompt": true,
            "bos_token": self.bos,
            "eos_token": self.eos,
        });
        self.env().render_str(&self.source, ctx).map_err(|e| {
            let mut msg = e.to_string();
            if let Some(d) = e.detail() {
                if !msg.contains(d) {
                    msg = format!("{msg}: {d}");
                }
            }
            ApiError::field(
                "messages",
                format!("the chat template ({}) rejected them: {msg}", self.origin),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(s: &str) -> Message {
        Message {
            role: "user".into(),
            content: s.into(),
        }
    }

    #[test]
    fn tokenizer_config_templates_render() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = json!({
            "bos_token": {"content": "<s>"},
            "eos_token": "</s>",
            "chat_template": [
                {"name": "tool_use", "template": "no"},
                {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content.strip() }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"},
            ]
        });
        std::fs::write(dir.path().join(TOKENIZER_CONFIG), cfg.to_string()).unwrap();
        let t = ChatTemplate::load(dir.path(), "B".into(), "E".into())
            .unwrap()
            .unwrap();
        assert_eq!(
            t.render(&[user("  hi  ")]).unwrap(),
            "<s>[user] hi</s>[assistant]"
        );
    }

    #[test]
    fn raise_exception_is_a_400_naming_messages() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(TEMPLATE_FILE),
            "{% if messages[0].role != 'system' %}{{ raise_exception('first must be system') }}{% endif %}",
        )
        .unwrap();
        let t = ChatTemplate::load(dir.path(), "B".into(), "E".into())
            .unwrap()
            .unwrap();
        let e = t.render(&[user("x")]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains("first must be system"), "{}", e.message);
    }

    #[test]
    fn the_embedded_default_has_one() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/default");
        let t = ChatTemplate::load(&dir, "B".into(), "E".into())
            .unwrap()
            .unwrap();
        let text = t.render(&[user("sort a list\nquickly")]).unwrap();
        assert_eq!(text, "# user: sort a list\n# quickly\n# assistant:");
    }
}
