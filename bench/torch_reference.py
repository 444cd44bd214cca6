#!/usr/bin/env python3
"""PyTorch reference for `specc bench --compare`: specc's shapes, timed the way specc times them.

A minimal dense decoder written here from the Hugging Face config.json that specc reads
(Llama-3.x / Qwen3: RMSNorm, grouped-query attention with RoPE over a static KV cache, SwiGLU
MLP, lm-head, greedy argmax), with random bf16 weights. It is the plain "PyTorch model" baseline:
separate q/k/v and gate/up projections, SDPA for attention, nothing hand-fused.

Figures (each with its own static KV cache, so every shape and cache offset is a constant and
the whole figure can be captured in one CUDA graph):
  forward,B,C,T  B sequences, T new tokens each at positions C..C+T-1, attending to the C
                 cached tokens and to each other causally (T = 1: decode; T = k + 1: verify);
                 output: the argmax token of every position.
  spec,B,C       one greedy speculative step (--draft, --k): k draft forwards with T = 1, each
                 fed the previous one's argmax, then one target forward over the k + 1 tokens,
                 then the accepted count (longest prefix where draft and target argmax agree).
Modes:
  eager           the figure as written: one kernel launch per op (launch-bound at B = 1)
  graph           the same eager kernels captured once into one torch.cuda.CUDAGraph, replayed
  compile         torch.compile(mode="reduce-overhead", dynamic=False) of the whole figure
                  (Inductor kernels under its own CUDA graphs; minutes to compile at 8B)
  compile-layers  Inductor compiles one decoder layer (every layer reuses that compilation) and
                  the lm-head; the whole figure is then captured in one torch.cuda.CUDAGraph
                  (seconds to compile)
A mode that fails (no CUDA device, a torch.compile error, out of memory) is reported as
skipped with the reason; the other modes still run.

Timing (as `specc bench`): `--warmup` untimed calls, then `--iters` calls chained on the stream
with a CUDA event recorded before the first and after each; the figure is the median of the
per-call times, with p10 and p90. On the CPU (`--device cpu`, for smoke tests) a wall clock
replaces the events.

Output: one JSON object on stdout; progress on stderr. Exit status 2 for bad arguments, 3 when
torch cannot be imported or (with --device cuda) sees no GPU, 0 otherwise (skipped modes
included).

    python3 bench/torch_reference.py --config bench/configs/llama-3.1-8b/config.json \
        --figure forward,1,1024,1 --figure forward,1,1024,8 \
        --figure spec,1,1024 --draft bench/configs/llama-3.2-1b --k 7
    python3 bench/torch_reference.py --config bench/configs/llama-3.1-8b --device cpu --tiny \
        --context 16 --tokens 4 --iters 5 --warmup 1     # smoke test on a CPU
"""
import argparse
import json
import math
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, replace

MODES = ("eager", "graph", "compile", "compile-layers")
DEFAULT_MODES = ("eager", "graph", "compile")
# The dense architectures modelled, and whether each normalises q and k per head (Qwen3).
QK_NORM_BY_ARCHITECTURE = {"LlamaForCausalLM": False, "Qwen3ForCausalLM": True}


# ---------------------------------------------------------------------------------------------
# Arguments (no torch needed: `--dry-run` and argument errors work without it)


@dataclass(frozen=True)
class Figure:
    kind: str  # "forward" or "spec"
    batch: int
    context: int
    tokens: int  # new tokens per sequence (forward); k + 1 (spec: the verify's width)

    def label(self):
        if self.kind == "spec":
            return f"spec k={self.tokens - 1} B={self.batch} ctx={self.context}"
        return f"forward T={self.tokens} B={self.batch} ctx={self.context}"


