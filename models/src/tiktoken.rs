//! Kimi's tokenizer (`tiktoken.model` + `tokenizer_config.json`, no `tokenizer.json`):
//! byte-level BPE over base64 ranks, through the `tiktoken-rs` crate (OpenAI's tiktoken core:
//! the code the Python reference runs), with Kimi's pre-tokenisation pattern and its layout of
//! special tokens.
//!
//! What `tokenization_kimi.py` defines and this reproduces:
//! - ranks: one `BASE64 RANK` pair per non-empty line; the number of ranks is the number of
//!   base tokens N;
//! - special tokens: the 256 ids N..N+256; an id listed in `tokenizer_config.json`'s
//!   `added_tokens_decoder` has that content, any other is `<|reserved_token_{id}|>`;
//! - encode: special-token text is encoded as the special id (tiktoken's
//!   `allowed_special="all"`); the text is cut into slices of 400 000 characters, each cut
//!   again so that no run of whitespace or non-whitespace exceeds 25 000 characters, and the
//!   slices are encoded one after another;
//! - decode: the tokens' bytes joined, invalid UTF-8 replaced by U+FFFD.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use tiktoken_rs::CoreBPE;

use crate::error::ModelError;
use crate::files::is_regular;
use crate::tokenizer::guarded;

/// Kimi's pre-tokenisation (`pat_str` of tokenization_kimi.py): Han runs are pieces of their
/// own, and the letter classes of the word alternatives have Han subtracted
/// (`[...&&[^\p{Han}]]`), so a Han run and an adjacent Latin word always part.
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// Special ids right above the ranks.
pub const RESERVED_SPECIAL_TOKENS: u32 = 256;
/// Text is encoded in slices of at most this many characters (tokenization_kimi.py).
const MAX_ENCODE_CHARS: usize = 400_000;
/// No slice holds a longer run of whitespace or of non-whitespace characters.
pub const MAX_RUN_CHARS: usize = 25_000;

pub struct Tiktoken {
    bpe: CoreBPE,
    num_base: u32,
    /// Every special token's text and id.
    specials: HashMap<String, u32>,
    /// Special ids that decoding with `skip_special` leaves out: those marked `special` in
    /// `added_tokens_decoder`, the bos / eos / pad / unk tokens, and the unnamed reserved ids.
    /// (Named non-special ones, Kimi's tool-call markers, are text.)
    skipped: HashSet<u32>,
    ranks_file: PathBuf,
}

