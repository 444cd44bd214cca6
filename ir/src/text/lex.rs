//! Tokens of one line of IR text, and a cursor over them.
//!
//! The text form is line-oriented: no token spans lines (strings escape their newlines), so
//! every token, and every error, belongs to exactly one line.

use std::fmt;

use crate::ValueId;

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// `%12`
    Value(u32),
    /// `rope`, `bf16`, `B`, `true`, `inf`: `[A-Za-z_][A-Za-z0-9_]*`.
    Ident(String),
    /// `12`, `-1.5e-5`, `-inf`: a digit or sign, then digits, letters, `.`, `_`, and a
    /// sign right after an exponent `e`/`E`.
    Num(String),
    /// `"model.embed_tokens.weight"`, unescaped.
    Str(String),
    /// One of `= , : { } [ ] ( )`.
    Punct(char),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Value(n) => write!(f, "%{n}"),
            Tok::Ident(s) | Tok::Num(s) => f.write_str(s),
            Tok::Str(s) => f.write_str(&quote(s)),
            Tok::Punct(c) => write!(f, "{c}"),
        }
    }
}

/// True if `s` lexes as one [`Tok::Ident`].
pub(super) fn is_ident(s: &str) -> bool {
    let mut cs = s.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `s` as a string literal that [`lex`] reads back to `s`.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Splits one line into tokens; `//` starts a comment that runs to the end of the line.
pub(super) fn lex(line: &str) -> Result<Vec<Tok>, String> {
    let cs: Vec<char> = line.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        let next = cs.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            break;
        } else if "=,:{}[]()".contains(c) {
            toks.push(Tok::Punct(c));
            i += 1;
        } else if c == '%' {
            let start = i + 1;
            i = start;
            while i < cs.len() && cs[i].is_ascii_digit() {
                i += 1;
            }
            let digits: String = cs[start..i].iter().collect();
            let n = digits
                .parse::<u32>()
                .map_err(|_| format!("bad value id `%{digits}`: expected `%` and a number"))?;
            toks.push(Tok::Value(n));
        } else if c == '"' {
            let (s, end) = string(&cs, i + 1)?;
            toks.push(Tok::Str(s));
            i = end;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < cs.len() && (cs[i].is_ascii_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            toks.push(Tok::Ident(cs[start..i].iter().collect()));
        } else if c.is_ascii_digit()
            || ((c == '-' || c == '+')
                && next.is_some_and(|n| n.is_ascii_alphanumeric() || n == '.'))
        {
            let start = i;
            i += 1;
            while i < cs.len() {
                let d = cs[i];
                let exp_sign = (d == '-' || d == '+') && matches!(cs[i - 1], 'e' | 'E');
                if d.is_ascii_alphanumeric() || d == '.' || d == '_' || exp_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            toks.push(Tok::Num(cs[start..i].iter().collect()));
        } else {
            return Err(format!("unexpected character `{c}`"));
        }
    }
    Ok(toks)
}

/// Reads a string body starting after its opening quote; returns it and the index after
/// the closing quote.
fn string(cs: &[char], mut i: usize) -> Result<(String, usize), String> {
    let mut s = String::new();
    while let Some(&c) = cs.get(i) {
        i += 1;
        match c {
            '"' => return Ok((s, i)),
            '\\' => {
                let e = *cs.get(i).ok_or("unterminated string")?;
                i += 1;
                match e {
                    '"' => s.push('"'),
                    '\\' => s.push('\\'),
                    'n' => s.push('\n'),
                    'r' => s.push('\r'),
                    't' => s.push('\t'),
                    'u' => {
                        let close = cs[i..].iter().position(|&c| c == '}');
                        let ok = cs.get(i) == Some(&'{') && close.is_some();
                        let hex: String = match (ok, close) {
                            (true, Some(k)) => cs[i + 1..i + k].iter().collect(),
                            _ => return Err("bad escape: expected `\\u{HEX}`".into()),
                        };
                        let ch = u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .ok_or_else(|| format!("bad escape `\\u{{{hex}}}`"))?;
                        s.push(ch);
                        i += hex.len() + 2;
                    }
                    other => return Err(format!("unknown escape `\\{other}` in string")),
                }
            }
            c => s.push(c),
        }
    }
    Err("unterminated string".into())
}

/// A cursor over one line's tokens. Errors say what was expected and what was found.
pub(super) struct Cursor {
    toks: Vec<Tok>,
    pos: usize,
}

impl Cursor {
    pub(super) fn new(toks: Vec<Tok>) -> Self {
        Cursor { toks, pos: 0 }
    }

    pub(super) fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    pub(super) fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    /// What the next token is, for "expected X, found Y".
    pub(super) fn found(&self) -> String {
        match self.peek() {
            Some(t) => format!("`{t}`"),
            None => "end of line".into(),
        }
    }

    pub(super) fn is_punct(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Punct(c))
    }

    /// Consumes `c` if it is next.
    pub(super) fn eat(&mut self, c: char) -> bool {
        let yes = self.is_punct(c);
        if yes {
            self.pos += 1;
        }
        yes
    }

    pub(super) fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected `{c}`, found {}", self.found()))
        }
    }

    pub(super) fn ident(&mut self, what: &str) -> Result<String, String> {
        match self.peek() {
            Some(Tok::Ident(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(format!("expected {what}, found {}", self.found())),
        }
    }

    pub(super) fn string(&mut self, what: &str) -> Result<String, String> {
        match self.peek() {
            Some(Tok::Str(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(format!("expected {what}, found {}", self.found())),
        }
    }

    pub(super) fn value(&mut self) -> Result<ValueId, String> {
        match self.peek() {
            Some(&Tok::Value(n)) => {
                self.pos += 1;
                Ok(ValueId(n))
            }
            _ => Err(format!("expected a value `%N`, found {}", self.found())),
        }
    }

    pub(super) fn end(&self) -> Result<(), String> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err(format!("unexpected `{t}` at end of line")),
        }
    }
}
