"""``vitkit study``: the article's training claims, measured on your data.

``data`` mode (:mod:`vitkit.train.study`): (a) a ViT against ResNet-18 and a narrow ResNet-18
of about the ViT's compute as the data grows; (b) both pre-trained on a disjoint source set and
fine-tuned; (c) augmentation (a stated sweep) and distillation from the CNN; (d) fine-tuning at
twice the resolution with the position table interpolated. Nested subsets, several seeds, an
equal-epochs budget with a floor; every run is ``vitkit train``; a rerun resumes. ``patch``
mode trains one ViT per patch size (and image size) and sets accuracy against FLOPs per image.
Each writes a CSV, a Markdown report and a plot.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vitkit.checkpoints.io import atomic_write, load_model
from vitkit.errors import ConfigError
from vitkit.models.cost import flop_model
from vitkit.train.config import resolve
from vitkit.train.runlog import write_csv
from vitkit.train.study import ARMS, Study, StudyPlan, arm_label, plan_dict
from vitkit.train.trainer import train

NAME = "study"
HELP = "the article's training claims on your data: ViT vs CNN, pre-training, augmentation, 2x"
DESCRIPTION = ("--mode data: ViT vs ResNet-18 (and one of the ViT's compute) on nested subsets, "
               "pre-trained arms, DeiT-style augmentation and distillation, and fine-tuning at "
               "twice the resolution; seeds, error bars, resumable. --mode patch: one ViT per "
               "patch size, accuracy vs FLOPs.")

# The committed run: Fashion-MNIST classes 5-9 (sandal, shirt, sneaker, bag, ankle boot;
# 30,000 training images) as the target, classes 0-4 as the disjoint pre-training source.
FULL = dict(data="fashion-mnist:5-9", source="fashion-mnist:0-4",
            fractions=(0.01, 0.05, 0.2, 1.0), seeds=3, epochs=10.0, min_steps=80,
            max_steps=150, source_steps=400, resolution_steps=150)
QUICK = dict(fractions=(0.1, 0.3, 1.0), seeds=2, epochs=5.0, min_steps=60, source_steps=200,
             resolution_steps=60)


@dataclass
class StudyOptions:
    """The patch-size study's options (``--mode patch``)."""

    data: str = "digits"
    img_size: int = 16
    vit: str = "vit_micro_patch4_32"
    steps: int = 200
    batch_size: int = 64
    lr: float = 8e-3
    patch_sizes: tuple[int, ...] = (2, 4, 8)
    img_sizes: tuple[int, ...] = ()
    out: str = "runs/study"


def _check(opts: StudyOptions) -> None:
    for name in ("steps", "batch_size", "img_size"):
        if getattr(opts, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be 1 or more, got "
                              f"{getattr(opts, name)}")
    if not opts.patch_sizes or min(opts.patch_sizes) < 1:
        raise ConfigError(f"--patch-sizes must be 1 or more, got {list(opts.patch_sizes)}")


def _base(opts: StudyOptions) -> dict:
    return dict(data=opts.data, img_size=opts.img_size, model=opts.vit, steps=opts.steps,
                batch_size=opts.batch_size, lr=opts.lr, warmup_epochs=0.0, out=opts.out,
                eval_every=10**6)  # tiny subsets make many tiny epochs: evaluate at the end


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
    import vitkit
    from vitkit.commands.demo import _flops
    from vitkit.data.datasets import load_split
    from vitkit.models.cnn import create_cnn, is_cnn

    classes = len(load_split(plan.data, "val", plan.img_size,
                             root=plan.extra.get("data_root", "data")).classes)
    out = {}
    for arm in [a for a in ARMS if any(r["arm"] == a for r in rows)]:
        mine = [r for r in rows if r["arm"] == arm]
        model_name, size = mine[0]["model"], mine[0]["img_size"]
        model = create_cnn(model_name, classes, size) if is_cnn(model_name) else \
            vitkit.create_model(model_name, num_classes=classes, img_size=size,
                                distilled=arm == "vit-distilled")
        out[arm] = dict(params=sum(p.numel() for p in model.parameters()),
                        gflops=_flops(model, size) / 1e9, img_size=size,
                        seconds=statistics.fmean(r["seconds"] for r in mine))
    return out


