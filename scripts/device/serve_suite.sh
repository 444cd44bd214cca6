#!/usr/bin/env bash
# `specc serve` on the GPU, from binaries carried gzipped in .gpu2/ (specc with
# --features cuda, tests/gpu_serve):
#   tests : the gpu_serve binary (every method batched against alone)
#   soak  : serve_soak.py, REQUESTS (2000) from CONCURRENCY (32) clients on 8 lanes
#   sweep : specc bench-serve --concurrency 1,4,16,64 against specc serve (8 lanes) for plain
#           decoding and each method of the embedded default; JSON per run in $OUT
# Usage: bash scripts/device/serve_suite.sh tests soak sweep
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/specc .gpu2/tests/* 2>/dev/null
S=.gpu2/specc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for mode in "$@"; do
  case $mode in
  tests)
    echo "== gpu_serve"
    timeout 300 .gpu2/tests/gpu_serve --test-threads=1 --nocapture > "$OUT/gpu_serve.log" 2>&1; echo "rc=$?"
    grep -E "^test |exact|identical|panicked|test result" "$OUT/gpu_serve.log" | grep -v "^test .* ok$" | tail -15
    ;;
  soak)
    echo "== soak"
    SPECC=$S REQUESTS=${REQUESTS:-2000} CONCURRENCY=${CONCURRENCY:-32} bash scripts/device/serve_soak.sh | tail -15
    ;;
  sweep)
    D=models/default
    mkdir -p /tmp/specs
    for m in none spec spec.eagle3 spec.dflash ddtree; do
      if [[ $m == none ]]; then
        printf 'method = "none"\ntarget = "%s"\nbatch_buckets = [8]\n' "$PWD/$D" > /tmp/specs/none.toml
      else
        sed -e '/^batch_buckets/d' -e "s|^target = \".\"|target = \"$PWD/$D\"|" -e "s|^draft = \"\(.*\)\"|draft = \"$PWD/$D/\1\"|" "$D/$m.toml" > /tmp/specs/$m.toml
        echo 'batch_buckets = [8]' >> /tmp/specs/$m.toml
      fi
      port=$((8100 + RANDOM % 500))
      $S serve --backend cuda --spec /tmp/specs/$m.toml --lanes 8 --port $port > "$OUT/serve_$m.log" 2>&1 &
      pid=$!
      for i in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
      echo "== sweep $m"
      timeout 240 $S bench-serve --url "http://127.0.0.1:$port" --concurrency 1,4,16,64 --requests 64 \
        --max-tokens 128 --ignore-eos --json "$OUT/sweep_$m.json" 2>&1 | tail -8
      kill $pid; wait $pid 2>/dev/null
    done
    ;;
  esac
done
