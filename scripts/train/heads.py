"""EAGLE-3 head and DFlash drafter in plain PyTorch, with the exact published tensor names.

Both modules have NO token embedding and (DFlash) no lm_head of their own: the caller passes the
target's `embed_tokens.weight` (and, for DFlash, the target's lm_head weight; tied here).
The forward conventions are written down in scripts/train/README.md; keep the two in sync.

Two formulations of each forward are implemented and cross-checked by train_family.py:
  * a parallel/training one (`Eagle3Head.forward_ttt`, `DFlashDrafter.forward_blocks`): every
    base position of a sequence at once, with masks;
  * a sequential/inference one (`Eagle3Head.chain_greedy`, `DFlashDrafter.block_greedy`): one
    speculative step with a plain KV cache, the way a runtime does it.
"""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


# ------------------------------------------------------------------------------------ basics
class RMSNorm(nn.Module):
    """Llama/Qwen3 RMSNorm: w * (x / sqrt(mean(x^2) + eps)), statistics in f32."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


class MLP(nn.Module):
    def __init__(self, h, inter):
        super().__init__()
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attn(nn.Module):
    """Projections only (the attention itself is done by the callers, which differ in masking)."""

    def __init__(self, in_dim, h, nh, nkv, hd, qk_norm_eps=None):
        super().__init__()
        self.q_proj = nn.Linear(in_dim, nh * hd, bias=False)
        self.k_proj = nn.Linear(in_dim, nkv * hd, bias=False)
        self.v_proj = nn.Linear(in_dim, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(hd, qk_norm_eps)
            self.k_norm = RMSNorm(hd, qk_norm_eps)


def rope_inv_freq(head_dim, theta):
    """HF default rope: inv_freq[i] = 1 / theta^(2i / head_dim), i = 0 .. head_dim/2 - 1."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rope_cos_sin(pos, inv_freq):
    """pos: integer tensor [...]; returns cos, sin [..., head_dim] in f32 (NeoX half layout)."""
    freqs = pos.float()[..., None] * inv_freq.to(pos.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """x [B, heads, N, hd]; cos/sin [N, hd] or [B, N, hd] (cast to x.dtype as HF does)."""
    if cos.dim() == 2:
        cos, sin = cos[None, None], sin[None, None]
    else:
        cos, sin = cos[:, None], sin[:, None]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


def split_heads(x, n, hd):
    b, t, _ = x.shape
    return x.view(b, t, n, hd).transpose(1, 2)


def merge_heads(x):
    b, n, t, hd = x.shape
    return x.transpose(1, 2).reshape(b, t, n * hd)


def repeat_kv(x, n_rep):
    """[B, nkv, N, hd] -> [B, nkv*n_rep, N, hd]; q head h uses kv head h // n_rep (HF repeat_kv)."""
    if n_rep == 1:
        return x
    b, n, t, hd = x.shape
    return x[:, :, None].expand(b, n, n_rep, t, hd).reshape(b, n * n_rep, t, hd)


def causal_attention(q, k, v, scale):
    """q [B,nh,N,hd], k/v [B,nh,N,hd] at the same positions; key j visible to query i iff j <= i."""
    n = q.shape[2]
    s = (q @ k.transpose(-1, -2)).float() * scale
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).to(v.dtype)
    return p @ v


def full_attention(q, k, v, scale):
    s = (q @ k.transpose(-1, -2)).float() * scale
    p = torch.softmax(s, dim=-1).to(v.dtype)
    return p @ v


def rope_theta(cfg):
    """θ of an HF config: transformers 5 keeps it in rope_parameters, older ones top-level."""
    rp = getattr(cfg, "rope_parameters", None) or {}
    return float(rp.get("rope_theta", getattr(cfg, "rope_theta", None)))


def save_module(module, path, float_dtype=torch.bfloat16):
    """state_dict -> safetensors (floating tensors in float_dtype, others as they are)."""
    from safetensors.torch import save_file

    sd = module.state_dict()
    tensors = {}
    for k in sorted(sd):
        v = sd[k].detach().cpu()
        tensors[k] = (v.to(float_dtype) if v.is_floating_point() else v).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)  # save_file creates the file 0600


