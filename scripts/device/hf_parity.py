#!/usr/bin/env python3
"""On the device: specc's CUDA backend vs Hugging Face transformers with the same weights.

For each model directory: HF logits over prompt + 32 greedy tokens vs `specc logits --backend
cuda` (relative L2, must be <= 1e-2); and, where the directory has a tokenizer, `specc run
--backend cuda` greedy ids vs HF greedy ids (must be identical).

The reference is HF with the checkpoint's exact weights computed in float32 (a bf16 checkpoint
is upcast, which is exact): specc reads bf16 weights but accumulates and keeps activations in
f32, so that is the computation it implements. HF run natively in bf16 rounds every activation
to bf16; it is printed too (specc vs HF-bf16, and HF-bf16 vs HF-f32 for scale), not asserted.

    python3 scripts/device/hf_parity.py .gpu/specc models/default tests/fixtures/llama_tied ...
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def rel_l2(a, b):
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def main():
    specc, dirs = sys.argv[1], sys.argv[2:]
    ok = True
    for d in dirs:
        cfg = json.load(open(os.path.join(d, "config.json")))
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            cfg.get("torch_dtype") or cfg.get("dtype"), torch.float32)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").cuda().eval()
        native = None
        if dtype != torch.float32:
            native = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager").cuda().eval()
        tmp = tempfile.mkdtemp()
        if os.path.exists(os.path.join(d, "tokenizer.json")):
            ids_file = os.path.join(tmp, "ids.json")
            subprocess.run([specc, "run", d, "--prompt", "def main(", "--max-tokens", "32",
                            "--backend", "cuda", "--ids-out", ids_file],
                           check=True, stdout=subprocess.DEVNULL)
            got = json.load(open(ids_file))
            prompt = got["prompt_ids"]
            with torch.no_grad():
                # An explicit all-ones mask: with no mask, generate() infers one from the pad id,
                # and a model whose BOS id equals the pad id (the default: both 0) would then
                # have its BOS masked out, which is not the computation specc (or HF's forward) does.
                out = model.generate(torch.tensor([prompt]).cuda(),
                                     attention_mask=torch.ones(1, len(prompt), dtype=torch.long).cuda(),
                                     max_new_tokens=32, do_sample=False, min_new_tokens=32,
                                     eos_token_id=None, pad_token_id=cfg.get("eos_token_id", 0))
            hf_ids = out[0, len(prompt):].tolist()
            same = hf_ids == got["generated_ids"]
            first_diff = next((i for i, (a, b) in enumerate(zip(hf_ids, got["generated_ids"])) if a != b), None)
            print(f"{d}: greedy 32 tokens specc(cuda) == HF(f32 compute, {dtype} weights): {same} (first difference at {first_diff})")
            ok &= same
            ids = prompt + hf_ids
        else:
            ref = load_file(os.path.join(d, "reference.safetensors"))
            ids = ref["prompt_ids"].tolist() + ref["greedy_ids"].tolist()
        out_file = os.path.join(tmp, "logits.safetensors")
        subprocess.run([specc, "logits", d, "--ids", ",".join(map(str, ids)), "--backend", "cuda",
                        "--out", out_file], check=True, stdout=subprocess.DEVNULL)
        specc_logits = load_file(out_file)["logits"].cuda()
        with torch.no_grad():
            hf = model(torch.tensor([ids]).cuda()).logits[0].float()
        r = rel_l2(specc_logits, hf)
        agree = (specc_logits.argmax(-1) == hf.argmax(-1)).float().mean().item()
        print(f"{d}: logits rel L2 specc(cuda) vs HF(f32 compute, {dtype} weights) = {r:.3e}; argmax agreement {agree:.3f}")
        if native is not None:
            with torch.no_grad():
                hb = native(torch.tensor([ids]).cuda()).logits[0].float()
            print(f"{d}:   for scale: specc vs HF({dtype} compute) {rel_l2(specc_logits, hb):.3e}; "
                  f"HF({dtype}) vs HF(f32) {rel_l2(hb, hf):.3e}, argmax agreement "
                  f"{(hb.argmax(-1) == hf.argmax(-1)).float().mean().item():.3f}")
        ok &= r <= 1e-2
    print("HF PARITY:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
