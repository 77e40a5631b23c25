"""Figures: grid maps upsampled (bilinear) and overlaid on the image, per head, per layer x
head, and method beside method. All functions return a matplotlib Figure; ``save`` writes it.

Images are (H, W, 3) arrays in [0, 1]; maps are (gh, gw) arrays or tensors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import matplotlib.patches as mpatches
import numpy as np
import torch
from matplotlib.figure import Figure

from vitkit.util.files import atomic_write
from vitkit.util.grids import upsample


def subplots(*args, figsize=None, **kwargs):
    """``(figure, axes)`` like ``pyplot.subplots``, through matplotlib's object API: no pyplot,
    no global figure list and no backend switch, so importing vitkit never changes a
    notebook's backend."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*args, **kwargs)


def to_image_size(grid_map, size: tuple[int, int]) -> np.ndarray:
    """(gh, gw) -> (H, W) bilinear, rescaled to [0, 1] (a constant map becomes zeros)."""
    t = torch.as_tensor(np.asarray(grid_map), dtype=torch.float32)[None]
    up = upsample(t, size)[0]
    lo, hi = up.min(), up.max()
    return ((up - lo) / (hi - lo) if hi > lo else torch.zeros_like(up)).numpy()


def overlay(ax, image: np.ndarray, grid_map=None, alpha: float = 0.5, cmap: str = "jet",
            box=None, title: str | None = None) -> None:
    """Draw ``image``, the upsampled map over it with ``alpha``, and a box (x0, y0, x1, y1)."""
    ax.imshow(image, interpolation="nearest")
    if grid_map is not None:
        ax.imshow(to_image_size(grid_map, image.shape[:2]), cmap=cmap, alpha=alpha,
                  vmin=0, vmax=1, interpolation="nearest")
    if box is not None:
        x0, y0, x1, y1 = (float(v) for v in box)
        ax.add_patch(mpatches.Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False,
                                        edgecolor="lime", linewidth=1.5))
    if title:
        ax.set_title(title, fontsize=8)
    ax.axis("off")


def figure_heads(image: np.ndarray, head_maps, layer: int, box=None,
                 title: str = "") -> Figure:
    """The image and one panel per head: [CLS] attention of one layer, (heads, gh, gw)."""
    heads = len(head_maps)
    cols = min(heads + 1, 7)
    rows = -(-(heads + 1) // cols)
    fig, axes = subplots(rows, cols, figsize=(2 * cols, 2 * rows + 0.4), squeeze=False)
    overlay(axes.flat[0], image, box=box, title="image")
    for h in range(heads):
        overlay(axes.flat[h + 1], image, head_maps[h], box=box, title=f"layer {layer} head {h}")
    for ax in list(axes.flat)[heads + 1:]:
        ax.axis("off")
    fig.suptitle(title or f"[CLS] attention per head, layer {layer}", fontsize=10)
    fig.tight_layout()
    return fig


def figure_mosaic(image: np.ndarray, cls_maps, box=None, title: str = "") -> Figure:
    """Layers x heads: [CLS] attention of every head of every layer, (layers, heads, gh, gw)."""
    layers, heads = len(cls_maps), len(cls_maps[0])
    fig, axes = subplots(layers, heads, figsize=(1.3 * heads, 1.3 * layers + 0.4),
                             squeeze=False)
    for i in range(layers):
        for h in range(heads):
            overlay(axes[i, h], image, cls_maps[i][h], box=box, alpha=0.6)
            if h == 0:
                axes[i, h].text(-0.08, 0.5, f"L{i}", transform=axes[i, h].transAxes,
                                ha="right", va="center", fontsize=7)
            if i == 0:
                axes[i, h].set_title(f"h{h}", fontsize=7)
    fig.suptitle(title or "[CLS] attention: layers (rows) x heads (columns)", fontsize=10)
    fig.tight_layout()
    return fig


def figure_methods(image: np.ndarray, maps: Mapping[str, object], box=None,
                   title: str = "") -> Figure:
    """The image and one overlay per method, side by side."""
    n = len(maps) + 1
    fig, axes = subplots(1, n, figsize=(2.2 * n, 2.6), squeeze=False)
    overlay(axes[0, 0], image, box=box, title="image")
    for ax, (name, m) in zip(axes[0, 1:], maps.items(), strict=True):
        overlay(ax, image, m, box=box, title=name)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def figure_curves(fractions, curves: Mapping[str, tuple[object, object]],
                  title: str = "") -> Figure:
    """Deletion and insertion curves per method: {name: (deletion (S+1,), insertion (S+1,))}."""
    fig, (ax_d, ax_i) = subplots(1, 2, figsize=(8, 3.2))
    for name, (deletion, insertion) in curves.items():
        ax_d.plot(fractions, deletion, label=name)
        ax_i.plot(fractions, insertion, label=name)
    for ax, what in ((ax_d, "deletion: patches removed"), (ax_i, "insertion: patches revealed")):
        ax.set_xlabel(f"fraction of {what.split(': ')[1]}")
        ax.set_ylabel("probability of the class")
        ax.set_title(what.split(":")[0], fontsize=9)
        ax.set_ylim(0, 1.02)
    ax_i.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def save(fig: Figure, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG, atomically (a failed draw leaves an earlier file as it was)."""
    return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))


def figure_confusion(confusion, class_names: list[str], title: str = "") -> Figure:
    """A confusion matrix (true rows x predicted columns), counts written in the cells."""
    counts = np.asarray(confusion)
    n = len(class_names)
    size = min(12, 2 + 0.45 * n)
    fig, ax = subplots(figsize=(size, size))
    ax.imshow(counts, cmap="Blues")
    ax.set_xticks(range(n), class_names, rotation=90 if n > 10 else 0, fontsize=7)
    ax.set_yticks(range(n), class_names, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if n <= 30:
        top = counts.max() or 1
        for i in range(n):
            for j in range(n):
                if counts[i, j]:
                    ax.text(j, i, int(counts[i, j]), ha="center", va="center", fontsize=6,
                            color="white" if counts[i, j] > top / 2 else "black")
    ax.set_title(title or "confusion matrix", fontsize=10)
    fig.tight_layout()
    return fig


def figure_bars(labels: list[str], values: list[float], ylabel: str = "", title: str = "",
                line: float | None = None) -> Figure:
    """One bar per label, values in [0, 1], with an optional dashed reference ``line``."""
    fig, ax = subplots(figsize=(max(4.0, 1.2 * len(labels)), 3.4))
    ax.bar(range(len(values)), values, color="tab:blue")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel(ylabel, fontsize=8)
    if line is not None:
        ax.axhline(line, color="grey", linestyle="--", linewidth=1)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def figure_grouped_bars(values: Mapping[str, Mapping[str, float]], ylabel: str = "",
                        title: str = "") -> Figure:
    """``values[label][group]``: one cluster of bars per label (x axis), one bar per group in
    it, a legend naming the groups; a label without a group's value leaves that bar out."""
    labels = list(values)
    groups = list(dict.fromkeys(g for by_group in values.values() for g in by_group))
    width = 0.8 / max(len(groups), 1)
    fig, ax = subplots(figsize=(max(5.0, 0.6 * len(labels) * max(1, len(groups) / 2)), 3.8))
    for k, group in enumerate(groups):
        xs = [i + (k - (len(groups) - 1) / 2) * width for i, label in enumerate(labels)
              if group in values[label]]
        ys = [values[label][group] for label in labels if group in values[label]]
        ax.bar(xs, ys, width=width, label=group)
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(ylabel, fontsize=8)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
