"""Pictures of a backbone's dense features for image files (``vitkit dense``): the PCA picture
beside the image, a patch's cosine-similarity map, the correspondence with another image, each
with the high-norm artifact tokens circled; and the raw ``.npy`` arrays.

The numbers are :mod:`vitkit.explain.dense`'s; this module reads the files, draws and writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.patches as mpatches
import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure

from vitkit.data.images import find_images, load_image, preprocessing
from vitkit.errors import VitkitError
from vitkit.explain import dense
from vitkit.util.files import atomic_write
from vitkit.viz import plot
from vitkit.viz.attention import output_stems, shown

MATCH_LINES = 24  # correspondence lines drawn: the most similar mutual nearest neighbours


@dataclass
class DenseReport:
    """What was found and written for one image."""

    path: Path
    grid: tuple[int, int] = (0, 0)
    artifacts: list[tuple[int, int]] = field(default_factory=list)  # (row, col), row by row
    explained: list[float] = field(default_factory=list)  # the foreground PCA's three ratios
    foreground: float = 0.0  # share of patches in the foreground
    files: list[Path] = field(default_factory=list)
    error: str | None = None  # why this image was skipped (the others are still written)


@dataclass
class _Image:
    picture: np.ndarray  # (H, W, 3) in [0, 1]
    tokens: torch.Tensor  # (gh, gw, D)
    prefix: torch.Tensor  # (P, D)
    artifacts: torch.Tensor  # (gh, gw) bool


def _analyse(model, x: torch.Tensor, picture: np.ndarray) -> _Image:
    """One preprocessed image x (3, H, W): its tokens and artifact patches."""
    tokens, prefix = dense.patch_features(model, x[None])
    return _Image(picture, tokens[0], prefix[0], dense.artifact_mask(model, x[None])[0])


# ------------------------------------------------------------------------------- figures
def _extent(image: np.ndarray) -> tuple[float, float, float, float]:
    h, w = image.shape[:2]
    return (-0.5, w - 0.5, h - 0.5, -0.5)


def _patch_xy(image: np.ndarray, grid, row: int, col: int) -> tuple[float, float, float, float]:
    """(x0, y0, width, height) of patch (row, col) in the picture's pixel coordinates."""
    h, w = image.shape[:2]
    sy, sx = h / grid[0], w / grid[1]
    return col * sx - 0.5, row * sy - 0.5, sx, sy


def mark_artifacts(ax, image: np.ndarray, artifacts) -> None:
    """Circle every True patch of ``artifacts`` (gh, gw) on an axis showing ``image``."""
    a = np.asarray(artifacts)
    for row, col in zip(*np.nonzero(a), strict=True):
        x0, y0, sx, sy = _patch_xy(image, a.shape, int(row), int(col))
        ax.add_patch(mpatches.Circle((x0 + sx / 2, y0 + sy / 2), 0.5 * min(sx, sy) + 1,
                                     fill=False, edgecolor="red", linewidth=1.5))


def _note(artifacts) -> str:
    n = int(np.asarray(artifacts).sum())
    return f"; {n} high-norm token(s) circled" if n else ""


def figure_pca(picture: np.ndarray, rgb: np.ndarray, artifacts, *, title: str = "") -> Figure:
    """The image beside its PCA picture (rgb (gh, gw, 3)), artifact patches circled on both."""
    fig, (ax_i, ax_p) = plot.subplots(1, 2, figsize=(6, 3.3))
    ax_i.imshow(picture, interpolation="nearest")
    ax_p.imshow(rgb, extent=_extent(picture), interpolation="nearest")
    for ax, name in ((ax_i, "image"), (ax_p, "PCA of the patch features")):
        mark_artifacts(ax, picture, artifacts)
        ax.set_title(name, fontsize=8)
        ax.axis("off")
    fig.suptitle(title + _note(artifacts), fontsize=9)
    fig.tight_layout()
    return fig


def _similarity_panel(fig, ax, picture, sim, *, artifacts, title, patch=None) -> None:
    s = np.asarray(sim)
    ax.imshow(picture, interpolation="nearest")
    im = ax.imshow(s, extent=_extent(picture), cmap="inferno", alpha=0.7,
                   interpolation="nearest", vmin=float(s.min()), vmax=float(s.max()))
    mark_artifacts(ax, picture, artifacts)
    if patch is not None:
        x0, y0, sx, sy = _patch_xy(picture, s.shape, *patch)
        ax.add_patch(mpatches.Rectangle((x0, y0), sx, sy, fill=False, edgecolor="cyan",
                                        linewidth=2))
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
    ax.set_title(title, fontsize=8)
    ax.axis("off")