def parse_figure(text, k):
    """`forward,B,C,T` or `spec,B,C` (the speculative step uses --k)."""
    parts = text.split(",")
    kind = parts[0]
    want = {"forward": 4, "spec": 3}.get(kind)
    if want is None:
        raise argparse.ArgumentTypeError(f"--figure {text}: kind must be forward or spec")
    if len(parts) != want:
        shape = "forward,B,C,T" if kind == "forward" else "spec,B,C"
        raise argparse.ArgumentTypeError(f"--figure {text}: expected {shape}")
    try:
        nums = [int(p) for p in parts[1:]]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--figure {text}: B, C and T must be integers") from None
    if any(n < 1 for n in nums[:1] + nums[2:]) or nums[1] < 0:
        raise argparse.ArgumentTypeError(f"--figure {text}: B and T must be >= 1, C >= 0")
    if kind == "spec":
        return Figure("spec", nums[0], nums[1], k + 1)
    return Figure("forward", nums[0], nums[1], nums[2])


def build_parser():
    p = argparse.ArgumentParser(
        description="PyTorch reference timings for specc bench --compare (JSON on stdout).")
    p.add_argument("--config", required=True, help="target config.json (or its directory)")
    p.add_argument("--draft", help="draft config.json (or directory) for spec figures")
    p.add_argument("--k", type=int, default=0, help="draft tokens per speculative step")
    p.add_argument("--figure", action="append", default=[],
                   help="forward,B,C,T or spec,B,C (repeatable; default: one forward from "
                        "--batch/--context/--tokens, plus spec,B,C when --draft is given)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"comma-separated subset of {','.join(MODES)}")
    p.add_argument("--iters", type=int, default=60, help="timed calls per mode (median)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true",
                   help="shrink the configs to a few small layers (smoke tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true",
                   help="print the resolved figures and shapes as JSON; import no torch")
    return p


def parse_args(argv):
    """Parsed and checked arguments; exits with status 2 and one message on a bad one."""
    p = build_parser()
    a = p.parse_args(argv)
    if a.k < 0:
        p.error("--k must be >= 0")
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--modes {a.modes}: expected a comma-separated subset of {','.join(MODES)}")
    a.modes = modes
    try:
        a.figures = [parse_figure(f, a.k) for f in a.figure]
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    if not a.figures:
        if a.batch < 1 or a.tokens < 1 or a.context < 0:
            p.error("--batch and --tokens must be >= 1, --context >= 0")
        a.figures = [Figure("forward", a.batch, a.context, a.tokens)]
        if a.draft:
            a.figures.append(Figure("spec", a.batch, a.context, a.k + 1))
    if any(f.kind == "spec" for f in a.figures) and (not a.draft or a.k < 1):
        p.error("a spec figure needs --draft and --k >= 1")
    try:
        a.target_cfg = ModelConfig.load(a.config)
        a.draft_cfg = ModelConfig.load(a.draft) if a.draft else None
    except ConfigError as e:
        p.error(str(e))
    if a.tiny:
        a.target_cfg = a.target_cfg.tiny()
        a.draft_cfg = a.draft_cfg.tiny(layers=1) if a.draft_cfg else None
    if a.draft_cfg and a.draft_cfg.vocab != a.target_cfg.vocab:
        p.error(f"--draft: vocab_size {a.draft_cfg.vocab} differs from the target's "
                f"{a.target_cfg.vocab}")
    return a


# ---------------------------------------------------------------------------------------------
# Model configuration: the raw HF JSON resolved once into the shapes the model needs


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ModelConfig:
    path: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    eps: float
    rope_theta: float
    rope_scaling: dict  # {} when absent
    tied: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before RoPE

    @staticmethod
    def load(path):
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        try:
            with open(file) as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{file}: {e}") from None
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in QK_NORM_BY_ARCHITECTURE), None)
        if arch is None:
            raise ConfigError(f"{file}: architectures {archs}: expected one of "
                              f"{sorted(QK_NORM_BY_ARCHITECTURE)} (dense Llama-3.x / Qwen3)")

        def need(key):
            if key not in raw:
                raise ConfigError(f"{file}: missing field \"{key}\"")
            return raw[key]

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ConfigError(f"{file}: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}")
        return ModelConfig(
            path=file, hidden=hidden, layers=need("num_hidden_layers"), heads=heads,
            kv_heads=kv_heads, head_dim=raw.get("head_dim") or hidden // heads,
            ffn=need("intermediate_size"), vocab=need("vocab_size"),
            eps=raw.get("rms_norm_eps", 1e-6), rope_theta=raw.get("rope_theta", 10000.0),
            rope_scaling=raw.get("rope_scaling") or {},
            tied=bool(raw.get("tie_word_embeddings", False)),
            qk_norm=QK_NORM_BY_ARCHITECTURE[arch])

    def tiny(self, layers=2):
        """Same structure (GQA ratio, q/k norm, tying, RoPE), widths small enough for a CPU."""
        group = self.heads // self.kv_heads
        kv = min(self.kv_heads, 2)
        return replace(self, hidden=64, layers=min(self.layers, layers), heads=kv * group,
                       kv_heads=kv, head_dim=16, ffn=128, vocab=256)

    def weight_bytes(self, elem=2):
        """Bytes of every weight but the embedding table (which a forward only gathers from)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attn + 3 * self.hidden * self.ffn + 2 * self.hidden
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        return elem * (self.layers * per_layer + self.hidden + self.vocab * self.hidden)


def dry_run(a):
    return {
        "dry_run": True, "device": a.device, "modes": a.modes, "iters": a.iters,
        "warmup": a.warmup, "k": a.k,
        "figures": [dict(asdict(f), label=f.label()) for f in a.figures],
        "target": asdict(a.target_cfg), "target_weight_bytes": a.target_cfg.weight_bytes(),
        "draft": asdict(a.draft_cfg) if a.draft_cfg else None,
    }


# ---------------------------------------------------------------------------------------------
# The model (torch is imported by main() and bound to this module's global `torch`)

torch = None
F = None


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def inverse_frequencies(cfg, device):
    """RoPE inverse frequencies, with Llama-3's long-context rescaling when configured."""
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device).float()
                                   / cfg.head_dim)
    s = cfg.rope_scaling
    if s.get("rope_type", s.get("type")) == "llama3":
        old = s["original_max_position_embeddings"]
        low_wave, high_wave = old / s["low_freq_factor"], old / s["high_freq_factor"]
        wave = 2 * math.pi / inv
        # Short wavelengths keep their frequency, long ones are divided by `factor`, and the
        # band between is interpolated linearly in old / wavelength.
        smooth = ((old / wave - s["low_freq_factor"])
                  / (s["high_freq_factor"] - s["low_freq_factor"])).clamp(0, 1)
        scaled = (1 - smooth) * inv / s["factor"] + smooth * inv
        inv = torch.where(wave < high_wave, inv, torch.where(wave > low_wave,
                                                             inv / s["factor"], scaled))
    return inv


