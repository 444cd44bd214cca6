#!/usr/bin/env bash
# Device calls for the engine artifact, from binaries carried gzipped in .gpu2/ (specc,
# specc_old, tests/gpu_*, E.tgz: an engine compiled off-device for sm_90a,sm_100a,sm_120).
#   tests     : every GPU exactness binary (engines built in memory for the device), then
#               `specc run E --backend cuda` with the loader's trace (no libnvrtc may open)
#               and its text against the CPU backend's
#   sanitize  : compute-sanitizer racecheck + memcheck on the trained DDTree and DFlash step
#               graphs (quick subsets, SPECC_GPU_QUICK=1)
#   figures   : step times of specc_old and specc in the same call (8B shape, B = 1, ctx 1024)
# Usage: bash scripts/device/engine_suite.sh tests|sanitize|figures [more modes...]
set -uo pipefail
export SPECC_CACHE_DIR=/tmp/specc-cache PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[[ -f .gpu3/specc_old.gz ]] && cp .gpu3/specc_old.gz .gpu2/
find .gpu2 -name '*.gz' -exec gunzip -kf {} \;
chmod +x .gpu2/specc* .gpu2/tests/* 2>/dev/null
[[ -f .gpu2/E.tgz ]] && tar xzf .gpu2/E.tgz -C .gpu2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
S=.gpu2/specc
P="def __init__(self"
t() { # name, timeout, args...
  local n=$1 to=$2; shift 2
  echo "== $n"
  timeout "$to" ".gpu2/tests/$n" --test-threads=1 --nocapture "$@" > "$OUT/$n.log" 2>&1; echo "rc=$?"
  grep -E "^test |exact|mean acceptance|panicked|test result|SKIP" "$OUT/$n.log" | grep -v "^test .* ok$" | tail -12
}
s() { # tool, timeout, test binary, test filter
  echo "== $1: $3 $4"
  SPECC_GPU_QUICK=1 timeout "$2" compute-sanitizer --tool "$1" --print-limit 5 ".gpu2/tests/$3" --test-threads=1 --nocapture "$4" 2>&1 \
    | grep -v uploading | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|hazard|test result|panicked" | tail -5
  echo "rc=${PIPESTATUS[0]}"
}
for mode in "$@"; do
  case $mode in
  tests)
    for b in gpu_e2e gpu_dflash gpu_ddtree gpu_eagle3_tree gpu_sampling; do t $b 150; done
    echo "== run E on cuda (LD_DEBUG=libs)"
    LD_DEBUG=libs timeout 120 $S run .gpu2/E --backend cuda --prompt "$P" --max-tokens 64 >"$OUT/cuda.out" 2>"$OUT/cuda.err"
    echo "rc $?; nvrtc libraries opened: $(grep -c 'libnvrtc' "$OUT/cuda.err")"
    grep -v "^ *[0-9]*:" "$OUT/cuda.err" | tail -3
    timeout 120 $S run .gpu2/E --prompt "$P" --max-tokens 64 >"$OUT/cpu.out" 2>/dev/null
    cmp "$OUT/cuda.out" "$OUT/cpu.out" && echo "cuda text == cpu text"
    ;;
  sanitize)
    s racecheck 200 gpu_ddtree trained_ddtree_is_exact
    s racecheck 120 gpu_dflash trained_dflash_is_exact
    s memcheck 70 gpu_ddtree trained_ddtree_is_exact
    s memcheck 70 gpu_dflash trained_dflash_is_exact
    ;;
  figures)
    C=bench/configs
    for bin in .gpu2/specc_old .gpu2/specc; do
      [[ -x $bin ]] || continue
      B="$bin bench $C/llama-3.1-8b/config.json --random-weights --iters 50 --batch 1 --context 1024"
      for a in "" "--tokens 8" "--tokens 64" "--spec $C/eagle3-k7.toml" "--spec $C/ddtree-b64.toml" "--spec $C/dflash-b16.toml"; do
        echo "## $bin $a"; timeout 150 $B $a 2>&1 | grep -E "^\| [vDdE]|error" | grep -v "^| step"
      done
    done
    ;;
  esac
done
