"""``vitkit trust``: the trust checks of every applicable method (``explain.trust.method_table``)
on a checkpoint and a data spec or image files, written as CSV, Markdown and a figure."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from vitkit.data.datasets import load_split
from vitkit.data.images import Preprocess, find_images, load_image, preprocessing
from vitkit.errors import DataError, ImageError
from vitkit.explain import trust
from vitkit.util.files import atomic_write
from vitkit.viz import plot


def inputs(model, data: str | None = None, images: list[str] | None = None, count: int = 32,
           ) -> tuple[torch.Tensor, torch.Tensor | None, str, list[str]]:
    """(images (B, C, H, W) preprocessed for ``model``, object boxes (B, 4) scaled to them where
    the data knows them, a description, the files that could not be read)."""
    size, mean, std = preprocessing(model)
    if data is not None:
        split = load_split(data, "val", size[0])
        n = min(count, len(split))
        prep = Preprocess(size, mean, std)
        x = torch.stack([prep(split[i][0]) for i in range(n)])
        boxes = None
        if split.boxes is not None:
            side = split[0][0].size[0]  # the canvas the boxes are drawn on
            boxes = (split.boxes[:n].float() * size[0] / side).round().long()
        return x, boxes, f"the first {n} validation images of {data}", []
    tensors, skipped = [], []
    for path in find_images(images or [])[:count]:
        try:
            tensors.append(load_image(path, size, mean, std)[0])
        except ImageError as err:
            skipped.append(f"{path}: {err}")
    if not tensors:
        raise DataError("none of the images could be read: " + "; ".join(skipped[:3]))
    return torch.stack(tensors), None, f"{len(tensors)} image files", skipped


def write(rows: list[dict], out: str | os.PathLike, title: str) -> list[Path]:
    """trust.csv, trust.md and trust.png (each method's percentile against random maps, with
    its sanity verdicts) in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = f"# {title}\n\n{trust.table_markdown(rows)}\n"
    atomic_write(out / "trust.csv", lambda tmp: tmp.write_text(trust.table_csv(rows)))
    atomic_write(out / "trust.md", lambda tmp: tmp.write_text(md))
    labels = [f"{r['method']}\n{'rand ' + r['randomisation']}, class {r['class_sensitivity']}"
              for r in rows]
    plot.save(plot.figure_bars(labels, [r["percentile_vs_random"] for r in rows],
                               ylabel="share of random maps beaten (deletion)", title=title,
                               line=0.5), out / "trust.png")
    return [out / "trust.csv", out / "trust.md", out / "trust.png"]
