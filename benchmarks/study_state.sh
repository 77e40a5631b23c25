#!/usr/bin/env bash
# Carry a long `vitkit study` run across sessions or machines: save what a resume needs into a
# folder that can be committed, and put it back.
#
#   bash benchmarks/study_state.sh save    RUN_FOLDER STATE_FOLDER
#   bash benchmarks/study_state.sh restore STATE_FOLDER RUN_FOLDER
#
# save copies plan.json, results/ (the finished runs' records) and, per run folder, its config,
# log, metrics and result, the best weights where they are still there (the study deletes those
# no later run needs) and, for a run without a record (interrupted), its resume state, so
# `vitkit study` continues it from its last epoch. Stop the study first (or copy between epochs). Not copied: locks, claims, curves and event files (remade or unused).
# Restore to the same RUN_FOLDER path the run used: its configs name their teachers and
# initialisations by absolute path, and a run whose config differs is trained again.
set -euo pipefail
what=${1:-}; src=${2:-}; dst=${3:-}
if [[ $what != save && $what != restore ]] || [[ -z $src || -z $dst ]]; then
    echo "usage: $0 save RUN_FOLDER STATE_FOLDER | restore STATE_FOLDER RUN_FOLDER" >&2
    exit 2
fi
[[ -f $src/plan.json ]] || { echo "$src has no plan.json: not a vitkit study folder" >&2; exit 2; }
if [[ $what == restore ]]; then
    mkdir -p "$dst"
    cp -a "$src/." "$dst/"
    rm -f "$dst/README.md"
    echo "restored $src into $dst: run the same vitkit study command with --out $dst"
    exit 0
fi
tmp="$dst.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
cp "$src/plan.json" "$tmp/"
[[ -d $src/results ]] && cp -a "$src/results" "$tmp/"
for run in "$src"/*/; do
    name=$(basename "$run")
    [[ $name == results || $name == claims || $name == *.replaced-* ]] && continue
    mkdir -p "$tmp/$name"
    files=(config.yaml run.json metrics.csv result.json train.log best.safetensors)
    # a finished run is read from its record; a later run needs only its best weights
    [[ -f $src/results/$name.json ]] || files+=(.progress last.safetensors state.pt)
    for f in "${files[@]}"; do
        if [[ -f $run$f ]]; then cp -a "$run$f" "$tmp/$name/"; fi
    done
done
if [[ -f $dst/README.md ]]; then cp "$dst/README.md" "$tmp/"; fi  # the folder's own note stays
rm -rf "$dst"
mv "$tmp" "$dst"
du -sh "$dst"
