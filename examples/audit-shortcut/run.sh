#!/usr/bin/env bash
# The planted-shortcut example of docs/audit.md: a nano ViT trained with `vitkit train` on the
# built-in cluttered digits with a mark stamped on 90% of the training 3s (cluttered-digits+mark:3;
# the validation split stays clean), and the same recipe without the mark; each audited on its
# training split, where the mark is. About 6 minutes on 2 CPU cores.
#
#   bash examples/audit-shortcut/run.sh [OUT]      # default: runs/audit-shortcut
#
# The committed files beside this script (marked/ and clean/: audit.json, audit.csv,
# audit.png, report.html) are its output; the run folders and the maps stay in OUT.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-runs/audit-shortcut}"
VITKIT="${VITKIT:-vitkit}"
RECIPE=(--model vit_nano_patch4_32 --img-size 32 --data-size 3000 --epochs 15 --batch-size 64
        --lr 8e-3 --label-smoothing 0.1 --seed 0 --out "$OUT")
for name in marked clean; do
    data=cluttered-digits
    [ "$name" = marked ] && data=cluttered-digits+mark:3
    [ -f "$OUT/$name/best.safetensors" ] || "$VITKIT" train "${RECIPE[@]}" --data "$data" --name "$name"
    "$VITKIT" audit --checkpoint "$OUT/$name/best.safetensors" --data "$data" --split train \
        --limit 3000 --batch-size 128 --out "$OUT/audit-$name"
    mkdir -p "$HERE/$name"
    for f in audit.json audit.csv audit.png report.html; do
        cp "$OUT/audit-$name/$f" "$HERE/$name/$f"
    done
done
echo "wrote $HERE/marked and $HERE/clean"
