"""Scoring and using a checkpoint: ``evaluate_checkpoint`` (top-1, top-5, per-class accuracy and
the confusion matrix on a dataset split; ``vitkit eval``) and ``predict`` (top-k classes for
image files; ``vitkit predict``), both with the checkpoint's own preprocessing."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vitkit.checkpoints.io import load_model
from vitkit.data.datasets import load_split
from vitkit.data.images import find_images, load_image, preprocessing
from vitkit.data.transforms import Transformed, eval_transform
from vitkit.deploy.runtime import OnnxModel, is_onnx
from vitkit.errors import ConfigError, ImageError, VitkitError
from vitkit.train.trainer import evaluate
from vitkit.util.files import atomic_write
from vitkit.util.numbers import check_number
from vitkit.viz import plot


def evaluate_checkpoint(checkpoint: str | os.PathLike, data: str, split: str = "val",
                        out: str | os.PathLike | None = None, batch_size: int = 256,
                        img_size: int | None = None, model_name: str | None = None,
                        **data_options) -> dict:
    """Top-1, top-5, per-class accuracy and the confusion matrix of ``checkpoint`` on a split,
    with the same preprocessing as ``predict`` and ``attention`` (the checkpoint's own).

    With ``out``, writes ``eval.json`` and ``confusion.png`` there. ``img_size``: evaluate at
    another input size, the position table interpolated (bicubic) as ``load_model`` does.
    ``model_name``: the registered architecture of a bare state dict (``load_model(model=)``).
    """
    model = load_for_inference(checkpoint, img_size=img_size, model_name=model_name)
    (size, _), mean, std = preprocessing(model)
    ds = load_split(data, split, size, **data_options)
    if len(ds.classes) != model.num_classes:
        raise ConfigError(f"the checkpoint has {model.num_classes} classes but {data} has "
                         f"{len(ds.classes)}; evaluate on the data it was trained for")
    loader = DataLoader(Transformed(ds, eval_transform(size, mean, std)), batch_size=batch_size)
    metrics = evaluate(model, loader, torch.device("cpu"), len(ds.classes))
    result = {"checkpoint": str(checkpoint), "data": data, "split": split, "images": len(ds),
              "top1": metrics["top1"], "top5": metrics["top5"],
              "per_class": dict(zip(ds.classes, metrics["per_class"], strict=True)),
              "confusion": metrics["confusion"].tolist()}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "eval.json",
                     lambda tmp: tmp.write_text(json.dumps(result, indent=2) + "\n"))
        plot.save(plot.figure_confusion(metrics["confusion"], ds.classes,
                                        title=f"{Path(checkpoint).name} on {data} ({split})"),
                  out / "confusion.png")
    return result


def load_for_inference(checkpoint: str | os.PathLike, img_size=None,
                       model_name: str | None = None):
    """A checkpoint (:func:`load_model`, ``model_name`` its architecture if it is a bare state
    dict), or an ONNX file under onnxruntime (:class:`vitkit.deploy.runtime.OnnxModel`), for
    eval and predict."""
    if is_onnx(checkpoint):
        if model_name is not None:
            raise VitkitError(f"--model {model_name} names the architecture of a state dict; "
                              f"{checkpoint} is an ONNX graph, which holds its own: drop --model")
        return OnnxModel(checkpoint, img_size=img_size)
    return load_model(checkpoint, img_size=img_size, model=model_name)


@torch.no_grad()
def predict(checkpoint: str | os.PathLike, inputs: list[str | os.PathLike], top_k: int = 5,
            out: str | os.PathLike | None = None, model_name: str | None = None) -> list[dict]:
    """Top-k classes for each image file (folders are searched); unreadable files are
    reported with their error instead of stopping the run. ``out``: ``.csv`` or ``.json``,
    written (atomically) only when at least one image was read, so a run that failed never
    replaces an earlier file. ``model_name``: the architecture of a bare state dict."""
    check_number("--top-k", top_k, error=VitkitError)
    if out is not None and Path(out).suffix not in (".csv", ".json"):
        raise VitkitError(f"--out must end in .csv or .json, got {Path(out).name!r}")
    if out is not None and Path(out).is_dir():
        raise VitkitError(f"--out {out} is a folder; give a file name ending in .csv or .json")
    files = find_images(inputs)
    model = load_for_inference(checkpoint, model_name=model_name)
    size, mean, std = preprocessing(model)
    names = model.cfg.extra.get("class_names") or [str(i) for i in range(model.num_classes)]
    rows = []
    for path in files:
        try:
            x, _ = load_image(path, size, mean, std)
        except ImageError as err:
            rows.append({"image": str(path), "error": str(err)})
            continue
        probs = model(x[None]).softmax(-1)[0]
        values, indices = probs.topk(min(top_k, len(probs)))
        rows.append({"image": str(path), "top": [
            {"class": names[i], "index": int(i), "probability": float(v)}
            for v, i in zip(values.tolist(), indices.tolist(), strict=True)]})
    if out is not None and any("top" in r for r in rows):
        _write_predictions(Path(out), rows, top_k)  # never the result of a run that failed
    return rows


def _write_predictions(out: Path, rows: list[dict], top_k: int) -> None:
    if out.suffix == ".json":
        atomic_write(out, lambda tmp: tmp.write_text(json.dumps(rows, indent=2) + "\n"))
        return
    header = ["image"] + [f"{k}{i}" for i in range(1, top_k + 1) for k in ("class", "prob")]
    header.append("error")

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
            w = csv.writer(f)
            w.writerow(header)
            for r in rows:
                cells = [r["image"]]
                for t in r.get("top", []):
                    cells += [t["class"], f"{t['probability']:.6f}"]
                cells += [""] * (len(header) - 1 - len(cells)) + [r.get("error", "")]
                w.writerow(cells)

    atomic_write(out, write)
