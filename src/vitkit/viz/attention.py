"""Explaining image files with a model, writing figures and raw maps (``vitkit attention``)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitkit.data.images import find_images, load_image, preprocessing
from vitkit.errors import ImageError, StorageError, VitkitError
from vitkit.explain import trust
from vitkit.explain.attention import cls_attention
from vitkit.explain.methods import applicable, explain_map
from vitkit.explain.perturb import deletion_insertion, random_maps
from vitkit.models.cnn import is_cnn
from vitkit.util.numbers import check_number
from vitkit.viz import plot

# writing failed, not reading: no space, over quota, a read-only file system
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


@dataclass
class ImageReport:
    """What was found and written for one image."""

    path: Path
    top: list[tuple[str, float]] = field(default_factory=list)  # (class name, probability)
    files: list = field(default_factory=list)  # written files (names while staged)
    faithfulness: dict[str, dict[str, float]] = field(default_factory=dict)
    error: str | None = None  # why this image could not be explained (the others still are)
    unwritten: bool = False  # the image was read, but its results could not be written


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
    Each image is guarded from reading to writing: one that cannot be read, computed, drawn
    or written gets a report with its ``error`` and leaves no partial outputs; the others go
    on. Outputs are named by :func:`output_stems` (no two inputs share one) and an image's
    files appear together, replacing an earlier run's only when all are written.
    """
    if is_cnn(model):
        raise VitkitError(f"attention maps need a ViT; this checkpoint is a CNN "
                          f"({model.cfg.arch}). Use `vitkit predict` for its predictions.")
    check_number("--top-k", top_k, error=VitkitError)
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
    if method not in applicable(model.cfg):
        raise VitkitError(f"--method {method} does not apply to this model (pool "
                          f"{model.cfg.pool}); methods that apply: "
                          f"{', '.join(applicable(model.cfg))}")
    size, mean, std = preprocessing(model)
    settings = _Settings(method, layer, head if head is not None else "mean", faithfulness,
                         top_k, size, mean, std)
    reports = []
    for path, stem in zip(files, output_stems(files, images), strict=True):
        stage = Path(tempfile.mkdtemp(dir=out, prefix=".staging-"))
        try:  # read, compute, draw and write: any failure is this image's alone
            report = _explain_one(model, path, stage, settings)
            report.files = _publish(stage, report.files, out / stem)
        except (VitkitError, ValueError, OSError, RuntimeError) as err:
            text = str(err) if isinstance(err, (ImageError, VitkitError)) else \
                f"{type(err).__name__}: {err}"
            full = isinstance(err, StorageError) or (
                isinstance(err, OSError) and err.errno in WRITE_ERRNOS)
            if full and isinstance(err, OSError):
                text = f"{os.strerror(err.errno)}, writing to {out}"
            report = ImageReport(path, error=text, unwritten=full)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        reports.append(report)
    return reports


def shown(path: str | os.PathLike) -> str:
    """``path`` as text that prints and draws anywhere: bytes of a file name that are not UTF-8
    are shown escaped (``caf\\xe9.png``) instead of reaching a library raw."""
    return os.fsdecode(path).encode("utf-8", "surrogateescape").decode("utf-8",
                                                                        "backslashreplace")


def output_stems(files: list[Path], inputs: list[str | os.PathLike]) -> list[str]:
    """One output name per input file, never two alike: its path relative to what the inputs
    share (``a/x`` and ``b/x`` for two folders' ``x.png``), the suffix kept where two files
    differ only by it (``x-png``, ``x-jpg``), a number where the same file is given twice."""
    bases = [os.path.abspath(i if Path(i).is_dir() else Path(i).parent) for i in inputs]
    root = Path(os.path.commonpath(bases)) if bases else Path.cwd()
    rel = []
    for f in files:
        a = Path(os.path.abspath(f))
        rel.append(a.relative_to(root) if a.is_relative_to(root) else Path(a.name))
    stems = [shown(r.with_suffix("")) for r in rel]
    counts = Counter(stems)
    stems = [shown(r.with_name(r.name.replace(".", "-"))) if counts[s] > 1 else s
             for r, s in zip(rel, stems, strict=True)]
    seen: Counter = Counter()
    out = []
    for s in stems:
        seen[s] += 1
        out.append(s if seen[s] == 1 else f"{s}-{seen[s]}")
    return out


