"""Make the real runs of the doctor's catalogue (tests/doctor_catalogue.py): short vitkit
trainings on the digits, each keeping what `vitkit doctor` reads (config.yaml, metrics.csv,
run.json, result.json), its train.log and, for the healthy run, its trained checkpoint. About 5
minutes on 2 CPU cores (`make_runs.py NAME...` makes only those):

    .venv/bin/python tests/data/doctor/make_runs.py

The runs are committed, so the tests read them and never train them again.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from vitkit.train import resolve, train
from vitkit.train.trainer import NonFiniteLoss

HERE = Path(__file__).parent
KEPT = ("config.yaml", "metrics.csv", "train.log", "run.json", "result.json")
BASE = dict(data="digits", model="vit_nano_patch4_32", batch_size=64, seed=0)
RUNS = {
    # 44 steps at a small lr: too early to judge learning (the doctor once called it an error)
    "short": dict(img_size=16, epochs=2),
    # 300 steps with warmup and clipping: top-1 about 0.85; its checkpoint is the catalogue's
    # trained model
    "healthy": dict(img_size=32, steps=300, lr=4e-2, warmup_steps=30, clip_grad=1.0),
    # lr 2.0 per 512 (0.25 at this batch) without warmup for 230 steps: stuck at chance
    "lr-too-high": dict(img_size=16, epochs=10, lr=2.0, warmup_epochs=0),
    # lr 300 per 512 without warmup: the loss jumps to tens of thousands and stays there
    "diverging": dict(img_size=16, epochs=6, lr=300.0, warmup_epochs=0),
    # lr 1e9 per 512: the loss becomes NaN in the first epoch; the folder keeps its log
    "nan": dict(img_size=16, epochs=3, lr=1e9, warmup_epochs=0),
    # 5% of the digits (72 images), 150 epochs, no augmentation: memorises them
    "overfitting": dict(img_size=16, epochs=150, data_fraction=0.05, lr=4e-3,
                        warmup_epochs=5, weight_decay=0.01),
    # `vitkit demo`'s recipe on cluttered digits (lr 8e-3, label smoothing 0.1, 375 steps):
    # a good model whose LayerNorms barely move; its checkpoint is demo-recipe.safetensors
    "demo-recipe": dict(data="cluttered-digits", data_size=3000, img_size=32, steps=375,
                        lr=8e-3, label_smoothing=0.1, warmup_epochs=0.5),
    # fine-tuning it with --recipe finetune (label smoothing, drop path, crop 0.5, flips) at
    # lr 1e-4 for 20 steps: validation good, the training loss above chance
    "finetune": dict(init=str(HERE / "demo-recipe.safetensors"), data="cluttered-digits",
                     data_size=3000, img_size=32, recipe="finetune", lr=1e-4, steps=20),
    # the same at lr 0.5: the validation loss above chance, top-1 at chance
    "finetune-diverging": dict(init=str(HERE / "demo-recipe.safetensors"),
                               data="cluttered-digits", data_size=3000, img_size=32,
                               recipe="finetune", lr=0.5, steps=20),
}


def make(name: str, options: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = resolve({**BASE, **options, "out": tmp, "name": name})
        try:
            train(cfg, progress=False)
        except NonFiniteLoss as err:
            print(f"{name}: {err}", file=sys.stderr)
        run = Path(tmp) / name
        dst = HERE / name
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir()
        for f in KEPT:
            if (run / f).exists():
                text = (run / f).read_text().replace(tmp, "runs").replace(
                    str(HERE), "tests/data/doctor")
                (dst / f).write_text(text)
        if name == "healthy":
            shutil.copy(run / "last.safetensors", HERE / "trained.safetensors")
        if name == "demo-recipe":
            shutil.copy(run / "last.safetensors", HERE / "demo-recipe.safetensors")


if __name__ == "__main__":
    for name in sys.argv[1:] or RUNS:
        make(name, RUNS[name])
        print(f"made {name}", file=sys.stderr)
