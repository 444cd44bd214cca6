"""Shared helpers for make_hf_fixtures.py and make_default_model.py.

Builds small random Hugging Face checkpoints deterministically and records reference outputs
(greedy tokens and full logits) from HF transformers on the CPU in float32 with eager attention.
"""
import copy
import json
import os
import shutil
import sys
import tempfile

try:
    import torch
except ImportError as e:  # pragma: no cover - environment help
    sys.exit(
        f"cannot import torch ({e}).\n"
        "If this is a CUDA build of torch without its CUDA libraries, build CPU-only stand-ins:\n"
        "  python3 scripts/torch_cuda_stubs.py /tmp/cudastubs && export LD_LIBRARY_PATH=/tmp/cudastubs"
    )
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GenerationConfig

N_NEW = 16


def setup_torch():
    """Single-threaded, deterministic CPU execution."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def build_model(config):
    """Fresh float32 model with eager attention; weights are overwritten by init_weights."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    return model


def init_weights(model, seed, embed_std, lm_head_std):
    """Deterministic init, in sorted parameter-name order, from one torch.Generator.

    - RMSNorm weights (input/post_attention layernorm, final norm, Qwen3 q_norm/k_norm): 1 + 0.1*N(0,1)
    - embed_tokens: embed_std * N(0,1); lm_head (untied only): lm_head_std * N(0,1)
    - every other Linear weight [out, in]: N(0,1) / sqrt(in)  (keeps activations O(1) so that
      attention scores and the MLP are far from trivial)
    named_parameters() de-duplicates tied parameters, so a tied lm_head is not drawn separately.
    """
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    for name in sorted(params):
        p = params[name]
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            val = 1.0 + 0.1 * noise
        elif name == "model.embed_tokens.weight":
            val = embed_std * noise
        elif name == "lm_head.weight":
            val = lm_head_std * noise
        elif name.endswith(".weight") and p.dim() == 2:
            val = noise / (p.shape[1] ** 0.5)
        else:
            raise ValueError(f"unexpected parameter {name} {tuple(p.shape)}")
        p.data.copy_(val.to(p.dtype))


def legacy_config_dict(v5_dict, dtype_name):
    """transformers >= 5 writes `rope_parameters` (with rope_theta inside) and `dtype`.
    Checkpoints on the Hub (Llama-3.x, Qwen3) use the older layout: top-level `rope_theta`,
    `rope_scaling` (null or {rope_type, ...}) and `torch_dtype`. Convert to that layout."""
    d = copy.deepcopy(v5_dict)
    rp = d.pop("rope_parameters", None)
    if rp is None or "rope_theta" not in rp:
        raise ValueError(f"unexpected rope_parameters {rp!r}")
    rp = dict(rp)
    theta = rp.pop("rope_theta")
    d["rope_theta"] = theta
    d["rope_scaling"] = None if rp.get("rope_type", "default") == "default" else rp
    d.pop("dtype", None)
    d["torch_dtype"] = dtype_name
    return dict(sorted(d.items()))


def save_checkpoint(model, outdir, save_dtype, extra_v5_config_name=None):
    """Writes outdir/model.safetensors exactly as save_pretrained(safe_serialization=True) writes it
    (in save_dtype) and outdir/config.json in the Hub (pre-v5) layout. Optionally also keeps the
    config.json that this transformers version wrote, under extra_v5_config_name."""
    os.makedirs(outdir, exist_ok=True)
    dtype_name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[save_dtype]
    with tempfile.TemporaryDirectory() as tmp:
        m = copy.deepcopy(model).to(save_dtype)
        m.save_pretrained(tmp, safe_serialization=True)
        files = sorted(os.listdir(tmp))
        assert "model.safetensors" in files, files
        shutil.copyfile(os.path.join(tmp, "model.safetensors"), os.path.join(outdir, "model.safetensors"))
        with open(os.path.join(tmp, "config.json")) as f:
            v5_text = f.read()
    v5 = json.loads(v5_text)
    legacy = legacy_config_dict(v5, dtype_name)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        f.write(json.dumps(legacy, indent=2) + "\n")
    if extra_v5_config_name:
        with open(os.path.join(outdir, extra_v5_config_name), "w") as f:
            f.write(v5_text)
    return legacy


