#!/usr/bin/env bash
# Session 33, last call: the blocked `sample` kernel against the interpreter (every generic
# case, gpu_generic), the 8B soak with the wgmma GEMM on by default (the 16-lane k = 7 verify
# is 128 rows: replies must equal their lone replies), the planted 8B sweep (plain, P = 0.6,
# P = 0.9) in one call with the new sample kernel and TCP_NODELAY on every run.
# Pack: scripts/gpu-pack --specc kernels-gen/gpu_generic
set -uo pipefail
source scripts/device/unpack.sh
start=$SECONDS; BUDGET=${BUDGET:-540}
left() { echo $((BUDGET - (SECONDS - start))); }
bash scripts/device/suite.sh gpu_generic
grep -ciE "^PASS|ok" "$OUT/gpu_generic.log"; grep -iE "sample" "$OUT/gpu_generic.log" | head -8
echo "== 8B soak, wgmma default ($(left)s left)"
REQUESTS=480 SOAK_S=110 bash scripts/device/serve_soak_8b.sh
echo "== 8B sweep ($(left)s left)"
LANES=16 MAX_CONTEXT=2048 REQUESTS=16 TOKENS=64 ACCEPT="0.6 0.9" \
  timeout $(( $(left) - 10 )) bash scripts/device/serve_sweep_accept.sh 8b 2>&1 | grep -v uploading | grep -E "^\||^ +[0-9]|== sweep" | tail -16
mkdir -p /tmp/rest; find "$OUT" -maxdepth 1 -type f ! -name 'gpu_generic.log' ! -name 'sweep_8b*' ! -name serve_soak_8b.txt -exec mv {} /tmp/rest/ \;
ls -la "$OUT"
