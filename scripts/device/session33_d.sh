#!/usr/bin/env bash
# Session 33, batch steps with the wgmma default against PyTorch in the same call
# (eager under one CUDA graph, and one Inductor-compiled layer reused under a graph).
# Pack: scripts/gpu-pack --specc
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-420}
left() { echo $((BUDGET - (SECONDS - start))); }
T=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 32 --tokens 8" "--batch 64 --tokens 8" "--batch 8 --tokens 8" "--batch 64"; do
  (( $(left) > 90 )) || break
  echo "== 8B $spec ($(left)s left)"
  timeout $(( $(left) - 10 )) .gpu2/specc bench $T --random-weights --iters 40 --context 1024 $spec \
    --compare --torch-modes graph,compile-layers 2>&1 | grep -E "^\||torch|error" | grep -v "^|---" | tail -8
done