def decoder_layer(x, w, kc, vc, cos, sin, mask, start, cfg):
    """One layer over x [B, T, hidden]; writes its keys/values at cache rows start..start+T-1.

    `w` is the layer's weights in a fixed order; kc, vc: [B, kv_heads, >= start + T, head_dim].
    Attention folds the query heads of each KV group into rows ([B, kv, group * T, D]) so every
    key is read once per KV head; `mask` (None when T = 1) is [group * T, start + T], True =
    visible.
    """
    attn_norm, wq, wk, wv, wo, mlp_norm, wg, wu, wd, q_norm, k_norm = w
    b, t, _ = x.shape
    kv, d, group = cfg.kv_heads, cfg.head_dim, cfg.heads // cfg.kv_heads
    h = rms_norm(x, attn_norm, cfg.eps)
    q = F.linear(h, wq).view(b, t, cfg.heads, d)
    k = F.linear(h, wk).view(b, t, kv, d)
    v = F.linear(h, wv).view(b, t, kv, d)
    if q_norm is not None:
        q, k = rms_norm(q, q_norm, cfg.eps), rms_norm(k, k_norm, cfg.eps)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    kc[:, :, start:start + t] = k
    vc[:, :, start:start + t] = v.transpose(1, 2)
    q = q.reshape(b, kv, group * t, d)
    a = F.scaled_dot_product_attention(q, kc[:, :, :start + t], vc[:, :, :start + t],
                                       attn_mask=mask)
    a = a.reshape(b, cfg.heads, t, d).transpose(1, 2).reshape(b, t, cfg.heads * d)
    x = x + F.linear(a, wo)
    h = rms_norm(x, mlp_norm, cfg.eps)
    return x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)


