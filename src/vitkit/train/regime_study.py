"""The regime study (``vitkit study --mode regime``): claims (b) and (d) where they can apply.

(b) "pre-training pays the data cost" speaks of a source hundreds of times the target. Here the
target is Fashion-MNIST 5-9 at 150 and 600 training images (evaluated on the test split's 5-9)
and the labelled source its classes 0-4 from both splits, 35,000 images: 233 and 58 times the
target. Pre-trained once each on the source, then fine-tuned on every target size and seed:

- the ViT and the CNN of its compute, supervised on the source's labels;
- the ViT by masked-image pre-training (MAE) on the same source images without labels, and on
  every Fashion-MNIST image outside the target's evaluation set (in-domain, unlabelled:
  70,000 - 5,000 = 65,000 images, the target's own training images among them).

Beside them, from scratch at each size: the ViT, the CNN (the distillation teacher), the ViT
with light DeiT-style augmentation and the ViT distilled from the CNN, so the same runs give
(a) and (c) at these sizes too.

(d) "fine-tuning at a higher resolution gains": the ViT trained at 14 px (patch 2, a 7x7 grid)
on a larger share of the target, then fine-tuned at 28 px, the images' native size, where the
larger size adds real detail (the same patch size, the table interpolated to 14x14), against
the same fine-tuning epochs at 14 px and a ViT trained at 28 px from scratch for the same
compute (the 14 px run's epochs counted at their FLOPs).

Every run that stops on patience anneals after (``--anneal-epochs``); fixed-length runs follow
a cosine to the floor, which is the same thing. Runs, records, claims, workers and resuming are
the data study's (:class:`vitkit.train.study.Study`).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
import time
from dataclasses import dataclass

from vitkit.errors import ConfigError
from vitkit.models.cost import flops_per_image
from vitkit.models.registry import create_model
from vitkit.train.config import FROM_INIT
from vitkit.train.evaluate import evaluate_checkpoint
from vitkit.train.study import AUGMENTATION, FINETUNE_LR, POLL, Study, StudyPlan, plan_from_file
from vitkit.util.files import atomic_write
from vitkit.util.numbers import check_counts

# arm -> (label, claim)
REGIME_ARMS: dict[str, tuple[str, str]] = {
    "cnn": ("CNN of the ViT's compute, from scratch", "a"),
    "vit": ("ViT from scratch", "a"),
    "vit-deit": ("ViT + light augmentation, from scratch", "c"),
    "vit-distilled": ("ViT distilled from the CNN", "c"),
    "vit-pretrained": ("ViT, supervised pre-training on the source", "b"),
    "cnn-pretrained": ("CNN, supervised pre-training on the source", "b"),
    "vit-mae": ("ViT, MAE on the source images (no labels)", "b"),
    "vit-mae-all": ("ViT, in-domain MAE (every image but the target's test set)", "b"),
    "source-vit": ("ViT on the source (supervised)", "b"),
    "source-cnn": ("CNN on the source (supervised)", "b"),
    "source-mae": ("ViT MAE on the source images", "b"),
    "source-mae-all": ("ViT MAE on every image outside the target's test set", "b"),
    "res-low": ("ViT at 14 px (pre-training for (d))", "d"),
    "res-ft-low": ("ViT at 14 px, fine-tuned more at 14 px", "d"),
    "res-ft-high": ("ViT at 14 px, fine-tuned at 28 px (table interpolated)", "d"),
    "res-scratch-high": ("ViT at 28 px from scratch, equal compute", "d"),
    "res-naive": ("ViT at 14 px, run at 28 px without fine-tuning", "d"),
}
# the fine-tuned arm of each pre-training run
FINETUNED = {"vit-pretrained": "source-vit", "cnn-pretrained": "source-cnn",
             "vit-mae": "source-mae", "vit-mae-all": "source-mae-all"}


@dataclass
class RegimePlan(StudyPlan):
    """The data study's plan (budget, model, seeds, out) and the regime's own sizes."""

    target_images: tuple[int, ...] = (150, 600)
    mae_source: str = "fashion-mnist:0-4@both"
    mae_all: str = "fashion-mnist@both-but:5-9"
    mask_ratio: float = 0.75
    low_size: int = 14
    high_size: int = 28
    resolution_patch: int = 2
    resolution_images: int = 2850
    finetune_epochs: int = 10

    def check(self) -> None:
        super().check()
        if not self.target_images:
            raise ConfigError("--target-images needs at least one count")
        check_counts([("target_images", n) for n in self.target_images]
                     + [("finetune_epochs", self.finetune_epochs),
                        ("resolution_images", self.resolution_images)])
        for size in (self.low_size, self.high_size):
            if size % self.resolution_patch:
                raise ConfigError(f"claim (d)'s sizes must be multiples of the patch "
                                  f"{self.resolution_patch}, got {size}")
        if not self.source:
            raise ConfigError("the regime study needs a labelled --source for claim (b)")


REGIME_PLAN = dict(data="fashion-mnist:5-9", source="fashion-mnist:0-4@both", seeds=3,
                   budget="converge", patience=5, max_epochs=100, holdout=0.05,
                   source_epochs=20, anneal_epochs=5, teacher="cnn-small",
                   pretrained_cnn="cnn-small", fractions=(1.0,), out="runs/study-regime")


# (flag, type, help) of `vitkit study`'s regime options
REGIME_OPTIONS = (
    ("resolution-images", int, "regime: claim (d)'s training images (2850)"),
    ("finetune-epochs", int, "regime: claim (d)'s fine-tuning epochs (10)"),
    ("low-size", int, "regime: claim (d)'s pre-training size (14)"),
    ("high-size", int, "regime: claim (d)'s fine-tuning size (28)"),
    ("resolution-patch", int, "regime: claim (d)'s patch size (2)"),
    ("mask-ratio", float, "regime: MAE's share of hidden patches (0.75)"),
    ("mae-source", str, "regime: MAE's unlabelled source (fashion-mnist:0-4@both)"),
    ("mae-all", str, "regime: in-domain MAE data (fashion-mnist@both-but:5-9)"),
)
# the regime's own options (--target-images takes several values, so is added apart)
REGIME_ONLY = ("target_images", *(flag.replace("-", "_") for flag, _, _ in REGIME_OPTIONS))


def check_regime_options(regime: bool, options: dict) -> None:
    """The regime's own options only with ``--mode regime``, which is a preset of its own."""
    if regime and (options.get("full") or options.get("converged")):
        raise ConfigError("--mode regime is its own preset; drop --full/--converged")
    given = [f for f in REGIME_ONLY if options.get(f) is not None]
    if given and not regime:
        raise ConfigError(f"--{given[0].replace('_', '-')} is an option of --mode regime")


