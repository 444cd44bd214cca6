#!/usr/bin/env python3
"""Builds tests/fixtures/tiktoken_small/: a small Kimi-style tiktoken tokenizer and the ids the
Python reference (the `tiktoken` package) gives for a set of test strings.

Written:
  tiktoken.model         base64 BPE ranks: the 256 single bytes (rank = byte value), then merges
                         learnt from corpus.txt by plain byte-pair counting (the ranks need not
                         be good, only valid: every byte has a rank and ranks are 0..n-1)
  tokenizer_config.json  Kimi's layout: 256 reserved special ids right above the ranks, some
                         named in added_tokens_decoder, bos/eos/pad, a chat template
  expected.json          per case: the text, its ids (Kimi's encode: specials allowed, long
                         runs split), and per decode case the ids and the text tiktoken decodes
                         them to (invalid UTF-8 replaced with U+FFFD)

Usage: pip install tiktoken; python3 scripts/make_tiktoken_fixture.py
The encoder is tiktoken's own (its Rust core, fancy-regex) with Kimi's pre-tokenisation
pattern, i.e. what tokenization_kimi.py runs.
"""

import base64
import collections
import json
import pathlib
import random

import regex
import tiktoken

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/tiktoken_small"
MERGES = 400
RESERVED = 256

# Kimi's pre-tokenisation (tokenization_kimi.py `pat_str`): Han runs first; letter runs use
# the letter classes with Han subtracted (`&&[^\p{Han}]`), so Han and other letters part.
PAT_STR = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

# Kimi's encode limits: text is encoded in slices of at most this many characters...
MAX_ENCODE_CHARS = 400_000
# ...each cut further so that no run of whitespace or of non-whitespace exceeds this.
MAX_RUN_CHARS = 25_000

# Named entries of the reserved block, as offsets from the first special id (Kimi's layout).
NAMED = {
    0: ("[BOS]", True),
    1: ("[EOS]", True),
    2: ("<|im_end|>", True),
    3: ("<|im_user|>", True),
    4: ("<|im_assistant|>", True),
    6: ("<|start_header_id|>", True),
    7: ("<|end_header_id|>", True),
    9: ("[EOT]", True),
    10: ("<|im_system|>", True),
    11: ("<|tool_calls_section_begin|>", False),
    12: ("<|tool_calls_section_end|>", False),
    13: ("<|tool_call_begin|>", False),
    14: ("<|tool_call_argument_begin|>", False),
    15: ("<|tool_call_end|>", False),
    17: ("<|im_middle|>", True),
    255: ("[PAD]", True),
}

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def train_ranks(corpus: str) -> dict[bytes, int]:
    """Byte ranks 0..255, then up to MERGES merges of the most frequent adjacent pair within
    the corpus's pre-tokenised pieces (ties: the smallest pair of byte strings)."""
    ranks = {bytes([b]): b for b in range(256)}
    pieces = collections.Counter(m.group(0).encode() for m in regex.finditer(PAT_STR, corpus, flags=regex.V1))
    words = {p: [bytes([b]) for b in p] for p in pieces}
    for _ in range(MERGES):
        pairs = collections.Counter()
        for p, parts in words.items():
            for a, b in zip(parts, parts[1:]):
                pairs[(a, b)] += pieces[p]
        if not pairs:
            break
        best = min(pairs, key=lambda ab: (-pairs[ab], ab))
        merged = best[0] + best[1]
        if merged not in ranks:
            ranks[merged] = len(ranks)
        for p, parts in words.items():
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            words[p] = out
    return ranks


def split_runs(s: str, max_run: int):
    """Cuts `s` before the character that would make a run of whitespace (str.isspace) or of
    non-whitespace longer than `max_run` (Kimi's rule for long inputs)."""
    start, run, in_space = 0, 0, s[:1].isspace()
    for i, ch in enumerate(s):
        space = ch.isspace()
        if space != in_space:
            in_space, run = space, 1
            continue
        run += 1
        if run > max_run:
            yield s[start:i]
            start, run = i, 1
    yield s[start:]


def kimi_encode(enc: tiktoken.Encoding, text: str, max_run: int = MAX_RUN_CHARS) -> list[int]:
    ids = []
    for i in range(0, len(text), MAX_ENCODE_CHARS):
        for part in split_runs(text[i : i + MAX_ENCODE_CHARS], max_run):
            ids.extend(enc.encode(part, allowed_special="all"))
    return ids


