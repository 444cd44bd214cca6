#!/usr/bin/env bash
# One device call, correctness of every GPU path against the CPU interpreter / target greedy /
# HF transformers, then compute-sanitizer on the newest step graphs. After scripts/gpu-build.
# Usage on the device: bash scripts/device/check_all.sh
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t() { # name, timeout, binary, args...
  local n=$1 to=$2; shift 2
  echo "== $n"
  timeout "$to" "$@" --test-threads=1 --nocapture > "$OUT/$n.log" 2>&1; echo "rc=$?"
  grep -E "^test |exact|rel L2|mean acceptance|panicked|test result|SKIP|chi2|edges|PDL" "$OUT/$n.log" | grep -v "^test .* ok$" | tail -25
}
t kernels 240 .gpu/tests/gpu_parity_mma
t gemv 120 .gpu/tests/gpu_parity
t attn 120 .gpu/tests/gpu_parity_attn
t generic 120 .gpu/tests/gpu_generic
t pdl 60 .gpu/tests/runtime_pdl
t smoke 60 .gpu/tests/runtime_smoke
t e2e 240 .gpu/tests/gpu_e2e
t dflash 240 .gpu/tests/gpu_dflash
t ddtree 240 .gpu/tests/gpu_ddtree
t eagle3_tree 240 .gpu/tests/gpu_eagle3_tree
t sampling 120 .gpu/tests/gpu_sampling
t serve 300 .gpu/tests/gpu_serve
echo "== HF parity"
timeout 120 python3 scripts/device/hf_parity.py .gpu/specc models/default tests/fixtures/llama_tied 2>&1 | grep -v Warning | grep -E "models|fixtures|PARITY|Error|error" | tee "$OUT/hf_parity.log"
echo "== memcheck: DDTree step graphs (PDL on; trained: tree verifies through the x-staged matmuls)"
timeout 120 compute-sanitizer --tool memcheck --print-limit 10 .gpu/tests/gpu_ddtree --test-threads=1 random 2>&1 | tail -3
timeout 150 compute-sanitizer --tool memcheck --print-limit 10 .gpu/tests/gpu_ddtree --test-threads=1 trained 2>&1 | tail -3
echo "== CLI per method (trained family, CUDA, 200 tokens)"
for m in none default eagle3 dflash ddtree; do
  case $m in none) a="--no-spec";; default) a="--spec models/default/spec.toml";; ddtree) a="--spec models/default/ddtree.toml";; *) a="--spec models/default/spec.$m.toml";; esac
  echo "-- $m"; timeout 60 .gpu/specc run models/default $a --backend cuda --prompt 'def __init__(self' --max-tokens 200 2>&1 >/dev/null | grep -E "tok/s|acceptance|launches|rror"
done
