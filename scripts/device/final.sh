#!/usr/bin/env bash
# One device call after the last merges: correctness of what changed (kernel families, every
# method's step graph, HF parity), racecheck on DDTree, then the DDTree budget sweep at the
# Llama-3.1-8B shape, attention-heavy figures and the M = 1 matmul variants.
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t() { # name, timeout, binary: run the test binary if it was built
  local n=$1 to=$2 bin=$3; shift 3
  [ -x "$bin" ] || { echo "== $n: not built"; return; }
  echo "== $n"
  timeout "$to" "$bin" --test-threads=1 --nocapture "$@" > "$OUT/$n.log" 2>&1; echo "rc=$?"
  grep -E "exact|rel L2|mean acceptance|panicked|test result|outside tolerance|µs|us " "$OUT/$n.log" | grep -v " 0 outside" | tail -14
}
t mma 200 .gpu/tests/gpu_parity_mma
t attn 200 .gpu/tests/gpu_parity_attn
t generic 120 .gpu/tests/gpu_generic
t e2e 200 .gpu/tests/gpu_e2e
t methods 200 .gpu/tests/gpu_dflash
t ddtree 200 .gpu/tests/gpu_ddtree
t eagle_tree 200 .gpu/tests/gpu_eagle3_tree
t sampling 100 .gpu/tests/gpu_sampling
t smoke 60 .gpu/tests/runtime_smoke
echo "== CLI: EAGLE-3 tree and DDTree on the trained family (CUDA, 200 tokens)"
for f in spec.eagle3-tree.toml ddtree.toml spec.toml; do
  timeout 60 .gpu/specc run models/default --spec models/default/$f --backend cuda --prompt 'def __init__(self' --max-tokens 200 2>&1 >/dev/null | grep -E "tok/s|acceptance|launches|rror" | sed "s/^/$f: /"
done
echo "== HF parity"
timeout 100 python3 scripts/device/hf_parity.py .gpu/specc models/default 2>&1 | grep -E "models|PARITY"
C=bench/configs
B=".gpu/specc bench $C/llama-3.1-8b/config.json --random-weights --iters 40"
echo "== DFlash b16 and the DDTree budget sweep (8B target, 8B-shaped DFlash drafter)"
for s in dflash-b16 ddtree-b16 ddtree-b32 ddtree-b64 ddtree-b128 ddtree-b256; do
  timeout 75 $B --spec $C/$s.toml --json "$OUT/$s.json" 2>&1 | grep -E "^\| (DFlash|DDTree)" | sed "s/^/$s /"
done
echo "== target forward over T tokens (causal), B=1 ctx 1024"
timeout 60 $B 2>&1 | grep -E "^\| decode"
for T in 8 16 64; do timeout 60 $B --tokens $T 2>&1 | grep -E "^\| verify" ; done
[ -x .gpu/kernel_bench ] && { echo "== kernel_bench tree attention"; timeout 60 .gpu/kernel_bench tree 2>&1 | tail -16; }
echo "== racecheck: DDTree step graph (random drafter)"
timeout 100 compute-sanitizer --tool racecheck --print-limit 5 .gpu/tests/gpu_ddtree --test-threads=1 random 2>&1 | tail -2
