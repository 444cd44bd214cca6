#!/usr/bin/env python3
"""Builds models/default/: the small model embedded in specc so that `specc run --prompt "Hello"`
works on a fresh machine. Deterministic: running it twice gives byte-identical files.

    python3 scripts/make_default_model.py                    # tokenizer + model + reference
    python3 scripts/make_default_model.py --tokenizer-only   # only tokenizer.json (needs no torch)
    python3 scripts/make_default_model.py --model-only       # keep tokenizer.json, redo the rest

Outputs (models/default/):
  tokenizer.json         byte-level BPE (HF `tokenizers` format), vocab 512, trained on the first
                         ~2 MB of this interpreter's standard-library .py files (sorted paths)
  config.json            LlamaForCausalLM, Hub layout (rope_theta / rope_scaling / torch_dtype)
  model.safetensors      bf16 weights, random init (fixed seed), tied embeddings (no lm_head.weight)
  reference.safetensors  prompt_ids = [BOS] + tokenize("Hello"), greedy_ids (16), logits f32
                         [P+16, 512] from HF in float32 with the bf16 weights upcast to f32
"""
import argparse
import hashlib
import json
import os
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "models", "default")

VOCAB = 512
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
CORPUS_BYTES = 2_000_000
SEED = 4242
EMBED_STD = 0.15
PROMPT = "Hello"
# the interpreter the committed tokenizer was trained with; another stdlib gives another corpus
EXPECTED_PYTHON = "3.11.7"


