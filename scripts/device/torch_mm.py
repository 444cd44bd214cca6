"""cuBLAS (torch.mm, bf16) at the Llama-3.1-8B projection shapes and the row counts of
verify(8) at batch 16 / 32 / 64, L2 flushed between reps (triton's do_bench): the per-GEMM
reference for `gpu_gemm --ignored time_wgmma_tiles` (weights cold there too)."""
import torch
from triton.testing import do_bench

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
for name, (k, n) in SHAPES.items():
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for m in (128, 256, 512):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ms = do_bench(lambda: x @ w.t(), warmup=25, rep=200)
        print(f"torch {name:<8} M={m:<4} {ms * 1e3:7.1f} us  {2 * m * k * n / ms / 1e9:6.0f} TFLOP/s")