def main() -> None:
    corpus = (OUT / "corpus.txt").read_text(encoding="utf-8")
    ranks = train_ranks(corpus)
    base = len(ranks)
    specials = {}
    added = {}
    for off in range(RESERVED):
        name, special = NAMED.get(off, (f"<|reserved_token_{base + off}|>", None))
        specials[name] = base + off
        if special is not None:
            added[str(base + off)] = {
                "content": name,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
    enc = tiktoken.Encoding(name="tiktoken_small", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)

    with open(OUT / "tiktoken.model", "w", encoding="ascii") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    config = {
        "added_tokens_decoder": added,
        "additional_special_tokens": [NAMED[o][0] for o in (2, 3, 4, 6, 7, 9, 10, 17)],
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    texts = [
        "",
        "Hello, world! 你好，世界。",
        "The quick brown fox jumps over the lazy dog.",
        "中文English混合text测试123abc中",
        "数字：3.14159、1,000,000 和 2024年12月2日",
        "  leading spaces\n\n\ttabs and\r\nCRLF   trailing   ",
        "    \n\n\n    x",
        "I'm sure they'll've DON'T YOU'RE it's",
        "Café naïve Ünïcödé ǅungla ǈ résumé",
        "日本語のテキスト：ひらがなカタカナ漢字",
        "한국어 텍스트와 English",
        "emoji 🙂🚀 and symbols ©®™ ±×÷ — “quotes”",
        "def f(x):\n    return x ** 2  # 平方\n",
        "<|im_user|>user<|im_middle|>你好！<|im_end|><|im_assistant|>assistant<|im_middle|>",
        "[BOS]text[EOS] [PAD]",
        f"reserved <|reserved_token_{base + 100}|> and <|tool_call_begin|>call<|tool_call_end|>",
        "<|im_end without close and [BOS",
        "12345678901234567890",
        "MixedCASEWords andCamelCase XMLHttpRequest",
        "\u3000全角空格\u3000和\u00a0不换行空格",
    ]
    # Random mixtures (fixed seed) of the classes the pattern tells apart.
    rng = random.Random(20)
    pool = [
        "a", "Z", "é", "Ü", "ǅ", "x", "The", "can't", "'S", "中", "文", "漢字", "の", "カ", "한",
        "0", "7", "123", "4567", " ", "  ", "\t", "\n", "\r\n", "\u3000", "\u00a0",
        ",", ".", "!", "？", "。", "#", "->", "🙂", "\u0301", "<|im_end|>", "[BOS]", "<|im_", "|>",
    ]
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 30))) for _ in range(40)]
    cases = []
    for t in texts:
        ids = kimi_encode(enc, t)
        assert enc.decode(ids) == t, t
        cases.append({"text": t, "ids": ids})
    # Long runs: Kimi cuts them before encoding; checked here with a small run limit so the
    # fixture stays small (the Rust test uses the same limit).
    run_limit = 7
    run_cases = []
    for t in ["aaaaaaaaaaaaaaaaaaaa", "word     " * 3 + "中文中文中文中文中文", " " * 20 + "x" * 15, "a\u001f" * 6 + "b c"]:
        run_cases.append(
            {
                "text": t,
                "max_run": run_limit,
                "parts": list(split_runs(t, run_limit)),
                "ids": kimi_encode(enc, t, run_limit),
            }
        )
    han = "中".encode()
    first = enc.encode_single_token(han[:1])
    decodes = [
        {"ids": ids, "text": enc.decode(ids)}
        for ids in [
            [first],
            [first, enc.encode_single_token(han[1:2])],
            enc.encode("ab", allowed_special="all") + [first],
            [specials["[BOS]"]] + enc.encode("hi") + [specials["<|im_end|>"]],
        ]
    ]
    expected = {
        "num_base_tokens": base,
        "pattern": PAT_STR,
        "cases": cases,
        "run_cases": run_cases,
        "decodes": decodes,
        "tiktoken_version": tiktoken.__version__,
    }
    # One case per line: diffs of a regenerated fixture stay readable.
    lines = []
    for key, value in expected.items():
        if isinstance(value, list):
            items = ",\n".join("  " + json.dumps(v, ensure_ascii=False) for v in value)
            lines.append(f"{json.dumps(key)}: [\n{items}\n ]")
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    text = "{\n " + ",\n ".join(lines) + "\n}\n"
    assert json.loads(text) == expected
    (OUT / "expected.json").write_text(text, encoding="utf-8")
    print(f"{OUT}: {base} ranks, {len(specials)} special ids, {len(cases)} encode cases")


if __name__ == "__main__":
    main()
