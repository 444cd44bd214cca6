"""One shape's `torch.mm` (bf16) repeated, for a profiler: `one_mm.py NAME ROWS` with NAME
one of qkv, o, gate_up, down (the Llama-3.1-8B projections)."""
import sys

import torch

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
k, n = SHAPES[sys.argv[1]]
m = int(sys.argv[2])
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
for _ in range(8):
    x @ w.t()
torch.cuda.synchronize()
