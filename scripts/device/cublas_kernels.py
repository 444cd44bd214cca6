"""The kernels cuBLAS runs for `torch.mm` (bf16) at the Llama-3.1-8B projection shapes and
128 / 256 / 512 rows, with their launch geometry: their names carry the tile, the cluster
shape and the schedule (the reference `gemm_wgmma` is measured against)."""
import torch
from torch.profiler import ProfilerActivity, profile

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096)}
for name, (k, n) in SHAPES.items():
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for m in (128, 256, 512):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            x @ w.t()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA], record_shapes=False) as prof:
            for _ in range(5):
                x @ w.t()
            torch.cuda.synchronize()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                print(f"{name:<8} M={m:<4} {e.device_time / 1:.1f} us  {e.name[:160]}")
                break
