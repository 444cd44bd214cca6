#!/usr/bin/env python3
"""Independent check of the committed reference outputs, without torch or transformers.

Re-implements the Llama-3.x / Qwen3 forward in numpy (float64) from config.json (Hub layout)
and model.safetensors alone, following shared/REFERENCE.md, and compares with
reference.safetensors (logits of all positions; greedy_ids = argmax chain).

    python3 scripts/check_fixtures_numpy.py [DIR ...]   # default: tests/fixtures/* models/default
"""
import glob
import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_weights(path):
    # bf16 is not a numpy dtype: read the raw header and upcast by hand
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        if info["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(info["dtype"])
        out[name] = arr.reshape(info["shape"]).astype(np.float64)
    return out


def inv_freq(cfg, head_dim):
    theta = cfg["rope_theta"]
    f = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    rs = cfg.get("rope_scaling")
    if rs is None:
        return f
    assert rs["rope_type"] == "llama3", rs
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    L = rs["original_max_position_embeddings"]
    out = []
    for x in f:
        lam = 2 * math.pi / x
        if lam < L / high:
            out.append(x)
        elif lam > L / low:
            out.append(x / factor)
        else:
            s = (L / lam - low) / (high - low)
            out.append(x * ((1 - s) / factor + s))
    return np.array(out)


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, pos, freqs):  # x [T, H, D], NeoX rotate-half
    ang = pos[:, None] * freqs[None, :]  # [T, D/2]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def forward(cfg, W, ids):
    T = len(ids)
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg["rms_norm_eps"]
    qwen3 = cfg["model_type"] == "qwen3"
    freqs = inv_freq(cfg, D)
    pos = np.arange(T, dtype=np.float64)
    x = W["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, H, D)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, KV, D)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, KV, D)
        if qwen3:
            q = rms(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, freqs), rope(k, pos, freqs)
        rep = H // KV
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(D) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H * D)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    assert ("lm_head.weight" in W) == (not cfg["tie_word_embeddings"])
    return x @ head.T


def check(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    W = load_weights(os.path.join(d, "model.safetensors"))
    ref = load_file(os.path.join(d, "reference.safetensors"))
    prompt, greedy, logits = ref["prompt_ids"], ref["greedy_ids"], ref["logits"]
    full = np.concatenate([prompt, greedy])
    ours = forward(cfg, W, full)
    diff = np.abs(ours - logits).max()
    P = len(prompt)
    argmax_ok = bool((ours[P - 1 : P - 1 + len(greedy)].argmax(-1) == greedy).all())
    scale = np.abs(logits).max()
    ok = diff <= 1e-4 * max(1.0, scale) and argmax_ok
    print(f"{os.path.relpath(d, ROOT)}: max|logits diff| {diff:.3g} (max|logit| {scale:.3g}), "
          f"greedy chain matches: {argmax_ok} -> {'OK' if ok else 'FAIL'}")
    return ok


def main():
    dirs = sys.argv[1:] or sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "*", ""))) + [
        os.path.join(ROOT, "models", "default")]
    dirs = [d for d in dirs if os.path.exists(os.path.join(d, "reference.safetensors"))]
    results = [check(d) for d in dirs]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
