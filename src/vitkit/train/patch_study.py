"""The patch-size study (``vitkit study --mode patch``): one ViT per patch size (and image
size) on the full data, with the budget rules of every study run (:mod:`vitkit.recipe`: a fixed
number of steps with a warmup, or ``budget="converge"``: early stopping on a held-out share);
accuracy against FLOPs per image."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from vitkit.checkpoints.io import load_model
from vitkit.errors import ConfigError
from vitkit.models.cost import flop_model
from vitkit.recipe import STUDY_WARMUP, study_base, study_budget, study_converge
from vitkit.train.config import resolve
from vitkit.train.trainer import train
from vitkit.util.numbers import check_counts, check_number

log = logging.getLogger("vitkit")  # progress lines: the CLI shows them


@dataclass
class PatchStudyOptions:
    """The patch-size study's options (``--mode patch``)."""

    data: str = "digits"
    img_size: int = 16
    vit: str = "vit_micro_patch4_32"
    steps: int = 200
    batch_size: int = 64
    lr: float = 8e-3
    patch_sizes: tuple[int, ...] = (2, 4, 8)
    img_sizes: tuple[int, ...] = ()
    warmup: float = STUDY_WARMUP  # share of every run's steps spent in linear warmup
    budget: str = "steps"  # steps | converge (then patience, max_epochs and holdout apply)
    patience: int = 5
    max_epochs: int = 60
    holdout: float = 0.05
    out: str = "runs/study"

    def run_budget(self) -> dict:
        if self.budget == "converge":
            return study_converge(self.max_epochs, self.patience, self.holdout, self.warmup)
        return study_budget(self.steps, self.warmup)


def _check(opts: PatchStudyOptions) -> None:
    check_counts((name, getattr(opts, name)) for name in ("steps", "batch_size", "img_size"))
    if not opts.patch_sizes:
        raise ConfigError("--patch-sizes needs at least one size")
    check_counts(("patch_sizes", p) for p in opts.patch_sizes)
    check_number("--lr", opts.lr, positive=True)
    sizes = opts.img_sizes or (opts.img_size,)
    if not any(img % patch == 0 for img in sizes for patch in opts.patch_sizes):
        raise ConfigError(f"no patch size of {list(opts.patch_sizes)} divides an image size of "
                          f"{list(sizes)}, so there is nothing to train; choose patch sizes "
                          f"that divide the image (e.g. --patch-sizes 2 4 8 for {sizes[0]}px)")
    if opts.budget not in ("steps", "converge"):
        raise ConfigError(f"--budget must be steps or converge, got {opts.budget!r}")
    if opts.budget == "converge" and (opts.patience < 1 or opts.max_epochs < 1
                                      or not 0 < opts.holdout <= 0.5):
        raise ConfigError(f"the converge budget needs --patience and --max-epochs of 1 or "
                          f"more and --holdout in (0, 0.5]; got {opts.patience}, "
                          f"{opts.max_epochs}, {opts.holdout}")
    if not 0 <= opts.warmup < 1:  # NaN fails too
        raise ConfigError(f"--warmup is a share of each run's steps in [0, 1), got "
                          f"{opts.warmup}")


def run_patch_study(opts: PatchStudyOptions,
                    say: Callable[[str], None] = log.info) -> list[dict]:
    """One ViT per (patch size, image size) on the full data, same steps: accuracy vs FLOPs."""
    _check(opts)
    rows = []
    for img in opts.img_sizes or (opts.img_size,):
        for patch in opts.patch_sizes:
            if img % patch:
                say(f"skipping patch {patch} at {img}px: {img} is not a multiple of {patch}")
                continue
            name = f"patch{patch}-img{img}"
            start = time.perf_counter()
            base = study_base(data=opts.data, model=opts.vit, img_size=img, patch_size=patch,
                              batch_size=opts.batch_size, lr=opts.lr, out=opts.out, name=name)
            result = train(resolve({**base, **opts.run_budget()}))
            model = load_model(result.run_dir / "last.safetensors", verbose=False)
            cost = flop_model(model.cfg)
            rows.append(dict(patch=patch, img_size=img, tokens=cost.tokens,
                             gflops=round(cost.flops / 1e9, 4),
                             top1=result.history[-1]["val_top1"],
                             seconds=round(time.perf_counter() - start, 1)))
            if result.outcome is not None:  # converge: the best epoch, on the val split
                o = result.outcome
                rows[-1].update(top1=o["test_top1"], epochs=o["epochs"], stopped=o["stopped"])
            say(f"patch {patch} at {img}px: {cost.tokens} tokens, {cost.flops / 1e9:.3f} "
                f"GFLOPs, top-1 {rows[-1]['top1']:.4f}")
    return rows
