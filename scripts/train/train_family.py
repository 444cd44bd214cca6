#!/usr/bin/env python3
"""Trains the tiny specc model family on the Python standard library and writes it to one folder:

    OUT/                 target: LlamaForCausalLM (HF layout: config.json, model.safetensors bf16,
                         tokenizer.json copied from models/default, reference.safetensors)
    OUT/draft/           standalone draft: smaller LlamaForCausalLM, distilled from the target
    OUT/eagle3/          EAGLE-3 head (LlamaForCausalLMEagle3 format), trained on the frozen target
    OUT/dflash/          DFlash block drafter (DFlashDraftModel format), trained on the frozen target
    OUT/README.md        what was trained, losses, greedy acceptance lengths, sample, provenance
    OUT/summary.json     the same numbers, machine-readable

    # device run (the lead): ~7 min on one H200, steps scaled to the time budget
    python3 scripts/train/train_family.py --out models/default-trained --time-budget-s 420
    # CPU smoke test (< 2 min on 2 cores): full-size models, few steps, small corpus
    python3 scripts/train/train_family.py --device cpu --tiny --out /tmp/family-tiny
    # re-check a written family (names, shapes, dtypes, reload, references) on the CPU
    python3 scripts/train/train_family.py --verify models/default-trained

Forward conventions of the EAGLE-3 head and the DFlash drafter: scripts/train/README.md.
"""
import time

T_START = time.time()

import argparse  # noqa: E402
import copy  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # scripts/ (hf_reference.py)

try:
    import torch
except ImportError as e:  # pragma: no cover
    sys.exit(f"cannot import torch ({e}); on a CPU-only machine with a CUDA wheel see "
             "tests/fixtures/README.md (scripts/torch_cuda_stubs.py)")
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import corpus as C  # noqa: E402
import heads as Hd  # noqa: E402

TOKENIZER_SRC = os.path.join(ROOT, "models", "default", "tokenizer.json")
BOS_ID, EOS_ID, VOCAB = 0, 1, 512
# relative stage lengths (seconds of the brief: target 150, draft 40, EAGLE-3 60, DFlash 60)
STAGE_WEIGHTS = {"target": 150.0, "draft": 40.0, "eagle3": 60.0, "dflash": 60.0}
REF_PROMPT = "Hello"  # same prompt as models/default/reference.safetensors
SAMPLE_PROMPT = "def "


def log(msg):
    print(f"[{time.time() - T_START:7.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------------------------ configs
def target_config(args):
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=6, num_attention_heads=8,
        num_key_value_heads=4, head_dim=32, intermediate_size=704, max_position_embeddings=1024,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=BOS_ID,
        eos_token_id=EOS_ID, pad_token_id=None)


def draft_config(args):
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, intermediate_size=352, max_position_embeddings=1024,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=BOS_ID,
        eos_token_id=EOS_ID, pad_token_id=None)


def build_llama(cfg, seed, attn="sdpa"):
    """Fresh f32 model; HF's own init (normal 0.02, norms 1) drawn from torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=attn, dtype=torch.float32)
    assert Hd.rope_theta(m.config) == 10000.0, m.config
    return m


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------ data
class Batches:
    """Deterministic random windows: [BOS] + ids[o : o + T - 1] for offsets drawn from a
    torch.Generator seeded per stage."""

    def __init__(self, ids, seq_len, batch, seed, device):
        self.ids = ids
        self.T, self.B = seq_len, batch
        self.gen = torch.Generator().manual_seed(seed)
        self.dev = device
        self.ar = torch.arange(seq_len - 1, device=device)

    def next(self):
        off = torch.randint(0, len(self.ids) - self.T, (self.B,), generator=self.gen).to(self.dev)
        x = self.ids[off[:, None] + self.ar]
        bos = torch.full((self.B, 1), BOS_ID, dtype=x.dtype, device=self.dev)
        return torch.cat([bos, x], dim=1)


# ------------------------------------------------------------------------------------ target helpers
class Taps:
    """Forward hooks on the target's decoder layers: out[i] = OUTPUT of decoder layer i (the
    residual stream after layer i, before the final norm)."""

    def __init__(self, model):
        self.out = {}
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            self.handles.append(layer.register_forward_hook(self._hook(i)))

    def _hook(self, i):
        def f(mod, inp, out):
            self.out[i] = out[0] if isinstance(out, tuple) else out
        return f

    def cat(self, ids):
        return torch.cat([self.out[i] for i in ids], dim=-1)

    def remove(self):
        for h in self.handles:
            h.remove()


CPU_BF16 = False  # --cpu-bf16: exercise the bf16-autocast code path on the CPU (testing only)


def autocast(dev):
    if dev.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=CPU_BF16)


def soft_ce(logits, p):
    """-(p * log_softmax(logits)).sum(-1), per position (f32)."""
    return -(p * torch.log_softmax(logits.float(), dim=-1)).sum(-1)


def entropy(p):
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


# ------------------------------------------------------------------------------------ training loop
def make_opt(module, lr, wd, dev):
    decay = [p for n, p in module.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in module.named_parameters() if p.requires_grad and p.dim() < 2]
    kw = {"fused": True} if dev.type == "cuda" else {"foreach": False}
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8, **kw)


def lr_at(step, total, peak, warmup, final_frac=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def calibrate(make_module, loss_fn, batches, dev, lr, n_warm=3, n_time=5):
    """Seconds per optimizer step, measured on a throw-away copy (does not touch the real run)."""
    m = make_module()
    opt = make_opt(m, lr, 0.0, dev)
    for i in range(n_warm + n_time):
        if i == n_warm:
            sync(dev)
            t0 = time.time()
        loss, _ = loss_fn(m, batches.next())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(dev)
    dt = (time.time() - t0) / n_time
    del m, opt
    return dt


def train(name, module, loss_fn, batches, steps, lr, wd, dev, log_every, deadline, warmup):
    """AdamW, linear warm-up then cosine to 10 % of the peak lr, grad clip 1.0.
    loss_fn(module, x) -> (loss, {metric: tensor}). Returns history of logged rows."""
    opt = make_opt(module, lr, wd, dev)
    params = [p for p in module.parameters() if p.requires_grad]
    module.train()
    hist = []
    acc = {}
    n_acc = 0
    t_log = time.time()
    tok_log = 0
    t0 = time.time()
    done = 0
    for step in range(steps):
        cur = lr_at(step, steps, lr, warmup)
        for g in opt.param_groups:
            g["lr"] = cur
        x = batches.next()
        loss, metrics = loss_fn(module, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        tok_log += x.numel()
        for k, v in [("loss", loss.detach())] + list(metrics.items()):
            acc[k] = acc.get(k, 0.0) + v.detach().float()
        n_acc += 1
        last = step == steps - 1
        over = deadline is not None and time.time() > deadline
        if (step + 1) % log_every == 0 or last or over:
            sync(dev)
            dt = time.time() - t_log
            row = {"step": step + 1, "lr": cur, "tok_per_s": tok_log / max(dt, 1e-9),
                   "elapsed_s": time.time() - t0}
            row.update({k: float(v) / n_acc for k, v in acc.items()})
            hist.append(row)
            extra = " ".join(f"{k} {row[k]:.4f}" for k in acc if k != "loss")
            log(f"{name} step {step + 1}/{steps} loss {row['loss']:.4f} {extra} lr {cur:.2e} "
                f"{row['tok_per_s'] / 1e3:.0f}k tok/s")
            acc, n_acc, tok_log, t_log = {}, 0, 0, time.time()
        if over and not last:
            log(f"WARNING: {name} passed its deadline: stopped at step {step + 1} of {steps}")
            break
    module.eval()
    return hist, done, time.time() - t0


class Planner:
    """Splits what is left of --time-budget-s between the remaining stages (STAGE_WEIGHTS)."""

    def __init__(self, budget, reserve):
        self.budget, self.reserve = budget, reserve
        self.left = list(STAGE_WEIGHTS)

    def alloc(self, stage):
        ws = sum(STAGE_WEIGHTS[s] for s in self.left)
        rem = self.budget - (time.time() - T_START) - self.reserve
        self.left.remove(stage)
        return max(5.0, rem * STAGE_WEIGHTS[stage] / ws)


def plan_steps(name, args, explicit, make_module, loss_fn, batches_calib, dev, lr, planner, default):
    """Explicit --X-steps wins; else the time budget (calibrated step time); else the default."""
    if explicit is not None:
        if planner is not None:
            planner.left.remove(name)
        return explicit, None
    if planner is None:
        return default, None
    sec = planner.alloc(name)
    t0 = time.time()
    dt = calibrate(make_module, loss_fn, batches_calib, dev, lr)
    sec = max(1.0, sec - (time.time() - t0))  # the calibration came out of the stage's share
    steps = max(20, int(sec / dt))
    log(f"{name}: {dt * 1e3:.1f} ms/step measured, {sec:.0f} s left of its share -> {steps} steps")
    return steps, time.time() + 1.25 * sec + 5


# ------------------------------------------------------------------------------------ eval
@torch.no_grad()
def greedy_generate(model, prompts, n_new):
    """Greedy continuation with HF generate (KV cache), eos stopping off."""
    from transformers import GenerationConfig

    gcfg = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=n_new, min_new_tokens=n_new,
                            use_cache=True, eos_token_id=None, pad_token_id=0, bos_token_id=None)
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=gcfg)
    return out


@torch.no_grad()
def heldout_loss(model, ids, seq_len, dev, max_seqs):
    n = min(max_seqs, (len(ids) - 1) // (seq_len - 1))
    if n == 0:
        return float("nan")
    tot, cnt = 0.0, 0
    for i in range(0, n, 16):
        rows = []
        for j in range(i, min(n, i + 16)):
            rows.append(torch.cat([torch.tensor([BOS_ID], device=dev),
                                   ids[j * (seq_len - 1): (j + 1) * (seq_len - 1)]]))
        x = torch.stack(rows)
        lg = model(input_ids=x, use_cache=False).logits.float()
        tot += float(F.cross_entropy(lg[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1), reduction="sum"))
        cnt += x[:, 1:].numel()
    return tot / cnt


def simulate(match, n_bases):
    """match [M, n_bases, k] bool: draft token s of the round whose bonus sits at base index n
    equals the target's greedy token. Greedy chain acceptance: the round emits m+1 tokens (m =
    leading matches) and the next round's bonus is at n+m+1."""
    m = match.int().cumprod(-1).sum(-1).cpu()  # [M, n_bases]
    steps = []
    for b in range(m.shape[0]):
        n = 0
        while n < n_bases:
            a = int(m[b, n])
            steps.append(a + 1)
            n += a + 1
    k = match.shape[-1]
    hist = [steps.count(i) for i in range(1, k + 2)]
    return sum(steps) / len(steps), len(steps), hist


