#!/usr/bin/env python3
"""Checks of bench/torch_reference.py, runnable without pytest:

    python3 bench/test_torch_reference.py          # argument parsing always; the model and the
                                                    # modes when torch (and transformers) import

The model check loads the reference's random weights into Hugging Face transformers
(LlamaForCausalLM, Qwen3ForCausalLM) in float32 on the CPU and compares logits: a prompt of C
tokens run through the reference (filling its static cache), then T new tokens at positions
C..C+T-1, against HF over all C + T tokens. On a machine whose torch wheel is a CUDA build
without the CUDA libraries, first `python3 scripts/torch_cuda_stubs.py /tmp/cudastubs &&
export LD_LIBRARY_PATH=/tmp/cudastubs`.
"""
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import torch_reference as ref  # noqa: E402

TARGET = os.path.join(ROOT, "bench/configs/llama-3.1-8b")
DRAFT = os.path.join(ROOT, "bench/configs/llama-3.2-1b")
QWEN3 = os.path.join(ROOT, "tests/fixtures/qwen3_headdim")
EAGLE = os.path.join(ROOT, "bench/configs/eagle3-llama-3.1-8b")


def parse(*argv):
    return ref.parse_args(["--config", TARGET, *argv])


def parse_fails(*argv):
    """The usage error message of a rejected argument list."""
    proc = subprocess.run([sys.executable, os.path.join(HERE, "torch_reference.py"), *argv],
                          capture_output=True, text=True)
    assert proc.returncode == 2, (argv, proc.returncode, proc.stderr)
    return proc.stderr.strip().splitlines()[-1]


