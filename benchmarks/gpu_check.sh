#!/usr/bin/env bash
# The performance issue's GPU check, one prepared script: under 8 minutes on one H100/H200.
#
#   bash benchmarks/gpu_check.sh
#
# 1. installs any wheels carried in .whl/ (for packages the machine lacks; the device image
#    already has torch, torchvision, timm and transformers), and puts src/ on PYTHONPATH;
# 2. benchmarks/compare_peers.py: vitkit vs timm, HF (sdpa, eager) and torchvision, ViT-S/16
#    and ViT-B/16 at 224, inference and training step, bf16 autocast, batch 256
#    -> benchmarks/results/gpu_compare_peers.md
# 3. benchmarks/bench_table.py: `vitkit bench` for ViT-B/16 and ViT-L/16 at 224 and 384,
#    inference and training, bf16 autocast, torch.compile -> benchmarks/results/gpu_bench.md
# Each stage has its own time limit so the whole stays inside 8 minutes; with $OUT set (the
# device tool sets it) the tables are copied there too.
#
# Everything is an environment variable, so the same script runs as a CPU smoke test:
#   DEVICE=cpu DTYPE=float32 BATCH=2 REPEATS=1 STEPS=1 COMPILE= SIZES=32 \
#   PEER_MODELS=vit_tiny_patch16_224 BENCH_MODELS=vit_nano_patch4_32 bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
BATCH=${BATCH:-256}
REPEATS=${REPEATS:-10}
STEPS=${STEPS:-10}
COMPILE=${COMPILE---compile}
SIZES=${SIZES:-224 384}
PEER_MODELS=${PEER_MODELS:-vit_small_patch16_224 vit_base_patch16_224}
BENCH_MODELS=${BENCH_MODELS:-vit_base_patch16_224 vit_large_patch16_224}
RESULTS=${RESULTS:-benchmarks/results}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/vitkit-site .whl/*.whl
    export PYTHONPATH=/tmp/vitkit-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$RESULTS"
"$PY" -c "import torch, timm, transformers, vitkit; print('torch', torch.__version__, '|',
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"

start=$SECONDS
# shellcheck disable=SC2086  # the model and size lists split on purpose
timeout 200 "$PY" benchmarks/compare_peers.py --device "$DEVICE" --dtype "$DTYPE" \
    --batch "$BATCH" --repeats "$REPEATS" --models $PEER_MODELS \
    --out "$RESULTS/gpu_compare_peers.md"
echo "compare_peers: $((SECONDS - start)) s"
# shellcheck disable=SC2086
timeout 240 "$PY" benchmarks/bench_table.py --device "$DEVICE" --dtype "$DTYPE" \
    --batch "$BATCH" --steps "$STEPS" $COMPILE --models $BENCH_MODELS --sizes $SIZES \
    --out "$RESULTS/gpu_bench.md"
echo "total: $((SECONDS - start)) s"
if [ -n "${OUT:-}" ]; then
    cp "$RESULTS"/gpu_compare_peers.md "$RESULTS"/gpu_bench.md "$OUT"/
fi