impl Tiktoken {
    /// Loads `dir/tiktoken.model` and, when present, `dir/tokenizer_config.json`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let ranks_file = dir.join("tiktoken.model");
        let ranks_text = read(&ranks_file)?;
        let config_file = dir.join("tokenizer_config.json");
        let config_text = if is_regular(&config_file)? {
            Some(read(&config_file)?)
        } else {
            None
        };
        Self::from_text(
            &ranks_file,
            &ranks_text,
            &config_file,
            config_text.as_deref(),
        )
    }

    /// Builds the tokenizer from the texts of its files (the paths name them in errors).
    pub fn from_text(
        ranks_file: &Path,
        ranks_text: &str,
        config_file: &Path,
        config_text: Option<&str>,
    ) -> Result<Self, ModelError> {
        let ranks = parse_ranks(ranks_file, ranks_text)?;
        let num_base = ranks.len() as u32;
        let config = match config_text {
            Some(text) => SpecialConfig::parse(config_file, text, num_base)?,
            None => SpecialConfig::default(),
        };
        let mut specials = HashMap::new();
        let mut skipped = HashSet::new();
        for id in num_base..num_base + RESERVED_SPECIAL_TOKENS {
            let (content, special) = match config.added.get(&id) {
                Some((content, special)) => (content.clone(), *special),
                None => (format!("<|reserved_token_{id}|>"), true),
            };
            if special || config.named.contains(&content) {
                skipped.insert(id);
            }
            if let Some(other) = specials.insert(content.clone(), id) {
                return Err(ModelError::Tokenizer {
                    file: config_file.to_path_buf(),
                    msg: format!(
                        "added_tokens_decoder: ids {other} and {id} both have content {content:?}"
                    ),
                });
            }
        }
        // (tiktoken-rs takes its own hasher's maps.)
        let encoder = ranks.into_iter().collect();
        let special_encoder = specials.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let bpe = guarded(|| CoreBPE::new(encoder, special_encoder, KIMI_PATTERN))
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|msg| ModelError::Tokenizer {
                file: ranks_file.to_path_buf(),
                msg: format!("cannot build the BPE: {msg}"),
            })?;
        Ok(Tiktoken {
            bpe,
            num_base,
            specials,
            skipped,
            ranks_file: ranks_file.to_path_buf(),
        })
    }

    pub fn ranks_file(&self) -> &Path {
        &self.ranks_file
    }

    /// The number of ids: the ranks and the reserved block above them.
    pub fn num_ids(&self) -> u32 {
        self.num_base + RESERVED_SPECIAL_TOKENS
    }

    /// The id of a special token's text (`[BOS]`, `<|im_end|>`, ...).
    pub fn special_id(&self, text: &str) -> Option<u32> {
        self.specials.get(text).copied()
    }

    /// The ids of `text` the way Kimi's `encode` gives them (special-token text allowed).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encode_with_max_run(text, MAX_RUN_CHARS)
    }

    /// [`Tiktoken::encode`] with another run limit (tests use a small one).
    pub fn encode_with_max_run(&self, text: &str, max_run: usize) -> Result<Vec<u32>, String> {
        let allowed: HashSet<&str> = self.specials.keys().map(String::as_str).collect();
        let mut ids = Vec::new();
        for slice in char_slices(text, MAX_ENCODE_CHARS) {
            for part in split_runs(slice, max_run) {
                let (part_ids, _) =
                    guarded(|| self.bpe.encode(part, &allowed))?.map_err(|e| e.message.clone())?;
                ids.extend(part_ids);
            }
        }
        Ok(ids)
    }

    /// The text of `ids`; with `skip_special`, the special ids listed at [`Tiktoken`]
    /// are left out. An id past the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, String> {
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| !(skip_special && self.skipped.contains(id)))
            .collect();
        let bytes = self
            .bpe
            .decode_bytes(&kept)
            .map_err(|e| format!("token id {} is outside the vocabulary", e.token))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

fn read(path: &Path) -> Result<String, ModelError> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        file: path.to_path_buf(),
        source,
    })?;
    String::from_utf8(bytes).map_err(|e| ModelError::Tokenizer {
        file: path.to_path_buf(),
        msg: format!("not UTF-8 text ({e})"),
    })
}

/// The ranks of a `tiktoken.model` text: `BASE64 RANK` per non-empty line. The ranks must be
/// exactly 0..n (distinct, no gaps) and every single byte must have one (the BPE starts from
/// bytes); errors name the line.
pub fn parse_ranks(file: &Path, text: &str) -> Result<HashMap<Vec<u8>, u32>, ModelError> {
    use base64::Engine;
    let err = |line: usize, msg: String| ModelError::Tokenizer {
        file: file.to_path_buf(),
        msg: format!("line {line}: {msg}"),
    };
    let mut ranks = HashMap::new();
    let mut line_of_rank: HashMap<u32, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [token, rank] = fields[..] else {
            return Err(err(
                n,
                format!("expected `BASE64 RANK`, found {} fields", fields.len()),
            ));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(token)
            .map_err(|e| err(n, format!("token {token:?} is not base64: {e}")))?;
        let rank: u32 = rank
            .parse()
            .map_err(|_| err(n, format!("rank {rank:?} is not a non-negative integer")))?;
        if let Some(first) = line_of_rank.insert(rank, n) {
            return Err(err(n, format!("rank {rank} again (first on line {first})")));
        }
        if ranks.insert(bytes, rank).is_some() {
            return Err(err(n, format!("token {token:?} again")));
        }
    }
    if ranks.is_empty() {
        return Err(ModelError::Tokenizer {
            file: file.to_path_buf(),
            msg: "no ranks".into(),
        });
    }
    if let Some((&rank, &line)) = line_of_rank
        .iter()
        .filter(|(&r, _)| r as usize >= ranks.len())
        .min_by_key(|(&r, _)| r)
    {
        return Err(err(
            line,
            format!(
                "rank {rank} is not below the number of ranks ({}): ranks must be 0..{} without gaps",
                ranks.len(),
                ranks.len()
            ),
        ));
    }
    if let Some(b) = (0..=255u8).find(|b| !ranks.contains_key(&vec![*b])) {
        return Err(ModelError::Tokenizer {
            file: file.to_path_buf(),
            msg: format!("byte 0x{b:02x} has no rank (a byte-level BPE needs all 256 bytes)"),
        });
    }
    Ok(ranks)
}

