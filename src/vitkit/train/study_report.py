"""The study's statistics, reports and plots: mean and sample standard deviation over seeds,
the ViT/CNN crossover, the costs of every arm, ``study.md``/``study.csv``/``study.png`` for the
data study and ``patch_study.*`` for the patch-size study."""

from __future__ import annotations

import json
import math
import statistics
import textwrap
from pathlib import Path

from vitkit.data.datasets import load_split
from vitkit.models.cnn import create_cnn, is_cnn
from vitkit.models.cost import flops_per_image
from vitkit.models.registry import create_model
from vitkit.train.patch_study import PatchStudyOptions
from vitkit.train.runlog import write_csv
from vitkit.train.study import ARMS, Study, StudyPlan, arm_label, plan_dict, run_workers
from vitkit.util.files import atomic_write
from vitkit.viz.plot import save, subplots


def crossover(sizes: list[int], vit: list[float], cnn: list[float]) -> float | None:
    """The training-set size where the ViT curve first rises above the CNN's (linear in
    log-size between the two points that bracket it), or None if it never does."""
    for i in range(1, len(sizes)):
        d0, d1 = vit[i - 1] - cnn[i - 1], vit[i] - cnn[i]
        if d0 < 0 <= d1:
            lo, hi = math.log(sizes[i - 1]), math.log(sizes[i])
            return math.exp(lo + (-d0 / (d1 - d0)) * (hi - lo))
    return None


def summarise(rows: list[dict]) -> dict[str, dict[int, tuple[float, float, int]]]:
    """arm -> training images -> (mean top-1, sample standard deviation over seeds, seeds)."""
    out: dict[str, dict[int, tuple[float, float, int]]] = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        per: dict[int, list[float]] = {}
        for r in rows:
            if r["arm"] == arm:
                per.setdefault(r["images"], []).append(r["top1"])
        out[arm] = {n: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0,
                        len(v)) for n, v in sorted(per.items())}
    return out


def arm_costs(plan: StudyPlan, rows: list[dict]) -> dict[str, dict]:
    """Parameters, GFLOPs per image and mean seconds per run of every arm that ran."""
    classes = len(load_split(plan.data, "val", plan.img_size,
                             root=plan.extra.get("data_root", "data")).classes)
    out = {}
    for arm in [a for a in ARMS if any(r["arm"] == a for r in rows)]:
        mine = [r for r in rows if r["arm"] == arm]
        model_name, size = mine[0]["model"], mine[0]["img_size"]
        model = create_cnn(model_name, classes, size) if is_cnn(model_name) else \
            create_model(model_name, num_classes=classes, img_size=size,
                                distilled=arm in ("vit-distilled", "vit-soft"))
        out[arm] = dict(params=sum(p.numel() for p in model.parameters()),
                        gflops=flops_per_image(model, size) / 1e9, img_size=size,
                        seconds=statistics.fmean(r["seconds"] for r in mine))
    return out


SCRATCH = ("cnn", "cnn-small", "vit", "vit-deit", "vit-distilled", "vit-soft")
PRETRAINED = ("vit-pretrained", "cnn-pretrained")
# one colour per model in every panel: a pre-trained arm in its from-scratch arm's colour
COLOURS = {"cnn": "#1f77b4", "cnn-small": "#17becf", "vit": "#d62728", "vit-deit": "#ff7f0e",
           "vit-distilled": "#9467bd", "vit-soft": "#e377c2", "vit-pretrained": "#d62728",
           "cnn-pretrained": "#1f77b4"}


def convergence(rows: list[dict]) -> dict[str, dict[int, str]]:
    """arm -> training images -> 'mean epochs (how many stopped on patience / ran to the
    maximum)', for the runs of a converge budget (rows with ``stopped``)."""
    out: dict[str, dict[int, str]] = {}
    for r in rows:
        if "stopped" in r:
            out.setdefault(r["arm"], {}).setdefault(r["images"], []).append(r)
    for per in out.values():
        for n, runs in per.items():
            early = sum(r["stopped"] == "patience" for r in runs)
            mean, cap = statistics.fmean(r["epochs"] for r in runs), runs[0]["max_epochs"]
            how = ("all on patience" if early == len(runs) else
                   f"all at the maximum of {cap}" if early == 0 else
                   f"{early} on patience, {len(runs) - early} at the maximum of {cap}")
            per[n] = f"{mean:.0f} ({how})"
    return out


