#!/usr/bin/env bash
# Session 49, call F (short, any card): the Kimi-K2.5 int4 step beyond 2 layers (issue 20 names
# "the layer count that fits"): verify(8) and decode at B = 1, ctx 1024, $LAYERS (6) layers,
# each against its union-of-experts roofline. Pack: scripts/gpu-pack --specc.
set -uo pipefail
BUDGET=${BUDGET:-200}
source scripts/device/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> "$S"
kimi "${LAYERS:-6}" --tokens 8
kimi "${LAYERS:-6}"
echo "total $((SECONDS - start))s" >> "$S"
