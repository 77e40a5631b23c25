"""What a frozen ViT gives for an image, as people use a backbone.

:func:`embed` runs one batch: the pooled embedding (the model's pre-logits,
``forward_head(forward_features(x), pre_logits=True)``) always, and on request the [CLS]
token, the other prefix tokens (distillation, registers), the patch tokens and chosen layers'
outputs (``forward_intermediates``). :func:`extract` does it over a whole data split, preprocessed
as every command does (:class:`vitkit.data.images.Preprocess`), or over a loader of batches
already preprocessed. :mod:`vitkit.backbone.shards` writes the same arrays to a folder,
resumable and under torchrun.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from vitkit.audit.analysis import _read
from vitkit.data.images import Preprocess, preprocessing
from vitkit.errors import ConfigError
from vitkit.models.cnn import CNN
from vitkit.models.config import as_pair, patch_grid

log = logging.getLogger("vitkit")

WHAT = ("pooled", "cls", "prefix", "patch")  # what can be stored, besides layers
EXTRA = ("index", "label")  # the rows' bookkeeping, stored beside the features


def parse_what(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"cls,patch"`` -> ("pooled", "cls", "patch"): the pooled embedding is always stored;
    the order is :data:`WHAT`'s."""
    names = [w.strip() for w in (text.split(",") if isinstance(text, str) else text)]
    wrong = [w for w in names if w not in WHAT]
    if wrong or not all(names):
        raise ConfigError(f"--what takes a comma-separated list of {', '.join(WHAT)}; got "
                          f"{','.join(names)!r}" + (f" ({', '.join(wrong)} unknown)" if wrong
                                                     else ""))
    return tuple(w for w in WHAT if w == "pooled" or w in names)


def parse_layers(text: str | Sequence[int] | None, depth: int) -> tuple[int, ...]:
    """``"3,-1,0"`` -> (0, 3, depth - 1): block indices, negative ones counted from the end,
    in block order (the order ``forward_intermediates`` gives them), each once."""
    if text is None or text == "" or text == ():
        return ()
    try:
        asked = [int(t) for t in text.split(",")] if isinstance(text, str) else \
            [int(t) for t in text]
    except ValueError:
        raise ConfigError(f"--layers takes comma-separated block indices like 3,-1; got "
                          f"{text!r}") from None
    wrong = [i for i in asked if not -depth <= i < depth]
    if wrong:
        raise ConfigError(f"--layers has {', '.join(map(str, wrong))}, but the model has {depth} "
                          f"blocks (valid: {-depth}..{depth - 1})")
    return tuple(sorted({i % depth for i in asked}))


def layer_key(i: int) -> str:
    return f"layer{i}"


def check_backbone(model, what: Sequence[str], layers: Sequence[int]) -> None:
    """Refuse what this model cannot give, before any image is read."""
    if isinstance(model, CNN):
        raise ConfigError(f"this checkpoint is a CNN ({model.cfg.arch}); features are read "
                          "from a ViT's tokens: give a ViT checkpoint")
    if "cls" in what and not model.cfg.class_token:
        raise ConfigError(f"--what cls: this model has no [CLS] token (it pools "
                          f"{model.cfg.pool!r}); ask for pooled (always stored) or patch")
    if "prefix" in what and not model.num_prefix_tokens:
        raise ConfigError("--what prefix: this model has no prefix token ([CLS], "
                          "distillation or register); ask for pooled or patch")


def resize(model, img_size) -> tuple[int, int]:
    """Run ``model`` at ``img_size`` (None: its own) and return the input size (H, W): a
    rotary model runs natively, an absolute position table is interpolated
    (``set_img_size``), a ``dynamic_img_size`` model takes the size as it is."""
    if isinstance(model, CNN):
        return preprocessing(model)[0]
    if img_size is None:
        return tuple(model.cfg.img_size)
    size = as_pair(img_size)
    patch_grid(size, model.cfg.patch_size)  # a ModelError naming the sizes
    if size != tuple(model.cfg.img_size) and not model.cfg.dynamic_img_size:
        model.set_img_size(size)
    return size


def transform(model, size: tuple[int, int] | None = None) -> Preprocess:
    """The preprocessing of ``model`` at ``size``: bicubic resize covering it, centre crop,
    the checkpoint's mean/std."""
    native, mean, std = preprocessing(model)
    return Preprocess(size or native, mean, std)