def _publish(stage: Path, names: list[str], stem: Path) -> list[Path]:
    """Move an image's finished files from ``stage`` to ``STEM_NAME``: an earlier image's
    outputs are replaced only by a complete new set."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    final = []
    for name in names:
        dst = stem.parent / f"{stem.name}_{name}"
        os.replace(stage / name, dst)
        final.append(dst)
    return final


@dataclass(frozen=True)
class _Settings:
    method: str
    layer: int
    head: int | str
    faithfulness: bool
    top_k: int
    size: tuple[int, int]
    mean: tuple
    std: tuple


def _explain_one(model, path: Path, stage: Path, o: _Settings) -> ImageReport:
    """Every figure and map of one image, written into ``stage``; the report's ``files`` are
    their names there."""
    x, picture = load_image(path, o.size, o.mean, o.std)
    x = x[None]  # (1, 3, H, W)
    with torch.no_grad():
        logits, maps = model(x, return_attn=True)
    probs = logits.softmax(-1)[0]
    values, indices = probs.topk(min(o.top_k, probs.numel()))
    report = ImageReport(path, [(_class_name(model, int(i)), float(v))
                                for v, i in zip(values, indices, strict=True)])
    # (layers, heads, T, T): what vitkit doctor reads
    np.save(stage / "maps.npy", torch.stack(list(maps))[:, 0].half().numpy())
    report.files.append("maps.npy")
    panels: dict[str, np.ndarray] = {}
    if model.cfg.pool == "cls":
        cls_all = torch.stack([cls_attention(maps, layer=i)[0] for i in range(len(maps))])
        np.save(stage / "cls_attention.npy", cls_all.numpy())  # (layers, heads, gh, gw)
        at = o.layer % len(maps)
        plot.save(plot.figure_heads(picture, cls_all[at], at), stage / "heads.png")
        plot.save(plot.figure_mosaic(picture, cls_all), stage / "mosaic.png")
        report.files += ["heads.png", "mosaic.png", "cls_attention.npy"]
        panels = {f"L{at} h{h}": m for h, m in enumerate(cls_all[at].numpy())}
    explanation = explain_map(model, x, o.method, layer=o.layer, head=o.head,
                              outputs=(logits, maps))
    grid_map = explanation.map[0]
    panels[f"cls ({o.head})" if o.method == "cls" else o.method] = grid_map.numpy()
    np.save(stage / f"{o.method}.npy", grid_map.numpy())
    title = f"{shown(path.name)}: {report.top[0][0]} ({report.top[0][1]:.2f})"
    plot.save(plot.figure_methods(picture, panels, title=title), stage / f"{o.method}.png")
    report.files += [f"{o.method}.png", f"{o.method}.npy"]
    if o.faithfulness:
        curves, own = {}, None
        for name, m in ((o.method, explanation.map), ("random", random_maps(explanation.map))):
            c = deletion_insertion(model, x, m, explanation.target,
                                   baseline=trust.VERDICT_BASELINE)
            curves[name] = (c.deletion[0].numpy(), c.insertion[0].numpy())
            report.faithfulness[name] = {"deletion_auc": float(c.deletion_auc[0]),
                                         "insertion_auc": float(c.insertion_auc[0])}
            own = c.deletion_auc if own is None else own  # the map's, computed once
        # the verdict: against many random maps, not the one drawn above
        floor = trust.random_floor(model, x, explanation.map, explanation.target,
                                   baseline=trust.VERDICT_BASELINE, own_auc=own)
        report.faithfulness[o.method].update(
            baseline=trust.VERDICT_BASELINE,
            percentile_vs_random=float(floor.percentile[0]), p_value=float(floor.p_value[0]))
        plot.save(plot.figure_curves(c.fractions.numpy(), curves, title=title),
                  stage / "faithfulness.png")
        report.files.append("faithfulness.png")
    return report
