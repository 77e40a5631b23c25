"""How good a frozen backbone's features are for a labelled task: the DINOv2 weighted kNN and
a logistic-regression linear probe, from two features folders (training and validation
splits embedded once by :mod:`vitkit.backbone.shards`), written as ``probe.json``,
``probe.md`` and ``knn.png`` (top-1 against k)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from vitkit.backbone import shards
from vitkit.backbone.classifier import save_probe_classifier
from vitkit.backbone.knn import KS, TEMPERATURE, knn_eval
from vitkit.backbone.linear import GRID, linear_probe
from vitkit.errors import ConfigError, DataError
from vitkit.util.files import atomic_write

OUTPUTS = ("probe.json", "probe.md", "knn.png")


def matrix(arrays: dict[str, np.ndarray], key: str) -> np.ndarray:
    """The probe's input from a stored array: (n, D) as it is, tokens (n, T, D) averaged over
    the tokens."""
    x = arrays[key]
    return x if x.ndim == 2 else x.reshape(len(x), -1, x.shape[-1]).mean(axis=1)


def _labels(manifest: dict, arrays: dict, folder) -> np.ndarray:
    y = arrays["label"]
    if (y < 0).any():
        raise DataError(f"{folder} has images without a label ({int((y < 0).sum())} of "
                        f"{len(y)}): a probe needs class sub-folders or a labelled data spec")
    return y


def check_pair(train: dict, val: dict, train_dir, val_dir) -> None:
    """Refuse training and validation features the probe cannot compare."""
    said = []
    if train["model"]["weights_sha256"] != val["model"]["weights_sha256"]:
        said.append(f"different models (weights sha256 {train['model']['weights_sha256'][:12]} "
                    f"from {train['model']['source']}, {val['model']['weights_sha256'][:12]} "
                    f"from {val['model']['source']})")
    for k, v in train["preprocessing"].items():
        if val["preprocessing"].get(k) != v:
            said.append(f"different preprocessing ({k} {v!r} and "
                        f"{val['preprocessing'].get(k)!r})")
    if train["classes"] and val["classes"] and train["classes"] != val["classes"]:
        said.append(f"different classes ({len(train['classes'])} and {len(val['classes'])}: "
                    f"{train['classes'][:5]} and {val['classes'][:5]})")
    if said:
        raise DataError(f"{train_dir} and {val_dir} cannot be compared: " + "; ".join(said)
                        + ". Embed both splits with the same checkpoint and options")


def probe_features(train_dir: str | os.PathLike, val_dir: str | os.PathLike,
                   out: str | os.PathLike | None = None, *, feature: str = "pooled",
                   ks: Sequence[int] = KS, temperature: float = TEMPERATURE, linear: bool = True,
                   grid: Sequence[float] = GRID, device: str = "cpu",
                   save_model: str | os.PathLike | None = None) -> dict:
    """kNN and linear probe of ``feature`` (a stored array: pooled, cls, patch, prefix or
    layerN; tokens are averaged) from two features folders; the record, written to ``out``
    (``probe.json``, ``probe.md``, ``knn.png``) when given. ``save_model``: also write the
    backbone with the fitted probe as its head to that ``.safetensors`` file
    (:mod:`vitkit.backbone.classifier`; pooled features and the linear probe only)."""
    if save_model is not None and (feature != "pooled" or not linear):
        raise ConfigError("--save-model writes the linear probe as the model's head, which "
                          f"reads the pooled embedding; got --feature {feature}"
                          + ("" if linear else " and --no-linear")
                          + ": use --feature pooled without --no-linear")
    if save_model is not None and Path(save_model).suffix != ".safetensors":
        raise ConfigError(f"--save-model {save_model}: expected a .safetensors file (vitkit's "
                          "own format, which every command reads)")
    train, tm = shards.read_features(train_dir, [feature])
    val, vm = shards.read_features(val_dir, [feature])
    check_pair(tm, vm, train_dir, val_dir)
    y, yv = _labels(tm, train, train_dir), _labels(vm, val, val_dir)
    if len(np.unique(y)) < 2:
        name = tm["classes"][y[0]] if tm["classes"] else y[0]
        raise DataError(f"{train_dir} holds one class ({name}); a probe needs two or more: "
                        "give data with several classes")
    classes = len(tm["classes"]) or int(max(y.max(), yv.max())) + 1
    x, xv = matrix(train, feature), matrix(val, feature)
    record = {
        "feature": feature + (" (averaged over its tokens)" if train[feature].ndim > 2 else ""),
        "model": {k: tm["model"][k] for k in ("name", "source", "weights_sha256")},
        "preprocessing": tm["preprocessing"], "classes": classes,
        "train": {"folder": str(train_dir), "data": tm["data"], "count": len(y)},
        "val": {"folder": str(val_dir), "data": vm["data"], "count": len(yv)},
        "knn": knn_eval(x, y, xv, yv, ks=ks, temperature=temperature, num_classes=classes,
                        device=device),
        "linear": None,
    }
    if linear:
        record["linear"], clf = linear_probe(x, y, xv, yv, grid=grid, num_classes=classes,
                                             return_classifier=True)
        if save_model is not None:
            record["saved_model"] = str(save_probe_classifier(tm, clf, classes, save_model))
    if out is not None:
        write(record, out)
    return record


def write(record: dict, out: str | os.PathLike) -> list[Path]:
    out = Path(out)
    files = [atomic_write(out / "probe.json",
                          lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n")),
             atomic_write(out / "probe.md", lambda tmp: tmp.write_text(report(record)))]
    try:
        files.append(plot(record, out / "knn.png"))
    except ImportError:  # matplotlib is an extra: the numbers are in probe.json and probe.md
        pass
    return files


def report(record: dict) -> str:
    """probe.md: the numbers, the protocols and what the features came from."""
    m, knn, lin = record["model"], record["knn"], record["linear"]
    lines = [f"# Probe of {m['name'] or m['source']}", "",
             f"Features: `{record['feature']}` of {m['source']} (weights sha256 "
             f"{m['weights_sha256'][:12]}), at {record['preprocessing']['img_size']}; "
             f"{record['train']['count']} training and {record['val']['count']} validation "
             f"images of {record['train']['data']['spec']}, {record['classes']} classes.", "",
             "## kNN", "", knn["protocol"] + ".", "", "| k | top-1 (%) | top-5 (%) |",
             "|---|---|---|"]
    lines += [f"| {r['k']}{'' if r['k'] == r['k_used'] else ' (' + str(r['k_used']) + ')'} | "
              f"{r['top1']:.2f} | {r['top5']:.2f} |" for r in knn["results"]]
    lines += [""] + [f"- {n}" for n in knn["notes"]] if knn["notes"] else []
    if lin is not None:
        lines += ["", "## Linear probe", "", lin["protocol"] + ".", "",
                  f"C = {lin['C']:g}: top-1 **{lin['top1']:.2f}%**, top-5 {lin['top5']:.2f}% "
                  "on the validation split.", "", "| C | held-out top-1 (%) | converged |",
                  "|---|---|---|"]
        lines += [f"| {r['C']:g} | {r['holdout_top1']:.2f} | {'yes' if r['converged'] else 'no'} |"
                  for r in lin["sweep"]]
        lines += [""] + [f"- {n}" for n in lin["notes"]] if lin["notes"] else []
    return "\n".join(lines) + "\n"


def plot(record: dict, path: Path) -> Path:
    from vitkit.viz import plot as viz

    fig, ax = viz.subplots(figsize=(4.5, 3.2))
    rows = record["knn"]["results"]
    ax.plot([r["k_used"] for r in rows], [r["top1"] for r in rows], "o-", label="kNN")
    if record["linear"] is not None:
        ax.axhline(record["linear"]["top1"], color="grey", ls="--", label="linear probe")
    ax.set_xscale("log")
    ax.set_xlabel("k (neighbours)")
    ax.set_ylabel("top-1 on the validation split (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return viz.save(fig, path)


def embed_and_probe(checkpoint: str | os.PathLike, data: str, out: str | os.PathLike, *,
                    say: Callable[[str], None] | None = None, feature: str = "pooled",
                    ks: Sequence[int] = KS, linear: bool = True, grid: Sequence[float] = GRID,
                    knn_device: str = "cpu", save_model: str | os.PathLike | None = None,
                    **options) -> dict | None:
    """Embed the training and validation splits of ``data`` into ``out/features-train`` and
    ``out/features-val`` (resumable, under torchrun: :func:`shards.run` with ``options``),
    then probe them (rank 0; None on the other ranks)."""
    out = Path(out)
    extra = {"say": say} if say is not None else {}
    if feature.startswith("layer") and feature[5:].isdigit():
        options = {"layers": [int(feature[5:])], **options}
    elif feature != "pooled":
        options = {"what": ("pooled", feature), **options}
    done = [shards.run(checkpoint, data, out / f"features-{split}", split=split, **options,
                       **extra) for split in ("train", "val")]
    if done[0] is None:
        return None
    return probe_features(out / "features-train", out / "features-val", out, feature=feature,
                          ks=ks, linear=linear, grid=grid, device=knn_device,
                          save_model=save_model)