def lm_head(x, norm, w, eps):
    return F.linear(rms_norm(x, norm, eps), w).argmax(-1)


def build_decoder(cfg, device, seed, dtype=None):
    """Random weights (bf16 unless `dtype`): linear layers ~ N(0, 1/in), norms 1; one
    nn.Module tree so that torch.compile sees parameters (static inputs), not constants."""
    g = torch.Generator(device=device).manual_seed(seed)
    bf16 = dtype or torch.bfloat16

    def param(*shape, scale):
        return torch.nn.Parameter(
            torch.randn(*shape, generator=g, device=device, dtype=bf16) * scale,
            requires_grad=False)

    def ones(n):
        return torch.nn.Parameter(torch.ones(n, device=device, dtype=bf16), requires_grad=False)

    def linear(out, inp):
        return param(out, inp, scale=inp ** -0.5)

    hd, kv, d = cfg.hidden, cfg.kv_heads, cfg.head_dim
    m = torch.nn.Module()
    m.layers = torch.nn.ModuleList()
    for _ in range(cfg.layers):
        layer = torch.nn.Module()
        layer.attn_norm, layer.mlp_norm = ones(hd), ones(hd)
        layer.wq = linear(cfg.heads * d, hd)
        layer.wk, layer.wv = linear(kv * d, hd), linear(kv * d, hd)
        layer.wo = linear(hd, cfg.heads * d)
        layer.wg, layer.wu, layer.wd = linear(cfg.ffn, hd), linear(cfg.ffn, hd), linear(hd, cfg.ffn)
        layer.q_norm = ones(d) if cfg.qk_norm else None
        layer.k_norm = ones(d) if cfg.qk_norm else None
        m.layers.append(layer)
    m.embed = param(cfg.vocab, hd, scale=1.0)
    m.final_norm = ones(hd)
    m.lm_head = m.embed if cfg.tied else linear(cfg.vocab, hd)
    return m


def layer_weights(layer):
    return (layer.attn_norm, layer.wq, layer.wk, layer.wv, layer.wo, layer.mlp_norm,
            layer.wg, layer.wu, layer.wd, layer.q_norm, layer.k_norm)


