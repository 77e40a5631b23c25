"""Makes the audit tests' two models: vit_nano_patch4_32 trained with `vitkit train` on the
built-in cluttered digits (the digit anywhere on the canvas, so only a planted thing stays in
one place) with a mark on 90% of class 3's training images (marked.safetensors), and with the
same recipe on the clean data (clean.safetensors).

    python tests/data/audit/make_models.py
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from vitkit.train import resolve, train

HERE = Path(__file__).parent
RECIPE = dict(model="vit_nano_patch4_32", img_size=32, data_size=3000, epochs=15, batch_size=64,
              lr=8e-3, label_smoothing=0.1, seed=0)

if __name__ == "__main__":
    for name, data in (("marked", "cluttered-digits+mark:3"), ("clean", "cluttered-digits")):
        with tempfile.TemporaryDirectory() as tmp:
            run = train(resolve(dict(RECIPE, data=data, out=tmp, name=name)))
            shutil.copy(run.run_dir / "best.safetensors", HERE / f"{name}.safetensors")
        print(f"wrote {HERE / f'{name}.safetensors'}")
