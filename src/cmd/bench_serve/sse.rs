//! Server-sent events, as far as OpenAI-style streams use them: `data:` fields, events ended
//! by a blank line, `:` comment lines; other fields (`event`, `id`, `retry`) are ignored.

use anyhow::{bail, Result};

/// Splits a byte stream arriving in arbitrary pieces into the data payloads of its events.
#[derive(Default)]
pub struct SseParser {
    /// Bytes of a line not yet ended by `\n`.
    partial: Vec<u8>,
    /// The data lines of the event being read, joined by `\n` (per the SSE rules).
    data: Option<String>,
}

impl SseParser {
    /// Feeds the next piece of the stream; returns the payloads of the events it completed.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>> {
        let mut events = Vec::new();
        self.partial.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(end) = self.partial[start..].iter().position(|&b| b == b'\n') {
            let line_end = start + end;
            let mut line = &self.partial[start..line_end];
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            let Ok(line) = std::str::from_utf8(line) else {
                bail!("malformed SSE stream: a line is not UTF-8");
            };
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    events.push(data);
                }
            } else if !line.starts_with(':') {
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                if field == "data" {
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match &mut self.data {
                        Some(d) => {
                            d.push('\n');
                            d.push_str(value);
                        }
                        None => self.data = Some(value.to_string()),
                    }
                }
            }
            start = line_end + 1;
        }
        self.partial.drain(..start);
        Ok(events)
    }

    /// At the end of the stream: the payload of a last event the server did not end with
    /// a blank line (lenient: some servers close right after the final `data:` line).
    pub fn finish(&mut self) -> Result<Option<String>> {
        if !self.partial.is_empty() {
            let rest = std::mem::take(&mut self.partial);
            self.push(&rest)?;
            self.push(b"\n")?;
        }
        Ok(self.data.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere() {
        let stream = b": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: one\ndata: two\n\ndata:[DONE]\n\n";
        for cut in 0..stream.len() {
            let mut p = SseParser::default();
            let mut got = p.push(&stream[..cut]).unwrap();
            got.extend(p.push(&stream[cut..]).unwrap());
            assert_eq!(got, ["{\"a\":1}", "one\ntwo", "[DONE]"], "cut at {cut}");
            assert_eq!(p.finish().unwrap(), None);
        }
    }

    #[test]
    fn unterminated_last_event() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: x\n\ndata: [DONE]").unwrap() == ["x"]);
        assert_eq!(p.finish().unwrap().as_deref(), Some("[DONE]"));
    }

    #[test]
    fn invalid_utf8_is_an_error() {
        let mut p = SseParser::default();
        let err = p.push(b"data: \xff\xfe\n\n").unwrap_err().to_string();
        assert!(err.contains("malformed SSE"), "{err}");
    }
}
