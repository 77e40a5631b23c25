"""``vitkit study``: when does a ViT beat a CNN as the data grows?

``data`` mode trains, on nested subsets of the training split (a smaller subset is always
inside a larger one) and with the same budget in optimizer steps at every size: a ViT trained
plainly, a ViT with the DeiT augmentations, a ViT distilled from the CNN trained on the same
subset, and the CNN. ``patch`` mode trains one ViT per patch size (and image size) and sets
accuracy against FLOPs per image. Each writes a CSV, a Markdown table and a plot.
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
from vitkit.train.trainer import train

NAME = "study"
HELP = "when does a ViT beat a CNN? accuracy against data size or patch size"
DESCRIPTION = ("--mode data: a plain ViT, a ViT with DeiT augmentation, a ViT distilled from the "
               "CNN, and the CNN, on nested subsets with the same step budget. --mode patch: one "
               "ViT per patch size (and image size), accuracy vs FLOPs.")

# name -> (label, options on top of the study's base options)
ARMS: dict[str, tuple[str, dict]] = {
    "cnn": ("ResNet-18", dict(model="resnet18")),
    "vit": ("ViT (plain)", dict()),
    "vit-deit": ("ViT + DeiT augmentation", dict(
        crop_scale=0.35, randaugment=9, mixup=0.8, cutmix=1.0, random_erasing=0.25,
        label_smoothing=0.1, drop_path=0.1)),
    "vit-distilled": ("ViT distilled from the CNN", dict(distill="hard")),
}


@dataclass
class StudyOptions:
    data: str = "digits"
    img_size: int = 16
    vit: str = "vit_micro_patch4_32"
    fractions: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0)
    steps: int = 200
    batch_size: int = 64
    lr: float = 8e-3
    seeds: int = 1
    patch_sizes: tuple[int, ...] = (2, 4, 8)
    img_sizes: tuple[int, ...] = ()
    out: str = "runs/study"
    keep_checkpoints: bool = False  # keep every run's weights (default: only what later arms need)


def _check(opts: StudyOptions) -> None:
    """Refuse options that would train nothing, before anything runs."""
    for name in ("seeds", "steps", "batch_size", "img_size"):
        if getattr(opts, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be 1 or more, got "
                              f"{getattr(opts, name)}")
    if not opts.fractions or not all(0 < f <= 1 for f in opts.fractions):
        raise ConfigError(f"--fractions must be shares in (0, 1], got {list(opts.fractions)}")
    if not opts.patch_sizes or min(opts.patch_sizes) < 1:
        raise ConfigError(f"--patch-sizes must be 1 or more, got {list(opts.patch_sizes)}")


def _base(opts: StudyOptions) -> dict:
    return dict(data=opts.data, img_size=opts.img_size, model=opts.vit, steps=opts.steps,
                batch_size=opts.batch_size, lr=opts.lr, warmup_epochs=0.0, out=opts.out,
                eval_every=10**6)  # tiny subsets make many tiny epochs: evaluate at the end


WEIGHTS = ("best.safetensors", "last.safetensors", "state.pt")


def _drop_weights(run_dir: Path) -> None:
    """Remove a finished run's weights and resume state; its config, log and metrics stay."""
    for name in WEIGHTS:
        (run_dir / name).unlink(missing_ok=True)


def _finished(out: Path, name: str) -> dict | None:
    """The row a finished run left in ``out/results``, or None."""
    path = out / "results" / f"{name}.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a damaged record: run it again


def _record(out: Path, name: str, row: dict) -> None:
    (out / "results").mkdir(parents=True, exist_ok=True)
    atomic_write(out / "results" / f"{name}.json", lambda tmp: tmp.write_text(json.dumps(row)))