@torch.no_grad()
def seq_spec_decode(target, propose, prompt, n_new, k):
    """Reference speculative decoding loop (no caches, f32): returns (emitted tokens, accepted
    lengths per round). propose(seq, bonus) -> k draft target-ids."""
    seq = prompt.clone()
    bonus = target(input_ids=seq[None], use_cache=False).logits[0, -1].argmax()
    out, lens = [], []
    while len(out) < n_new:
        d = propose(seq, bonus)
        ver = torch.cat([seq, bonus.view(1), d])
        am = target(input_ids=ver[None], use_cache=False).logits[0, len(seq):].argmax(-1)
        m = 0
        while m < k and int(d[m]) == int(am[m]):
            m += 1
        out += [int(bonus)] + [int(t) for t in d[:m]]
        lens.append(m + 1)
        seq = torch.cat([seq, bonus.view(1), d[:m]])
        bonus = am[m]
    return out, lens


@torch.no_grad()
def evaluate(args, target, draft, eagle, dflash, held, dev, res):
    """Greedy acceptance lengths on held-out prompts: chain k=7 (draft, EAGLE-3), block 8
    (DFlash). The target's greedy continuation G is computed once; since every draft proposal
    depends only on the committed prefix (plus the target's hidden states of it), each method's
    proposals for every possible round start are computed in ONE teacher-forced forward over G,
    then the rounds are replayed. seq_spec_decode cross-checks this on a few prompts."""
    k = 7
    P, N, M = args.eval_prompt_len, args.eval_new, args.eval_prompts
    span = len(held) - P
    assert span > 0, "held-out set too small"
    prompts = torch.stack([torch.cat([torch.tensor([BOS_ID], device=dev),
                                      held[i * span // M: i * span // M + P]]) for i in range(M)])
    p1 = P + 1
    G = greedy_generate(target, prompts, N + k + 1)  # [M, p1 + N + 8]
    taps = Taps(target)
    lg = target(input_ids=G, use_cache=False).logits.float()
    agree = (lg[:, p1 - 1:-1].argmax(-1) == G[:, p1:]).float().mean().item()
    e_taps = taps.cat(args.eagle_taps)
    d_taps = taps.cat(args.dflash_taps)
    taps.remove()
    embed_w = target.model.embed_tokens.weight
    lm_w = target.lm_head.weight
    bases = torch.arange(p1, p1 + N, device=dev)  # index n of the bonus token of a round
    s_ar = torch.arange(1, k + 1, device=dev)
    want = G[:, bases[:, None] + s_ar]  # [M, N, k]: G[n + s]
    out = {}
    tables = {}  # method -> match table [M, N, k'] (bool)
    if draft is not None:
        # standalone draft: proposal s at base n = argmax draft(G[0 .. n+s-1]) at position n+s-1
        dl = draft(input_ids=G, use_cache=False).logits.argmax(-1)
        tables["draft"] = dl[:, bases[:, None] + s_ar - 1] == want
    if eagle is not None:
        # EAGLE-3: round with bonus G[n] = chain at base t = n-1; step s at base t predicts G[t+s+1]
        lgs, _ = eagle.forward_ttt(embed_w, e_taps, G, k)
        am = torch.stack([eagle.to_target_ids(x.argmax(-1)) for x in lgs], -1)  # [M, T-1, k]
        tables["eagle3"] = am[:, bases - 1] == want
    if dflash is not None:
        # DFlash: block at anchor n: [G[n], MASK...], position i predicts G[n+i]
        anchors = bases[None].expand(M, N).contiguous()
        bl = dflash.forward_blocks(embed_w, lm_w, d_taps, G, anchors).argmax(-1)  # [M, N, bs-1]
        tables["dflash"] = bl == want[..., : dflash.block_size - 1]
    for name, tab in tables.items():
        out[name] = simulate(tab, N)
        tau, rounds, hist = out[name]
        log(f"eval {name}: acceptance length {tau:.3f} ({rounds} rounds; rounds emitting 1..8 tokens: {hist})")
    log(f"eval: target cached-vs-uncached greedy agreement {agree:.4f}")
    res["acceptance"] = {n: {"tau": v[0], "rounds": v[1], "hist": v[2]} for n, v in out.items()}
    res["acceptance_setup"] = {"prompts": M, "prompt_tokens": P, "new_tokens": N, "k": k,
                               "dflash_block": args.dflash_block,
                               "target_cached_vs_full_argmax_agreement": agree}

    # cross-check with the sequential runtime-style loops on a few prompts
    if args.check_seq > 0:
        def prop_draft(seq, bonus):
            cur = torch.cat([seq, bonus.view(1)])
            ds = []
            for _ in range(k):
                t = draft(input_ids=cur[None], use_cache=False).logits[0, -1].argmax()
                ds.append(t)
                cur = torch.cat([cur, t.view(1)])
            return torch.stack(ds)

        def target_taps(seq, ids):
            tp = Taps(target)
            target(input_ids=seq[None], use_cache=False)
            t = tp.cat(ids)[0]
            tp.remove()
            return t

        def prop_eagle(seq, bonus):
            return eagle.chain_greedy(embed_w, target_taps(seq, args.eagle_taps),
                                      torch.cat([seq, bonus.view(1)]), k)[0]

        def prop_dflash(seq, bonus):
            return dflash.block_greedy(embed_w, lm_w, target_taps(seq, args.dflash_taps), bonus)[0]

        ok_all = True
        props = {"draft": prop_draft, "eagle3": prop_eagle, "dflash": prop_dflash}
        for name, tab in tables.items():
            for b in range(min(args.check_seq, M)):
                emitted, lens = seq_spec_decode(target, props[name], prompts[b], N, tab.shape[-1])
                exact = emitted[:N] == G[b, p1: p1 + N].tolist()
                # replay the parallel match table for this prompt
                mm = tab[b].int().cumprod(-1).sum(-1).cpu()
                plens, n = [], 0
                while n < N:
                    plens.append(int(mm[n]) + 1)
                    n += int(mm[n]) + 1
                same = plens == lens
                ok_all &= exact and same
                log(f"check {name} prompt {b}: sequential output == target greedy: {exact}; "
                    f"sequential round lengths == parallel: {same} ({sum(lens)}/{len(lens)} tokens/rounds)")
        res["sequential_check"] = ok_all
        if args.tiny and not ok_all:
            raise SystemExit("sequential / parallel disagreement")


# ------------------------------------------------------------------------------------ saving
def hub_config(saved):
    """The config save_pretrained wrote -> the Hub layout of models/default/config.json (top-level
    rope_theta / rope_scaling, torch_dtype). Accepts the transformers-5 layout (rope_parameters,
    dtype) and the older one."""
    d = dict(saved)
    rp = d.pop("rope_parameters", None)
    if rp is not None:
        rp = dict(rp)
        d["rope_theta"] = rp.pop("rope_theta")
        d["rope_scaling"] = None if rp.get("rope_type", "default") == "default" else rp
    d.setdefault("rope_scaling", None)
    d.pop("dtype", None)
    d["torch_dtype"] = "bfloat16"
    assert d["rope_theta"] == 10000.0 and d["rope_scaling"] is None, d
    return dict(sorted(d.items()))


def save_llama(model, outdir):
    """model.safetensors exactly as save_pretrained(safe_serialization=True) writes it, in bf16
    (tied: no lm_head.weight), and config.json in the Hub layout."""
    import tempfile

    m = copy.deepcopy(model).to("cpu").to(torch.bfloat16)
    os.makedirs(outdir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        m.save_pretrained(tmp, safe_serialization=True)
        assert "model.safetensors" in os.listdir(tmp), os.listdir(tmp)
        shutil.copyfile(os.path.join(tmp, "model.safetensors"), os.path.join(outdir, "model.safetensors"))
        with open(os.path.join(tmp, "config.json")) as f:
            saved = json.load(f)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        f.write(json.dumps(hub_config(saved), indent=2) + "\n")


def write_refs(out, target_cfg, eagle_cfg, dflash_cfg, tok, res, args):
    """reference.safetensors per model, computed on the CPU in f32 from the files just written."""
    import hf_reference as HR
    from safetensors.torch import save_file

    torch.set_grad_enabled(False)
    meta = {"generator": "scripts/train/train_family.py", "torch": torch.__version__,
            "transformers": transformers.__version__, "attn_implementation": "eager",
            "compute_dtype": "float32 (bf16 weights upcast)", "seed": args.seed}
    prompt_ids = [BOS_ID] + tok.encode(REF_PROMPT).ids
    tgt = LlamaForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    for sub, model in (("", tgt), ("draft", None)):
        d = os.path.join(out, sub)
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            continue
        if model is None:
            model = LlamaForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
        greedy, logits = HR.greedy_and_logits(model, prompt_ids)
        HR.write_reference(os.path.join(d, "reference.safetensors"), prompt_ids, greedy, logits,
                           dict(meta, prompt=REF_PROMPT))
        log(f"reference {sub or 'target'}: {REF_PROMPT!r} -> {tok.decode(greedy.tolist())!r}")
    # EAGLE-3 / DFlash: a code prompt; target taps, parallel logits and one runtime-style round
    ids = torch.tensor([BOS_ID] + tok.encode("import os\n\ndef main(argv):\n    ").ids)
    tp = Taps(tgt)
    lg = tgt(input_ids=ids[None], use_cache=False).logits[0]
    bonus = lg[-1].argmax()
    emb = tgt.model.embed_tokens.weight
    for sub, cls, cfg in (("eagle3", Hd.Eagle3Head, eagle_cfg), ("dflash", Hd.DFlashDrafter, dflash_cfg)):
        d = os.path.join(out, sub)
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            continue
        head = Hd.load_module(cls(cfg), os.path.join(d, "model.safetensors")).eval()
        if sub == "eagle3":
            taps = tp.cat(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])[0]
            full = torch.cat([ids, bonus.view(1)])
            step1 = head.forward_ttt(emb, taps[None], full[None], 1)[0][0][0]  # [L, Vd]
            chain, chain_lg = head.chain_greedy(emb, taps, full, 7)
            t = {"input_ids": full, "target_taps": taps, "step1_logits": step1,
                 "chain_ids": chain, "chain_logits": chain_lg}
            info = ("input_ids = committed tokens + bonus (last); target_taps[t] = concat of the "
                    "tapped layers' outputs at position t (L = len(input_ids) - 1 rows); "
                    "step1_logits[t] = step-1 logits of the pair (fc(taps[t]), input_ids[t+1]) at "
                    "position t (causal over pairs 0..t); chain_ids/chain_logits = the 7-step "
                    "greedy chain drafted after the last pair (chain step s at position L-1+s-1)")
        else:
            taps = tp.cat(cfg["dflash_config"]["target_layer_ids"])[0]
            blk_ids, blk_lg = head.block_greedy(emb, tgt.lm_head.weight, taps, bonus)
            t = {"context_ids": ids, "target_taps": taps,
                 "block_ids": torch.cat([bonus.view(1), torch.full((cfg["block_size"] - 1,),
                                                                   cfg["mask_token_id"])]),
                 "block_logits": blk_lg, "draft_ids": blk_ids}
            info = ("context_ids at positions 0..L-1 (processed by the target; target_taps = their "
                    "tapped hidden states); block_ids = [bonus, MASK x 7] at positions L..L+7; "
                    "block_logits[i-1] = logits of block position i (predicts the token at L+i); "
                    "draft_ids = their argmax")
        t = {kk: (v.to(torch.float32) if v.is_floating_point() else v.to(torch.int64)).contiguous()
             for kk, v in t.items()}
        save_file(t, os.path.join(d, "reference.safetensors"),
                  metadata={"info": json.dumps(dict(meta, layout=info), sort_keys=True)})
        os.chmod(os.path.join(d, "reference.safetensors"), 0o644)
    tp.remove()


# ------------------------------------------------------------------------------------ verify
def verify(out, in_memory=None):
    """Names / shapes / dtypes of every file against the expected lists, then reload each model
    from disk and compare with the stored references (and with the in-memory models, bit for
    bit, when given)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    torch.set_grad_enabled(False)
    problems = []

    def header(path):
        with safe_open(path, "pt") as f:
            return {k: (list(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}

    def expect_llama(cfg):
        h, i, nh, nkv, hd, L, v = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                     "num_key_value_heads", "head_dim", "num_hidden_layers",
                                                     "vocab_size"))
        e = {"model.embed_tokens.weight": ([v, h], "BF16"), "model.norm.weight": ([h], "BF16")}
        for li in range(L):
            p = f"model.layers.{li}."
            e.update({p + "input_layernorm.weight": ([h], "BF16"),
                      p + "post_attention_layernorm.weight": ([h], "BF16"),
                      p + "self_attn.q_proj.weight": ([nh * hd, h], "BF16"),
                      p + "self_attn.k_proj.weight": ([nkv * hd, h], "BF16"),
                      p + "self_attn.v_proj.weight": ([nkv * hd, h], "BF16"),
                      p + "self_attn.o_proj.weight": ([h, nh * hd], "BF16"),
                      p + "mlp.gate_proj.weight": ([i, h], "BF16"), p + "mlp.up_proj.weight": ([i, h], "BF16"),
                      p + "mlp.down_proj.weight": ([h, i], "BF16")})
        if not cfg.get("tie_word_embeddings"):
            e["lm_head.weight"] = ([v, h], "BF16")
        return e

    cfgs = {}
    for sub in ("", "draft", "eagle3", "dflash"):
        d = os.path.join(out, sub)
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            problems.append(f"{sub or 'target'}: no model.safetensors")
            continue
        cfg = Hd.read_config(os.path.join(d, "config.json"))
        cfgs[sub] = cfg
        exp = {"": expect_llama, "draft": expect_llama, "eagle3": Hd.eagle3_expected_shapes,
               "dflash": Hd.dflash_expected_shapes}[sub](cfg)
        got = header(os.path.join(d, "model.safetensors"))
        if sub == "eagle3" and sorted(got) != sorted(Hd.EAGLE3_NAMES):
            problems.append(f"eagle3 names {sorted(got)}")
        if got != exp:
            diff = {k: (got.get(k), exp.get(k)) for k in set(got) | set(exp) if got.get(k) != exp.get(k)}
            problems.append(f"{sub or 'target'}: tensors differ from the expected list: {diff}")
        else:
            log(f"verify {sub or 'target'}: {len(got)} tensors, names/shapes/dtypes as expected")
    if "eagle3" in cfgs:
        c = cfgs["eagle3"]
        assert c["architectures"] == ["LlamaForCausalLMEagle3"] and c["num_hidden_layers"] == 1
        assert c["draft_vocab_size"] == c["vocab_size"]
        e = load_file(os.path.join(out, "eagle3", "model.safetensors"))
        assert e["d2t"].dtype == torch.int64 and int(e["d2t"].abs().sum()) == 0
        assert e["t2d"].dtype == torch.bool and bool(e["t2d"].all())
    if "dflash" in cfgs:
        c = cfgs["dflash"]
        assert c["architectures"] == ["DFlashDraftModel"]
        assert c["target_layer_ids"] == c["dflash_config"]["target_layer_ids"]
        assert c["mask_token_id"] == c["dflash_config"]["mask_token_id"]
    assert cfgs[""].get("tie_word_embeddings") is True and cfgs[""]["torch_dtype"] == "bfloat16"

    # reload and recompute the references
    tgt = LlamaForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
    emb, lm_w = tgt.model.embed_tokens.weight, tgt.lm_head.weight
    worst = 0.0
    for sub in [x for x in ("", "draft") if x in cfgs]:
        d = os.path.join(out, sub)
        m = tgt if sub == "" else LlamaForCausalLM.from_pretrained(
            d, attn_implementation="eager", dtype=torch.float32).eval()
        ref = load_file(os.path.join(d, "reference.safetensors"))
        full = torch.cat([ref["prompt_ids"], ref["greedy_ids"]])
        lg = m(input_ids=full[None], use_cache=False).logits[0]
        diff = float((lg - ref["logits"]).abs().max())
        worst = max(worst, diff)
        log(f"verify {sub or 'target'}: reloaded logits vs reference.safetensors max |diff| {diff:.3g}")
        if in_memory is not None and in_memory.get(sub) is not None:
            lm = in_memory[sub].to("cpu")(input_ids=full[None], use_cache=False).logits[0]
            d0 = float((lm - lg).abs().max())
            log(f"verify {sub or 'target'}: reloaded vs in-memory (bf16-rounded) max |diff| {d0}")
            if d0 != 0.0:
                problems.append(f"{sub or 'target'}: reload differs from the in-memory model by {d0}")
    for sub, cls in (("eagle3", Hd.Eagle3Head), ("dflash", Hd.DFlashDrafter)):
        if sub not in cfgs:
            continue
        d = os.path.join(out, sub)
        head = Hd.load_module(cls(cfgs[sub]), os.path.join(d, "model.safetensors")).eval()
        ref = load_file(os.path.join(d, "reference.safetensors"))
        if sub == "eagle3":
            step1 = head.forward_ttt(emb, ref["target_taps"][None], ref["input_ids"][None], 1)[0][0][0]
            _, chain_lg = head.chain_greedy(emb, ref["target_taps"], ref["input_ids"], 7)
            diff = max(float((step1 - ref["step1_logits"]).abs().max()),
                       float((chain_lg - ref["chain_logits"]).abs().max()))
            # the last step-1 row is the first chain row: the two formulations must agree
            d_form = float((step1[-1] - chain_lg[0]).abs().max())
            # taps from the reloaded target
            tp = Taps(tgt)
            tgt(input_ids=ref["input_ids"][:-1][None], use_cache=False)
            d_taps = float((tp.cat(cfgs[sub]["eagle_config"]["eagle_aux_hidden_state_layer_ids"])[0]
                            - ref["target_taps"]).abs().max())
            tp.remove()
        else:
            _, blk_lg = head.block_greedy(emb, lm_w, ref["target_taps"], ref["block_ids"][0])
            diff = float((blk_lg - ref["block_logits"]).abs().max())
            L = ref["target_taps"].shape[0]
            full = torch.cat([ref["context_ids"], ref["block_ids"][:1]])
            tp = Taps(tgt)
            tgt(input_ids=full[None], use_cache=False)
            taps_full = tp.cat(cfgs[sub]["dflash_config"]["target_layer_ids"])
            tp.remove()
            d_taps = float((taps_full[0, :L] - ref["target_taps"]).abs().max())
            # parallel formulation on a padded sequence: anchor L, block positions L..L+7
            pad = torch.cat([full, torch.zeros(head.block_size, dtype=torch.long)])
            tp = Taps(tgt)
            tgt(input_ids=pad[None], use_cache=False)
            par = head.forward_blocks(emb, lm_w, tp.cat(cfgs[sub]["dflash_config"]["target_layer_ids"]),
                                      pad[None], torch.tensor([[L]]))[0, 0]
            tp.remove()
            d_form = float((par - blk_lg).abs().max())
        worst = max(worst, diff, d_taps)
        log(f"verify {sub}: reloaded logits vs reference max |diff| {diff:.3g}; taps vs reference "
            f"{d_taps:.3g}; parallel vs sequential formulation {d_form:.3g}")
        if d_form > 1e-3:
            problems.append(f"{sub}: parallel and sequential formulations differ by {d_form}")
        if in_memory is not None and in_memory.get(sub) is not None:
            m = in_memory[sub].to("cpu")
            if sub == "eagle3":
                lm = m.forward_ttt(emb, ref["target_taps"][None], ref["input_ids"][None], 1)[0][0][0]
                d0 = float((lm - step1).abs().max())
            else:
                _, lm = m.block_greedy(emb, lm_w, ref["target_taps"], ref["block_ids"][0])
                d0 = float((lm - blk_lg).abs().max())
            log(f"verify {sub}: reloaded vs in-memory (bf16-rounded) max |diff| {d0}")
            if d0 != 0.0:
                problems.append(f"{sub}: reload differs from the in-memory model by {d0}")
    if worst > 1e-3:
        problems.append(f"reference mismatch up to {worst}")
    for p in problems:
        log(f"VERIFY PROBLEM: {p}")
    log("verify: OK" if not problems else f"verify: {len(problems)} problem(s)")
    return not problems


# ------------------------------------------------------------------------------------ README
def write_readme(out, res, args):
    a = res.get("acceptance", {})
    c = res["corpus"]
    st = res.get("stages", {})
    lines = [
        "# specc tiny family (trained)",
        "",
        "Written by `scripts/train/train_family.py` (forward conventions of the EAGLE-3 head and the",
        "DFlash drafter: `scripts/train/README.md`). Tokenizer: `models/default/tokenizer.json`, copied",
        "unchanged (byte-level BPE, vocab 512, BOS 0, EOS 1).",
        "",
        "## Models",
        "",
        "| dir | format | params | trained steps | batch x seq | s | final train loss | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [("target", ".", "LlamaForCausalLM, hidden 256, 6 layers, 8/4 heads, FFN 704, tied",
             "CE on the corpus"),
            ("draft", "draft/", "LlamaForCausalLM, hidden 128, 2 layers, 4/2 heads, FFN 352, tied",
             "KL to the target's next-token distribution"),
            ("eagle3", "eagle3/", "LlamaForCausalLMEagle3, taps " + str(args.eagle_taps),
             f"KL to the target, {args.eagle_ttt} unrolled steps (weights 0.8^(s-1))"),
            ("dflash", "dflash/", f"DFlashDraftModel, {args.dflash_layers} layers, block {args.dflash_block}, "
             f"taps {args.dflash_taps}, mask id {res.get('mask_token_id')}",
             "KL to the target at block positions 1..7 (weights exp(-(i-1)/4))")]
    for key, d, fmt, note in rows:
        s = st.get(key, {})
        if "params" not in s:
            lines.append(f"| `{d}` | {fmt} | FAILED | | | | | see the log |")
            continue
        lines.append(f"| `{d}` | {fmt} | {s.get('params', '?'):,} | {s.get('steps', '?')} | "
                     f"{s.get('batch', '?')} x {args.seq_len} | {s.get('seconds', 0):.0f} | "
                     f"{s.get('final_loss', float('nan')):.4f} | {note} |")
    lines += ["", f"Target held-out CE: {res.get('target_heldout_ce', float('nan')):.4f} nats/token "
              f"(train CE over the last logged steps {st.get('target', {}).get('final_loss', float('nan')):.4f}); "
              f"draft held-out CE {res.get('draft_heldout_ce', float('nan')):.4f}.", ""]
    lines += ["## Greedy acceptance length (held-out prompts)", ""]
    if a:
        s = res["acceptance_setup"]
        lines += [
            f"{s['prompts']} prompts of {s['prompt_tokens']} held-out tokens (after BOS), {s['new_tokens']} "
            "greedy tokens each; acceptance length = tokens emitted per target verify forward "
            "(accepted draft tokens + 1 bonus), computed in PyTorch f32 from the saved bf16 weights.",
            "",
            "| method | draft per round | acceptance length | rounds | rounds emitting 1..8 tokens |",
            "| --- | --- | --- | --- | --- |"]
        for key, label, per in (("draft", "standalone draft", "chain k=7"), ("eagle3", "EAGLE-3", "chain k=7"),
                                ("dflash", "DFlash", f"block {s['dflash_block']} ({s['dflash_block'] - 1} drafted)")):
            if key in a:
                lines.append(f"| {label} | {per} | {a[key]['tau']:.3f} | {a[key]['rounds']} | {a[key]['hist']} |")
            else:
                lines.append(f"| {label} | {per} | not measured | | |")
        lines += [
            "",
            f"Sequential (runtime-style) loops agree with the parallel computation: {res.get('sequential_check')}.",
            ""]
    else:
        lines += ["(not measured: the evaluation failed, see the log)", ""]
    if "sample" in res:
        lines += ["## Sample (target, greedy, prompt `def `)", "", "```python", res["sample"], "```", ""]
    lines += [
        "## Provenance",
        "",
        f"- Python {c['python']} standard library ({c['stdlib']}): training = {c['train_files']} files, "
        f"{c['train_bytes']:,} bytes, `{c['train_first']}` .. `{c['train_last']}` (sorted paths, rule of "
        f"`scripts/make_default_model.py`), sha256 of the (path, text) stream `{c['train_sha256']}`; "
        f"{c['train_tokens']:,} tokens (+1 EOS per file).",
        f"- Held-out = the files that follow: {c['heldout_files']} files, {c['heldout_bytes']:,} bytes, "
        f"`{c['heldout_first']}` .. `{c['heldout_last']}`, sha256 `{c['heldout_sha256']}`, "
        f"{c['heldout_tokens']:,} tokens.",
        f"- torch {res['versions']['torch']}, transformers {res['versions']['transformers']}, "
        f"tokenizers {res['versions']['tokenizers']}, device {res['versions']['device']}.",
        f"- Seed {args.seed}. Steps were {'set by --time-budget-s ' + str(args.time_budget_s) if args.time_budget_s else 'given'}; "
        "to repeat the same run: `" + res["repro"] + "` (bit-identical on the same hardware "
        "and software up to CUDA kernel nondeterminism; on the CPU it is deterministic).",
        f"- Wall time {res.get('wall_s', 0):.0f} s.",
        "- Weights are stored in bf16; every number above (acceptance, references) uses those bf16 "
        "values upcast to f32.",
        "",
        "## Files",
        "",
        "| path | bytes | sha256 |",
        "| --- | --- | --- |",
    ]
    for rel, size, h in res.get("files", []):
        lines.append(f"| `{rel}` | {size:,} | `{h[:16]}…` |")
    lines.append("")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


# ------------------------------------------------------------------------------------ main
def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "default-trained"))
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tiny", action="store_true", help="smoke test: small corpus, few steps")
    ap.add_argument("--verify", metavar="DIR", help="only check a written family and exit")
    ap.add_argument("--corpus-bytes", type=int, default=None, help="training text (default 16 MB; tiny 300 kB)")
    ap.add_argument("--heldout-bytes", type=int, default=None, help="held-out text (default 256 kB; tiny 64 kB)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default 256; tiny 4)")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="whole-run wall-time budget: stages without explicit steps get a share of it "
                         "(weights target 150 : draft 40 : eagle3 60 : dflash 60)")
    ap.add_argument("--reserve-s", type=float, default=None,
                    help="part of the budget kept for evaluation and saving (default 40; tiny 30)")
    for s, d in (("target", 3000), ("draft", 1000), ("eagle3", 1000), ("dflash", 1000)):
        ap.add_argument(f"--{s}-steps", type=int, default=None, help=f"default: from the budget, else {d}")
    ap.add_argument("--target-lr", type=float, default=3e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--eagle3-lr", type=float, default=2e-3)
    ap.add_argument("--dflash-lr", type=float, default=3e-3)
    ap.add_argument("--eagle-taps", default="1,2,3")
    ap.add_argument("--eagle-ttt", type=int, default=7, help="unrolled steps in EAGLE-3 training")
    ap.add_argument("--dflash-taps", default="1,3,5")
    ap.add_argument("--dflash-block", type=int, default=8)
    ap.add_argument("--dflash-layers", type=int, default=2)
    ap.add_argument("--eval-prompts", type=int, default=None, help="default 32; tiny 4")
    ap.add_argument("--eval-prompt-len", type=int, default=64)
    ap.add_argument("--eval-new", type=int, default=None, help="default 128; tiny 32")
    ap.add_argument("--check-seq", type=int, default=None,
                    help="prompts replayed with the sequential spec-decoding loops (default 2; tiny 1)")
    ap.add_argument("--log-every", type=int, default=None, help="default 50; tiny 3")
    ap.add_argument("--cpu-bf16", action="store_true", help="testing: bf16 autocast on the CPU too")
    args = ap.parse_args()
    t = args.tiny
    dflt = {"corpus_bytes": 300_000 if t else 16_000_000, "heldout_bytes": 64_000 if t else 256_000,
            "batch": 4 if t else 256, "reserve_s": 30.0 if t else 40.0, "eval_prompts": 4 if t else 32,
            "eval_new": 32 if t else 128, "check_seq": 1 if t else 2}
    for k, v in dflt.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if t:
        for s, n in (("target", 12), ("draft", 6), ("eagle3", 6), ("dflash", 6)):
            if getattr(args, f"{s}_steps") is None and args.time_budget_s is None:
                setattr(args, f"{s}_steps", n)
    if args.log_every is None:
        args.log_every = 3 if t else 50
    args.eagle_taps = [int(x) for x in args.eagle_taps.split(",")]
    args.dflash_taps = [int(x) for x in args.dflash_taps.split(",")]
    return args


def main():
    args = parse_args()
    if args.verify:
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        ok = verify(args.verify)
        sys.exit(0 if ok else 1)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    global CPU_BF16
    CPU_BF16 = args.cpu_bf16
    if dev.type == "cuda" and args.time_budget_s is None and all(
            getattr(args, f"{s}_steps") is None for s in STAGE_WEIGHTS):
        args.time_budget_s = 420.0
        log("no steps given on CUDA: --time-budget-s 420")
    if dev.type == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
        torch.use_deterministic_algorithms(True)
    else:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import warnings
    warnings.filterwarnings("ignore", message=".*deterministic.*")
    import tokenizers
    from tokenizers import Tokenizer

    res = {"versions": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"},
           "stages": {}}
    log(f"python {platform.python_version()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, device {res['versions']['device']}, seed {args.seed}")
    out = args.out
    os.makedirs(out, exist_ok=True)
    for sub in ("draft", "eagle3", "dflash"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)

    # ---- corpus + tokenizer
    tok = Tokenizer.from_file(TOKENIZER_SRC)
    assert tok.get_vocab_size() == VOCAB and tok.token_to_id("<|begin_of_text|>") == BOS_ID
    assert tok.token_to_id("<|end_of_text|>") == EOS_ID
    shutil.copyfile(TOKENIZER_SRC, os.path.join(out, "tokenizer.json"))
    train_files, held_files, cinfo = C.select(args.corpus_bytes, args.heldout_bytes)
    t0 = time.time()
    train_ids = C.tokenize(tok, train_files, EOS_ID)
    held_ids = C.tokenize(tok, held_files, EOS_ID)
    cinfo.update(train_tokens=len(train_ids), heldout_tokens=len(held_ids))
    res["corpus"] = cinfo
    log(f"corpus: Python {cinfo['python']}: train {cinfo['train_files']} files {cinfo['train_bytes']:,} B "
        f"-> {len(train_ids):,} tokens ({cinfo['train_first']} .. {cinfo['train_last']}, sha256 "
        f"{cinfo['train_sha256'][:16]}); held-out {cinfo['heldout_files']} files -> {len(held_ids):,} tokens; "
        f"tokenized in {time.time() - t0:.1f} s")
    # DFlash mask: the byte token of 0xFF (never in UTF-8 text, so never in any real input)
    mask_id = tok.token_to_id("\u00ff")
    assert mask_id is not None and mask_id not in (BOS_ID, EOS_ID)
    res["mask_token_id"] = mask_id
    train_t = torch.tensor(train_ids, dtype=torch.long)
    n_mask = int((train_t == mask_id).sum())
    assert n_mask == 0, f"mask token {mask_id} occurs {n_mask} times in the corpus"
    train_t = train_t.to(dev)
    held_t = torch.tensor(held_ids, dtype=torch.long, device=dev)

    planner = Planner(args.time_budget_s, args.reserve_s) if args.time_budget_s else None
    T, B = args.seq_len, args.batch
    tcfg, dcfg = target_config(args), draft_config(args)

    # ---- 1. target
    def make_target():
        return build_llama(tcfg, args.seed).to(dev)

    def target_loss(m, x):
        with autocast(dev):
            lg = m(input_ids=x, use_cache=False).logits
        return F.cross_entropy(lg[:, :-1].float().reshape(-1, VOCAB), x[:, 1:].reshape(-1)), {}

    steps, deadline = plan_steps("target", args, args.target_steps, make_target, target_loss,
                                 Batches(train_t, T, B, args.seed + 99, dev), dev, args.target_lr,
                                 planner, 3000)
    target = make_target()
    log(f"target: {n_params(target):,} params, {steps} steps x {B} x {T}")
    hist, done, secs = train("target", target, target_loss, Batches(train_t, T, B, args.seed + 1, dev),
                             steps, args.target_lr, 0.1, dev, args.log_every, deadline,
                             warmup=min(200, max(1, steps // 10)))
    Hd.round_to_bf16_(target)
    for p in target.parameters():
        p.requires_grad_(False)
    res["stages"]["target"] = {"params": n_params(target), "steps": done, "batch": B, "seconds": secs,
                               "final_loss": hist[-1]["loss"], "history": hist}
    save_llama(target, out)
    log(f"saved target ({secs:.0f} s of training)")
    target.eval()
    embed_w = target.model.embed_tokens.weight
    lm_w = target.lm_head.weight
    taps = Taps(target)
    need = sorted(set(args.eagle_taps) | set(args.dflash_taps))

    @torch.no_grad()
    def teacher(x):
        with autocast(dev):
            lg = target(input_ids=x, use_cache=False).logits
        return {i: taps.out[i] for i in need}, lg.float()

    def guarded(name, fn):
        """A failed drafter stage is logged and skipped: the other models are still finished."""
        try:
            return fn()
        except Exception:
            traceback.print_exc()
            log(f"WARNING: stage {name} failed; continuing without it")
            res["stages"][name] = {"failed": traceback.format_exc()}
            if planner is not None and name in planner.left:
                planner.left.remove(name)
            return None

    def finish_stage(name, module, hist, done, secs, extra=None):
        Hd.round_to_bf16_(module)
        res["stages"][name] = dict({"params": n_params(module), "steps": done, "batch": B, "seconds": secs,
                                    "final_loss": hist[-1]["loss"], "history": hist}, **(extra or {}))

    # ---- 2. standalone draft (distillation)
    def run_draft():
        def make_draft():
            return build_llama(dcfg, args.seed + 2).to(dev)

        def draft_loss(m, x):
            _, tl = teacher(x)
            p = torch.softmax(tl, -1)
            with autocast(dev):
                dl = m(input_ids=x, use_cache=False).logits
            ce = soft_ce(dl, p).mean()
            return ce, {"kl": ce.detach() - entropy(p).mean(),
                        "top1": (dl.argmax(-1) == tl.argmax(-1)).float().mean()}

        steps, deadline = plan_steps("draft", args, args.draft_steps, make_draft, draft_loss,
                                     Batches(train_t, T, B, args.seed + 98, dev), dev, args.draft_lr, planner,
                                     1000)
        draft = make_draft()
        log(f"draft: {n_params(draft):,} params, {steps} steps")
        hist, done, secs = train("draft", draft, draft_loss, Batches(train_t, T, B, args.seed + 3, dev), steps,
                                 args.draft_lr, 0.1, dev, args.log_every, deadline,
                                 warmup=min(100, max(1, steps // 10)))
        finish_stage("draft", draft, hist, done, secs,
                     {"final_kl": hist[-1].get("kl"), "final_top1": hist[-1].get("top1")})
        save_llama(draft, os.path.join(out, "draft"))
        log("saved draft")
        return draft

    draft = guarded("draft", run_draft)

    # ---- 3. EAGLE-3 head
    ecfg = Hd.eagle3_config(tcfg, args.eagle_taps)

    def run_eagle():
        S = args.eagle_ttt
        sw = [0.8 ** s for s in range(S)]

        def make_eagle():
            h = Hd.Eagle3Head(ecfg)
            h.init_weights(args.seed + 4, lm_head_from=embed_w.detach().cpu())
            return h.to(dev)

        def eagle_loss(m, x):
            tp, tl = teacher(x)
            p = torch.softmax(tl, -1)
            feats = torch.cat([tp[i] for i in args.eagle_taps], -1)
            with autocast(dev):
                lgs, _ = m.forward_ttt(embed_w, feats, x, S)
            tot, met = 0.0, {}
            for s in range(1, S + 1):
                # base t valid while t + s <= T-1; label = target distribution at position t+s
                lg_s = lgs[s - 1][:, : T - s]
                l_s = soft_ce(lg_s, p[:, s:T]).mean()
                tot = tot + sw[s - 1] * l_s
                if s in (1, S):
                    met[f"top1_s{s}"] = (lg_s.argmax(-1) == tl[:, s:T].argmax(-1)).float().mean()
            return tot / sum(sw), met

        steps, deadline = plan_steps("eagle3", args, args.eagle3_steps, make_eagle, eagle_loss,
                                     Batches(train_t, T, B, args.seed + 97, dev), dev, args.eagle3_lr, planner,
                                     1000)
        eagle = make_eagle()
        log(f"eagle3: {n_params(eagle):,} params, {steps} steps, {S} unrolled steps")
        hist, done, secs = train("eagle3", eagle, eagle_loss, Batches(train_t, T, B, args.seed + 5, dev), steps,
                                 args.eagle3_lr, 0.0, dev, args.log_every, deadline,
                                 warmup=min(100, max(1, steps // 10)))
        finish_stage("eagle3", eagle, hist, done, secs)
        Hd.write_json(os.path.join(out, "eagle3", "config.json"), ecfg)
        Hd.save_module(eagle, os.path.join(out, "eagle3", "model.safetensors"))
        log("saved eagle3")
        return eagle

    eagle = guarded("eagle3", run_eagle)

    # ---- 4. DFlash drafter
    bs = args.dflash_block
    fcfg = Hd.dflash_config(tcfg, args.dflash_taps, bs, mask_id, args.dflash_layers)

    def run_dflash():
        nb = T // bs - 1
        pw = torch.tensor([math.exp(-(i - 1) / 4.0) for i in range(1, bs)], device=dev)
        anchor_gen = torch.Generator().manual_seed(args.seed + 6)

        def make_dflash():
            h = Hd.DFlashDrafter(fcfg)
            h.init_weights(args.seed + 7)
            return h.to(dev)

        def dflash_loss(m, x):
            tp, tl = teacher(x)
            b = x.shape[0]
            # blocks at a = off + bs*j, off in [1, bs]: a + bs - 1 <= T - 1
            off = torch.randint(1, bs + 1, (b, 1), generator=anchor_gen).to(dev)
            anchors = off + bs * torch.arange(nb, device=dev)
            feats = torch.cat([tp[i] for i in args.dflash_taps], -1)
            with autocast(dev):
                lg = m.forward_blocks(embed_w, lm_w, feats, x, anchors)  # [b, nb, bs-1, V]
            # label of block position i = target distribution at position a+i-1 (predicts token a+i)
            pos = (anchors[..., None] + torch.arange(bs - 1, device=dev)).view(b, -1)
            tsel = tl.gather(1, pos[..., None].expand(-1, -1, VOCAB)).view(b, nb, bs - 1, VOCAB)
            ce = soft_ce(lg, torch.softmax(tsel, -1))  # [b, nb, bs-1]
            loss = (ce * pw).sum(-1).mean() / pw.sum()
            hit = (lg.argmax(-1) == tsel.argmax(-1)).float()
            return loss, {"top1_p1": hit[..., 0].mean(), "top1_p7": hit[..., -1].mean()}

        steps, deadline = plan_steps("dflash", args, args.dflash_steps, make_dflash, dflash_loss,
                                     Batches(train_t, T, B, args.seed + 96, dev), dev, args.dflash_lr, planner,
                                     1000)
        anchor_gen.manual_seed(args.seed + 6)  # calibration drew from it
        dflash = make_dflash()
        log(f"dflash: {n_params(dflash):,} params, {steps} steps, block {bs}, mask id {mask_id}")
        hist, done, secs = train("dflash", dflash, dflash_loss, Batches(train_t, T, B, args.seed + 8, dev), steps,
                                 args.dflash_lr, 0.0, dev, args.log_every, deadline,
                                 warmup=min(100, max(1, steps // 10)))
        finish_stage("dflash", dflash, hist, done, secs)
        Hd.write_json(os.path.join(out, "dflash", "config.json"), fcfg)
        Hd.save_module(dflash, os.path.join(out, "dflash", "model.safetensors"))
        log("saved dflash")
        return dflash

    dflash = guarded("dflash", run_dflash)
    taps.remove()
    train_t = None
    res["repro"] = " ".join(
        ["python3 scripts/train/train_family.py", f"--device {dev.type}", f"--seed {args.seed}"]
        + (["--tiny"] if args.tiny else [])
        + [f"--corpus-bytes {args.corpus_bytes}", f"--heldout-bytes {args.heldout_bytes}",
           f"--batch {args.batch}"]
        + [f"--{s}-steps {res['stages'][s].get('steps', 0)}" for s in STAGE_WEIGHTS])

    # ---- evaluation (f32, eager attention, bf16-rounded weights); failures do not lose the models
    torch.set_grad_enabled(False)
    tgt32 = build_llama(tcfg, 0, attn="eager").to(dev)
    tgt32.load_state_dict(target.state_dict())
    tgt32.eval()
    dr32 = None
    if draft is not None:
        dr32 = build_llama(dcfg, 0, attn="eager").to(dev)
        dr32.load_state_dict(draft.state_dict())
        dr32.eval()
    for m in (eagle, dflash):
        if m is not None:
            m.float().eval()
    try:
        res["target_heldout_ce"] = heldout_loss(tgt32, held_t, T, dev, 64)
        if dr32 is not None:
            res["draft_heldout_ce"] = heldout_loss(dr32, held_t, T, dev, 64)
        log(f"held-out CE: target {res['target_heldout_ce']:.4f}, draft {res.get('draft_heldout_ce', float('nan')):.4f}")
        sp = torch.tensor([[BOS_ID] + tok.encode(SAMPLE_PROMPT).ids], device=dev)
        g = greedy_generate(tgt32, sp, 96)[0].tolist()
        res["sample"] = tok.decode(g[1:])
        log("sample (target, greedy):\n" + res["sample"])
    except Exception:
        traceback.print_exc()
    try:
        evaluate(args, tgt32, dr32, eagle, dflash, held_t, dev, res)
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        log("WARNING: evaluation failed (models are saved)")
    try:
        write_refs(out, tcfg, ecfg, fcfg, tok, res, args)
        res["verified"] = verify(out, in_memory={"": tgt32, "draft": dr32, "eagle3": eagle, "dflash": dflash})
    except Exception:
        traceback.print_exc()
        res["verified"] = False
        log("WARNING: references / verification failed (models are saved)")
    res["wall_s"] = time.time() - T_START
    files = []
    for dp, dn, fns in os.walk(out):
        dn.sort()
        for fn in sorted(fns):
            if fn in ("README.md", "summary.json"):
                continue
            p = os.path.join(dp, fn)
            files.append((os.path.relpath(p, out), os.path.getsize(p), sha256_file(p)))
    res["files"] = files
    write_readme(out, res, args)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({k: v for k, v in res.items()}, f, indent=1, sort_keys=True, default=str)

    # ---- summary
    print("\n==================== SUMMARY ====================")
    for s in STAGE_WEIGHTS:
        st = res["stages"].get(s, {})
        if "failed" in st:
            print(f"{s:7s} FAILED")
            continue
        print(f"{s:7s} params {st['params']:>9,}  steps {st['steps']:>6} x {st['batch']} x {T}  "
              f"{st['seconds']:6.1f} s  {st['history'][-1]['tok_per_s'] / 1e3:8.0f}k tok/s  "
              f"final loss {st['final_loss']:.4f}")
    print(f"target held-out CE {res.get('target_heldout_ce', float('nan')):.4f}, draft "
          f"{res.get('draft_heldout_ce', float('nan')):.4f}")
    for n, v in res.get("acceptance", {}).items():
        print(f"acceptance length {n:7s} {v['tau']:.3f}  (rounds {v['rounds']}, hist {v['hist']})")
    print(f"sequential check: {res.get('sequential_check')}, verify: {res.get('verified')}")
    if "sample" in res:
        print("sample:\n" + res["sample"])
    total = sum(s for _, s, _ in files)
    print(f"files: {len(files)}, {total:,} bytes in {out}")
    print(f"wall time {res['wall_s']:.1f} s")
    if not res.get("verified"):
        sys.exit(1)


if __name__ == "__main__":
    main()
