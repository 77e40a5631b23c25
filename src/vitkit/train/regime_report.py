"""The regime study's report: ``study_regime.{csv,md,png}`` (:mod:`vitkit.train.regime_study`).

Every comparison is paired by seed: the two arms of a seed share its subset, so the difference
is taken per seed, then its mean and standard error (sample standard deviation / sqrt(seeds)).
A claim *holds* when its difference is more than two standard errors on its side of zero,
*does not hold* when it is more than two on the other side, and is *not settled* between.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from vitkit.data.datasets import load_split
from vitkit.train.regime_study import RegimePlan, RegimeStudy, arm_label
from vitkit.train.runlog import write_csv
from vitkit.train.study import plan_dict, run_workers
from vitkit.util.files import atomic_write
from vitkit.viz.plot import save, subplots

Stats = tuple[float, float, int]  # mean, standard error, seeds


def run_regime(plan: RegimePlan, workers: int = 1) -> dict[str, Path]:
    """Run the plan (resuming what ``plan.out`` holds) on ``workers`` processes, then write
    its report; the files written."""
    plan.check()
    out = Path(plan.out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(plan_dict(plan), indent=2)
    atomic_write(out / "plan.json", lambda tmp: tmp.write_text(text))
    if workers != 1:
        rows = run_workers(plan, workers, study=RegimeStudy,
                           module="vitkit.train.regime_study").rows
    else:
        rows = RegimeStudy(plan).run()
    source = len(load_split(plan.source, "train", plan.img_size,
                            root=plan.extra.get("data_root", "data")))
    return write_regime_report(rows, plan, out, source)


def _stats(values: list[float]) -> Stats | None:
    if not values:
        return None
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return statistics.fmean(values), se, len(values)


def scores(rows: list[dict], arm: str, size: int | None = None) -> dict[int, float]:
    """seed -> top-1 of ``arm`` (at ``size`` target images, for claims (a)-(c))."""
    return {r["seed"]: r["top1"] for r in rows if r["arm"] == arm and (
        size is None or r.get("target") == size)}


def paired(rows: list[dict], a: str, b: str, size: int | None = None) -> Stats | None:
    """Mean and standard error over seeds of top-1(a) - top-1(b)."""
    sa, sb = scores(rows, a, size), scores(rows, b, size)
    return _stats([sa[s] - sb[s] for s in sorted(sa.keys() & sb.keys())])


def gain_difference(rows: list[dict], size: int) -> Stats | None:
    """(ViT pre-trained - ViT) - (CNN pre-trained - CNN), per seed: the claim's mechanism."""
    arms = ("vit-pretrained", "vit", "cnn-pretrained", "cnn")
    per = [scores(rows, a, size) for a in arms]
    seeds = sorted(set.intersection(*(set(p) for p in per)))
    return _stats([(per[0][s] - per[1][s]) - (per[2][s] - per[3][s]) for s in seeds])


def verdict(stats: Stats | None) -> str:
    if stats is None or math.isnan(stats[1]):
        return "not measured" if stats is None else "one seed: not settled"
    mean, se, _ = stats
    if mean > 2 * se:
        return "holds"
    if mean < -2 * se:
        return "does not hold"
    return "not settled"


def cell(stats: Stats | None) -> str:
    if stats is None:
        return "-"
    mean, se, n = stats
    return f"{mean:+.3f} ± {se:.3f}" if not math.isnan(se) else f"{mean:+.3f} (1 seed)"


def level(rows: list[dict], arm: str, size: int | None = None) -> str:
    stats = _stats(list(scores(rows, arm, size).values()))
    if stats is None:
        return "-"
    mean, se, n = stats
    return f"{mean:.3f} ± {se:.3f}" if n > 1 else f"{mean:.3f}"


