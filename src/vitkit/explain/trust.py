"""Checks a random map cannot pass: how far a map can be trusted.

Deletion and insertion fill the removed patches with something, and what they are filled with
moves the image off the data the model saw, so the drop in probability measures that shift as
much as the map (ROAD, Rong et al. 2022). So the curves here take a choice of baseline and of
order, and a map is judged against many random maps rather than one:

- :func:`vitkit.explain.perturb.perturbation_curves` (the one deletion and insertion):
  most- or least-relevant patches first, the removed pixels filled with a constant, a
  blurred copy or ROAD's noisy linear imputation; each caller names its baseline.
- :func:`random_floor`: a map's AUC as a percentile among ``n`` random maps, with its p-value.
- :func:`randomisation_check`: Adebayo et al. 2018's model-randomisation test: re-initialise the
  weights from the head down, block by block; a map that barely changes copies the input or the
  architecture, not the model.
- :func:`class_sensitivity`: the map for the predicted class against the map for the least
  likely class; a map that does not change explains no class.

Maps are (B, gh, gw) on the patch grid; images (B, C, H, W) as the model takes them.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from vitkit.explain.localisation import mass_in_box, pointing_game
from vitkit.explain.perturb import BASELINES, auc, perturbation_curves
from vitkit.explain.registry import METHODS, applicable, explain_map

RANDOM_MAPS = 20  # random maps per image for the floor
# The verdict "trust this map": its deletion AUC (most relevant first, the removed patches set
# to zero) beats this share of random maps, and it passes both sanity checks below. The
# explorer, vitkit attention --faithfulness and vitkit trust's first column all use it.
VERDICT_BASELINE = "constant"
TRUSTED_PERCENTILE = 0.9
# Adebayo et al. 2018: a map whose rank correlation with the trained model's map stays high
# after every block is re-initialised does not depend on what the model learned.
RANDOMISED_MAX_CORRELATION = 0.5
# A map for the predicted class this close (rank correlation) to the map for the least likely
# class explains no class in particular.
CLASS_MAX_CORRELATION = 0.9


@dataclass
class Floor:
    """A map's AUC (B,) against those of ``n`` random maps (B, n): ``percentile`` (B,) is the
    share of random maps it beats, ``p_value`` (B,) the chance that a random map does at
    least as well ((1 + ties or better) / (n + 1))."""

    auc: torch.Tensor
    random: torch.Tensor
    percentile: torch.Tensor
    p_value: torch.Tensor


def random_floor(model, images: torch.Tensor, maps: torch.Tensor, target: torch.Tensor, *,
                 baseline: str, n: int = RANDOM_MAPS, mode: str = "deletion",
                 order: str = "most", steps: int = 16, batch_size: int = 256,
                 seed: int = 0, own_auc: torch.Tensor | None = None) -> Floor:
    """The map's AUC as a percentile among ``n`` uniformly random maps of each image;
    ``own_auc`` (B,) is the map's AUC under the same settings where already computed."""
    def area(m):
        return auc(perturbation_curves(model, images, m, target, mode=mode, baseline=baseline,
                                       order=order, steps=steps, batch_size=batch_size,
                                       seed=seed))

    own = area(maps) if own_auc is None else own_auc
    g = torch.Generator().manual_seed(seed)
    others = torch.stack([area(torch.rand(maps.shape, generator=g).to(maps))
                          for _ in range(n)], dim=1)  # (B, n)
    lower_better = (mode == "deletion") == (order == "most")
    beats = others > own[:, None] if lower_better else others < own[:, None]
    return Floor(own, others, beats.float().mean(1), (1 + (~beats).sum(1)) / (n + 1))


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """(B, ...) -> (B, N) the rank of each value within its row, ties given their mean rank (as
    Spearman's correlation needs: tied patches, such as a black background's zero relevance,
    must not be ordered by their position, which two maps would share)."""
    flat = x.flatten(1).float()
    b, n = flat.shape
    values, order = flat.sort(dim=1, stable=True)
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[:, 1:] = values[:, 1:] != values[:, :-1]
    group = starts.long().cumsum(1) - 1  # (B, N) index of each sorted value's tie group
    position = torch.arange(n, dtype=flat.dtype).expand(b, n)
    total = torch.zeros_like(flat).scatter_add_(1, group, position)
    count = torch.zeros_like(flat).scatter_add_(1, group, torch.ones_like(flat))
    mean = (total / count.clamp_min(1)).gather(1, group)
    return torch.empty_like(flat).scatter_(1, order, mean)


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation of each pair of maps (B, ...) -> (B,), ties at their mean
    rank; 0 where a map is constant."""
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)
    return (ra * rb).sum(1) / (ra.norm(dim=1) * rb.norm(dim=1)).clamp_min(1e-12)


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Structural similarity of each pair of maps (B, ...) over the whole map, each scaled to
    [0, 1] first (Adebayo et al. 2018 report it beside the rank correlation) -> (B,)."""
    def unit(x):
        flat = x.flatten(1).float()
        lo, hi = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
        return (flat - lo) / (hi - lo).clamp_min(1e-12)

    x, y = unit(a), unit(b)
    c1, c2 = 0.01**2, 0.03**2
    mx, my = x.mean(1), y.mean(1)
    vx, vy = x.var(1, unbiased=False), y.var(1, unbiased=False)
    cov = ((x - mx[:, None]) * (y - my[:, None])).mean(1)
    return ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))


