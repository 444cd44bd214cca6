#!/usr/bin/env bash
# One device call (see scripts/gpu-build): correctness first, then memcheck, then timings.
# Logs land in $OUT. Usage on the device: bash scripts/device/run_checks.sh [quick]
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== GPU end-to-end tests"
timeout 300 .gpu/tests/gpu_e2e --test-threads=1 --nocapture 2>&1 | tee "$OUT/gpu_e2e.log" | grep -E "test |rel L2|exact|identical|panicked|result" 
echo "== runtime smoke tests"
timeout 60 .gpu/tests/runtime_smoke --test-threads=1 2>&1 | tail -3
echo "== PDL: captured / eager chains over reused arena offsets (the tests turn PDL on themselves)"
timeout 120 .gpu/tests/runtime_pdl --test-threads=1 --nocapture 2>&1 | tee "$OUT/runtime_pdl.log" | grep -E "test |PDL|graph:|replay of|control|panicked|result"
echo "== CLI: cuda vs cpu on the embedded model"
.gpu/specc run --prompt "def main(" --max-tokens 32 --backend cuda --ids-out "$OUT/cuda_ids.json" > "$OUT/run_cuda.txt" 2> "$OUT/run_cuda.err"
.gpu/specc run --prompt "def main(" --max-tokens 32 --backend cpu --ids-out "$OUT/cpu_ids.json" > "$OUT/run_cpu.txt" 2>/dev/null
cat "$OUT/run_cuda.err"
if cmp -s "$OUT/cuda_ids.json" "$OUT/cpu_ids.json"; then echo "CUDA tokens == CPU tokens"; else echo "CUDA tokens DIFFER from CPU"; cat "$OUT/cuda_ids.json" "$OUT/cpu_ids.json"; fi
echo "== HF transformers parity"
timeout 120 python3 scripts/device/hf_parity.py .gpu/specc models/default tests/fixtures/llama3_scaled_untied tests/fixtures/llama_tied tests/fixtures/qwen3_headdim 2>&1 | grep -v Warning | tee "$OUT/hf_parity.log"
echo "== compute-sanitizer memcheck (captured step graphs; acceptance k and 0)"
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 .gpu/tests/gpu_e2e --test-threads=1 draft_model 2>&1 | tail -6 | tee "$OUT/memcheck.log"
