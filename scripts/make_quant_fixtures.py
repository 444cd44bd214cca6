#!/usr/bin/env python3
"""Quantised DeepSeek-V3 checkpoints in the published formats + HF reference outputs, for
parity tests of the CPU interpreter's int4 / fp8 weight paths. Deterministic and CPU-only.

    python3 scripts/make_quant_fixtures.py          # writes tests/fixtures/deepseek_v3_{int4,fp8}/

Fixtures (see tests/fixtures/README.md):
  deepseek_v3_int4  Kimi-K2-Thinking / K2.5 layout: the routed experts compressed-tensors
                    `pack-quantized` int4, symmetric, group 32 (`weight_packed` int32
                    [out, in/8], `weight_scale` bf16 [out, in/32], `weight_shape` int64 [2]);
                    everything else f32; Kimi's `quantization_config` (with its `ignore` list).
  deepseek_v3_fp8   DeepSeek-V3 / Kimi-K2-Instruct layout: every Linear but the router fp8
                    e4m3 with an f32 `weight_scale_inv` [ceil(out/128), ceil(in/128)]; sizes
                    chosen so that most Linears have partial edge blocks on one or both axes
                    (hidden 160, kv_a 144 rows, kv_b 136 columns, FFN 200); DeepSeek-V3's
                    `quantization_config`.
Both run in float32. The reference is transformers over the exactly dequantised weights
(W = (u - 8) * scale; W = fp8 * scale_inv per block, computed in f32): a float32 copy of the
checkpoint is written to a temporary directory and loaded with from_pretrained. transformers'
own fp8 dequantisation is not used (it infers the block size from the shapes and is wrong on
partial blocks). Each directory: config.json, model.safetensors, reference.safetensors.
"""
import copy
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as H  # noqa: E402
import make_mla_fixtures as M  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures")
GROUP = 32
BLOCK = 128
FP8_MAX = 448.0

# Kimi-K2-Thinking's quantization_config (its ignore list names what stays bf16; specc finds
# the quantised tensors by their `weight_packed`, not by these patterns).
INT4_CONFIG = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": GROUP,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        "re:.*mlp\\.gate$",
    ],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}

FP8_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [BLOCK, BLOCK],
}


def int4_config():
    cfg = M.config(32, 1.0)
    cfg.moe_intermediate_size = 32  # in-features of down_proj divisible by the group
    return cfg


def fp8_config():
    cfg = M.config(144, 1.0)
    cfg.hidden_size = 160
    cfg.intermediate_size = 200
    cfg.moe_intermediate_size = 48
    cfg.kv_lora_rank = 136
    return cfg


def is_int4_target(name):
    return ".mlp.experts." in name and name.endswith(".weight")


def is_fp8_target(name, t):
    if t.dim() != 2 or not name.endswith(".weight"):
        return False
    return not (name.endswith("mlp.gate.weight") or name.endswith("embed_tokens.weight") or name == "lm_head.weight")