def load_module(module, path):
    from safetensors.torch import load_file

    sd = load_file(path)
    cur = module.state_dict()
    for k, v in sd.items():
        sd[k] = v.to(cur[k].dtype) if k in cur else v
    module.load_state_dict(sd, strict=True)
    return module


def round_to_bf16_(module):
    """Round the floating parameters to bf16 values (kept in their dtype): what gets saved."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


# ------------------------------------------------------------------------------------ EAGLE-3
def eagle3_config(target_cfg, tap_ids):
    """config.json of the head (Hub layout, as published EAGLE-3 heads plus eagle_config)."""
    h = target_cfg.hidden_size
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "attention_bias": False,
        "bos_token_id": target_cfg.bos_token_id,
        "eos_token_id": target_cfg.eos_token_id,
        "draft_vocab_size": target_cfg.vocab_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(tap_ids)},
        "head_dim": h // target_cfg.num_attention_heads,
        "hidden_act": "silu",
        "hidden_size": h,
        "intermediate_size": target_cfg.intermediate_size,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "mlp_bias": False,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_hidden_layers": 1,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": rope_theta(target_cfg),
        "target_hidden_size": h,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": target_cfg.vocab_size,
    }


class Eagle3Head(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h = cfg["hidden_size"]
        th = cfg.get("target_hidden_size", h)
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        eps = cfg["rms_norm_eps"]
        ntap = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        self.fc = nn.Linear(ntap * th, h, bias=False)
        m = nn.Module()
        m.input_layernorm = RMSNorm(h, eps)
        m.hidden_norm = RMSNorm(h, eps)
        m.self_attn = Attn(2 * h, h, self.nh, self.nkv, self.hd)
        m.post_attention_layernorm = RMSNorm(h, eps)
        m.mlp = MLP(h, cfg["intermediate_size"])
        self.midlayer = m
        self.norm = RMSNorm(h, eps)
        self.lm_head = nn.Linear(h, cfg["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(cfg["draft_vocab_size"], dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(cfg["vocab_size"], dtype=torch.bool))
        self.register_buffer("inv_freq", rope_inv_freq(self.hd, cfg["rope_theta"]), persistent=False)
        self.scale = self.hd ** -0.5

    def init_weights(self, seed, lm_head_from=None, std=0.02):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(self.named_parameters()):
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * std)
            if lm_head_from is not None:
                self.lm_head.weight.copy_(lm_head_from)

    def to_target_ids(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]

    def _qkv(self, emb, g, pos):
        """emb: raw target embeddings of the input tokens [B,N,H]; g: [B,N,H]; pos: [N] or [B,N]."""
        m = self.midlayer
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(g)], dim=-1)
        a = m.self_attn
        q = split_heads(a.q_proj(x), self.nh, self.hd)
        k = split_heads(a.k_proj(x), self.nkv, self.hd)
        v = split_heads(a.v_proj(x), self.nkv, self.hd)
        cos, sin = rope_cos_sin(pos, self.inv_freq)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        r = self.nh // self.nkv
        return q, repeat_kv(k, r), repeat_kv(v, r)

    def _finish(self, g, attn):
        m = self.midlayer
        out = g + m.self_attn.o_proj(merge_heads(attn))
        return out + m.mlp(m.post_attention_layernorm(out))

    def logits(self, out):
        return self.lm_head(self.norm(out))

    def forward_ttt(self, embed_w, taps, tokens, steps):
        """Training-time test, all base positions at once.

        taps [B,T,ntap*H]: concatenated tapped target hidden states at positions 0..T-1 (computed
        by the target on tokens[0..t]); tokens [B,T]. Base t = 0..T-2. Step s (1-based) at base t
        is the pair (g, tokens[t+s]) at position t+s-1, with g = fc(taps[t]) for s = 1 and the
        previous step's `out` at base t for s >= 2; it predicts tokens[t+s+1]. Its attention sees
        the step-1 pairs at positions 0..t and its own chain (steps 2..s of base t) - exactly the
        KV cache of a runtime drafting after committing tokens[0..t+1]. Entries whose token index
        t+s runs past T-1 are computed on a clamped token and must be ignored by the caller.
        Returns [logits of step s: [B, T-1, draft_vocab] for s = 1..steps], outs likewise."""
        b, t_len = tokens.shape
        n = t_len - 1
        dev = tokens.device
        tpos = torch.arange(n, device=dev)
        g = self.fc(taps[:, :n])
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        k1 = v1 = None
        chain_k, chain_v, logits, outs = [], [], [], []
        for s in range(1, steps + 1):
            tok = tokens[:, (tpos + s).clamp(max=t_len - 1)]
            emb = F.embedding(tok, embed_w)
            q, k, v = self._qkv(emb, g, tpos + s - 1)
            if s == 1:
                k1, v1 = k, v
            else:
                chain_k.append(k)
                chain_v.append(v)
            sc = (q @ k1.transpose(-1, -2)).float() * self.scale
            sc = sc.masked_fill(~causal, float("-inf"))
            diag = [(q.float() * kj.float()).sum(-1, keepdim=True) * self.scale for kj in chain_k]
            p = torch.softmax(torch.cat([sc] + diag, dim=-1), dim=-1)
            attn = p[..., :n].to(v1.dtype) @ v1
            for j, vj in enumerate(chain_v):
                attn = attn + p[..., n + j : n + j + 1].to(vj.dtype) * vj
            out = self._finish(g, attn)
            logits.append(self.logits(out))
            outs.append(out)
            g = out
        return logits, outs

    @torch.no_grad()
    def chain_greedy(self, embed_w, taps, tokens, k):
        """Runtime formulation of one drafting round. taps [L, ntap*H]: target taps at positions
        0..L-1 (the committed tokens tokens[0..L-1] that the target has processed); tokens [L+1]
        (tokens[L] = the bonus token the target just produced). Returns (draft target-ids [k],
        logits [k, draft_vocab]). KV cache: step-1 pairs (fc(taps[t]), tokens[t+1]) at positions
        t = 0..L-1, then one entry per chained step at positions L, L+1, ..."""
        L = taps.shape[0]
        dev = taps.device
        g = self.fc(taps[None])
        emb = F.embedding(tokens[1 : L + 1][None], embed_w)
        q, kc, vc = self._qkv(emb, g, torch.arange(L, device=dev))
        out = self._finish(g, causal_attention(q, kc, vc, self.scale))[:, -1:]
        ids, lgs = [], []
        for s in range(1, k + 1):
            if s > 1:
                emb = F.embedding(ids[-1].view(1, 1), embed_w)
                q, k1, v1 = self._qkv(emb, out, torch.tensor([L - 1 + s - 1], device=dev))
                kc, vc = torch.cat([kc, k1], dim=2), torch.cat([vc, v1], dim=2)
                out = self._finish(out, full_attention(q, kc, vc, self.scale))
            lg = self.logits(out)[0, -1]
            lgs.append(lg)
            ids.append(self.to_target_ids(lg.argmax()))
        return torch.stack(ids), torch.stack(lgs)


EAGLE3_NAMES = [
    "d2t", "fc.weight", "lm_head.weight", "midlayer.hidden_norm.weight",
    "midlayer.input_layernorm.weight", "midlayer.mlp.down_proj.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.v_proj.weight", "norm.weight", "t2d",
]


def eagle3_expected_shapes(cfg):
    h, i, nh, nkv, hd = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                            "num_key_value_heads", "head_dim"))
    ntap = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    vd, v = cfg["draft_vocab_size"], cfg["vocab_size"]
    return {
        "d2t": ([vd], "I64"), "t2d": ([v], "BOOL"),
        "fc.weight": ([h, ntap * cfg.get("target_hidden_size", h)], "BF16"),
        "lm_head.weight": ([vd, h], "BF16"), "norm.weight": ([h], "BF16"),
        "midlayer.hidden_norm.weight": ([h], "BF16"), "midlayer.input_layernorm.weight": ([h], "BF16"),
        "midlayer.post_attention_layernorm.weight": ([h], "BF16"),
        "midlayer.self_attn.q_proj.weight": ([nh * hd, 2 * h], "BF16"),
        "midlayer.self_attn.k_proj.weight": ([nkv * hd, 2 * h], "BF16"),
        "midlayer.self_attn.v_proj.weight": ([nkv * hd, 2 * h], "BF16"),
        "midlayer.self_attn.o_proj.weight": ([h, nh * hd], "BF16"),
        "midlayer.mlp.gate_proj.weight": ([i, h], "BF16"), "midlayer.mlp.up_proj.weight": ([i, h], "BF16"),
        "midlayer.mlp.down_proj.weight": ([h, i], "BF16"),
    }


# ------------------------------------------------------------------------------------ DFlash
def dflash_config(target_cfg, tap_ids, block_size, mask_token_id, n_layers):
    h = target_cfg.hidden_size
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": block_size,
        "bos_token_id": target_cfg.bos_token_id,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(tap_ids)},
        "eos_token_id": target_cfg.eos_token_id,
        "head_dim": h // target_cfg.num_attention_heads,
        "hidden_act": "silu",
        "hidden_size": h,
        "intermediate_size": target_cfg.intermediate_size,
        "layer_types": ["full_attention"] * n_layers,
        "mask_token_id": mask_token_id,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_hidden_layers": n_layers,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "num_target_layers": target_cfg.num_hidden_layers,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": rope_theta(target_cfg),
        "sliding_window": None,
        "target_layer_ids": list(tap_ids),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": target_cfg.vocab_size,
    }


class DFlashLayer(nn.Module):
    def __init__(self, h, inter, nh, nkv, hd, eps):
        super().__init__()
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = Attn(h, h, nh, nkv, hd, qk_norm_eps=eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = MLP(h, inter)


class DFlashDrafter(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h = cfg["hidden_size"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        eps = cfg["rms_norm_eps"]
        self.block_size = cfg["block_size"]
        self.mask_token_id = cfg["dflash_config"]["mask_token_id"]
        ntap = len(cfg["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(ntap * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, eps)
        self.layers = nn.ModuleList(
            [DFlashLayer(h, cfg["intermediate_size"], self.nh, self.nkv, self.hd, eps)
             for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(h, eps)
        self.register_buffer("inv_freq", rope_inv_freq(self.hd, cfg["rope_theta"]), persistent=False)
        self.scale = self.hd ** -0.5

    def init_weights(self, seed, std=0.02):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in sorted(self.named_parameters()):
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def _kv(self, layer, x, pos):
        """K (k_proj -> per-head k_norm -> RoPE at pos) and V (v_proj) of x, repeated to nh heads."""
        a = layer.self_attn
        k = a.k_norm(split_heads(a.k_proj(x), self.nkv, self.hd))
        cos, sin = rope_cos_sin(pos, self.inv_freq)
        k = apply_rope(k, cos, sin)
        v = split_heads(a.v_proj(x), self.nkv, self.hd)
        r = self.nh // self.nkv
        return repeat_kv(k, r), repeat_kv(v, r)

    def _q(self, layer, x, pos):
        a = layer.self_attn
        q = a.q_norm(split_heads(a.q_proj(x), self.nh, self.hd))
        cos, sin = rope_cos_sin(pos, self.inv_freq)
        return apply_rope(q, cos, sin)

    def _finish(self, layer, h, attn):
        h = h + layer.self_attn.o_proj(merge_heads(attn))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def forward_blocks(self, embed_w, lm_head_w, taps, tokens, anchors):
        """All blocks of a batch at once. taps [B,T,ntap*H] (target taps at positions 0..T-1),
        tokens [B,T], anchors [B,NB] (block start a >= 1, a + block_size - 1 <= T - 1 for
        training labels). Block b = [tokens[a], MASK x (bs-1)] at positions a..a+bs-1; its
        queries see the context K/V of positions 0..a-1 and all bs block positions (non-causal).
        Returns logits [B, NB, bs-1, V]: block position i = 1..bs-1 predicts the token at a+i."""
        bs = self.block_size
        b, t_len = tokens.shape
        nb = anchors.shape[1]
        dev = tokens.device
        ctx = self.hidden_norm(self.fc(taps))
        ctx_pos = torch.arange(t_len, device=dev)
        blk = torch.full((b, nb, bs), self.mask_token_id, dtype=torch.long, device=dev)
        blk[..., 0] = tokens.gather(1, anchors)
        blk_pos = (anchors[..., None] + torch.arange(bs, device=dev)).view(b, nb * bs)
        h = F.embedding(blk.view(b, nb * bs), embed_w)
        # query row (b, i) sees context key p iff p < anchor of its block
        vis = ctx_pos[None, None, :] < anchors.repeat_interleave(bs, dim=1)[:, :, None]
        vis = vis[:, None]  # [B,1,NB*bs,T]
        for layer in self.layers:
            hn = layer.input_layernorm(h)
            q = self._q(layer, hn, blk_pos)
            kc, vc = self._kv(layer, ctx, ctx_pos)
            kb, vb = self._kv(layer, hn, blk_pos)
            sc = (q @ kc.transpose(-1, -2)).float() * self.scale
            sc = sc.masked_fill(~vis, float("-inf"))
            qb = q.view(b, self.nh, nb, bs, self.hd)
            kbb = kb.view(b, self.nh, nb, bs, self.hd)
            vbb = vb.view(b, self.nh, nb, bs, self.hd)
            sb = (qb @ kbb.transpose(-1, -2)).float().view(b, self.nh, nb * bs, bs) * self.scale
            p = torch.softmax(torch.cat([sc, sb], dim=-1), dim=-1)
            attn = p[..., :t_len].to(vc.dtype) @ vc
            pb = p[..., t_len:].to(vb.dtype).view(b, self.nh, nb, bs, bs)
            attn = attn + (pb @ vbb).view(b, self.nh, nb * bs, self.hd)
            h = self._finish(layer, h, attn)
        out = self.norm(h).view(b, nb, bs, -1)[:, :, 1:]
        return out @ lm_head_w.t()

    @torch.no_grad()
    def block_greedy(self, embed_w, lm_head_w, taps, bonus):
        """Runtime formulation of one drafting round. taps [L, ntap*H]: target taps of the L
        committed tokens (positions 0..L-1); bonus: the token at position L (not yet processed
        by the target). Block [bonus, MASK x (bs-1)] at positions L..L+bs-1. Per layer
        K/V = concat(ctx entries at 0..L-1, block entries at L..L+bs-1), no mask.
        Returns (draft ids [bs-1], logits [bs-1, V])."""
        bs = self.block_size
        L = taps.shape[0]
        dev = taps.device
        ctx = self.hidden_norm(self.fc(taps[None]))
        blk = torch.full((1, bs), self.mask_token_id, dtype=torch.long, device=dev)
        blk[0, 0] = bonus
        h = F.embedding(blk, embed_w)
        cpos = torch.arange(L, device=dev)
        bpos = torch.arange(L, L + bs, device=dev)
        for layer in self.layers:
            hn = layer.input_layernorm(h)
            q = self._q(layer, hn, bpos)
            kc, vc = self._kv(layer, ctx, cpos)
            kb, vb = self._kv(layer, hn, bpos)
            attn = full_attention(q, torch.cat([kc, kb], 2), torch.cat([vc, vb], 2), self.scale)
            h = self._finish(layer, h, attn)
        lg = (self.norm(h)[0, 1:] @ lm_head_w.t())
        return lg.argmax(-1), lg


def dflash_expected_shapes(cfg):
    h, i, nh, nkv, hd = (cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                            "num_key_value_heads", "head_dim"))
    ntap = len(cfg["dflash_config"]["target_layer_ids"])
    out = {"fc.weight": ([h, ntap * h], "BF16"), "hidden_norm.weight": ([h], "BF16"),
           "norm.weight": ([h], "BF16")}
    for li in range(cfg["num_hidden_layers"]):
        p = f"layers.{li}."
        out.update({
            p + "input_layernorm.weight": ([h], "BF16"),
            p + "post_attention_layernorm.weight": ([h], "BF16"),
            p + "self_attn.q_proj.weight": ([nh * hd, h], "BF16"),
            p + "self_attn.k_proj.weight": ([nkv * hd, h], "BF16"),
            p + "self_attn.v_proj.weight": ([nkv * hd, h], "BF16"),
            p + "self_attn.o_proj.weight": ([h, nh * hd], "BF16"),
            p + "self_attn.q_norm.weight": ([hd], "BF16"),
            p + "self_attn.k_norm.weight": ([hd], "BF16"),
            p + "mlp.gate_proj.weight": ([i, h], "BF16"),
            p + "mlp.up_proj.weight": ([i, h], "BF16"),
            p + "mlp.down_proj.weight": ([h, i], "BF16"),
        })
    return out


def read_config(path):
    with open(path) as f:
        return json.load(f)


def write_json(path, obj):
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