/// What `tokenizer_config.json` says about the reserved block.
#[derive(Default)]
struct SpecialConfig {
    /// `added_tokens_decoder` entries inside the reserved block: content and `special`.
    added: HashMap<u32, (String, bool)>,
    /// The contents of `bos_token`, `eos_token`, `pad_token`, `unk_token`.
    named: HashSet<String>,
}

impl SpecialConfig {
    /// Entries outside the reserved block are ignored, as tokenization_kimi.py ignores them.
    fn parse(file: &Path, text: &str, num_base: u32) -> Result<Self, ModelError> {
        let err = |msg: String| ModelError::Tokenizer {
            file: file.to_path_buf(),
            msg,
        };
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| err(format!("not JSON: {e}")))?;
        let mut config = SpecialConfig::default();
        if let Some(added) = v.get("added_tokens_decoder") {
            let added = added
                .as_object()
                .ok_or_else(|| err("added_tokens_decoder: expected an object".into()))?;
            for (key, entry) in added {
                let id: u32 = key.parse().map_err(|_| {
                    err(format!(
                        "added_tokens_decoder: key {key:?} is not a token id"
                    ))
                })?;
                let content = entry["content"].as_str().ok_or_else(|| {
                    err(format!(
                        "added_tokens_decoder.{key}.content: expected a string"
                    ))
                })?;
                let special = entry["special"].as_bool().unwrap_or(true);
                if (num_base..num_base + RESERVED_SPECIAL_TOKENS).contains(&id) {
                    config.added.insert(id, (content.to_string(), special));
                }
            }
        }
        for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            match &v[key] {
                serde_json::Value::String(s) => {
                    config.named.insert(s.clone());
                }
                serde_json::Value::Object(o) => {
                    if let Some(s) = o.get("content").and_then(|c| c.as_str()) {
                        config.named.insert(s.to_string());
                    }
                }
                _ => {}
            }
        }
        Ok(config)
    }
}

/// `text` in consecutive slices of at most `max_chars` characters.
fn char_slices(text: &str, max_chars: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest
            .char_indices()
            .nth(max_chars)
            .map_or(rest.len(), |(i, _)| i);
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    if out.is_empty() {
        out.push(text);
    }
    out
}