def greedy_and_logits(model, prompt_ids):
    """16 greedy tokens from HF generate (use_cache, no sampling, no eos stopping), then the
    logits of ONE forward over prompt+greedy, all positions, float32."""
    prompt = torch.tensor([prompt_ids], dtype=torch.long)
    gcfg = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=N_NEW,
        min_new_tokens=N_NEW,
        use_cache=True,
        eos_token_id=None,
        pad_token_id=0,
        bos_token_id=None,
    )
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=gcfg)
    assert out.shape == (1, len(prompt_ids) + N_NEW), out.shape
    assert out[0, : len(prompt_ids)].tolist() == list(prompt_ids)
    greedy = out[0, len(prompt_ids):].clone()
    full = out[0].clone()
    logits = model(input_ids=full[None], use_cache=False).logits[0].to(torch.float32).contiguous()
    assert logits.shape == (len(full), model.config.vocab_size), logits.shape
    return greedy, logits


def check_reference(name, prompt_ids, greedy, logits):
    """Sanity checks; returns (ok, stats). ok is False when the model is too degenerate or a
    greedy step is too close to a tie to be a robust parity target."""
    P = len(prompt_ids)
    # the cached greedy decode must agree with the argmax of the uncached full forward
    steps = logits[P - 1 : P - 1 + N_NEW]
    argmax = steps.argmax(-1)
    consistent = bool(torch.equal(argmax, greedy))
    top2 = steps.topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    distinct = len(set(greedy.tolist()))
    stats = {
        "max_abs_logit": float(logits.abs().max()),
        "logit_std": float(logits.std()),
        "min_greedy_margin": margin,
        "distinct_greedy_tokens": distinct,
        "cache_vs_full_argmax_consistent": consistent,
    }
    ok = consistent and distinct >= 4 and margin >= 1e-2 and stats["logit_std"] > 0.5
    print(f"  [{name}] " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items()))
    return ok, stats


def reload_and_compare(outdir, prompt_ids, greedy, logits):
    """Round trip: load the written config.json (Hub layout) + model.safetensors with
    from_pretrained and check the logits are bit-identical."""
    m = AutoModelForCausalLM.from_pretrained(outdir, attn_implementation="eager", dtype=torch.float32)
    m.eval()
    full = torch.cat([torch.tensor(prompt_ids, dtype=torch.long), greedy])
    l2 = m(input_ids=full[None], use_cache=False).logits[0].to(torch.float32)
    diff = float((l2 - logits).abs().max())
    print(f"  reload from {outdir}: max |logits diff| = {diff}")
    assert diff == 0.0, diff


def write_reference(path, prompt_ids, greedy, logits, metadata):
    tensors = {
        "prompt_ids": torch.tensor(prompt_ids, dtype=torch.int64),
        "greedy_ids": greedy.to(torch.int64).contiguous(),
        "logits": logits.to(torch.float32).contiguous(),
    }
    # One metadata key only: safetensors writes the metadata map in hash order, so several keys
    # would make the file bytes differ from run to run.
    save_file(tensors, path, metadata={"info": json.dumps(metadata, sort_keys=True)})
    os.chmod(path, 0o644)  # save_file creates the file 0600


def rope_regions(model):
    """Classify each inv_freq of a llama3-scaled rotary embedding: kept / divided by factor /
    smoothly interpolated (compared with the unscaled base frequencies)."""
    cfg = model.config
    rp = cfg.rope_parameters
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    base = 1.0 / (rp["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    inv = model.model.rotary_emb.inv_freq.float()
    regions = []
    for b, f in zip(base.tolist(), inv.tolist()):
        if abs(f - b) <= 1e-6 * b:
            regions.append("keep")
        elif abs(f - b / rp["factor"]) <= 1e-6 * b:
            regions.append("divide")
        else:
            regions.append("smooth")
    return regions
