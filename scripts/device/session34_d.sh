#!/usr/bin/env bash
# Session 34, call D: the server reading each step's tokens behind the next step. gpu_serve
# (every method served with reads behind = alone), the 8B soak (every reply = its lone
# reply, idle values restored), the planted 8B sweep (plain, P = 0.6, P = 0.9), and
# decode attention on the tensor-core tiles at 1–64 sequences (kernel_bench batch_splits).
# Pack: scripts/gpu-pack --specc gpu_serve; kernel_bench as in session34_b.sh
set -uo pipefail
source scripts/device/unpack.sh
gunzip -kf .gpu2/kernel_bench.gz; chmod +x .gpu2/kernel_bench
start=$SECONDS; BUDGET=${BUDGET:-520}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_serve 2>&1 | grep -vE "^test .* ok$"
grep -E "greedy twins" "$OUT/gpu_serve.log"
echo "== 8B soak ($(left)s left)"
REQUESTS=480 SOAK_S=100 bash scripts/device/serve_soak_8b.sh 2>&1 | tail -12
if (( $(left) > 230 )); then
  echo "== planted sweep ($(left)s left)"
  LANES=16 MAX_CONTEXT=2048 REQUESTS=16 TOKENS=64 ACCEPT="0.6 0.9" \
    timeout $(( $(left) - 60 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | tail -9
fi
if (( $(left) > 40 )); then
  echo "== kernel_bench batch_splits ($(left)s left)"
  timeout $(( $(left) - 5 )) .gpu2/kernel_bench batch_splits > "$OUT/batch_splits.log" 2>&1
  grep -E "attn_tile B=[0-9]+ T=1 " "$OUT/batch_splits.log"
fi
echo "total $((SECONDS - start))s"