/// Python's `str.isspace`: Unicode White_Space plus the separators U+001C..U+001F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Cuts `s` before each character that would make a run of whitespace, or of
/// non-whitespace, longer than `max_run` characters (tokenization_kimi.py's rule against
/// tiktoken's slow path on long runs). Always at least one part (an empty `s` gives `[""]`).
pub fn split_runs(s: &str, max_run: usize) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut run = 0;
    let mut in_space = s.chars().next().is_some_and(is_python_space);
    for (i, c) in s.char_indices() {
        let space = is_python_space(c);
        if space != in_space {
            in_space = space;
            run = 1;
            continue;
        }
        run += 1;
        if run > max_run {
            parts.push(&s[start..i]);
            start = i;
            run = 1;
        }
    }
    parts.push(&s[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_cut_where_python_cuts_them() {
        assert_eq!(split_runs("", 3), [""]);
        assert_eq!(split_runs("aaaaaaa", 3), ["aaa", "aaa", "a"]);
        assert_eq!(split_runs("ab  cd", 3), ["ab  cd"]);
        assert_eq!(split_runs("     x", 2), ["  ", "  ", " x"]);
        // U+001F is whitespace to Python, so these runs have length 1.
        assert_eq!(
            split_runs("a\u{1f}a\u{1f}a\u{1f}", 2),
            ["a\u{1f}a\u{1f}a\u{1f}"]
        );
        assert_eq!(split_runs("中文中文中", 2), ["中文", "中文", "中"]);
        assert_eq!(char_slices("", 2), [""]);
        assert_eq!(char_slices("abcde", 2), ["ab", "cd", "e"]);
    }

    fn ranks_err(text: &str) -> String {
        parse_ranks(Path::new("tiktoken.model"), text)
            .unwrap_err()
            .to_string()
    }

    /// All 256 bytes, rank = byte value.
    fn byte_ranks() -> String {
        use base64::Engine;
        (0..=255u8)
            .map(|b| {
                format!(
                    "{} {b}\n",
                    base64::engine::general_purpose::STANDARD.encode([b])
                )
            })
            .collect()
    }

    #[test]
    fn malformed_ranks_name_the_line() {
        let good = byte_ranks();
        assert_eq!(parse_ranks(Path::new("t"), &good).unwrap().len(), 256);
        let e = ranks_err(&format!("{good}YWI= 256 extra\n"));
        assert!(e.contains("tiktoken.model: cannot load tokenizer: line 257: expected `BASE64 RANK`, found 3 fields"), "{e}");
        let e = ranks_err(&format!("{good}!!! 256\n"));
        assert!(e.contains("line 257: token \"!!!\" is not base64"), "{e}");
        let e = ranks_err(&format!("{good}YWI= -1\n"));
        assert!(
            e.contains("line 257: rank \"-1\" is not a non-negative integer"),
            "{e}"
        );
        let e = ranks_err(&format!("{good}YWI= 5\n"));
        assert!(
            e.contains("line 257: rank 5 again (first on line 6)"),
            "{e}"
        );
        let e = ranks_err(&format!("{good}AA== 256\n"));
        assert!(e.contains("line 257: token \"AA==\" again"), "{e}");
        let e = ranks_err(&format!("{good}YWI= 300\n"));
        assert!(
            e.contains("line 257: rank 300 is not below the number of ranks (257)"),
            "{e}"
        );
        let without_a: String = good
            .lines()
            .filter(|l| !l.ends_with(" 97"))
            .map(|l| format!("{l}\n"))
            .collect();
        let e = ranks_err(&format!("{without_a}YWI= 97\n"));
        assert!(e.contains("byte 0x61 has no rank"), "{e}");
        assert!(ranks_err("\n\n").contains("no ranks"));
    }

    #[test]
    fn special_layout() {
        let ranks = byte_ranks();
        let config = r#"{"added_tokens_decoder": {
            "256": {"content": "[BOS]", "special": true},
            "258": {"content": "<|tool|>", "special": false},
            "9999": {"content": "ignored", "special": true}},
            "bos_token": "[BOS]", "eos_token": {"content": "<|reserved_token_257|>"}}"#;
        let t = Tiktoken::from_text(
            Path::new("tiktoken.model"),
            &ranks,
            Path::new("tokenizer_config.json"),
            Some(config),
        )
        .unwrap();
        assert_eq!(t.num_ids(), 512);
        assert_eq!(t.special_id("[BOS]"), Some(256));
        assert_eq!(t.special_id("<|reserved_token_257|>"), Some(257));
        assert_eq!(t.special_id("<|tool|>"), Some(258));
        assert_eq!(t.special_id("<|reserved_token_511|>"), Some(511));
        assert_eq!(t.special_id("ignored"), None);
        let ids = t.encode("[BOS]a<|tool|>b<|reserved_token_300|>").unwrap();
        assert_eq!(ids, [256, 97, 258, 98, 300]);
        assert_eq!(
            t.decode(&ids, false).unwrap(),
            "[BOS]a<|tool|>b<|reserved_token_300|>"
        );
        assert_eq!(t.decode(&ids, true).unwrap(), "a<|tool|>b");
        assert!(t
            .decode(&[512], false)
            .unwrap_err()
            .contains("token id 512"));

        let dup = r#"{"added_tokens_decoder": {"256": {"content": "x"}, "257": {"content": "x"}}}"#;
        let e = Tiktoken::from_text(
            Path::new("t"),
            &ranks,
            Path::new("tokenizer_config.json"),
            Some(dup),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("tokenizer_config.json: cannot load tokenizer: added_tokens_decoder: ids 256 and 257 both have content \"x\""), "{e}");
        let bad = r#"{"added_tokens_decoder": {"x": {"content": "y"}}}"#;
        let e = Tiktoken::from_text(
            Path::new("t"),
            &ranks,
            Path::new("tokenizer_config.json"),
            Some(bad),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("key \"x\" is not a token id"), "{e}");
    }
}
