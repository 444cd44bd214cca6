#!/usr/bin/env bash
# The MLA tiles on one H200 (issue 19): parity with the interpreter and bucket invariance
# (`gpu_parity_mla`), launch timings at Kimi-K2 dims, ctx 8192, racecheck of a small case, then
# the Kimi-K2 bench's MLA per kernel at ctx 8192 (B = 1, 8; T = 1, 2, 4, 8) and the end-to-end
# exactness of `gpu_deepseek`. Pack first: scripts/gpu-pack --specc kernels-gen/gpu_parity_mla gpu_deepseek
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/tests/* .gpu2/specc 2>/dev/null
P=.gpu2/tests/gpu_parity_mla
echo "== parity + invariance"
timeout 240 $P --test-threads=1 --nocapture > "$OUT/mla_parity.log" 2>&1; echo "rc=$?"
grep -E "^(PASS|FAIL)|panicked|test result" "$OUT/mla_parity.log" | tail -80
echo "== timings"
timeout 120 $P --ignored --nocapture mla_tile_timings 2>&1 | grep -E "^kimi|panicked"
echo "== racecheck (fixture dims)"
timeout 150 compute-sanitizer --tool racecheck $P --test-threads=1 mla_tiles_match_interpreter_fixture_dims 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" | tail -3
K=(.gpu2/specc bench bench/configs/kimi-k2/config.json --random-weights --layers 2 --iters 20 --context 8192 --per-kernel)
for bt in "1 1" "8 1" "1 2" "1 4" "1 8"; do
  set -- $bt
  echo "== bench B=$1 T=$2 ctx 8192"
  timeout 200 "${K[@]}" --batch "$1" --tokens "$2" > "$OUT/bench_b$1_t$2.log" 2>&1
  grep -iE "mla|median|step" "$OUT/bench_b$1_t$2.log" | head -12
done
echo "== gpu_deepseek"
timeout 300 .gpu2/tests/gpu_deepseek --test-threads=1 --nocapture > "$OUT/gpu_deepseek.log" 2>&1; echo "rc=$?"
grep -E "test result|panicked|FAIL" "$OUT/gpu_deepseek.log" | tail -10