SCRATCH = ("cnn", "cnn-small", "vit", "vit-deit", "vit-distilled")
PRETRAINED = ("vit-pretrained", "cnn-pretrained")
# one colour per model in every panel: a pre-trained arm in its from-scratch arm's colour
COLOURS = {"cnn": "#1f77b4", "cnn-small": "#17becf", "vit": "#d62728", "vit-deit": "#ff7f0e",
           "vit-distilled": "#9467bd", "vit-pretrained": "#d62728", "cnn-pretrained": "#1f77b4"}


def _cell(stats: tuple[float, float, int] | None) -> str:
    if stats is None:
        return "-"
    mean, std, n = stats
    return f"{mean:.3f} ± {std:.3f}" if n > 1 else f"{mean:.3f}"


def write_data_report(rows: list[dict], plan: StudyPlan, out: Path,
                      sweep: dict[str, float] | None = None) -> dict[str, Path]:
    """study.csv (every run), study.md (the tables and one line per claim) and study.png."""
    from vitkit.viz.plot import save, subplots

    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "study.csv", rows)
    table = summarise(rows)
    costs = arm_costs(plan, rows)
    sizes = sorted({r["images"] for r in rows if r["arm"] in SCRATCH})
    label = {arm: arm_label(arm, plan) for arm in ARMS}

    def mean(arm: str, n: int) -> float | None:
        return table.get(arm, {}).get(n, (None,))[0]

    fig, axes = subplots(1, 3, figsize=(15, 4.4), gridspec_kw=dict(width_ratios=[3, 3, 2]))
    for ax, arms, title in ((axes[0], SCRATCH, "(a), (c): from scratch"),
                            (axes[1], ("vit", "vit-pretrained", "cnn", "cnn-pretrained"),
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
    fig.suptitle(f"{plan.data} at {plan.img_size}px; budget: {plan.budget}", fontsize=9)
    fig.tight_layout()
    save(fig, out / "study.png")

    seeds = max(v[2] for arm in SCRATCH if arm in table for v in table[arm].values())
    lines = [f"# Study: {plan.data}", "",
             f"Target `{plan.data}` at {plan.img_size}px, ViT `{plan.vit}`; nested subsets; "
             f"{seeds} seeds per point (mean ± sample standard deviation); validation top-1. "
             f"Budget rule: {plan.budget}"
             + (f"; pre-training source `{plan.source}` ({plan.source_steps} steps)"
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
    lines += ["", "## (a) a CNN wins on little data, a ViT on a lot", ""]
    for cnn in ("cnn", "cnn-small"):
        both = [n for n in sizes if mean("vit", n) is not None and mean(cnn, n) is not None]
        if both:
            x = crossover(both, [mean("vit", n) for n in both], [mean(cnn, n) for n in both])
            gaps = ", ".join(f"{mean('vit', n) - mean(cnn, n):+.3f} at {n}" for n in both)
            lines.append(f"- ViT minus {label[cnn]}: {gaps}; "
                         + (f"the ViT passes it at about {x:.0f} images."
                            if x is not None else "the ViT does not pass it at these sizes."))
    lines += ["", "## (b) pre-training inverts the table", ""]
    for model in ("vit", "cnn"):
        pre = f"{model}-pretrained"
        if pre in table:
            moved = ", ".join(f"{mean(pre, n) - mean(model, n):+.3f} at {n}" for n in sizes
                              if mean(pre, n) is not None and mean(model, n) is not None)
            lines.append(f"- pre-training moved {label[model]} by {moved}.")
    if "vit-pretrained" in table:
        beats = [n for n in sizes if mean("vit-pretrained", n) is not None
                 and mean("cnn", n) is not None and mean("vit-pretrained", n) > mean("cnn", n)]
        lines.append("- the pre-trained ViT beats ResNet-18 from scratch at "
                     + (", ".join(map(str, beats)) + " images." if beats else "no size here."))
    lines += ["", "## (c) augmentation and distillation close the gap", ""]
    if sweep:
        lines.append("- augmentation sweep at the largest subset, seed 0 (levels in "
                     "`vitkit.train.study.AUGMENTATION`): " + ", ".join(
                         f"{k} {v:.3f}" for k, v in sweep.items())
                     + f"; the augmented arm uses {max(sweep, key=sweep.get)}.")
    for arm in ("vit-deit", "vit-distilled"):
        if arm in table:
            lines.append(f"- {label[arm]} minus the plain ViT: " + ", ".join(
                f"{mean(arm, n) - mean('vit', n):+.3f} at {n}" for n in sizes
                if mean(arm, n) is not None and mean("vit", n) is not None) + ".")
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


def run_patch_study(opts: StudyOptions, say: Callable[[str], None] = print) -> list[dict]:
    """One ViT per (patch size, image size) on the full data, same steps: accuracy vs FLOPs."""
    _check(opts)
    rows = []
    for img in opts.img_sizes or (opts.img_size,):
        for patch in opts.patch_sizes:
            if img % patch:
                say(f"skipping patch {patch} at {img}px: {img} is not a multiple of {patch}")
                continue
            name = f"patch{patch}-img{img}"
            start = time.perf_counter()
            result = train(resolve({**_base(opts), "img_size": img, "patch_size": patch,
                                    "name": name}))
            model = load_model(result.run_dir / "last.safetensors", verbose=False)
            cost = flop_model(model.cfg)
            rows.append(dict(patch=patch, img_size=img, tokens=cost.tokens,
                             gflops=round(cost.flops / 1e9, 4),
                             top1=result.history[-1]["val_top1"],
                             seconds=round(time.perf_counter() - start, 1)))
            say(f"patch {patch} at {img}px: {cost.tokens} tokens, {cost.flops / 1e9:.3f} "
                f"GFLOPs, top-1 {rows[-1]['top1']:.4f}")
    return rows


def write_patch_report(rows: list[dict], opts: StudyOptions, out: Path) -> dict[str, Path]:
    from vitkit.viz.plot import save, subplots

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
    ax.set_title(f"patch size against cost: {opts.data}, {opts.steps} steps", fontsize=9)
    fig.tight_layout()
    save(fig, out / "patch_study.png")
    lines = ["# Patch-size study", "", "| patch | image | tokens | GFLOPs | top-1 | time |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['patch']} | {r['img_size']} | {r['tokens']} | {r['gflops']} | "
              f"{r['top1']:.3f} | {r['seconds']} s |" for r in rows]
    lines += ["", "![accuracy against FLOPs](patch_study.png)", ""]
    atomic_write(out / "patch_study.md", lambda tmp: tmp.write_text("\n".join(lines)))
    return {"csv": out / "patch_study.csv", "md": out / "patch_study.md",
            "png": out / "patch_study.png"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=["data", "patch"], default="data")
    p.add_argument("--full", action="store_true",
                   help="the committed run: Fashion-MNIST 5-9 as target, 0-4 as source, 3 seeds "
                        "(about 40 minutes on 2 cores)")
    p.add_argument("--data", default=None,
                   help="target data spec as for train --data (default digits)")
    p.add_argument("--data-root", default=None, help="where Fashion-MNIST/MNIST/CIFAR are")
    p.add_argument("--source", default=None,
                   help="pre-training data for claim (b), disjoint from the target (default: "
                        "fashion-mnist when it is installed, for the digits; 'none' skips (b))")
    p.add_argument("--img-size", type=int, default=None, help="default 16")
    p.add_argument("--vit", default=None, help="default vit_micro_patch4_32")
    p.add_argument("--cnn", default=None, help="the CNN baseline and teacher (default resnet18)")
    p.add_argument("--cnn-small", default=None,
                   help="a CNN of about the ViT's compute (default resnet18_w24)")
    p.add_argument("--fractions", type=float, nargs="+", default=None,
                   help="shares of the training split (default 0.1 0.3 1.0)")
    p.add_argument("--seeds", type=int, default=None, help="repeats per point (default 2)")
    p.add_argument("--epochs", type=float, default=None,
                   help="budget: epochs of each subset (default 5)")
    p.add_argument("--min-steps", type=int, default=None,
                   help="budget floor in optimizer steps (default 60)")
    p.add_argument("--max-steps", type=int, default=None, help="budget cap (default none)")
    p.add_argument("--warmup", type=float, default=None,
                   help="share of every run's steps spent in linear warmup (default 0.1)")
    p.add_argument("--source-steps", type=int, default=None,
                   help="pre-training steps on the source (default 200)")
    p.add_argument("--resolution-steps", type=int, default=None,
                   help="claim (d): fine-tuning steps at twice the size (default 60)")
    p.add_argument("--no-resolution", action="store_true", help="skip claim (d)")
    p.add_argument("--augmentation", choices=["sweep", "light", "heavy"], default=None,
                   help="the augmented arm's level (default: sweep light and heavy)")
    p.add_argument("--steps", type=int, default=None, help="patch mode: steps per run (200)")
    p.add_argument("--batch-size", type=int, default=None, help="default 64")
    p.add_argument("--lr", type=float, default=None, help="at batch 512 (default 8e-3)")
    p.add_argument("--device", default=None, help="auto (default), cpu or cuda")
    p.add_argument("--patch-sizes", type=int, nargs="+", default=None,
                   help="patch mode (default 2 4 8)")
    p.add_argument("--img-sizes", type=int, nargs="+", default=None,
                   help="patch mode: image sizes to sweep as well")
    p.add_argument("--out", default=None,
                   help="default runs/study; run again with the same --out to resume")
    p.add_argument("--keep-checkpoints", action="store_true", default=None,
                   help="keep every run's weights (default: only while a later run needs them)")


def _default_source(data: str) -> str | None:
    """Fashion-MNIST for the digits when its files are installed (a disjoint source)."""
    if not data.startswith("digits"):
        return None
    from vitkit.data.idx import find_idx_folder

    try:
        find_idx_folder("fashion-mnist", "data")
    except ValueError:
        return None
    return "fashion-mnist"


def plan_from(args: argparse.Namespace) -> StudyPlan:
    chosen = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
              if v is not None and k in StudyPlan.__dataclass_fields__}
    preset = FULL if args.full else QUICK
    values = {**preset, **chosen}
    if args.data_root:
        values["extra"] = {"data_root": args.data_root}
    if args.no_resolution:
        values["resolution"] = False
    if values.get("source") == "none":
        values["source"] = None
    elif "source" not in values:
        values["source"] = _default_source(values.get("data", "digits"))
    return StudyPlan(**values)


def run(args: argparse.Namespace) -> None:
    if args.mode == "data":
        plan = plan_from(args)
        study = Study(plan)
        out = Path(plan.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "plan.json",
                     lambda tmp: tmp.write_text(json.dumps(plan_dict(plan), indent=2)))
        rows = study.run()
        files = write_data_report(rows, plan, out, getattr(study, "sweep_scores", None))
    else:
        chosen = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
                  if v is not None and k in StudyOptions.__dataclass_fields__}
        opts = StudyOptions(**chosen)
        files = write_patch_report(run_patch_study(opts), opts, Path(opts.out))
    print("wrote " + ", ".join(str(p) for p in files.values()))