def _reinitialise(module: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                torch.nn.init.normal_(m.bias, std=0.02)
        elif isinstance(m, torch.nn.LayerNorm):
            torch.nn.init.normal_(m.weight, mean=1.0, std=0.1)
            torch.nn.init.normal_(m.bias, std=0.02)


@dataclass
class Randomisation:
    """Per stage of the cascade (``stages``: "head", "final norm", "block 11", ...): the mean
    rank correlation and SSIM of the map with the trained model's map; ``passes`` when the
    correlation after every block is re-initialised is below RANDOMISED_MAX_CORRELATION in
    size (a map that flips sign still follows the input, not the model)."""

    stages: list[str]
    correlation: list[float]
    ssim: list[float]

    @property
    def passes(self) -> bool:
        return abs(self.correlation[-1]) < RANDOMISED_MAX_CORRELATION


def randomisation_check(model, images: torch.Tensor, method: str, target=None, seed: int = 0,
                        **options) -> Randomisation:
    """Adebayo et al. 2018's cascading model randomisation, from the head down to the first
    block, on a copy of ``model``; the maps explain the trained model's classes throughout."""
    trained = explain_map(model, images, method, target=target, **options)
    fixed = trained.target
    copy_ = copy.deepcopy(model).eval()
    stages: list[tuple[str, torch.nn.Module]] = []
    for name in ("head_dist", "head", "attn_pool", "fc_norm", "norm"):
        part = getattr(copy_, name, None)
        if isinstance(part, torch.nn.Module) and any(True for _ in part.parameters()):
            stages.append(("final norm" if name in ("norm", "fc_norm") else name, part))
    stages += [(f"block {i}", b) for i, b in reversed(list(enumerate(copy_.blocks)))]
    names, corr, sim = [], [], []
    for k, (name, part) in enumerate(stages):
        with torch.no_grad():
            _reinitialise(part, seed + k)
        m = explain_map(copy_, images, method, target=fixed, **options).map
        names.append(name)
        corr.append(rank_correlation(trained.map, m).mean().item())
        sim.append(ssim(trained.map, m).mean().item())
    return Randomisation(names, corr, sim)


@dataclass
class ClassSensitivity:
    """Mean rank correlation (and per image, (B,)) between the maps for the predicted class
    and for the least likely one; ``passes`` when below CLASS_MAX_CORRELATION."""

    correlation: torch.Tensor

    @property
    def passes(self) -> bool:
        return self.correlation.mean().item() < CLASS_MAX_CORRELATION


def class_sensitivity(model, images: torch.Tensor, method: str, **options) -> ClassSensitivity:
    """The maps of the predicted and of the least likely class, compared."""
    top = explain_map(model, images, method, **options)
    far = top.logits.argmin(-1)
    other = explain_map(model, images, method, target=far, **options)
    return ClassSensitivity(rank_correlation(top.map, other.map))


@dataclass
class Verdict:
    """Whether to trust a map: ``trusted`` when it beats TRUSTED_PERCENTILE of the random maps
    and passes both sanity checks; ``fails`` names the checks it does not pass; ``text`` says
    it in one sentence (what the explorer shows)."""

    trusted: bool
    fails: list[str]
    text: str


def verdict(percentile: float, randomisation_passes: bool, class_passes: bool) -> Verdict:
    """The one "trust this map" rule (the explorer, vitkit attention and vitkit trust read it
    from here): ``percentile`` is the map's share of random maps beaten (:func:`random_floor`,
    deletion under VERDICT_BASELINE); the other two are :class:`Randomisation` and
    :class:`ClassSensitivity`'s ``passes``."""
    fails = [name for name, ok in (("random maps", percentile >= TRUSTED_PERCENTILE),
                                   ("model randomisation", randomisation_passes),
                                   ("class sensitivity", class_passes)) if not ok]
    if not fails:
        return Verdict(True, [], "Trust it for this image.")
    return Verdict(False, fails, "Trust it less: it fails " + ", ".join(fails) + ", a check a "
                   "random or model-blind map would fail.")


# ------------------------------------------------------------------------------ the table
def score_maps(model, images: torch.Tensor, maps: torch.Tensor, target: torch.Tensor, *,
               boxes: torch.Tensor | None = None, baselines: tuple[str, ...] = BASELINES,
               n_random: int = RANDOM_MAPS, steps: int = 16, batch_size: int = 256) -> dict:
    """The scores of one method's maps (B, gh, gw) for ``target`` (B,), whoever made them: the
    mean deletion and insertion AUC under each baseline, the percentile and win rate against
    ``n_random`` random maps (deletion, most relevant first, under ``VERDICT_BASELINE``
    whichever ``baselines`` are asked for, so that the verdict means one thing), and where
    ``boxes`` (B, 4) are known the pointing game and the mass in the box."""
    row = {}
    for baseline in baselines:
        for mode in ("deletion", "insertion"):
            row[f"{mode}_{baseline}"] = auc(perturbation_curves(
                model, images, maps, target, mode=mode, baseline=baseline, steps=steps,
                batch_size=batch_size))
    floor = random_floor(model, images, maps, target, n=n_random, baseline=VERDICT_BASELINE,
                         steps=steps, batch_size=batch_size,
                         own_auc=row.get(f"deletion_{VERDICT_BASELINE}"))
    row = {k: v.mean().item() for k, v in row.items()}
    row["percentile_vs_random"] = floor.percentile.mean().item()
    row["win_rate"] = (floor.p_value <= 0.05).float().mean().item()
    if boxes is not None:
        size = tuple(images.shape[-2:])
        row["pointing"] = pointing_game(maps, boxes, size).float().mean().item()
        row["mass_in_box"] = mass_in_box(maps, boxes, size).mean().item()
    return row


def method_table(model, images: torch.Tensor, *, boxes: torch.Tensor | None = None,
                 methods: list[str] | None = None, baselines: tuple[str, ...] = BASELINES,
                 n_random: int = RANDOM_MAPS, steps: int = 16, sanity_images: int = 8,
                 batch_size: int = 256, progress=None) -> tuple[list[dict], list[str]]:
    """Every method that applies to ``model`` (or those of ``methods`` that do) on ``images``:
    one row per method with deletion and insertion AUC under each baseline, the percentile and
    win rate against ``n_random`` random maps (deletion, most relevant first, under
    ``VERDICT_BASELINE``), pointing game and mass in box where ``boxes`` (B, 4) are known, the
    randomisation and class-sensitivity verdicts (on the first ``sanity_images`` images) and
    the seconds per map. Returns (rows, methods left out with the reason)."""
    fits = applicable(model.cfg)
    asked = list(methods) if methods else list(METHODS)
    left_out = [f"{m} (does not apply to this model's readout)" for m in asked if m not in fits]
    rows = []
    for method in (m for m in asked if m in fits):
        start = time.perf_counter()
        e = explain_map(model, images, method)
        row = {"method": method,
               "seconds_per_image": (time.perf_counter() - start) / len(images)}
        row.update(score_maps(model, images, e.map, e.target, boxes=boxes, baselines=baselines,
                              n_random=n_random, steps=steps, batch_size=batch_size))
        few = images[:sanity_images]
        randomised = randomisation_check(model, few, method)
        row["randomisation"] = "pass" if randomised.passes else "fail"
        row["randomised_correlation"] = randomised.correlation[-1]
        sensitive = class_sensitivity(model, few, method)
        row["class_sensitivity"] = "pass" if sensitive.passes else "fail"
        row["class_correlation"] = sensitive.correlation.mean().item()
        row["verdict"] = "trust" if verdict(row["percentile_vs_random"], randomised.passes,
                                            sensitive.passes).trusted else "trust less"
        row.update(budget_shares(model, few, method))
        rows.append(row)
        if progress is not None:
            progress(method)
    return rows, left_out


def budget_shares(model, images: torch.Tensor, method: str) -> dict[str, float]:
    """For a relevance (LRP) method, where the explained logit goes, as mean shares of it over
    ``images``: ``budget_pixels``, ``budget_position_table``, ... (lrp.BUDGET_PARTS; they sum
    to 1). {} for the other methods."""
    budget = explain_map(model, images, method, budget=True).budget
    if budget is None:
        return {}
    logit = sum(budget.values())
    return {f"budget_{part}": (share / logit).mean().item() for part, share in budget.items()}


def _columns(rows: list[dict]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    return keys


def table_markdown(rows: list[dict]) -> str:
    """The rows of :func:`method_table` as a Markdown table (numbers to 3 places; a cell a row
    does not have is left empty)."""
    if not rows:
        return ""
    keys = _columns(rows)
    lines = ["| " + " | ".join(k.replace("_", " ") for k in keys) + " |",
             "|" + "---|" * len(keys)]
    for r in rows:
        cells = [f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k, ""))
                 for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_csv(rows: list[dict]) -> str:
    """The rows as CSV (a header, one line per method)."""
    if not rows:
        return ""
    keys = _columns(rows)
    return "\n".join([",".join(keys)] + [",".join(str(r.get(k, "")) for k in keys)
                                         for r in rows]) + "\n"
