#!/usr/bin/env bash
# The planted-shortcut examples of docs/audit.md: a nano ViT trained with `vitkit train` on the
# built-in cluttered digits with a shortcut on 90% of the training 3s (the validation split
# stays clean), three kinds: a checkerboard mark in the top-right corner (marked/), a white
# stripe along the left border (stripe/) and an orange colour cast over the whole image (cast/,
# not a place); and the marked recipe on the clean data (clean/). Each is audited on the first
# 1000 images of its training split, where the shortcut is. marked and clean are the test
# models' recipe (15 epochs); stripe and cast the recipe of benchmarks/audit_shortcuts.py (early
# stopping on a held-out tenth, then annealing), so they equal tests/data/audit's models and
# that benchmark's cluttered-digits-cls-*-s1 ones, which can be copied to
# OUT/NAME/best.safetensors instead of trained again. About 40 minutes on 2 CPU cores.
#
#   bash examples/audit-shortcut/run.sh [OUT]      # default: runs/audit-shortcut
#
# The committed files beside this script (marked/, stripe/, cast/, clean/: audit.json,
# audit.csv, audit.png, report.html) are its output; the run folders and the maps stay in OUT.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-runs/audit-shortcut}"
VITKIT="${VITKIT:-vitkit}"
FIXED=(--model vit_nano_patch4_32 --img-size 32 --data-size 3000 --epochs 15 --batch-size 64
       --lr 8e-3 --label-smoothing 0.1 --seed 0 --out "$OUT")
STOPPED=(--model vit_nano_patch4_32 --img-size 32 --data-size 3000 --epochs 40 --patience 4
         --anneal-epochs 4 --holdout 0.1 --batch-size 64 --lr 8e-3 --label-smoothing 0.1
         --mean 0 0 0 --std 1 1 1 --seed 0 --out "$OUT")
for name in marked stripe cast clean; do
    case "$name" in
        marked) data=cluttered-digits+mark:3; recipe=("${FIXED[@]}") ;;
        stripe) data=cluttered-digits+stripe:3; recipe=("${STOPPED[@]}") ;;
        cast) data=cluttered-digits+cast:3; recipe=("${STOPPED[@]}") ;;
        clean) data=cluttered-digits; recipe=("${FIXED[@]}") ;;
    esac
    [ -f "$OUT/$name/best.safetensors" ] || "$VITKIT" train "${recipe[@]}" --data "$data" --name "$name"
    "$VITKIT" audit --checkpoint "$OUT/$name/best.safetensors" --data "$data" --split train \
        --limit 1000 --batch-size 128 --out "$OUT/audit-$name"
    mkdir -p "$HERE/$name"
    for f in audit.json audit.csv audit.png report.html; do
        cp "$OUT/audit-$name/$f" "$HERE/$name/$f"
    done
done
echo "wrote $HERE/marked, $HERE/stripe, $HERE/cast and $HERE/clean"