class Forward:
    """One model's forward over `tokens` new tokens per sequence at rows start..start+tokens-1
    of a static KV cache (shared between the forwards of one speculative step)."""

    def __init__(self, cfg, model, cache, start, tokens, kernels):
        self.cfg, self.model, self.cache, self.start, self.t = cfg, model, cache, start, tokens
        self.layer_fn, self.head_fn = kernels
        dev = model.embed.device
        pos = torch.arange(start, start + tokens, device=dev).float()
        ang = torch.outer(pos, inverse_frequencies(cfg, dev))
        ang = torch.cat((ang, ang), dim=-1)
        dtype = model.embed.dtype
        self.cos, self.sin = ang.cos().to(dtype), ang.sin().to(dtype)
        self.mask = None
        if tokens > 1:
            row = torch.arange(tokens, device=dev).repeat(cfg.heads // cfg.kv_heads)
            col = torch.arange(start + tokens, device=dev)
            self.mask = col[None, :] <= start + row[:, None]

    def __call__(self, ids):
        x = F.embedding(ids, self.model.embed)
        for layer, (kc, vc) in zip(self.model.layers, self.cache):
            x = self.layer_fn(x, layer_weights(layer), kc, vc, self.cos, self.sin, self.mask,
                              self.start, self.cfg)
        return self.head_fn(x, self.model.final_norm, self.model.lm_head, self.cfg.eps)


def kv_cache(cfg, batch, rows, device, static, dtype=None):
    """Per layer (keys, values) [B, kv_heads, rows, head_dim], filled with small noise (what
    was cached is irrelevant to the time; zeros could hit special cases)."""
    def one():
        t = torch.randn(batch, cfg.kv_heads, rows, cfg.head_dim, device=device,
                        dtype=dtype or torch.bfloat16) * 0.1
        if static:
            # The cache is mutated in place; reduce-overhead's CUDA graphs need its address fixed.
            torch._dynamo.mark_static_address(t)
        return t
    return [(one(), one()) for _ in range(cfg.layers)]


def make_figure(fig, models, device, kernels, static):
    """(callable, input) for one figure; the callable never synchronises with the host."""
    target_cfg, target, draft_cfg, draft = models
    ids = torch.randint(0, target_cfg.vocab, (fig.batch, 1), device=device)
    if fig.kind == "forward":
        cache = kv_cache(target_cfg, fig.batch, fig.context + fig.tokens, device, static,
                         target.embed.dtype)
        fwd = Forward(target_cfg, target, cache, fig.context, fig.tokens, kernels)

        def forward(tokens):
            return fwd(tokens)

        return forward, ids.repeat(1, fig.tokens)
    k = fig.tokens - 1
    dcache = kv_cache(draft_cfg, fig.batch, fig.context + k, device, static, draft.embed.dtype)
    tcache = kv_cache(target_cfg, fig.batch, fig.context + k + 1, device, static,
                      target.embed.dtype)
    drafts = [Forward(draft_cfg, draft, dcache, fig.context + i, 1, kernels) for i in range(k)]
    verify = Forward(target_cfg, target, tcache, fig.context, k + 1, kernels)

    def step(last):
        proposed, tok = [], last
        for fwd in drafts:
            tok = fwd(tok)
            proposed.append(tok)
        proposed = torch.cat(proposed, dim=1)
        checked = verify(torch.cat((last, proposed), dim=1))
        accepted = (proposed == checked[:, :k]).int().cumprod(dim=1).sum(dim=1)
        return accepted, checked

    return step, ids


# ---------------------------------------------------------------------------------------------
# Modes and timing


class Skip(Exception):
    pass


def time_calls(call, device, warmup, iters):
    for _ in range(warmup):
        call()
    times = []
    if device == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record()
        for ev in events[1:]:
            call()
            ev.record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"median_ms": times[len(times) // 2], "p10_ms": times[len(times) // 10],
            "p90_ms": times[len(times) * 9 // 10], "iters": iters}


def capture(fn, arg):
    """fn(arg) captured in one CUDA graph after a warm-up on a side stream (which also runs any
    compilation outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(arg)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(arg)
    torch.cuda.synchronize()
    return g


def run_mode(mode, fig, models, a):
    eager_kernels = (decoder_layer, lm_head)
    if mode in ("graph", "compile-layers") and a.device != "cuda":
        raise Skip("CUDA graphs need a CUDA device")
    if mode in ("eager", "graph"):
        fn, arg = make_figure(fig, models, a.device, eager_kernels, static=False)
        if mode == "eager":
            return time_calls(lambda: fn(arg), a.device, a.warmup, a.iters)
        g = capture(fn, arg)
        return time_calls(g.replay, a.device, a.warmup, a.iters)
    t0 = time.perf_counter()
    if mode == "compile-layers":
        kernels = (torch.compile(decoder_layer, dynamic=False, fullgraph=True),
                   torch.compile(lm_head, dynamic=False, fullgraph=True))
        fn, arg = make_figure(fig, models, a.device, kernels, static=False)
        g = capture(fn, arg)
        compile_s = time.perf_counter() - t0
        out = time_calls(g.replay, a.device, a.warmup, a.iters)
    else:
        fn, arg = make_figure(fig, models, a.device, eager_kernels, static=True)
        compiled = torch.compile(fn, mode="reduce-overhead", dynamic=False, fullgraph=True)

        def call():
            torch.compiler.cudagraph_mark_step_begin()
            compiled(arg)

        skips_before = cudagraph_skips()
        call()  # compiles; the next calls record the CUDA graph, then replay it
        compile_s = time.perf_counter() - t0
        out = time_calls(call, a.device, max(a.warmup, 3), a.iters)
        if a.device == "cuda" and cudagraph_skips() > skips_before:
            out["note"] = "torch.compile skipped its CUDA graph (see stderr)"
    out["compile_s"] = round(compile_s, 1)
    return out


def cudagraph_skips():
    from torch._dynamo.utils import counters
    return sum(counters["inductor"].get(k, 0) for k in counters["inductor"]
               if "cudagraph_skip" in k)


def reset_between_modes(device):
    torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def import_torch():
    global torch, F
    try:
        import torch as t
        import torch.nn.functional as f
    except Exception as e:  # an ImportError, or a missing shared library behind it
        print(f"error: torch is not importable by {sys.executable}: {e}", file=sys.stderr)
        sys.exit(3)
    torch, F = t, f


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.dry_run:
        print(json.dumps(dry_run(a), indent=1))
        return 0
    import_torch()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: torch sees no CUDA device (use --device cpu for a smoke test)",
              file=sys.stderr)
        return 3
    # One compilation per figure and model shape; the default limit (8) would fall back to
    # eager after a few figures.
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    t_start = time.perf_counter()
    torch.set_grad_enabled(False)
    with torch.inference_mode():
        target = build_decoder(a.target_cfg, a.device, a.seed)
        draft = (build_decoder(a.draft_cfg, a.device, a.seed + 1)
                 if any(f.kind == "spec" for f in a.figures) else None)
        models = (a.target_cfg, target, a.draft_cfg, draft)
        figures = []
        for fig in a.figures:
            modes = {}
            for mode in a.modes:
                print(f"torch_reference: {fig.label()}: {mode} ...", file=sys.stderr, flush=True)
                try:
                    modes[mode] = run_mode(mode, fig, models, a)
                except Skip as e:
                    modes[mode] = {"skipped": str(e)}
                except Exception as e:  # a torch.compile or CUDA failure skips this mode only
                    print("\n".join(traceback.format_exc().splitlines()[-12:]), file=sys.stderr)
                    first = (str(e).strip().splitlines() or [""])[0][:300]
                    modes[mode] = {"skipped": f"{type(e).__name__}: {first}"}
                reset_between_modes(a.device)
                print(f"torch_reference: {fig.label()}: {mode}: {modes[mode]}", file=sys.stderr,
                      flush=True)
            figures.append(dict(asdict(fig), label=fig.label(), modes=modes))
    dev = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print(json.dumps({
        "torch": torch.__version__, "device": dev, "dtype": "bfloat16",
        "config": a.target_cfg.path, "draft_config": a.draft_cfg.path if a.draft_cfg else None,
        "tiny": a.tiny, "k": a.k, "warmup": a.warmup, "iters": a.iters,
        "target_weight_bytes": a.target_cfg.weight_bytes(),
        "draft_weight_bytes": a.draft_cfg.weight_bytes() if a.draft_cfg else None,
        "figures": figures, "wall_s": round(time.perf_counter() - t_start, 1),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
