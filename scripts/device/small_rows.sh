#!/usr/bin/env bash
# One device call after the small-row policy change (x-staged matmuls above 8 rows, tensor-core
# attention from 2 tokens per sequence): the GPU paths against the interpreter / target greedy,
# then the step figures it moves (Llama-3.1-8B shapes, random bf16, B = 1, ctx 1024). After
# scripts/gpu-build. Usage on the device: bash scripts/device/small_rows.sh
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
t() { # name, timeout, binary
  echo "== $1"
  timeout "$2" ".gpu/tests/$1" --test-threads=1 --nocapture 2>&1 \
    | grep -E "exact|test result|panicked|SKIP|mean acceptance" | grep -v "^test .* ok$" | tail -12
}
t gpu_e2e 70
t gpu_dflash 80
t gpu_ddtree 80
t gpu_eagle3_tree 70
t gpu_parity_attn 50
C=bench/configs
B=".gpu/specc bench $C/llama-3.1-8b/config.json --random-weights --iters 50 --batch 1 --context 1024"
for a in "" "--tokens 8" "--tokens 16" "--tokens 64" "--spec $C/eagle3-k7.toml" "--spec $C/ddtree-b16.toml" "--spec $C/ddtree-b64.toml" "--spec $C/dflash-b16.toml"; do
  echo "## $a"; timeout 40 $B $a 2>&1 | grep "^| [vDdE]" | grep -v "^| step"
done