@torch.no_grad()
def embed(model, x: torch.Tensor, what: Sequence[str] = ("pooled",),
          layers: Sequence[int] = ()) -> dict[str, torch.Tensor]:
    """One batch x (B, C, H, W) -> {"pooled": (B, D'), "cls": (B, D), "prefix": (B, P, D),
    "patch": (B, N, D), "layer{i}": what ``forward_intermediates`` gives for block i (B, N, D)},
    the keys asked for (``layers``: block indices, any order, negative from the end); every
    tensor contiguous, on the model's device."""
    layers = parse_layers(list(layers), len(model.blocks))
    inter: list[torch.Tensor] = []
    if layers:  # one pass: the final tokens and the blocks' outputs, in block order
        tokens, inter = model.forward_intermediates(x, indices=list(layers), output_fmt="NLC")
    else:
        tokens = model.forward_features(x)  # (B, T, D) after the final norm
    out = {"pooled": model.forward_head(tokens, pre_logits=True)}
    prefix = model.num_prefix_tokens
    if "cls" in what:
        out["cls"] = tokens[:, 0]
    if "prefix" in what:
        out["prefix"] = tokens[:, :prefix]
    if "patch" in what:
        out["patch"] = tokens[:, prefix:]
    for i, t in zip(layers, inter, strict=True):  # both in block order
        out[layer_key(i)] = t
    return {k: v.contiguous() for k, v in out.items()}


def embed_rows(model, split, indices: Sequence[int], *, what: Sequence[str], layers: Sequence[int],
               preprocess: Preprocess, batch_size: int = 64,
               device: torch.device | str = "cpu") -> tuple[dict[str, np.ndarray], dict[int, str]]:
    """The images ``indices`` of ``split`` in batches of ``batch_size`` (in order) -> (arrays:
    :func:`embed`'s keys as float32 numpy arrays plus "index" and "label" (n,) int64, one row
    per readable image; {index: error} for the images that could not be read)."""
    parts: dict[str, list[np.ndarray]] = {}
    errors: dict[int, str] = {}
    for start in range(0, len(indices), batch_size):
        ok, x, bad = _read(split, list(indices[start:start + batch_size]), preprocess)
        errors.update(bad)
        if not ok:
            continue
        got = embed(model, x.to(device), what, layers)
        got = {k: v.float().cpu().numpy() for k, v in got.items()}
        got["index"] = np.asarray(ok, dtype=np.int64)
        got["label"] = np.asarray([int(split.labels[i]) for i in ok], dtype=np.int64)
        for k, v in got.items():
            parts.setdefault(k, []).append(v)
    return {k: np.ascontiguousarray(np.concatenate(v)) for k, v in parts.items()}, errors


def extract(model, data, *, what: Sequence[str] | str = ("pooled",),
            layers: Sequence[int] | str | None = None, img_size=None, batch_size: int = 64,
            device: torch.device | str | None = None) -> dict[str, np.ndarray]:
    """Features of a whole data set in memory: ``data`` is a split (a sequence of (PIL image,
    label), e.g. :func:`vitkit.data.datasets.load_split`), preprocessed as every command does,
    or an iterable of (images (B, C, H, W), labels (B,)) batches already preprocessed (a
    ``DataLoader``). Returns :func:`embed`'s arrays (float32) with "label" (n,) and, for a
    split, "index" (n,): the rows of the images that could be read (an unreadable one is
    left out and logged)."""
    what = parse_what(what)
    layers = parse_layers(layers, len(model.blocks)) if not isinstance(model, CNN) else ()
    check_backbone(model, what, layers)
    size = resize(model, img_size)
    device = device or next(model.parameters()).device
    model.to(device).eval()
    if hasattr(data, "__getitem__") and hasattr(data, "labels"):
        arrays, errors = embed_rows(model, data, range(len(data)), what=what, layers=layers,
                                    preprocess=transform(model, size), batch_size=batch_size,
                                    device=device)
        if errors:
            first = next(iter(errors.items()))
            log.warning(
                "%d image(s) could not be read and were left out; the first: #%d %s",
                len(errors), *first)
        return arrays
    return _from_batches(model, data, what, layers, device)


def _from_batches(model, batches: Iterable, what, layers, device) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {}
    for x, y in batches:
        got = {k: v.float().cpu().numpy() for k, v in embed(model, x.to(device), what,
                                                              layers).items()}
        got["label"] = np.asarray(y, dtype=np.int64).reshape(-1)
        for k, v in got.items():
            parts.setdefault(k, []).append(v)
    if not parts:
        raise ConfigError("extract: the loader gave no batch; give it a non-empty data set")
    return {k: np.ascontiguousarray(np.concatenate(v)) for k, v in parts.items()}
