#!/usr/bin/env bash
# Trains the whole tiny family on the device machine (one H200) and leaves in $OUT:
#   family.tar   the output folder `family/` (target + draft/ + eagle3/ + dflash/ + README.md)
#                (split into family.tar.part00, part01, ... only if it exceeded 16 MB)
#   train.log    the full log;  README.md, summary.json  copies of the family's own
# The folder $OUT/family itself is removed after tarring: the device tool returns at most 8
# files from $OUT. Usage (repository root):  bash scripts/train/run_on_device.sh [extra args]
# TIME_BUDGET_S (default 420) is the training script's whole wall-time budget; with the start of
# python and the tar the command stays under 8 minutes.
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?OUT must be set (the device tool sets it)}"
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
BUDGET="${TIME_BUDGET_S:-420}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
python3 scripts/train/train_family.py --out "$OUT/family" --device cuda --time-budget-s "$BUDGET" "$@" \
    2>&1 | tee "$OUT/train.log"
rc=${PIPESTATUS[0]}
if [ -d "$OUT/family" ]; then
    tar -C "$OUT" -cf "$OUT/family.tar" family
    size=$(stat -c %s "$OUT/family.tar")
    if [ "$size" -gt 16700000 ]; then
        split -b 15000000 -d "$OUT/family.tar" "$OUT/family.tar.part"
        rm -f "$OUT/family.tar"
        echo "family.tar was $size bytes: split into $(ls "$OUT" | grep -c 'family.tar.part') parts (cat family.tar.part* > family.tar)"
    fi
    for f in README.md summary.json; do
        [ -f "$OUT/family/$f" ] && cp "$OUT/family/$f" "$OUT/$f"
    done
    rm -rf -- "${OUT:?}/family"
    echo "---- $OUT:"
    ls -l "$OUT"
    echo "---- family/README.md:"
    [ -f "$OUT/README.md" ] && cat "$OUT/README.md"
fi
echo "exit code $rc, total wall time $(( $(date +%s) - T0 )) s"
exit "$rc"
