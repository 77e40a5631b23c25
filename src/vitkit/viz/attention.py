"""Explaining image files with a model, writing figures and raw maps (``vitkit attention``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitkit.data.images import find_images, load_image, preprocessing
from vitkit.errors import ImageError, VitkitError
from vitkit.explain.attention import cls_attention
from vitkit.explain.methods import applicable, explain_map
from vitkit.explain.metrics import deletion_insertion, random_maps
from vitkit.models.cnn import is_cnn
from vitkit.viz import plot


@dataclass
class ImageReport:
    """What was found and written for one image."""

    path: Path
    top: list[tuple[str, float]] = field(default_factory=list)  # (class name, probability)
    files: list[Path] = field(default_factory=list)
    faithfulness: dict[str, dict[str, float]] = field(default_factory=dict)
    error: str | None = None  # why this image could not be explained (the others still are)


def _class_name(model, index: int) -> str:
    names = model.cfg.extra.get("class_names")
    return names[index] if names and index < len(names) else f"class {index}"


def explain_images(model, images: list[str | os.PathLike], out_dir: str | os.PathLike,
                   method: str = "rollout", layer: int = -1, head: int | str | None = None,
                   faithfulness: bool = False, top_k: int = 5) -> list[ImageReport]:
    """For each image (files, or folders searched for images): top-k prediction, per-head
    [CLS] maps of ``layer``, a layers x heads mosaic, ``method``'s map beside the per-head ones
    (PNG), and the raw maps (``.npy``).

    ``head`` picks one head (or "mean"/"max"/"min") for the single ``cls`` map; the per-head
    figures always show every head. A model that pools by average has no [CLS] maps: the
    [CLS] figures are skipped and ``method="cls"`` is an error naming the methods that apply.
    An image that cannot be read gets a report with its ``error``; the others go on.
    """
    if is_cnn(model):
        raise VitkitError(f"attention maps need a ViT; this checkpoint is a CNN "
                          f"({model.cfg.arch}). Use `vitkit predict` for its predictions.")
    if top_k < 1:
        raise VitkitError(f"--top-k must be 1 or more, got {top_k}")
    if not -model.cfg.depth <= layer < model.cfg.depth:
        raise VitkitError(f"--layer {layer} does not exist: the model has {model.cfg.depth} "
                          f"layers (0..{model.cfg.depth - 1}, or -1 for the last)")
    if isinstance(head, int) and not -model.cfg.num_heads <= head < model.cfg.num_heads:
        raise VitkitError(f"--head {head} does not exist: the model has {model.cfg.num_heads} "
                          "heads per layer; or use mean, max or min")
    files = find_images(images)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise VitkitError(f"--out {out} is a file; give a folder for the figures and maps")
    out.mkdir(parents=True, exist_ok=True)
    has_cls = model.cfg.pool == "cls"
    if method not in applicable(model.cfg):
        raise VitkitError(f"--method {method} does not apply to this model (pool "
                          f"{model.cfg.pool}); methods that apply: "
                          f"{', '.join(applicable(model.cfg))}")
    size, mean, std = preprocessing(model)
    reports = []
    for path in files:
        try:
            x, picture = load_image(path, size, mean, std)
        except ImageError as err:
            reports.append(ImageReport(path, error=str(err)))
            continue
        x = x[None]  # (1, 3, H, W)
        with torch.no_grad():
            logits, maps = model(x, return_attn=True)
        probs = logits.softmax(-1)[0]
        k = min(top_k, probs.numel())
        values, indices = probs.topk(k)
        report = ImageReport(path, [(_class_name(model, int(i)), float(v))
                                    for v, i in zip(values, indices, strict=True)])
        stem = out / path.stem
        np.save(f"{stem}_maps.npy", torch.stack(list(maps))[:, 0].half().numpy())
        report.files.append(Path(f"{stem}_maps.npy"))  # (layers, heads, T, T): vitkit doctor
        panels: dict[str, np.ndarray] = {}
        if has_cls:
            cls_all = torch.stack([cls_attention(maps, layer=i)[0] for i in range(len(maps))])
            np.save(f"{stem}_cls_attention.npy", cls_all.numpy())  # (layers, heads, gh, gw)
            shown = layer % len(maps)
            report.files += [
                plot.save(plot.figure_heads(picture, cls_all[shown], shown), f"{stem}_heads.png"),
                plot.save(plot.figure_mosaic(picture, cls_all), f"{stem}_mosaic.png"),
                Path(f"{stem}_cls_attention.npy"),
            ]
            panels = {f"L{shown} h{h}": m for h, m in enumerate(cls_all[shown].numpy())}
        chosen = head if head is not None else "mean"
        explanation = explain_map(model, x, method, layer=layer, head=chosen,
                                  outputs=(logits, maps))
        grid_map = explanation.map[0]
        label = f"cls ({chosen})" if method == "cls" else method
        panels[label] = grid_map.numpy()
        np.save(f"{stem}_{method}.npy", grid_map.numpy())
        title = f"{path.name}: {report.top[0][0]} ({report.top[0][1]:.2f})"
        report.files += [
            plot.save(plot.figure_methods(picture, panels, title=title), f"{stem}_{method}.png"),
            Path(f"{stem}_{method}.npy"),
        ]
        if faithfulness:
            curves = {}
            for name, m in ((method, explanation.map), ("random", random_maps(explanation.map))):
                c = deletion_insertion(model, x, m, explanation.target)
                curves[name] = (c.deletion[0].numpy(), c.insertion[0].numpy())
                report.faithfulness[name] = {"deletion_auc": float(c.deletion_auc[0]),
                                             "insertion_auc": float(c.insertion_auc[0])}
            fig = plot.figure_curves(c.fractions.numpy(), curves, title=title)
            report.files.append(plot.save(fig, f"{stem}_faithfulness.png"))
        reports.append(report)
    return reports
