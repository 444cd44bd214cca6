#!/usr/bin/env bash
# One device call for the engine split: an engine compiled off-device (`specc compile -o E
# --arch sm_90a,sm_100a,sm_120`, carried in .gpu2/E) run on the CUDA backend with the dynamic
# loader's trace showing no libnvrtc opened, its text compared with the CPU backend's; the
# baked engine on CUDA; then step figures of this binary and of the previous one
# (.gpu2/specc_old) in the same call. Usage: bash scripts/device/engine_checks.sh [figures]
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache
for f in .gpu2/*.gz; do gunzip -kf "$f"; done; chmod +x .gpu2/specc .gpu2/specc_old; tar xzf .gpu2/E.tgz -C .gpu2
S=.gpu2/specc
P="def __init__(self"
echo "== run E on cuda (LD_DEBUG=libs)"
LD_DEBUG=libs timeout 120 $S run .gpu2/E --backend cuda --prompt "$P" --max-tokens 64 >"$OUT/cuda.out" 2>"$OUT/cuda.err"
echo "rc $?; nvrtc libraries opened: $(grep -c 'libnvrtc' "$OUT/cuda.err")"
grep -v "^ *[0-9]*:" "$OUT/cuda.err" | tail -4
timeout 120 $S run .gpu2/E --prompt "$P" --max-tokens 64 >"$OUT/cpu.out" 2>"$OUT/cpu.err"
cmp "$OUT/cuda.out" "$OUT/cpu.out" && echo "cuda text == cpu text"
echo "== baked engine on cuda"
timeout 120 $S run --backend cuda --prompt "$P" --max-tokens 64 2>&1 | tail -3
if [[ "${1:-figures}" == figures ]]; then
  C=bench/configs
  for bin in .gpu2/specc_old .gpu2/specc; do
    B="$bin bench $C/llama-3.1-8b/config.json --random-weights --iters 50 --batch 1 --context 1024"
    for a in "" "--tokens 8" "--tokens 64" "--spec $C/eagle3-k7.toml" "--spec $C/ddtree-b64.toml" "--spec $C/dflash-b16.toml"; do
      echo "## $bin $a"; /usr/bin/time -f "%e s" timeout 150 $B $a 2>&1 | grep -E "^\| [vDdE]|^[0-9.]+ s$|error" | grep -v "^| step"
    done
  done
fi
