#!/usr/bin/env bash
# Session 32, first call: the paths changed after their last device run (the captured
# prefill path after the run_role refactor, the int4 tensor-core experts at the 3x atol
# bound), then compute-sanitizer racecheck + memcheck on the MLA / MoE step graphs.
# Binaries: scripts/gpu-pack gpu_serve gpu_e2e gpu_deepseek kernels-gen/gpu_quant_moe
set -uo pipefail
source scripts/device/unpack.sh
bash scripts/device/suite.sh gpu_serve gpu_e2e gpu_quant_moe
RACE_S=${RACE_S:-250} MEM_S=${MEM_S:-90} bash scripts/device/sanitize_mla.sh
