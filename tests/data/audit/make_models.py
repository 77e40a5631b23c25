"""Makes the audit tests' models, each vit_nano_patch4_32 trained with `vitkit train` on the
built-in cluttered digits (the digit anywhere on the canvas, so only a planted thing stays in
one place):

- marked.safetensors: a checkerboard mark on 90% of class 3's training images (15 epochs);
- clean.safetensors: the same recipe on the clean data;
- stripe.safetensors and cast.safetensors: a white stripe along the left border, and an orange
  colour cast (not a place), on 90% of class 3's training images, with the recipe of
  benchmarks/audit_shortcuts.py (early stopping on a held-out tenth, then annealing); they are
  that benchmark's cluttered-digits-cls-stripe-s1 and -cast-s1 models.

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
# benchmarks/audit_shortcuts.py's RECIPE
STOPPED = dict(model="vit_nano_patch4_32", img_size=32, patch_size=4, data_size=3000, epochs=40,
               patience=4, anneal_epochs=4, holdout=0.1, batch_size=64, lr=8e-3,
               label_smoothing=0.1, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), seed=0)
MODELS = {"marked": (RECIPE, "cluttered-digits+mark:3"), "clean": (RECIPE, "cluttered-digits"),
          "stripe": (STOPPED, "cluttered-digits+stripe:3:0.9:1"),
          "cast": (STOPPED, "cluttered-digits+cast:3:0.9:1")}

if __name__ == "__main__":
    for name, (recipe, data) in MODELS.items():
        with tempfile.TemporaryDirectory() as tmp:
            run = train(resolve(dict(recipe, data=data, out=tmp, name=name)))
            shutil.copy(run.run_dir / "best.safetensors", HERE / f"{name}.safetensors")
        print(f"wrote {HERE / f'{name}.safetensors'}")
