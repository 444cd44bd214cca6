#!/usr/bin/env bash
# `specc serve` soak at the Llama-3.1-8B shape (issue 21 item 8): the planted target
# (--random-weights --synthetic-acceptance 0.6) with the 2-layer draft, draft_model k = 7
# under the adaptive policy, 16 lanes (batch buckets 1, 4, 16, no shrinking: a request's
# tokens must not depend on the load), REQUESTS (2000) requests of 32 tokens from 32
# concurrent clients over 16 token-id prompts; every reply is checked against the prompt's
# lone reply, /metrics and the device memory must be back at their idle values at the end.
# Pack: scripts/gpu-pack --specc
set -uo pipefail
source scripts/device/unpack.sh
mkdir -p /tmp/specs
printf 'method = "draft_model"\ndraft = "%s"\nnum_steps = 7\nbatch_buckets = [1, 4, 16]\n' \
  "$PWD/bench/configs/llama-tiny-128k" > /tmp/specs/soak_8b.toml
timeout "${SOAK_S:-400}" python3 scripts/device/serve_soak.py --bin .gpu2/specc \
  --requests "${REQUESTS:-2000}" --concurrency "${CONCURRENCY:-32}" --max-tokens 32 --ids 16 \
  --timeout "$(( ${SOAK_S:-400} - 20 ))" -- --backend cuda bench/configs/llama-3.1-8b/config.json \
  --random-weights --synthetic-acceptance 0.6 --max-context 1024 --lanes 16 \
  --spec /tmp/specs/soak_8b.toml --spec-policy adaptive 2>&1 | grep -v uploading | tee "$OUT/serve_soak_8b.txt" | tail -12
