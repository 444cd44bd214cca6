#!/usr/bin/env bash
# One device call after a change to the many-row paths of tree verify (the wide matmul row
# tiles above 16 rows, tree attention): old/new A/B of verify-64 and DDTree-64, GPU tests
# through those paths, the budget sweep, then verify-64's per-kernel table.
# Binaries in .gpu/ (specc, specc_old, tests/*); tables to stdout and $OUT.
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t() { # name, timeout, binary
  echo "== $1"
  timeout "$2" "$3" --test-threads=1 > "$OUT/$1.log" 2>&1; echo "rc=$?"
  grep -E "panicked|test result|FAILED" "$OUT/$1.log" | tail -4
}
C=bench/configs
b() { # binary, args...
  local bin=$1; shift
  echo "-- $bin $*"
  timeout 60 .gpu/$bin bench $C/llama-3.1-8b/config.json --random-weights --iters 50 --batch 1 --context 1024 "$@" 2>&1 | grep "^| [a-zA-Z]" | grep -v "^| step" | tee -a "$OUT/bench.md"
}
for bin in specc_old specc; do
  b $bin --tokens 64
  b $bin --spec $C/ddtree-b64.toml
done
[ -x .gpu/tests/gpu_parity_attn ] && t attn 120 .gpu/tests/gpu_parity_attn
[ -x .gpu/tests/gpu_parity_mma ] && t mma 60 .gpu/tests/gpu_parity_mma
t ddtree 120 .gpu/tests/gpu_ddtree
t eagle3_tree 120 .gpu/tests/gpu_eagle3_tree
t e2e 90 .gpu/tests/gpu_e2e
t dflash 90 .gpu/tests/gpu_dflash
b specc
b specc --tokens 8
b specc --tokens 16
b specc --tokens 32
for n in 16 32 128 256; do b specc --spec $C/ddtree-b$n.toml; done
b specc --spec $C/dflash-b16.toml
echo "-- per-kernel, verify T = 64"
timeout 120 .gpu/specc bench $C/llama-3.1-8b/config.json --random-weights --iters 20 --batch 1 --context 1024 --tokens 64 --per-kernel > "$OUT/per_kernel_t64.txt" 2>&1
grep -vE "^\s*$" "$OUT/per_kernel_t64.txt" | head -60