# ---------------------------------------------------------------------------------- tokenizer
def corpus_files():
    """(relative path, text) of stdlib .py files in sorted path order until ~2 MB, skipping
    site-packages and files that are not valid UTF-8."""
    stdlib = sysconfig.get_paths()["stdlib"]
    rels = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        for fn in filenames:
            if fn.endswith(".py"):
                rels.append(os.path.relpath(os.path.join(dirpath, fn), stdlib).replace(os.sep, "/"))
    rels.sort()
    out, total, skipped = [], 0, 0
    for rel in rels:
        if total >= CORPUS_BYTES:
            break
        with open(os.path.join(stdlib, rel), "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        out.append((rel, text))
        total += len(data)
    return stdlib, out, total, skipped


def train_tokenizer(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # No post-processor: encode() adds no BOS/EOS (callers prepend BOS themselves).
    tok.post_processor = None
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=[BOS, EOS],  # ids 0 and 1
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def make_tokenizer():
    import platform

    import tokenizers

    if platform.python_version() != EXPECTED_PYTHON:
        print(f"WARNING: Python {platform.python_version()} (committed tokenizer used {EXPECTED_PYTHON}): "
              "the stdlib corpus, hence tokenizer.json, will differ")
    stdlib, files, total, skipped = corpus_files()
    texts = [t for _, t in files]
    h = hashlib.sha256()
    for rel, t in files:
        h.update(rel.encode() + b"\0" + t.encode("utf-8") + b"\0")
    print(f"corpus: {stdlib}: {len(files)} files, {total} bytes, first {files[0][0]}, last {files[-1][0]}, "
          f"{skipped} non-UTF-8 skipped, sha256 {h.hexdigest()}")

    # training twice (fresh hash seeds inside the Rust library) must give the same bytes
    j1 = train_tokenizer(texts).to_str(pretty=True)
    j2 = train_tokenizer(texts).to_str(pretty=True)
    assert j1 == j2, "BPE training is not deterministic"
    print("tokenizer: trained twice in-process, identical JSON")
    tok = __import__("tokenizers").Tokenizer.from_str(j1)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1
    for s in [PROMPT, "def f(x):\n    return x + 1\n", "héllo wörld ✓ 日本"]:
        ids = tok.encode(s).ids
        assert tok.decode(ids) == s, (s, tok.decode(ids))
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(j1 + "\n")
    print(f"wrote models/default/tokenizer.json (tokenizers {tokenizers.__version__}); "
          f"'{PROMPT}' -> {tok.encode(PROMPT).tokens} {tok.encode(PROMPT).ids}")
    return {"files": len(files), "bytes": total, "skipped": skipped, "sha256": h.hexdigest(),
            "first": files[0][0], "last": files[-1][0], "tokenizers": tokenizers.__version__}


# ---------------------------------------------------------------------------------- model
def make_model():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hf_reference as H
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig

    H.setup_torch()
    print(f"torch {torch.__version__}, transformers {H.transformers.__version__}")
    tok = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    enc = tok.encode(PROMPT)
    assert BOS not in enc.tokens
    prompt_ids = [tok.token_to_id(BOS)] + enc.ids

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=352,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        # head_dim 32: wavelengths 2*pi*1e4^(i/16); L=128: keep i<=2 (<32), smooth i=3..5, divide i>=6
        rope_scaling={
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
    )
    # Deterministic seed search from SEED: the first seed whose reference is not degenerate
    # (>= 4 distinct greedy tokens, no near-tie among the greedy steps) is kept.
    for seed in range(SEED, SEED + 50):
        model = H.build_model(config)
        H.init_weights(model, seed, embed_std=EMBED_STD, lm_head_std=0.0)
        # weights are stored in bf16; the reference runs the bf16 values upcast to f32. Round the
        # parameters only: model.to(bf16) would also round the rotary inv_freq buffer.
        for p in model.parameters():
            p.data.copy_(p.data.to(torch.bfloat16).to(torch.float32))
        greedy, logits = H.greedy_and_logits(model, prompt_ids)
        ok, stats = H.check_reference(f"default seed {seed}", prompt_ids, greedy, logits)
        if ok:
            break
        print(f"  seed {seed} rejected (degenerate or near-tie); trying the next one")
    else:
        raise SystemExit("no acceptable seed")
    regions = H.rope_regions(model)
    print(f"llama3 rope regions per frequency: {regions}")
    assert {"keep", "smooth", "divide"} <= set(regions)
    H.save_checkpoint(model, OUT, torch.bfloat16)

    from safetensors import safe_open

    with safe_open(os.path.join(OUT, "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in keys}
    assert dtypes == {"BF16"}, dtypes
    assert "lm_head.weight" not in keys
    H.reload_and_compare(OUT, prompt_ids, greedy, logits)
    meta = {
        "generator": "scripts/make_default_model.py",
        "seed": seed,
        "prompt": PROMPT,
        "torch": torch.__version__,
        "transformers": H.transformers.__version__,
        "attn_implementation": "eager",
        "compute_dtype": "float32 (bf16 weights upcast)",
    }
    H.write_reference(os.path.join(OUT, "reference.safetensors"), prompt_ids, greedy, logits, meta)
    print(f"prompt {PROMPT!r} -> prompt_ids {prompt_ids}")
    print(f"greedy_ids {greedy.tolist()} -> {tok.decode(greedy.tolist(), skip_special_tokens=False)!r}")
    return {"torch": torch.__version__, "transformers": H.transformers.__version__, **stats}


def main():
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tokenizer-only", action="store_true")
    g.add_argument("--model-only", action="store_true")
    args = ap.parse_args()
    if not args.model_only:
        info = make_tokenizer()
        print("corpus info:", json.dumps(info))
    if not args.tokenizer_only:
        info = make_model()
        print("model info:", json.dumps(info))
    total = 0
    for fn in sorted(os.listdir(OUT)):
        p = os.path.join(OUT, fn)
        total += os.path.getsize(p)
        print(f"  {os.path.relpath(p, ROOT)}: {os.path.getsize(p)} bytes, "
              f"sha256 {hashlib.sha256(open(p, 'rb').read()).hexdigest()}")
    print(f"  total {total} bytes")
    assert total < 3_000_000


if __name__ == "__main__":
    main()