def figure_similarity(picture: np.ndarray, sim, patch: tuple[int, int], *, artifacts,
                      title: str = "", other=None) -> Figure:
    """The cosine similarity (gh, gw) of ``patch`` with every patch over the image, the patch
    boxed, artifacts circled; ``other`` (picture, sim, artifacts): the same patch's similarity
    over a second image beside it. Colours: each map's own minimum to maximum (the bar)."""
    n = 2 if other is None else 3
    fig, axes = plot.subplots(1, n, figsize=(3.2 * n, 3.3), squeeze=False)
    ax0 = axes[0, 0]
    ax0.imshow(picture, interpolation="nearest")
    x0, y0, sx, sy = _patch_xy(picture, np.asarray(sim).shape, *patch)
    ax0.add_patch(mpatches.Rectangle((x0, y0), sx, sy, fill=False, edgecolor="cyan",
                                     linewidth=2))
    ax0.set_title(f"patch (row {patch[0]}, column {patch[1]})", fontsize=8)
    ax0.axis("off")
    _similarity_panel(fig, axes[0, 1], picture, sim, artifacts=artifacts,
                      title="cosine similarity", patch=patch)
    if other is not None:
        _similarity_panel(fig, axes[0, 2], other[0], other[1], artifacts=other[2],
                          title="in the --match image")
    fig.suptitle(title + _note(artifacts), fontsize=9)
    fig.tight_layout()
    return fig


def figure_matches(a: np.ndarray, b: np.ndarray, matches: dense.Matches, *, artifacts_a,
                   artifacts_b, title: str = "", lines: int = MATCH_LINES) -> Figure:
    """Image A beside image B, lines from A's patches to their best matches in B: the
    ``lines`` most similar mutual nearest neighbours (or, without any, the most similar
    matches); artifacts circled in both."""
    gap = 8
    h = max(a.shape[0], b.shape[0])
    canvas = np.ones((h, a.shape[1] + gap + b.shape[1], 3), dtype=np.float32)
    canvas[:a.shape[0], :a.shape[1]] = a
    canvas[:b.shape[0], a.shape[1] + gap:] = b
    fig, ax = plot.subplots(figsize=(6.5, 3.5))
    ax.imshow(canvas, interpolation="nearest")
    mark_artifacts(ax, a, artifacts_a)
    offset = a.shape[1] + gap
    marked_b = np.asarray(artifacts_b)
    for row, col in zip(*np.nonzero(marked_b), strict=True):
        x0, y0, sx, sy = _patch_xy(b, marked_b.shape, int(row), int(col))
        ax.add_patch(mpatches.Circle((offset + x0 + sx / 2, y0 + sy / 2),
                                     0.5 * min(sx, sy) + 1, fill=False, edgecolor="red",
                                     linewidth=1.5))
    sim, mutual = matches.similarity.numpy(), matches.mutual.numpy()
    pool = np.flatnonzero(mutual.ravel()) if mutual.any() else np.arange(sim.size)
    chosen = pool[np.argsort(-sim.ravel()[pool])][:lines]
    grid_a, grid_b = sim.shape, tuple(marked_b.shape)
    cmap = plot_colours(len(chosen))
    for k, flat in enumerate(chosen):
        r, c = divmod(int(flat), grid_a[1])
        rb, cb = (int(v) for v in matches.index[r, c])
        xa, ya, sxa, sya = _patch_xy(a, grid_a, r, c)
        xb, yb, sxb, syb = _patch_xy(b, grid_b, rb, cb)
        ax.plot([xa + sxa / 2, offset + xb + sxb / 2], [ya + sya / 2, yb + syb / 2],
                color=cmap[k], linewidth=1, marker="o", markersize=2)
    ax.set_title((title or "best matches") + f": {len(chosen)} strongest "
                 f"{'mutual ' if mutual.any() else ''}matches", fontsize=8)
    ax.axis("off")
    fig.tight_layout()
    return fig


def plot_colours(n: int) -> list:
    """``n`` distinct colours around the hue circle."""
    cmap = colormaps["hsv"]
    return [cmap(k / max(n, 1)) for k in range(n)]


# --------------------------------------------------------------------------- image files
def _save(path: Path, array) -> Path:
    a = array.numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
    return atomic_write(path, lambda tmp: np.save(tmp, a))