def write_regime_report(rows: list[dict], plan: RegimePlan, out: Path,
                        source_images: int | None = None) -> dict[str, Path]:
    """Write study_regime.csv, .md and .png into ``out``; ``source_images``: the labelled
    source's size (for the ratios)."""
    out.mkdir(parents=True, exist_ok=True)
    for r in rows:  # the target size of each (a)-(c) row: its images
        if not r["arm"].startswith(("source-", "res-")):
            r["target"] = r["images"]
    write_csv(out / "study_regime.csv", rows)
    sizes = sorted(plan.target_images)
    lines = ["# Claims (b) and (d) in their regime", "",
             f"Target: {plan.data}, {', '.join(map(str, sizes))} training images, evaluated "
             f"on its validation split (for Fashion-MNIST: the test set); labelled source: "
             f"{plan.source}" + (f" ({source_images:,} images, "
                                 + ", ".join(f"{source_images / n:.0f}x" for n in sizes)
                                 + " the target)" if source_images else "")
             + f"; unlabelled sources: {plan.mae_source} and {plan.mae_all}. "
             f"{plan.seeds} seeds; mean ± standard error over seeds; differences paired by "
             f"seed. Every run: {plan.rule}; patience followed by {plan.anneal_epochs} epochs "
             "of annealing to the floor.", ""]
    arms = ["vit", "vit-pretrained", "vit-mae", "vit-mae-all", "cnn", "cnn-pretrained",
            "vit-deit", "vit-distilled"]
    lines += ["## Top-1 by arm", "", "| arm | " + " | ".join(f"{n} images" for n in sizes) + " |",
              "|---|" + "---|" * len(sizes)]
    lines += [f"| {arm_label(a, plan)} | " + " | ".join(level(rows, a, n) for n in sizes) + " |"
              for a in arms]
    claims = []
    for n in sizes:
        claims += [
            (f"(a) {n} images: the CNN beats the ViT from scratch", paired(rows, "cnn", "vit", n)),
            (f"(b) {n} images: supervised pre-training helps the ViT",
             paired(rows, "vit-pretrained", "vit", n)),
            (f"(b) {n} images: MAE on the source helps the ViT", paired(rows, "vit-mae", "vit", n)),
            (f"(b) {n} images: in-domain MAE helps the ViT",
             paired(rows, "vit-mae-all", "vit", n)),
            (f"(b) {n} images: supervised pre-training helps the CNN",
             paired(rows, "cnn-pretrained", "cnn", n)),
            (f"(b) {n} images: pre-training helps the ViT more than the CNN (the mechanism)",
             gain_difference(rows, n)),
            (f"(b) {n} images: the fine-tuned ViT beats the fine-tuned CNN",
             paired(rows, "vit-pretrained", "cnn-pretrained", n)),
            (f"(b) {n} images: the ViT fine-tuned from in-domain MAE beats the fine-tuned CNN",
             paired(rows, "vit-mae-all", "cnn-pretrained", n)),
            (f"(c) {n} images: light augmentation helps the ViT",
             paired(rows, "vit-deit", "vit", n)),
            (f"(c) {n} images: distillation from the CNN helps the ViT",
             paired(rows, "vit-distilled", "vit", n)),
        ]
    high, low = plan.high_size, plan.low_size
    claims += [
        (f"(d) fine-tuning at {high} px beats as many epochs at {low} px",
         paired(rows, "res-ft-high", "res-ft-low")),
        (f"(d) {low} px then {high} px beats {high} px from scratch at equal compute",
         paired(rows, "res-ft-high", "res-scratch-high")),
        (f"(d) the {low} px model loses top-1 when run at {high} px without fine-tuning",
         paired(rows, "res-low", "res-naive")),
    ]
    lines += ["", "## The claims", "", "| claim | difference in top-1 | verdict |", "|---|---|---|"]
    lines += [f"| {text} | {cell(stats)} | {verdict(stats)} |" for text, stats in claims]
    res = ["res-low", "res-ft-low", "res-ft-high", "res-scratch-high", "res-naive"]
    lines += ["", f"## Claim (d): {low} px -> {high} px on {plan.resolution_images:,} images", "",
              "| arm | top-1 | epochs |", "|---|---|---|"]
    for a in res:
        mine = [r for r in rows if r["arm"] == a]
        epochs = sorted({r.get("epochs", 0) for r in mine})
        lines.append(f"| {arm_label(a, plan)} | {level(rows, a)} | "
                     f"{', '.join(map(str, epochs)) if mine else '-'} |")
    lines += ["", "![top-1 by arm](study_regime.png)", ""]
    atomic_write(out / "study_regime.md", lambda tmp: tmp.write_text("\n".join(lines)))
    _plot(rows, plan, sizes, arms, res, out / "study_regime.png")
    return {"csv": out / "study_regime.csv", "md": out / "study_regime.md",
            "png": out / "study_regime.png"}


def _plot(rows, plan, sizes, arms, res, path: Path) -> None:
    fig, (left, right) = subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(arms)
    for i, a in enumerate(arms):
        means, errs = [], []
        for n in sizes:
            stats = _stats(list(scores(rows, a, n).values()))
            means.append(stats[0] if stats else math.nan)
            errs.append(stats[1] if stats and not math.isnan(stats[1]) else 0.0)
        xs = [j + (i - len(arms) / 2 + 0.5) * width for j in range(len(sizes))]
        left.bar(xs, means, width, yerr=errs, label=arm_label(a, plan), capsize=2)
    left.set_xticks(range(len(sizes)), [f"{n} images" for n in sizes])
    left.set_ylabel("top-1 on the test split")
    left.set_title("(a)-(c) at the target sizes", fontsize=9)
    left.legend(fontsize=6, loc="lower right")
    stats = [_stats(list(scores(rows, a).values())) for a in res]
    right.bar(range(len(res)), [s[0] if s else math.nan for s in stats],
              yerr=[s[1] if s and not math.isnan(s[1]) else 0.0 for s in stats], capsize=3)
    right.set_xticks(range(len(res)), [arm_label(a, plan).replace(", ", ",\n") for a in res],
                     fontsize=6)
    right.set_title(f"(d) {plan.low_size} px -> {plan.high_size} px", fontsize=9)
    fig.tight_layout()
    save(fig, path)
