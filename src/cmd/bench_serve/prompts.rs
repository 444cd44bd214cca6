//! The prompts requests cycle through: `--prompts FILE` or a built-in set.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// Used when no `--prompts` file is given: short instructions of varied topics and lengths,
/// so that prefill is small next to decoding (the figures are about generation).
const BUILT_IN: &[&str] = &[
    "Explain how a transformer language model generates text, one token at a time.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List ten practical tips for writing clear technical documentation.",
    "What are the main differences between TCP and UDP? Answer with examples.",
    "Describe the water cycle to a ten-year-old.",
    "Summarize the causes and consequences of the industrial revolution.",
    "Write a Python function that checks whether a string is a palindrome, and explain it.",
    "Give a recipe for a simple vegetable soup, with quantities and steps.",
    "Why is the sky blue? Explain the physics in plain words.",
    "Compare the economic systems of capitalism and socialism in a balanced way.",
    "Write a haiku sequence about the four seasons.",
    "How does public-key cryptography let two strangers agree on a secret?",
    "Plan a three-day walking tour of an old European city.",
    "Explain what a hash table is and when it is slower than a balanced tree.",
    "Draft a polite email asking a colleague to review a pull request.",
    "What should someone consider before adopting a dog?",
];

/// The prompts of `file`, or the built-in set, as the request's `prompt` value. A file is
/// JSON Lines when its first non-empty line starts with `{` (each non-empty line an object
/// whose `prompt` is a string or an array of token ids — the form for a server without a
/// tokenizer), else plain text with one prompt per non-empty line.
pub fn load(file: Option<&Path>) -> Result<Vec<Value>> {
    let Some(file) = file else {
        return Ok(BUILT_IN.iter().map(|&s| Value::from(s)).collect());
    };
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read --prompts {}", file.display()))?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .peekable();
    let jsonl = lines
        .peek()
        .is_some_and(|(_, l)| l.trim_start().starts_with('{'));
    let prompts = lines
        .map(|(i, line)| {
            if !jsonl {
                return Ok(Value::from(line));
            }
            let at = || format!("{}:{}", file.display(), i + 1);
            let mut v: Value = serde_json::from_str(line)
                .map_err(|e| anyhow!("{}: not a JSON object: {e}", at()))?;
            match v["prompt"].take() {
                p @ Value::String(_) => Ok(p),
                Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_u64) => {
                    Ok(Value::Array(ids))
                }
                _ => Err(anyhow!(
                    "{}: no field `prompt` holding a string or a non-empty array of token ids",
                    at()
                )),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    if prompts.is_empty() {
        bail!("--prompts {} holds no prompt", file.display());
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("specc-prompts-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn text_and_jsonl_files() {
        let p = write("plain.txt", "first prompt\n\n  second {x}\n");
        assert_eq!(load(Some(&p)).unwrap(), ["first prompt", "  second {x}"]);
        let p = write(
            "p.jsonl",
            "{\"prompt\": \"a\\nb\"}\n\n{\"prompt\": \"c\", \"id\": 2}\n",
        );
        assert_eq!(load(Some(&p)).unwrap(), ["a\nb", "c"]);
        let p = write(
            "ids.jsonl",
            "{\"prompt\": [1, 20, 300]}\n{\"prompt\": \"d\"}\n",
        );
        assert_eq!(
            load(Some(&p)).unwrap(),
            [serde_json::json!([1, 20, 300]), Value::from("d")]
        );
        assert_eq!(load(None).unwrap().len(), BUILT_IN.len());
    }

    #[test]
    fn bad_files_name_the_line() {
        let p = write("bad.jsonl", "{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n");
        let err = load(Some(&p)).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "bad.jsonl:2: no field `prompt` holding a string or a non-empty array of token ids"
            ),
            "{err}"
        );
        for bad in ["[]", "[1, -2]", "[\"a\"]"] {
            let p = write("badids.jsonl", &format!("{{\"prompt\": {bad}}}\n"));
            let err = load(Some(&p)).unwrap_err().to_string();
            assert!(err.ends_with("array of token ids"), "{bad}: {err}");
        }
        let p = write("broken.jsonl", "{\"prompt\": \"a\"}\n{oops\n");
        let err = load(Some(&p)).unwrap_err().to_string();
        assert!(err.contains("broken.jsonl:2: not a JSON object"), "{err}");
        let p = write("empty.txt", "\n \n");
        let err = load(Some(&p)).unwrap_err().to_string();
        assert!(err.contains("holds no prompt"), "{err}");
    }
}
