#!/usr/bin/env bash
# One device call: CUDA exactness of every method on the trained family, the per-method
# tok/s table of issue 7, HF bf16 parity of the trained default, and compute-sanitizer on the
# captured step graphs (acceptance ~0 and partial; memcheck + racecheck on DFlash).
# Usage on the device, after scripts/gpu-build: bash scripts/device/check_family.sh
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== gpu_dflash (DFlash random/trained, trained draft_model, trained EAGLE-3; B = 1, 4)"
timeout 240 .gpu/tests/gpu_dflash --test-threads=1 --nocapture 2>&1 | tee "$OUT/gpu_dflash.log" | grep -E "^test |exact|panicked|result|note"
echo "== gpu_e2e"
timeout 240 .gpu/tests/gpu_e2e --test-threads=1 --nocapture 2>&1 | tee "$OUT/gpu_e2e.log" | grep -E "^test |rel L2|exact|panicked|result"
echo "== per-method table on the trained family (CUDA, 200 tokens)"
P='def __init__(self'
for m in none default eagle3 dflash; do
  case $m in
    none) a="--no-spec";; default) a="--spec models/default/spec.toml";; *) a="--spec models/default/spec.$m.toml";;
  esac
  echo "-- $m"
  timeout 60 .gpu/specc run models/default $a --backend cuda --prompt "$P" --max-tokens 200 2>&1 >/dev/null | grep -E "tok/s|acceptance|launches|rror"
done
echo "== HF transformers parity (bf16 trained default + f32 fixtures)"
timeout 120 python3 scripts/device/hf_parity.py .gpu/specc models/default tests/fixtures/llama_tied 2>&1 | grep -v Warning | tee "$OUT/hf_parity.log"
echo "== memcheck: unrelated draft (acceptance ~0), captured step graph"
timeout 120 compute-sanitizer --tool memcheck --print-limit 10 .gpu/tests/gpu_e2e --test-threads=1 draft_model_unrelated 2>&1 | tail -4
echo "== memcheck: trained DFlash step graph"
timeout 150 compute-sanitizer --tool memcheck --print-limit 10 .gpu/tests/gpu_dflash --test-threads=1 trained_dflash 2>&1 | tail -4
echo "== racecheck: random DFlash step graph"
timeout 200 compute-sanitizer --tool racecheck --print-limit 10 .gpu/tests/gpu_dflash --test-threads=1 random_dflash 2>&1 | tail -4