def dense_images(model, images: list[str | os.PathLike], out_dir: str | os.PathLike, *,
                 pca: bool = True, similar: tuple[int, int] | None = None,
                 match: str | os.PathLike | None = None, shared_basis: bool = False,
                 threshold: float | None = dense.THRESHOLD) -> list[DenseReport]:
    """For each image (files, or folders searched for images), in ``out_dir`` as
    ``STEM_NAME``: ``tokens.npy`` (gh, gw, D) patch tokens after the final norm,
    ``prefix.npy`` (P, D) when the model has prefix tokens, ``artifacts.npy`` (gh, gw) bool;
    with ``pca``: ``pca.png`` (the image beside its PCA picture), ``pca.npy`` (gh, gw, 3),
    ``foreground.npy`` (gh, gw) bool; with ``similar`` (row, col): ``similar.png`` and
    ``similar.npy`` (gh, gw), the cosine of that patch with every patch (and
    ``similar_match.npy`` over the ``match`` image); with ``match`` (one image B):
    ``match.png``, ``match.npy`` (gh, gw, 2) the (row, col) of each patch's best match in B,
    ``match_similarity.npy`` (gh, gw) its cosine. ``shared_basis``: one PCA fitted on the
    patches of every image read (else each image alone). Artifact tokens are circled in every
    picture.

    An image that cannot be read gets a report with its ``error`` and the others go on; a
    ``match`` image that cannot be read is an error (every image needs it).
    """
    if similar is not None:
        dense.check_patch(*similar, model.cfg.grid_size)
    files = find_images(images)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise VitkitError(f"--out {out} is a file; give a folder for the pictures and arrays")
    size, mean, std = preprocessing(model)
    other = _analyse(model, *load_image(match, size, mean, std)) if match is not None else None
    reports, seen = [], {}
    for path, stem in zip(files, output_stems(files, images), strict=True):
        try:  # the user's file: one that cannot be read is skipped, the others go on
            x, picture = load_image(path, size, mean, std)
        except (VitkitError, OSError) as err:
            reports.append(DenseReport(path, error=str(err)))
            continue
        seen[stem] = _analyse(model, x, picture)
        reports.append(DenseReport(path, grid=tuple(seen[stem].tokens.shape[:2])))
    done = [r for r in reports if r.error is None]
    fitted = None
    if pca and seen:
        fitted = dense.feature_pca(torch.stack([i.tokens for i in seen.values()]),
                                   threshold=threshold, shared=shared_basis)
    for k, (report, (stem, img)) in enumerate(zip(done, seen.items(), strict=True)):
        base = out / stem

        def name(suffix: str, base: Path = base) -> Path:
            return base.parent / f"{base.name}_{suffix}"
        report.artifacts = [(int(r), int(c)) for r, c in img.artifacts.nonzero()]
        report.files += [_save(name("tokens.npy"), img.tokens.float()),
                         _save(name("artifacts.npy"), img.artifacts)]
        if img.prefix.shape[0]:
            report.files.append(_save(name("prefix.npy"), img.prefix.float()))
        title = shown(report.path.name)
        if fitted is not None:
            report.explained = fitted.explained[k].tolist()
            report.foreground = float(fitted.foreground[k].mean())
            report.files += [
                plot.save(figure_pca(img.picture, fitted.rgb[k], img.artifacts, title=title),
                          name("pca.png")),
                _save(name("pca.npy"), fitted.rgb[k]),
                _save(name("foreground.npy"), fitted.foreground[k])]
        if similar is not None:
            sim = dense.patch_similarity(img.tokens[None], *similar)[0]
            beside = None
            if other is not None:
                sim_b = dense.patch_similarity(img.tokens[None], *similar,
                                               other=other.tokens[None])[0]
                beside = (other.picture, sim_b.numpy(), other.artifacts)
                report.files.append(_save(name("similar_match.npy"), sim_b))
            report.files += [
                plot.save(figure_similarity(img.picture, sim.numpy(), similar,
                                            artifacts=img.artifacts, title=title,
                                            other=beside), name("similar.png")),
                _save(name("similar.npy"), sim)]
        if other is not None:
            m = dense.best_matches(img.tokens, other.tokens)
            report.files += [
                plot.save(figure_matches(img.picture, other.picture, m,
                                         artifacts_a=img.artifacts,
                                         artifacts_b=other.artifacts, title=title),
                          name("match.png")),
                _save(name("match.npy"), m.index),
                _save(name("match_similarity.npy"), m.similarity)]
    return reports