class Arguments(unittest.TestCase):
    def test_default_is_one_decode(self):
        a = parse()
        self.assertEqual(a.figures, [ref.Figure("forward", 1, 1024, 1)])
        self.assertEqual(a.modes, ["eager", "graph", "compile"])

    def test_figures_in_order(self):
        a = parse("--figure", "forward,8,1024,1", "--figure", "spec,1,512",
                  "--figure", "forward,1,8192,8", "--draft", DRAFT, "--k", "7")
        self.assertEqual(a.figures, [ref.Figure("forward", 8, 1024, 1),
                                     ref.Figure("spec", 1, 512, 8),
                                     ref.Figure("forward", 1, 8192, 8)])
        self.assertEqual(a.figures[1].label(), "spec k=7 B=1 ctx=512")

    def test_draft_adds_a_spec_figure(self):
        a = parse("--tokens", "8", "--draft", DRAFT, "--k", "3")
        self.assertEqual([f.kind for f in a.figures], ["forward", "spec"])
        self.assertEqual(a.figures[1].tokens, 4)

    def test_shapes_from_config(self):
        a = parse("--draft", DRAFT, "--k", "7")
        t, d = a.target_cfg, a.draft_cfg
        self.assertEqual((t.hidden, t.layers, t.heads, t.kv_heads, t.head_dim, t.ffn),
                         (4096, 32, 32, 8, 128, 14336))
        self.assertEqual((d.head_dim, d.tied, d.layers), (64, True, 16))
        # BENCH.md: 15.0 GB a decode must stream (all weights but the embedding table).
        self.assertAlmostEqual(t.weight_bytes() / 1e9, 15.0, places=1)
        q = ref.ModelConfig.load(QWEN3)
        self.assertTrue(q.qk_norm)
        self.assertEqual(q.head_dim, 32)

    def test_tiny_keeps_the_structure(self):
        a = parse("--tiny", "--draft", DRAFT, "--k", "2")
        t = a.target_cfg
        self.assertEqual(t.heads // t.kv_heads, 4)
        self.assertEqual((t.layers, a.draft_cfg.layers), (2, 1))
        self.assertEqual(t.rope_scaling["rope_type"], "llama3")

    def test_modes(self):
        self.assertEqual(parse("--modes", "compile-layers,eager").modes,
                         ["compile-layers", "eager"])

    def test_rejected(self):
        cases = [
            (["--config", TARGET, "--figure", "forward,1,1024"], "expected forward,B,C,T"),
            (["--config", TARGET, "--figure", "prefill,1,2,3"], "kind must be forward or spec"),
            (["--config", TARGET, "--figure", "forward,0,16,1"], "must be >= 1"),
            (["--config", TARGET, "--figure", "forward,1,x,1"], "must be integers"),
            (["--config", TARGET, "--figure", "spec,1,16"], "needs --draft and --k >= 1"),
            (["--config", TARGET, "--modes", "eager,fast"], "--modes eager,fast"),
            (["--config", TARGET, "--iters", "0"], "--iters must be >= 1"),
            (["--config", EAGLE], "expected one of"),
            (["--config", os.path.join(ROOT, "nope.json")], "No such file"),
            (["--config", TARGET, "--draft", QWEN3, "--k", "2"], "vocab_size 384 differs"),
        ]
        for argv, want in cases:
            with self.subTest(argv=argv):
                self.assertIn(want, parse_fails(*argv))

    def test_dry_run_needs_no_torch(self):
        # -S: no site-packages, so no torch (nor anything else installed) can be imported.
        out = subprocess.run([sys.executable, "-S", os.path.join(HERE, "torch_reference.py"),
                              "--config", TARGET, "--figure", "forward,1,1024,8", "--dry-run"],
                             capture_output=True, text=True, check=True)
        d = json.loads(out.stdout)
        self.assertEqual(d["figures"][0]["tokens"], 8)

    def test_missing_torch_is_exit_status_3(self):
        proc = subprocess.run([sys.executable, "-S", os.path.join(HERE, "torch_reference.py"),
                               "--config", TARGET, "--device", "cpu", "--tiny"],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 3, proc.stderr)
        self.assertIn("error: torch is not importable by", proc.stderr)


def torch_or_none():
    try:
        import torch
        return torch
    except Exception:
        return None


torch = torch_or_none()


@unittest.skipIf(torch is None, "torch is not importable")
class Model(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ref.torch, ref.F = torch, torch.nn.functional
        torch.set_grad_enabled(False)

    def hf_logits(self, cfg, model, ids):
        try:
            import transformers
        except Exception:
            self.skipTest("transformers is not importable")
        with open(cfg.path) as f:
            raw = json.load(f)
        raw.update(hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
                   num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
                   head_dim=cfg.head_dim, intermediate_size=cfg.ffn, vocab_size=cfg.vocab,
                   torch_dtype="float32", dtype="float32")
        for key in ("layer_types", "model_type", "bos_token_id", "eos_token_id"):
            raw.pop(key, None)
        arch = raw["architectures"][0]
        hf_cfg = transformers.AutoConfig.for_model(
            "qwen3" if cfg.qk_norm else "llama", **raw)
        hf = getattr(transformers, arch)(hf_cfg).eval()
        sd = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.final_norm,
              "lm_head.weight": model.lm_head}
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            sd.update({
                p + "input_layernorm.weight": layer.attn_norm,
                p + "post_attention_layernorm.weight": layer.mlp_norm,
                p + "self_attn.q_proj.weight": layer.wq, p + "self_attn.k_proj.weight": layer.wk,
                p + "self_attn.v_proj.weight": layer.wv, p + "self_attn.o_proj.weight": layer.wo,
                p + "mlp.gate_proj.weight": layer.wg, p + "mlp.up_proj.weight": layer.wu,
                p + "mlp.down_proj.weight": layer.wd})
            if cfg.qk_norm:
                sd[p + "self_attn.q_norm.weight"] = layer.q_norm
                sd[p + "self_attn.k_norm.weight"] = layer.k_norm
        missing, unexpected = hf.load_state_dict({k: v.data for k, v in sd.items()}, strict=False)
        self.assertEqual([m for m in missing if "rotary" not in m], [])
        self.assertEqual(unexpected, [])
        return hf(ids).logits

    def check_against_hf(self, config, context, tokens):
        cfg = ref.ModelConfig.load(config).tiny()
        model = ref.build_decoder(cfg, "cpu", seed=1, dtype=torch.float32)
        # Norm weights of 1 would hide a wrong norm weight; perturb them.
        for layer in model.layers:
            for n in ("attn_norm", "mlp_norm", "q_norm", "k_norm"):
                w = getattr(layer, n)
                if w is not None:
                    w.data += 0.1 * torch.randn_like(w)
        logits_head = (ref.decoder_layer,
                       lambda x, norm, w, eps: ref.F.linear(ref.rms_norm(x, norm, eps), w))
        cache = ref.kv_cache(cfg, 2, context + tokens, "cpu", False, dtype=torch.float32)
        ids = torch.randint(0, cfg.vocab, (2, context + tokens))
        ref.Forward(cfg, model, cache, 0, context, logits_head)(ids[:, :context])
        got = ref.Forward(cfg, model, cache, context, tokens, logits_head)(ids[:, context:])
        want = self.hf_logits(cfg, model, ids)[:, context:]
        err = (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()
        self.assertLess(err, 1e-4, f"rel L2 {err} vs HF")

    def test_llama_decode_matches_hf(self):
        self.check_against_hf(TARGET, context=9, tokens=1)

    def test_llama_verify_matches_hf(self):
        self.check_against_hf(TARGET, context=7, tokens=5)

    def test_llama_tied_matches_hf(self):
        self.check_against_hf(DRAFT, context=5, tokens=3)

    def test_qwen3_matches_hf(self):
        self.check_against_hf(QWEN3, context=6, tokens=4)

    def spec_step(self, draft_seed):
        cfg = ref.ModelConfig.load(TARGET).tiny()
        target = ref.build_decoder(cfg, "cpu", seed=3, dtype=torch.float32)
        draft = ref.build_decoder(cfg, "cpu", seed=draft_seed, dtype=torch.float32)
        # Context 0: every cache row read is one the step itself wrote, so the caches' initial
        # noise cannot make the draft and the target disagree.
        fig = ref.Figure("spec", 3, 0, 4)
        step, last = ref.make_figure(fig, (cfg, target, cfg, draft), "cpu",
                                     (ref.decoder_layer, ref.lm_head), static=False)
        return step(last)

    def test_spec_step_accepts_all_when_draft_is_target(self):
        accepted, checked = self.spec_step(draft_seed=3)
        self.assertEqual(tuple(checked.shape), (3, 4))
        self.assertEqual(accepted.tolist(), [3, 3, 3])

    def test_spec_step_rejects_an_unrelated_draft(self):
        accepted, _ = self.spec_step(draft_seed=4)
        # Vocabulary 256, random models: agreeing on the first token is a 1/256 event.
        self.assertEqual(accepted.tolist(), [0, 0, 0])

    def test_cpu_run_reports_every_mode(self):
        out = subprocess.run([sys.executable, os.path.join(HERE, "torch_reference.py"),
                              "--config", TARGET, "--device", "cpu", "--tiny", "--iters", "3",
                              "--warmup", "1", "--figure", "forward,1,8,2", "--figure",
                              "spec,1,8", "--draft", DRAFT, "--k", "2", "--modes",
                              "eager,graph,compile-layers"],
                             capture_output=True, text=True, check=True)
        d = json.loads(out.stdout)
        self.assertEqual([f["kind"] for f in d["figures"]], ["forward", "spec"])
        for f in d["figures"]:
            self.assertGreater(f["modes"]["eager"]["median_ms"], 0)
            self.assertIn("CUDA", f["modes"]["graph"]["skipped"])
            self.assertIn("CUDA", f["modes"]["compile-layers"]["skipped"])


if __name__ == "__main__":
    unittest.main()
