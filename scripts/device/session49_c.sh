#!/usr/bin/env bash
# Session 49, call C: issue 20's Kimi-K2.5 int4 figures beyond 2 layers (the issue names "the
# layer count that fits, e.g. 12 of 61"): decode and verify(8) at B = 1, ctx 1024, with 2 and
# with the most layers this card holds (12 on an H200, 6 on an H100), the per-kernel table of
# verify(8) at both; the planted P = 0.6 sweep at c = 1 (issue 22 item 5); then the 8B
# per-kernel tables at B = 8 / 64 and verify(8) B = 1 with what is left.
# Pack: scripts/gpu-pack --specc (specc as xz).
set -uo pipefail
source scripts/device/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
kimi_layers
echo "kimi $((SECONDS - start))s" >> "$S"
# Issue 22 item 5 on this card: the planted P = 0.6 at c = 1 against plain (2.05x on an H100 in
# session 37 with 128-token requests; 1.87-1.90x on the H200 in session 34).
if (( $(left) > 200 )); then
  CONC=1 REQUESTS=16 TOKENS=128 LANES=16 MAX_CONTEXT=2048 ACCEPT=0.6 timeout $(( $(left) - 60 )) \
    bash scripts/device/serve_sweep_accept.sh 8b > /tmp/sweep.txt 2>&1
  echo "== sweep P=0.6 c=1 rc=$? ($(left)s left)" >> "$S"
  grep -vE "^\s*$" /tmp/sweep.txt | grep -E "sweep|tok/s|^ *1 |plain|0.6|x\)" | head -16 >> "$S"
fi
# Issue 22's limiter analysis: per-kernel tables of the 8B steps not yet tabled on the H200.
per_kernel_8b "--batch 8" "--batch 8 --tokens 8" "--batch 64" "--batch 64 --tokens 8" \
  "--batch 1 --tokens 8"
echo "total $((SECONDS - start))s" >> "$S"
