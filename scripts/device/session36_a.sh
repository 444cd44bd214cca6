#!/usr/bin/env bash
# Session 36, call A: the q|k|v projection carries RoPE + KV write up to 8 rows, its
# cos / sin computed while the first weight loads are in flight. Checks (qkv_rope parity at
# 1–64 rows, the tiny HF fixtures end to end, the planted 8B shape's exactness, serving
# exactness), then the 8B step at B = 1 against the previous binary in the same call
# (decode and verify 8, per kernel), then the planted P = 0.6 serve at c = 1.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_parity_qkv_rope gpu_e2e gpu_serve gpu_planted,
# plus the previous commit's `specc` stripped and gzipped as .gpu2/specc_base.gz.
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - (SECONDS - start))); }
chmod +x .gpu2/specc_base 2>/dev/null
bash scripts/device/suite.sh gpu_parity_qkv_rope gpu_e2e gpu_planted gpu_serve 2>&1 | tail -40
echo "checks $((SECONDS - start))s"
T8=bench/configs/llama-3.1-8b/config.json
for spec in "--batch 1" "--batch 1 --tokens 8"; do
  for bin in specc_base specc specc_base specc; do
    f="$OUT/b1_$(echo $spec | tr -cd 0-9)_$bin.txt"
    echo "== 8B $spec $bin ($(left)s left)"
    timeout 60 .gpu2/$bin bench $T8 --random-weights --iters 40 --context 1024 $spec --per-kernel > "$f" 2>&1
    grep -E "^\| (decode|verify)" "$f" | cut -c1-150
    grep -E "qkv|rope" "$f" | sort -u -t'|' -k5,5 | head -4 | cut -c1-150
  done
done
if (( $(left) > 150 )); then
  LANES=16 MAX_CONTEXT=2048 REQUESTS=16 TOKENS=64 ACCEPT=0.6 CONC=1 \
    timeout $(( $(left) - 5 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | tail -8
fi
echo "total $((SECONDS - start))s"
