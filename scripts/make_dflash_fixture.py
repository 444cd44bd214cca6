#!/usr/bin/env python3
"""Writes a tiny DFlash drafter with random weights, in the published tensor layout (z-lab
DFlash: `fc`, `hidden_norm`, `norm`, `layers.i.*` with Qwen3 q_norm/k_norm, no embedding or
lm_head of its own), for the target tests/fixtures/llama3_scaled_untied.

Deterministic (numpy seed); needs only numpy and safetensors:
    python3 scripts/make_dflash_fixture.py
Writes tests/fixtures/dflash_random/{config.json, model.safetensors}.

Shape choices: 2 drafter layers, block 4 (k = 3), taps [1, 0] (order matters: the test
pins it), mask token 383 (the target's last id), rms eps 1e-6 (differs from the target's),
the target's RoPE (llama3 scaling). Both spellings of the DFlash fields are written, like the
published checkpoints (top level and under `dflash_config`).
"""
import json
import os

import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TARGET = os.path.join(ROOT, "tests", "fixtures", "llama3_scaled_untied")
OUT = os.path.join(ROOT, "tests", "fixtures", "dflash_random")


def main():
    with open(os.path.join(TARGET, "config.json")) as f:
        t = json.load(f)
    h = t["hidden_size"]
    heads = t["num_attention_heads"]
    kv = t["num_key_value_heads"]
    hd = t.get("head_dim") or h // heads
    ffn = 96
    vocab = t["vocab_size"]
    layers = 2
    taps = [1, 0]
    block = 4
    mask = vocab - 1
    rng = np.random.default_rng(4242)

    def lin(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tensors = {
        "fc.weight": lin(h, len(taps) * h),
        "hidden_norm.weight": norm(h),
        "norm.weight": norm(h),
    }
    for i in range(layers):
        p = f"layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": norm(h),
                p + "post_attention_layernorm.weight": norm(h),
                p + "self_attn.q_proj.weight": lin(heads * hd, h),
                p + "self_attn.k_proj.weight": lin(kv * hd, h),
                p + "self_attn.v_proj.weight": lin(kv * hd, h),
                p + "self_attn.o_proj.weight": lin(h, heads * hd),
                p + "self_attn.q_norm.weight": norm(hd),
                p + "self_attn.k_norm.weight": norm(hd),
                p + "mlp.gate_proj.weight": lin(ffn, h),
                p + "mlp.up_proj.weight": lin(ffn, h),
                p + "mlp.down_proj.weight": lin(h, ffn),
            }
        )
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": block,
        "mask_token_id": mask,
        "target_layer_ids": taps,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": taps},
        "num_target_layers": t["num_hidden_layers"],
        "layer_types": ["full_attention"] * layers,
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": t["rope_theta"],
        "rope_scaling": t.get("rope_scaling"),
        "max_position_embeddings": t["max_position_embeddings"],
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "torch_dtype": "float32",
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file(tensors, os.path.join(OUT, "model.safetensors"))
    print(f"wrote {OUT}: {sum(v.nbytes for v in tensors.values())} bytes of tensors")


if __name__ == "__main__":
    main()