def pack_int4(w):
    """Symmetric int4 groups of GROUP columns: scale = bf16(max|w| / 7) per group, q = round(w /
    scale) clamped to -8..7; packed as compressed-tensors' pack_to_int32 does (column 8j + i in
    nibble i of word j, as u = q + 8). Returns (packed int32, scale bf16, shape int64,
    dequantised f32)."""
    out, inp = w.shape
    g = w.reshape(out, inp // GROUP, GROUP)
    scale = (g.abs().amax(-1) / 7.0).clamp_min(1e-8).to(torch.bfloat16)
    s = scale.to(torch.float32)
    q = torch.clamp(torch.round(g / s[..., None]), -8, 7).to(torch.int64).reshape(out, inp)
    deq = (q.to(torch.float32).reshape(out, inp // GROUP, GROUP) * s[..., None]).reshape(out, inp)
    u = (q + 8).to(torch.int64)
    words = torch.zeros(out, inp // 8, dtype=torch.int64)
    for i in range(8):
        words |= u[:, i::8] << (4 * i)
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return packed.contiguous(), scale.contiguous(), torch.tensor([out, inp], dtype=torch.int64), deq


def quant_fp8(w):
    """fp8 e4m3 blocks of BLOCK x BLOCK (edge blocks partial): scale_inv = amax / 448 in f32,
    fp8 = e4m3(w / scale_inv). Returns (fp8, scale_inv f32, dequantised f32 = fp8 * scale_inv)."""
    out, inp = w.shape
    rb, cb = -(-out // BLOCK), -(-inp // BLOCK)
    scale = torch.zeros(rb, cb, dtype=torch.float32)
    q = torch.zeros(out, inp, dtype=torch.float8_e4m3fn)
    deq = torch.zeros(out, inp, dtype=torch.float32)
    for i in range(rb):
        for j in range(cb):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            s = (blk.abs().amax() / FP8_MAX).clamp_min(1e-12)
            scale[i, j] = s
            qb = (blk / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = qb
            deq[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = qb.to(torch.float32) * scale[i, j]
    return q, scale, deq


def make(name, cfg, kind, base_seed):
    print(f"== {name}")
    outdir = os.path.join(OUT, name)
    os.makedirs(outdir, exist_ok=True)
    for attempt in range(M.MAX_SEED_TRIES):
        seed = base_seed + attempt
        model = H.build_model(cfg)
        M.init_weights(model, seed)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            with open(os.path.join(tmp, "config.json")) as f:
                v5 = json.load(f)
            plain = load_file(os.path.join(tmp, "model.safetensors"))
        stored, deq = {}, {}
        for n in sorted(plain):
            t = plain[n]
            if kind == "int4" and is_int4_target(n):
                stem = n[: -len(".weight")]
                packed, scale, shape, d = pack_int4(t)
                stored[stem + ".weight_packed"] = packed
                stored[stem + ".weight_scale"] = scale
                stored[stem + ".weight_shape"] = shape
                deq[n] = d
            elif kind == "fp8" and is_fp8_target(n, t):
                q, s, d = quant_fp8(t)
                stored[n] = q
                stored[n[: -len(".weight")] + ".weight_scale_inv"] = s
                deq[n] = d
            else:
                stored[n] = t
                deq[n] = t
        hub = M.hub_config(v5, "float32", "type")
        with tempfile.TemporaryDirectory() as tmp:
            save_file(deq, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(hub, f)
            ref = AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="eager", dtype=torch.float32)
        ref.eval()
        gen = torch.Generator().manual_seed(seed)
        prompt_ids = torch.randint(0, cfg.vocab_size, (M.PROMPT_LEN,), generator=gen).tolist()
        greedy, logits = H.greedy_and_logits(ref, prompt_ids)
        ok, stats = H.check_reference(f"{name} seed {seed}", prompt_ids, greedy, logits)
        if ok:
            break
        print(f"  seed {seed} rejected (degenerate or near-tie); trying the next one")
    else:
        raise SystemExit(f"{name}: no acceptable seed in {M.MAX_SEED_TRIES} tries")
    hub["quantization_config"] = copy.deepcopy(INT4_CONFIG if kind == "int4" else FP8_CONFIG)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        f.write(json.dumps(dict(sorted(hub.items())), indent=2) + "\n")
    path = os.path.join(outdir, "model.safetensors")
    save_file(stored, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)
    meta = {
        "generator": "scripts/make_quant_fixtures.py",
        "seed": seed,
        **H.versions(),
        "attn_implementation": "eager",
        "compute_dtype": "float32",
        "weights": kind,
    }
    H.write_reference(os.path.join(outdir, "reference.safetensors"), prompt_ids, greedy, logits, meta)
    print(f"  prompt_ids {prompt_ids}")
    print(f"  greedy_ids {greedy.tolist()}")
    for fn in sorted(os.listdir(outdir)):
        print(f"  wrote {os.path.relpath(os.path.join(outdir, fn), ROOT)} ({os.path.getsize(os.path.join(outdir, fn))} bytes)")
    return {"name": name, "seed": seed, **stats}


def main():
    H.setup_torch()
    print(f"torch {torch.__version__}, transformers {H.transformers.__version__}")
    summary = [
        make("deepseek_v3_int4", int4_config(), "int4", 6000),
        make("deepseek_v3_fp8", fp8_config(), "fp8", 7000),
    ]
    print("summary:")
    for s in summary:
        print("  " + json.dumps(s))


if __name__ == "__main__":
    main()
