#!/usr/bin/env bash
# Runs GPU test binaries carried gzipped in .gpu2/tests/ (built off-device with
# `cargo test --release --features cuda,specc-runtime/cuda --no-run`), each with an optional
# test-name filter. Usage: bash scripts/device/suite.sh BINARY[:FILTER] ...
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/tests/* 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for spec in "$@"; do
  bin=${spec%%:*}; filter=""; [[ $spec == *:* ]] && filter=${spec#*:}
  echo "== $bin $filter"
  timeout 300 ".gpu2/tests/$bin" --test-threads=1 --nocapture $filter > "$OUT/$bin.log" 2>&1; echo "rc=$?"
  grep -E "^test |identical|exact|rel L2|panicked|test result|SKIP|error" "$OUT/$bin.log" | grep -v "^test .* ok$" | tail -20
done