def _clock(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def run_data_study(opts: StudyOptions, say: Callable[[str], None] = print) -> list[dict]:
    """Every arm at every fraction and seed; the CNN first, as the distilled ViT's teacher.

    Each finished run leaves its row in ``out/results/NAME.json``: run again, the study skips
    what is done (a crash loses at most the run in progress). Weights are kept only while a
    later arm needs them (the CNN until its distilled ViT has trained) unless
    ``keep_checkpoints``; every run keeps its config, log and metrics.
    """
    _check(opts)
    out = Path(opts.out)
    plan = [(seed, fraction, arm) for seed in range(opts.seeds) for fraction in opts.fractions
            for arm in ("cnn", "vit", "vit-deit", "vit-distilled")]
    rows, spent, trained, start_all = [], 0.0, 0, time.perf_counter()
    teacher: Path | None = None
    for k, (seed, fraction, arm) in enumerate(plan, 1):
        label, extra = ARMS[arm]
        name = f"{arm}-f{fraction:g}-s{seed}"
        done = _finished(out, name)
        needs_teacher = arm == "cnn" and not opts.keep_checkpoints and \
            _finished(out, f"vit-distilled-f{fraction:g}-s{seed}") is None
        if done is not None and not (needs_teacher and
                                     not (out / name / "best.safetensors").exists()):
            rows.append(done)
            if arm == "cnn":
                teacher = out / name / "best.safetensors"
            say(f"[{k}/{len(plan)}] {label}, {fraction:.0%}, seed {seed}: done before "
                f"(top-1 {done['top1']:.4f})")
            continue
        extra = dict(extra)
        if arm == "vit-distilled":
            extra["teacher"] = str(teacher)
        start = time.perf_counter()
        result = train(resolve({**_base(opts), **extra, "data_fraction": fraction,
                                "seed": seed, "name": name}))
        seconds = time.perf_counter() - start
        row = dict(arm=arm, model=label, fraction=fraction, images=result.train_images,
                   seed=seed, top1=result.history[-1]["val_top1"], best_top1=result.best_top1,
                   steps=result.history[-1]["step"], seconds=round(seconds, 1))
        _record(out, name, row)
        rows.append(row)
        if arm == "cnn":
            teacher = result.run_dir / "best.safetensors"
        elif not opts.keep_checkpoints:
            _drop_weights(result.run_dir)
            if arm == "vit-distilled" and teacher is not None:
                _drop_weights(teacher.parent)  # the teacher's work is done
        spent, trained = spent + seconds, trained + 1
        left = (len(plan) - k) * spent / trained
        say(f"[{k}/{len(plan)}] {label}, {fraction:.0%} ({result.train_images} images), seed "
            f"{seed}: top-1 {row['top1']:.4f} in {_clock(seconds)}; "
            f"{_clock(time.perf_counter() - start_all)} elapsed, about {_clock(left)} left")
    return rows


def crossover(sizes: list[int], vit: list[float], cnn: list[float]) -> float | None:
    """The training-set size where the ViT curve first rises above the CNN's (linear in
    log-size between the two points that bracket it), or None if it never does."""
    for i in range(1, len(sizes)):
        d0, d1 = vit[i - 1] - cnn[i - 1], vit[i] - cnn[i]
        if d0 < 0 <= d1:
            lo, hi = math.log(sizes[i - 1]), math.log(sizes[i])
            return math.exp(lo + (-d0 / (d1 - d0)) * (hi - lo))
    return None


def summarise(rows: list[dict]) -> dict[str, dict[int, tuple[float, float]]]:
    """arm -> images -> (mean top-1, std over seeds)."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        per: dict[int, list[float]] = {}
        for r in rows:
            if r["arm"] == arm:
                per.setdefault(r["images"], []).append(r["top1"])
        out[arm] = {n: (statistics.fmean(v), statistics.pstdev(v) if len(v) > 1 else 0.0)
                    for n, v in sorted(per.items())}
    return out


def write_data_report(rows: list[dict], opts: StudyOptions, out: Path) -> dict[str, Path]:
    """study.csv, study.md and study.png (accuracy against training-set size)."""
    from vitkit.viz.plot import save, subplots

    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "study.csv", rows)
    table = summarise(rows)
    sizes = sorted({r["images"] for r in rows})
    cross = {arm: crossover(sizes, [table[arm][n][0] for n in sizes],
                            [table["cnn"][n][0] for n in sizes])
             for arm in table if arm != "cnn"}
    fig, ax = subplots(figsize=(7, 4.2))
    for arm, per in table.items():
        xs = list(per)
        ys = [per[n][0] for n in xs]
        err = [per[n][1] for n in xs]
        ax.errorbar(xs, ys, yerr=err if opts.seeds > 1 else None, marker="o", capsize=3,
                    label=ARMS[arm][0])
    for arm, x in cross.items():
        if x is not None:
            ax.axvline(x, linestyle="--", linewidth=1, color="grey")
            ax.annotate(f"{ARMS[arm][0]} passes the CNN\n~{x:.0f} images", (x, 0.05),
                        fontsize=7, rotation=90, va="bottom", ha="right")
    ax.set_xscale("log")
    ax.set_xlabel("training images (log scale)")
    ax.set_ylabel("validation top-1")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{opts.data} at {opts.img_size}px, {opts.steps} steps of {opts.batch_size} "
                 "at every size", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    save(fig, out / "study.png")

    header = "| model | " + " | ".join(f"{n} images" for n in sizes) + " |"
    lines = [f"# Data-size study: {opts.data}", "",
             f"{opts.steps} optimizer steps of batch {opts.batch_size} at every size; "
             f"nested subsets; {opts.seeds} seed(s); validation top-1"
             + (" (mean ± std)" if opts.seeds > 1 else "") + ".", "", header,
             "|---|" + "---|" * len(sizes)]
    for arm, per in table.items():
        cells = [f"{per[n][0]:.3f}" + (f" ± {per[n][1]:.3f}" if opts.seeds > 1 else "")
                 for n in sizes]
        lines.append(f"| {ARMS[arm][0]} | " + " | ".join(cells) + " |")
    lines.append("")
    for arm, x in cross.items():
        lines.append(f"- {ARMS[arm][0]}: " + (f"passes the CNN at about {x:.0f} images."
                                               if x is not None else
                                               "does not pass the CNN at these sizes."))
    lines += ["", "![accuracy against training-set size](study.png)", ""]
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
    p.add_argument("--data", default=None,
                   help="a data spec as for train --data, e.g. fashion-mnist (default digits)")
    p.add_argument("--img-size", type=int, default=None, help="default 16")
    p.add_argument("--vit", default=None, help="default vit_micro_patch4_32")
    p.add_argument("--fractions", type=float, nargs="+", default=None,
                   help="shares of the training split (default 0.05 0.1 0.25 0.5 1.0)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run "
                                                           "(default 200)")
    p.add_argument("--batch-size", type=int, default=None, help="default 64")
    p.add_argument("--lr", type=float, default=None, help="at batch 512 (default 8e-3)")
    p.add_argument("--seeds", type=int, default=None, help="repeats per point (default 1)")
    p.add_argument("--patch-sizes", type=int, nargs="+", default=None,
                   help="patch mode (default 2 4 8)")
    p.add_argument("--img-sizes", type=int, nargs="+", default=None,
                   help="patch mode: image sizes to sweep as well")
    p.add_argument("--out", default=None,
                   help="default runs/study; run again with the same --out to resume")
    p.add_argument("--keep-checkpoints", action="store_true", default=None,
                   help="keep every run's weights (default: only while a later arm needs them)")


def run(args: argparse.Namespace) -> None:
    chosen = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
              if k not in ("command", "run", "mode") and v is not None}
    opts = StudyOptions(**chosen)
    if args.mode == "data":
        files = write_data_report(run_data_study(opts), opts, Path(opts.out))
    else:
        files = write_patch_report(run_patch_study(opts), opts, Path(opts.out))
    print("wrote " + ", ".join(str(p) for p in files.values()))
