#!/usr/bin/env bash
# `specc serve` soak on the GPU: the embedded default with 8 lanes (trained draft, k = 5),
# 200 requests from 16 concurrent clients, every reply checked against its lone text, and
# /metrics back at idle at the end. Output to stdout and $OUT/serve_soak.txt.
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BIN=${SPECC:-.gpu/specc}
timeout 590 python3 scripts/device/serve_soak.py --bin "$BIN" --requests "${REQUESTS:-200}" \
  --concurrency "${CONCURRENCY:-16}" --timeout 480 -- \
  --backend "${BACKEND:-cuda}" --spec models/default/spec.lanes8.toml --lanes 8 2>&1 | tee "$OUT/serve_soak.txt"
