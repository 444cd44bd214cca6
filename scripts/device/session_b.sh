#!/usr/bin/env bash
# One device call: the tiled GEMM's parity, row invariance and timings (gpu_gemm), the MLA tile
# parity, then the 8B-shape steps at batch 8 / 32 (decode, verify of 8) beside PyTorch under one
# CUDA graph, while the call has time left (BUDGET seconds, default 560).
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/tests/* .gpu2/specc 2>/dev/null
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
G=.gpu2/tests/gpu_gemm
echo "== gpu_gemm checks"
timeout 220 $G --test-threads=1 --nocapture > "$OUT/gpu_gemm.log" 2>&1; echo "rc=$?"
grep -E "FAIL|row invariance|panicked|test result" "$OUT/gpu_gemm.log" | tail -20
grep -c "^PASS" "$OUT/gpu_gemm.log"
echo "== gpu_gemm timings ($(left)s left)"
timeout 100 $G --test-threads=1 --nocapture --ignored time_ > "$OUT/gpu_gemm_time.log" 2>&1; echo "rc=$?"
grep -vE "^(running|test |$)" "$OUT/gpu_gemm_time.log" | tail -30
echo "== gpu_parity_mla ($(left)s left)"
timeout 90 .gpu2/tests/gpu_parity_mla --test-threads=1 --nocapture > "$OUT/gpu_parity_mla.log" 2>&1; echo "rc=$?"
grep -E "FAIL|panicked|test result" "$OUT/gpu_parity_mla.log" | tail -8; grep -c "^PASS" "$OUT/gpu_parity_mla.log"
B=(.gpu2/specc bench bench/configs/llama-3.1-8b/config.json --random-weights --iters 30 --context 1024)
for args in "--batch 32 --compare --torch-modes graph" "--batch 32 --tokens 8 --compare --torch-modes graph" "--batch 8 --tokens 8 --compare --torch-modes graph" "--batch 8"; do
  (( $(left) < 80 )) && { echo "skip $args: $(left)s left"; continue; }
  echo "== bench 8B $args ($(left)s left)"
  timeout $(( $(left) - 5 )) "${B[@]}" $args > "$OUT/bench8b_${args// /_}.log" 2>&1
  grep -E "^\| (verify|decode|torch|specc)|specc /|vs torch" "$OUT/bench8b_${args// /_}.log" | head -8
done
