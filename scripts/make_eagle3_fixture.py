#!/usr/bin/env python3
"""Writes a tiny EAGLE-3 head with random weights, in the published tensor layout
(SpecForge / EAGLE repos), for the target tests/fixtures/llama3_scaled_untied.

Deterministic (numpy seed); needs only numpy and safetensors:
    python3 scripts/make_eagle3_fixture.py
Writes tests/fixtures/eagle3_random/{config.json, model.safetensors}.
"""
import json
import os

import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TARGET = os.path.join(ROOT, "tests", "fixtures", "llama3_scaled_untied")
OUT = os.path.join(ROOT, "tests", "fixtures", "eagle3_random")


def main():
    with open(os.path.join(TARGET, "config.json")) as f:
        t = json.load(f)
    h = t["hidden_size"]
    heads = t["num_attention_heads"]
    kv = t["num_key_value_heads"]
    hd = t.get("head_dim") or h // heads
    ffn = 96
    vocab = t["vocab_size"]
    draft_vocab = 256
    rng = np.random.default_rng(31337)

    def lin(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    # Draft ids map to a fixed, non-identity subset of target ids: target = draft + d2t.
    chosen = np.sort(rng.choice(vocab, size=draft_vocab, replace=False))
    d2t = (chosen - np.arange(draft_vocab)).astype(np.int64)
    t2d = np.zeros(vocab, dtype=bool)
    t2d[chosen] = True
    tensors = {
        "fc.weight": lin(h, 3 * h),
        "midlayer.input_layernorm.weight": norm(h),
        "midlayer.hidden_norm.weight": norm(h),
        "midlayer.post_attention_layernorm.weight": norm(h),
        "midlayer.self_attn.q_proj.weight": lin(heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": lin(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": lin(kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": lin(h, heads * hd),
        "midlayer.mlp.gate_proj.weight": lin(ffn, h),
        "midlayer.mlp.up_proj.weight": lin(ffn, h),
        "midlayer.mlp.down_proj.weight": lin(h, ffn),
        "norm.weight": norm(h),
        "lm_head.weight": lin(draft_vocab, h),
        "d2t": d2t,
        "t2d": t2d,
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "intermediate_size": ffn,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "rms_norm_eps": t["rms_norm_eps"],
        "rope_theta": t["rope_theta"],
        "rope_scaling": t.get("rope_scaling"),
        "max_position_embeddings": t["max_position_embeddings"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 0, 1]},
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file(tensors, os.path.join(OUT, "model.safetensors"))
    print(f"wrote {OUT}: {sum(v.nbytes for v in tensors.values())} bytes of tensors")


if __name__ == "__main__":
    main()
