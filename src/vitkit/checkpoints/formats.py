"""The registry of checkpoint formats: one module per layout, listed once here.

Every format module defines ``NAME``, ``LABEL`` (how users recognise it),
``detect(ckpt) -> bool`` and ``to_vitkit(state, config, notes) -> (state, kwargs, extra)``;
``to_vitkit`` may also take ``named=`` (the config fields of the registered model the user
named, ``load_model(path, model=NAME)``) and read from it what a bare file does not say instead
of refusing or guessing it (timm's layout); the loader checks every format's result against the
name (:mod:`vitkit.checkpoints.named`). ``DEPTH_FROM_WEIGHTS = True`` when a bare file of
the layout does not state its depth (the loader then warns when the depth fits no known ViT
while a deeper one does).
A format vitkit can also write adds ``refusals(cfg) -> list[str]`` (why a model does not fit
the layout; empty when it does), ``write(model, dst) -> Path``, and the options contract: every
field of ``ViTConfig`` that is not in ``ViTConfig.NEUTRAL`` is in exactly one of

- ``HOLDS``: the written file keeps it, whatever value ``refusals`` lets through (exactly, or as
  an equivalent: a missing bias written as zeros);
- ``REFUSES``: the layout cannot say it, and ``refusals`` refuses every value but the default;
- ``UNSTORED`` (optional): the file does not store it and the reader must be told it
  (``load_model(path, num_heads=...)``), as the layout's own library is told by its users.

``RECORDS_SOURCE = False`` (vitkit's own format) keeps the file's ``extra`` as written instead
of recording ``source_format``. Adding a format is one module plus one line in ``FORMATS``; the
loader, ``export``, the CLI's ``--to`` choices and the "supported" text all come from this
list, and tests/test_options_contract.py holds every writer to its declarations.
"""

from __future__ import annotations

from types import ModuleType

from vitkit.checkpoints import (
    deit,
    hf,
    hf_clip,
    hf_dinov2,
    hf_dinov3,
    hf_siglip,
    jax,
    native,
    openclip,
    resnet,
    timm,
    torchvision,
)
from vitkit.checkpoints.common import CheckpointError

# Detection order: the first whose detect() is true reads the file (DeiT before timm: DeiT is
# timm's layout with a dist_token; HF DINOv3 before HF DINOv2, whose LayerScale keys it shares;
# HF DINOv2 before HF ViT, whose patch keys it shares).
FORMATS: tuple[ModuleType, ...] = (native, deit, timm, hf_dinov3, hf_dinov2, hf, hf_clip,
                                   hf_siglip,
                                   openclip, torchvision, jax, resnet)
EXPORTS: tuple[str, ...] = tuple(f.NAME for f in FORMATS if hasattr(f, "write"))


def get(name: str) -> ModuleType:
    """The format module called ``name``; a clear error naming the formats otherwise."""
    for f in FORMATS:
        if f.NAME == name:
            return f
    raise CheckpointError(f"unknown format {name!r}; formats: "
                          + ", ".join(f.NAME for f in FORMATS))


def supported() -> str:
    """One line listing what vitkit reads, for error messages and help texts."""
    return "; ".join(f.LABEL for f in FORMATS)


def writable(cfg) -> list[str]:
    """The export formats whose layout can hold a model with config ``cfg``."""
    return [name for name in EXPORTS if not get(name).refusals(cfg)]
