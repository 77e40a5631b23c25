"""The doctor's checks that need a loaded model (and so torch): a checkpoint of any format,
loaded non-strictly so that what is missing or extra becomes a finding, and the maps and token
norms of the model on images."""

from __future__ import annotations

from pathlib import Path

import torch

from vitkit.checkpoints import load_model
from vitkit.data.datasets import load_split
from vitkit.data.images import Preprocess, load_image, preprocessing
from vitkit.diagnose import maps as maps_checks
from vitkit.diagnose.findings import Finding
from vitkit.diagnose.weights import Weights
from vitkit.errors import MissingBlocks
from vitkit.explain.stats import token_norms
from vitkit.models.cnn import is_cnn


def load(path: Path, model_name: str | None = None):
    """(model, None), or (None, findings) when the file cannot become a ViT to check;
    ``model_name``: the registered architecture of a bare state dict."""
    try:  # not strict: what is missing or extra becomes a finding, not a refusal
        model = load_model(path, strict=False, verbose=False, model=model_name)
    except MissingBlocks as err:
        return None, [Finding(
            "weights.partially_loaded", "error",
            f"transformer block(s) {', '.join(map(str, err.missing[:12]))} are missing from "
            f"the file ({err.found} present)", {"missing_blocks": err.missing[:12],
                                                 "blocks_present": err.found},
            "A model built from what is there would be a different, shallower one; every "
            "loader in vitkit refuses it.", "restore the file from its source")]
    if is_cnn(model):
        return None, [Finding("weights.trained", "ok",
                              f"a CNN ({model.cfg.arch}): the doctor's checks are for ViTs")]
    return model, None


def weights_of(model) -> Weights:
    return Weights.of_model(model)


def images(model, image, data) -> torch.Tensor | None:
    """(B, C, H, W): the image, or up to 8 validation images of a data spec, preprocessed as
    the model expects."""
    size, mean, std = preprocessing(model)
    if image is not None:
        return load_image(image, size, mean, std)[0][None]
    if data is not None:
        split = load_split(data, "val", size[0])
        prep = Preprocess(size, mean, std)
        return torch.stack([prep(split[i][0]) for i in range(min(8, len(split)))])
    return None


def computed(model, x: torch.Tensor, apply) -> list[Finding]:
    """The map checks on the model's own maps and token norms of ``x``; ``apply(looks_at,
    subject, ctx, only=None)`` runs the rules."""
    with torch.no_grad():
        _, maps = model(x, return_attn=True)
        norms = token_norms(model, x)
    ctx = {"layout": {"grid": tuple(maps.grid), "patch_size": model.cfg.patch_size,
                      "num_prefix_tokens": maps.num_prefix_tokens}}
    m = maps_checks.Maps(torch.stack(list(maps)), "layers x heads", True)
    return (apply("maps", m, ctx, only=("maps.uniform", "maps.sinks"))
            + apply("computed", list(maps), ctx) + apply("norms", norms, ctx))