def arm_label(arm: str, plan: RegimePlan | None = None) -> str:
    """The arm's name in reports, with the plan's two sizes of claim (d)."""
    text = REGIME_ARMS[arm][0]
    if plan is not None:
        text = text.replace("14 px", f"{plan.low_size} px").replace("28 px",
                                                                  f"{plan.high_size} px")
    return text


class RegimeStudy(Study):
    """Runs a :class:`RegimePlan` (see the module docstring); rows as the data study's."""

    plan: RegimePlan

    def label(self, arm: str) -> str:
        return arm_label(arm, self.plan)

    def claim(self, arm: str) -> str:
        return REGIME_ARMS[arm][1]

    def run(self) -> list[dict]:
        p = self.plan
        sizes = sorted(p.target_images)
        self.total = 4 + p.seeds * (len(sizes) * 8 + 5)
        items = [self.pretrain_all]
        for seed in range(p.seeds):
            items += [functools.partial(self.point, n, seed) for n in sizes]
            items.append(functools.partial(self.resolution, seed))
        first = len(items) * self.worker // self.workers
        pending = items[first:] + items[:first]
        while pending:
            left = [item for item in pending if not item()]
            if len(left) == len(pending):
                time.sleep(POLL)
            pending = left
        if all(self.finished(f"{arm}-n{n}-s{s}") is not None for arm in FINETUNED
               for n in sizes for s in range(p.seeds)):
            for source in FINETUNED.values():
                self.release(source)
        return self.rows

    # ------------------------------------------------------------------ shared runs
    @functools.cached_property
    def target_train_images(self) -> int:
        """The target's training split after the held-out share (what subsets are taken of)."""
        n = self.train_images
        return n - max(1, round(self.plan.holdout * n))

    def fraction(self, images: int) -> float:
        """The data fraction that gives ``images`` training images (nested by seed)."""
        return min(1.0, images / self.target_train_images)

    def _pending_finetunes(self, arm: str) -> bool:
        return any(self.finished(f"{arm}-n{n}-s{s}") is None for n in self.plan.target_images
                   for s in range(self.plan.seeds))

    def source(self, arm: str) -> dict | None:
        """Train (or take) one pre-training run; None while another worker holds it."""
        p = self.plan
        budget = p.converge(p.source_epochs)
        options = {
            "source-vit": dict(data=p.source, model=p.vit),
            "source-cnn": dict(data=p.source, model=self.pretrained_cnn),
            "source-mae": dict(data=p.mae_source, model=p.vit, objective="mae",
                               mask_ratio=p.mask_ratio),
            "source-mae-all": dict(data=p.mae_all, model=p.vit, objective="mae",
                                   mask_ratio=p.mask_ratio),
        }[arm]
        fine = next(k for k, v in FINETUNED.items() if v == arm)
        return self.run_one(arm, arm, 0, 1.0, {**options, **budget},
                            needed_later=self._pending_finetunes(fine))

    def pretrain_all(self) -> bool:
        return all([self.source(arm) is not None for arm in self._mine(list(FINETUNED.values()))])

    # ------------------------------------------------------------------ claims (a)-(c)
    def point(self, images: int, seed: int) -> bool:
        """Every arm at one target size and seed. False while a run it needs is another
        worker's."""
        p = self.plan
        tag = f"n{images}-s{seed}"
        fraction = self.fraction(images)
        steps = p.converge(p.max_epochs)
        cnn = self.run_one(f"cnn-{tag}", "cnn", seed, fraction, {"model": p.cnn_small, **steps},
                           needed_later=self.finished(f"vit-distilled-{tag}") is None)
        if cnn is None:
            return False
        rows = [cnn,
                self.run_one(f"vit-{tag}", "vit", seed, fraction, steps),
                self.run_one(f"vit-deit-{tag}", "vit-deit", seed, fraction,
                             {**AUGMENTATION["light"], **steps}),
                self.run_one(f"vit-distilled-{tag}", "vit-distilled", seed, fraction,
                             {"distill": "hard", "teacher": str(self.weights(f"cnn-{tag}")),
                              **steps})]
        if self.finished(f"vit-distilled-{tag}") is not None:
            self.release(f"cnn-{tag}")
        for arm, source in FINETUNED.items():
            if self.source(source) is None:
                rows.append(None)
                continue
            model = self.pretrained_cnn if arm == "cnn-pretrained" else p.vit
            rows.append(self.run_one(f"{arm}-{tag}", arm, seed, fraction,
                                     dict(model=model, init=str(self.weights(source)),
                                          lr=p.lr * FINETUNE_LR, **steps)))
        return all(row is not None for row in rows)

    # ------------------------------------------------------------------ claim (d)
    def resolution(self, seed: int) -> bool:
        """The 14 px ViT, then 10 more epochs at 14 px, at 28 px, and 28 px from scratch."""
        p = self.plan
        fraction = self.fraction(p.resolution_images)
        low = f"res-low-s{seed}"
        arms = ("res-ft-low", "res-ft-high", "res-scratch-high")
        pending = [a for a in arms if self.finished(f"{a}-s{seed}") is None]
        small = dict(img_size=p.low_size, patch_size=p.resolution_patch)
        low_row = self.run_one(low, "res-low", seed, fraction,
                               {**small, **p.converge(p.max_epochs)},
                               needed_later=bool(pending) or
                               self.finished(f"res-naive-s{seed}") is None)
        if low_row is None:
            return False
        tune = dict(init=str(self.weights(low)), model=FROM_INIT, lr=p.lr * FINETUNE_LR,
                    **p.converge(p.finetune_epochs, patience=False))
        rows = [self.run_one(f"res-ft-low-s{seed}", "res-ft-low", seed, fraction,
                             dict(tune, img_size=p.low_size)),
                self.run_one(f"res-ft-high-s{seed}", "res-ft-high", seed, fraction,
                             dict(tune, img_size=p.high_size))]
        epochs = self.equal_compute_epochs(low_row["epochs"])
        rows.append(self.run_one(
            f"res-scratch-high-s{seed}", "res-scratch-high", seed, fraction,
            dict(img_size=p.high_size, patch_size=p.resolution_patch,
                 **p.converge(epochs, patience=False))))
        rows.append(self.naive(seed, low, low_row))
        if None in rows:
            return False
        self.release(low)
        return True

    def equal_compute_epochs(self, low_epochs: int) -> int:
        """Epochs at the high size with the compute of ``low_epochs`` at the low size plus the
        fine-tuning epochs (FLOPs per image of the two models)."""
        p = self.plan
        flops = {size: flops_per_image(create_model(p.vit, img_size=size,
                                                    patch_size=p.resolution_patch), size)
                 for size in (p.low_size, p.high_size)}
        ratio = flops[p.low_size] / flops[p.high_size]
        return max(1, math.ceil(p.finetune_epochs + low_epochs * ratio))

    def naive(self, seed: int, low: str, low_row: dict) -> dict:
        """The 14 px model run at 28 px, its table interpolated, without fine-tuning."""
        p = self.plan
        name = f"res-naive-s{seed}"
        row, seconds = self.finished(name), None
        if row is None:
            start = time.perf_counter()
            result = evaluate_checkpoint(self.weights(low), p.data, "val", img_size=p.high_size,
                                         root=p.extra.get("data_root", "data"))
            row = dict(arm="res-naive", claim="d", fraction=low_row["fraction"],
                       images=low_row["images"], seed=seed, top1=result["top1"],
                       best_top1=result["top1"], steps=0, img_size=p.high_size, model=p.vit,
                       seconds=0.0)
            (self.out / "results").mkdir(parents=True, exist_ok=True)
            atomic_write(self._record_path(name), lambda tmp: tmp.write_text(json.dumps(row)))
            seconds = time.perf_counter() - start
        return self._take(name, row, seconds)


if __name__ == "__main__":  # one worker of run_workers: PLAN_JSON K N
    _plan, _k, _n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    logging.basicConfig(level=logging.INFO, format="vitkit: %(message)s", stream=sys.stderr)
    RegimeStudy(plan_from_file(_plan, RegimePlan),
                say=lambda text: logging.getLogger("vitkit").info(f"worker {_k}: {text}"),
                worker=(_k, _n)).run()
