#!/usr/bin/env bash
# One device call: the captured step graphs against target greedy / the interpreter's draws and
# the matmul kernels against the interpreter (`tests`), then the step figures (`figures`:
# Llama-3.1-8B shapes, random bf16, B = 1, ctx 1024, PDL off): decode, verify of T = 8..64
# tokens, EAGLE-3 k = 7, DDTree budgets 16..256, DFlash block 16. After scripts/gpu-build.
# Usage on the device: bash scripts/device/step_checks.sh [tests] [figures] (default: both)
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
parts="${*:-tests figures}"
t() { # name, timeout
  echo "== $1"
  timeout "$2" ".gpu/tests/$1" --test-threads=1 --nocapture 2>&1 \
    | grep -E "exact|test result|panicked|SKIP|mean acceptance" | grep -v "^test .* ok$" | tail -12
}
if [[ $parts == *tests* ]]; then
  t gpu_parity_mma 90
  t gpu_e2e 70
  t gpu_dflash 80
  t gpu_ddtree 90
  t gpu_eagle3_tree 70
fi
if [[ $parts == *figures* ]]; then
  C=bench/configs
  B=".gpu/specc bench $C/llama-3.1-8b/config.json --random-weights --iters 50 --batch 1 --context 1024"
  for a in "" "--tokens 8" "--tokens 16" "--tokens 32" "--tokens 64" "--spec $C/eagle3-k7.toml" \
    "--spec $C/ddtree-b16.toml" "--spec $C/ddtree-b32.toml" "--spec $C/ddtree-b64.toml" \
    "--spec $C/ddtree-b128.toml" "--spec $C/ddtree-b256.toml" "--spec $C/dflash-b16.toml"; do
    echo "## $a"; timeout 40 $B $a 2>&1 | grep "^| [vDdE]" | grep -v "^| step"
  done
fi