def gap(rows: list[dict], arm: str) -> dict[int, tuple[float, float, int]]:
    """Training images -> the train minus validation top-1 of ``arm``'s best checkpoints
    (mean, sample standard deviation, runs): how far the arm overfits."""
    per: dict[int, list[float]] = {}
    for r in rows:
        if r["arm"] == arm and "train_top1" in r:
            per.setdefault(r["images"], []).append(r["train_top1"] - r["top1"])
    return {n: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v))
            for n, v in sorted(per.items())}


def difference(a: tuple[float, float, int], b: tuple[float, float, int]) -> str:
    """Mean of a minus mean of b, ± the standard error of that difference where both have
    more than one seed ((mean, sample standard deviation, seeds) as `summarise` gives)."""
    text = f"{a[0] - b[0]:+.3f}"
    if a[2] > 1 and b[2] > 1:
        text += f" ± {math.sqrt(a[1] ** 2 / a[2] + b[1] ** 2 / b[2]):.3f}"
    return text


def _cell(stats: tuple[float, float, int] | None) -> str:
    if stats is None:
        return "-"
    mean, std, n = stats
    return f"{mean:.3f} ± {std:.3f}" if n > 1 else f"{mean:.3f}"


def write_data_report(rows: list[dict], plan: StudyPlan, out: Path,
                      sweep: dict[str, float] | None = None) -> dict[str, Path]:
    """study.csv (every run), study.md (the tables and one line per claim) and study.png."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "study.csv", rows)
    table = summarise(rows)
    costs = arm_costs(plan, rows)
    sizes = sorted({r["images"] for r in rows if r["arm"] in SCRATCH})
    label = {arm: arm_label(arm, plan) for arm in ARMS}

    def mean(arm: str, n: int) -> float | None:
        return table.get(arm, {}).get(n, (None,))[0]

    def minus(arm: str, other: str) -> str:
        """arm minus other at every size both have, each ± its standard error."""
        return ", ".join(f"{difference(table[arm][n], table[other][n])} at {n}" for n in sizes
                         if mean(arm, n) is not None and mean(other, n) is not None)

    fig, axes = subplots(1, 3, figsize=(15, 4.4), gridspec_kw=dict(width_ratios=[3, 3, 2]))
    for ax, arms, title in ((axes[0], SCRATCH, "(a), (c): from scratch"),
                            (axes[1], ("vit", "vit-pretrained", plan.pretrained_cnn,
                                       "cnn-pretrained"),
                             "(b): pre-trained on the source, then fine-tuned")):
        for arm in arms:
            if arm not in table:
                continue
            xs = [n for n in table[arm] if n in sizes]
            ax.errorbar(xs, [table[arm][n][0] for n in xs], yerr=[table[arm][n][1] for n in xs],
                        marker="o", capsize=3, label=label[arm], color=COLOURS[arm],
                        linestyle="--" if arm.endswith("pretrained") else "-")
        ax.set_xscale("log")
        ax.set_xlabel("training images (log scale)")
        ax.set_ylabel("validation top-1 (mean ± std over seeds)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="best")
    res = [a for a in ("vit", "res-low", "res-2x", "res-naive") if a in table]
    if res[1:]:
        full = max(sizes)
        vals = [table[a][full if a == "vit" else max(table[a])] for a in res]
        low, high = f"{plan.img_size}px", f"{2 * plan.img_size}px"
        names = {"vit": low, "res-low": f"{low}\n+ steps", "res-2x": f"{high}\nfine-tuned",
                 "res-naive": f"{high}\nnot tuned"}
        axes[2].bar(range(len(res)), [v[0] for v in vals], yerr=[v[1] for v in vals],
                    capsize=3, color=["#777", "#999", "#2962ff", "#d50000"][:len(res)])
        axes[2].set_xticks(range(len(res)), [names[a] for a in res], fontsize=7)
        axes[2].set_ylim(0, 1)
        axes[2].set_ylabel("validation top-1")
        axes[2].set_title(f"(d): twice the resolution, {full} images\n(the {high} runs use "
                          "the interpolated table)", fontsize=9)
    else:
        axes[2].set_axis_off()
    # the converge budget's rule is a sentence: wrapped, so no part of it falls off the figure
    fig.suptitle(textwrap.fill(f"{plan.data} at {plan.img_size}px; budget: {plan.rule}", 190),
                 fontsize=9)
    fig.tight_layout()
    save(fig, out / "study.png")

    seeds = max(v[2] for arm in SCRATCH if arm in table for v in table[arm].values())
    lines = [f"# Study: {plan.data}", "",
             f"Target `{plan.data}` at {plan.img_size}px, ViT `{plan.vit}`; nested subsets; "
             f"{seeds} seeds per point (mean ± sample standard deviation; a difference of "
             "means ± its standard error); validation top-1. "
             f"Budget rule: {plan.rule}"
             + (f"; pre-training source `{plan.source}`" + (
                 "" if plan.converging else f" ({plan.source_steps} steps)")
                if plan.source else "") + ".", "",
             "| arm | " + " | ".join(f"{n} images" for n in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for arm in (*SCRATCH, *PRETRAINED):
        if arm in table:
            lines.append(f"| {label[arm]} | "
                         + " | ".join(_cell(table[arm].get(n)) for n in sizes) + " |")
    lines += ["", "| arm | parameters | GFLOPs / image | mean time per run |", "|---|---|---|---|"]
    for arm, c in costs.items():
        lines.append(f"| {label.get(arm, arm)} | {c['params']:,} | {c['gflops']:.4f} "
                     f"({c['img_size']}px) | {c['seconds']:.0f} s |")
    epochs = convergence(rows)
    if epochs:
        lines += ["", "Epochs trained (mean over seeds; how each run stopped):", "",
                  "| arm | " + " | ".join(f"{n} images" for n in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        for arm in [a for a in (*SCRATCH, *PRETRAINED) if a in epochs]:
            lines.append(f"| {label[arm]} | "
                         + " | ".join(epochs[arm].get(n, "-") for n in sizes) + " |")
        lines += [""] + [f"- {label[arm]}: {text} epochs on {n} images"
                         for arm in ("source-vit", "source-cnn", "sweep-light", "sweep-heavy",
                                     "res-low", "res-2x")
                         if arm in epochs for n, text in epochs[arm].items()]
        overfit = gap(rows, "vit")
        if overfit:
            lines.append("- the plain ViT's train minus validation top-1 at its best epoch: "
                         + ", ".join(f"{_cell(v)} at {n}" for n, v in overfit.items()) + ".")
    lines += ["", "## (a) a CNN wins on little data, a ViT on a lot", ""]
    for cnn in ("cnn", "cnn-small"):
        both = [n for n in sizes if mean("vit", n) is not None and mean(cnn, n) is not None]
        if both:
            x = crossover(both, [mean("vit", n) for n in both], [mean(cnn, n) for n in both])
            lines.append(f"- ViT minus {label[cnn]}: {minus('vit', cnn)}; "
                         + (f"the ViT passes it at about {x:.0f} images."
                            if x is not None else "the ViT does not pass it at these sizes."))
    lines += ["", "## (b) pre-training inverts the table", ""]
    scratch_cnn = plan.pretrained_cnn  # the from-scratch arm of the pre-trained CNN
    for model, pre in (("vit", "vit-pretrained"), (scratch_cnn, "cnn-pretrained")):
        if pre in table:
            lines.append(f"- pre-training moved {label[model]} by {minus(pre, model)}.")
    for cnn in ("cnn", "cnn-small") if "vit-pretrained" in table else ():
        both = [n for n in sizes if mean("vit-pretrained", n) is not None
                and mean(cnn, n) is not None]
        beats = [n for n in both if mean("vit-pretrained", n) > mean(cnn, n)]
        if both:
            lines.append(f"- the pre-trained ViT beats {label[cnn]} from scratch at "
                         + (", ".join(map(str, beats)) + " images" if beats else "no size")
                         + f" of {', '.join(map(str, both))}.")
    lines += ["", "## (c) augmentation and distillation close the gap", ""]
    if sweep:
        lines.append("- augmentation sweep at the largest subset, seed 0, "
                     + ("held-out top-1 " if plan.converging else "")
                     + "(levels in "
                     "`vitkit.train.study.AUGMENTATION`): " + ", ".join(
                         f"{k} {v:.3f}" for k, v in sweep.items())
                     + f"; the augmented arm uses {max(sweep, key=sweep.get)}.")
    for arm in ("vit-deit", "vit-distilled", "vit-soft"):
        if arm in table:
            lines.append(f"- {label[arm]} minus the plain ViT: {minus(arm, 'vit')}.")
    if res[1:]:
        lines += ["", "## (d) fine-tuning at twice the resolution", "",
                  "| | top-1 |", "|---|---|"]
        full = max(sizes)
        for a in res:
            stats = table[a][full if a == "vit" else max(table[a])]
            lines.append(f"| {label.get(a, a) if a != 'vit' else 'ViT at the low size'} "
                         f"| {_cell(stats)} |")
        lines.append("")
        lines.append(f"The naive resize that leaves the table alone is refused by the model "
                     f"(a {plan.img_size}px position table cannot take a "
                     f"{2 * plan.img_size}px grid); the last row is the table interpolated "
                     "(bicubic) without any fine-tuning.")
    lines += ["", "![the study](study.png)", ""]
    atomic_write(out / "study.md", lambda tmp: tmp.write_text("\n".join(lines)))
    return {"csv": out / "study.csv", "md": out / "study.md", "png": out / "study.png"}


def run_data_study(plan: StudyPlan, workers: int = 1) -> dict[str, Path]:
    """Run the data study's plan (resuming what ``plan.out`` holds) on ``workers`` processes,
    then write its report; the files written."""
    study = Study(plan)
    out = Path(plan.out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(plan_dict(plan), indent=2)
    atomic_write(out / "plan.json", lambda tmp: tmp.write_text(text))
    study = run_workers(plan, workers) if workers != 1 else study  # it checks < 1
    rows = study.rows if workers != 1 else study.run()
    return write_data_report(rows, plan, out, study.sweep_scores)


def write_patch_report(rows: list[dict], opts: PatchStudyOptions, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "patch_study.csv", rows)
    fig, ax = subplots(figsize=(6, 4))
    ax.plot([r["gflops"] for r in rows], [r["top1"] for r in rows], "o-")
    for r in rows:
        ax.annotate(f"P={r['patch']}, {r['img_size']}px", (r["gflops"], r["top1"]),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("GFLOPs per image (log scale)")
    ax.set_ylabel("validation top-1")
    budget = (f"to convergence (patience {opts.patience}, at most {opts.max_epochs} epochs)"
              if opts.budget == "converge" else f"{opts.steps} steps")
    ax.set_title(f"patch size against cost: {opts.data}, {budget}", fontsize=9)
    fig.tight_layout()
    save(fig, out / "patch_study.png")
    converged = any("stopped" in r for r in rows)
    lines = ["# Patch-size study", "", "| patch | image | tokens | GFLOPs | top-1 | time |"
             + (" epochs |" if converged else ""), "|---|---|---|---|---|---|"
             + ("---|" if converged else "")]
    lines += [f"| {r['patch']} | {r['img_size']} | {r['tokens']} | {r['gflops']} | "
              f"{r['top1']:.3f} | {r['seconds']} s |"
              + (f" {r['epochs']} ({r['stopped']}) |" if converged else "") for r in rows]
    lines += ["", "![accuracy against FLOPs](patch_study.png)", ""]
    atomic_write(out / "patch_study.md", lambda tmp: tmp.write_text("\n".join(lines)))
    return {"csv": out / "patch_study.csv", "md": out / "patch_study.md",
            "png": out / "patch_study.png"}
