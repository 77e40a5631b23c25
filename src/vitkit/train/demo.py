"""The whole library in one run (``vitkit demo``).

Trains a small ViT and a ResNet-18 on cluttered digits (or the user's image folder), compares
them (accuracy, parameters, FLOPs per image, training time), draws what the ViT attends to on a
few validation images (per-head [CLS] maps, a layers x heads mosaic, rollout and gradient
attribution, with the digit's box), and writes one self-contained ``report.html``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from vitkit import explain
from vitkit.checkpoints.io import load_model
from vitkit.data.datasets import load_split
from vitkit.data.digits import cluttered_digits
from vitkit.data.images import load_image, preprocess, preprocessing, to_rgb
from vitkit.models.cost import flops_per_image
from vitkit.train.config import resolve
from vitkit.train.trainer import train
from vitkit.util.numbers import check_counts
from vitkit.viz import plot
from vitkit.viz.report import Report

log = logging.getLogger("vitkit")  # progress lines: the CLI shows them


@dataclass
class DemoOptions:
    data: str = "cluttered-digits"
    img_size: int = 32
    vit: str = "vit_micro_patch4_32"
    cnn: str = "resnet18"
    data_size: int = 3000
    vit_steps: int = 375
    cnn_steps: int = 150
    batch_size: int = 64
    num_images: int = 4  # validation images to explain
    out: str = "runs/demo"

    @classmethod
    def quick(cls, **kw) -> DemoOptions:
        """A minute-long smoke run: tiny data and a few steps (numbers mean little)."""
        return cls(**{**dict(data_size=300, vit_steps=12, cnn_steps=4, num_images=2), **kw})


def examples(opts: DemoOptions, vit):
    """(normalised images (n, 3, H, W), pictures (n, H, W, 3), boxes or None, labels)."""
    size, mean, std = preprocessing(vit)
    if opts.data == "cluttered-digits":
        d = cluttered_digits(opts.num_images, "val", canvas=opts.img_size, align=4, seed=99)
        m, s = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]
        return (d.images - m) / s, d.images.permute(0, 2, 3, 1).numpy(), d.boxes, d.labels
    split = load_split(opts.data, "val", opts.img_size)
    files = [split.images[i] for i in range(min(opts.num_images, len(split)))]
    loaded = [preprocess(to_rgb(f), size, mean, std) if isinstance(f, Image.Image)
              else load_image(f, size, mean, std) for f in files]  # in memory, or files
    return (torch.stack([x for x, _ in loaded]), [p for _, p in loaded], None,
            torch.tensor(split.labels[:len(files)]))


def run_demo(opts: DemoOptions, say=log.info) -> Path:
    check_counts((name, getattr(opts, name)) for name in (
        "img_size", "vit_steps", "cnn_steps", "num_images", "batch_size", "data_size"))
    out = Path(opts.out)
    base = dict(data=opts.data, img_size=opts.img_size, data_size=opts.data_size,
                batch_size=opts.batch_size, lr=8e-3, label_smoothing=0.1, warmup_epochs=0.5,
                out=str(out), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    runs = {}
    for key, model, steps in (("vit", opts.vit, opts.vit_steps),
                              ("cnn", opts.cnn, opts.cnn_steps)):
        say(f"training {model} for {steps} steps on {opts.data} ...")
        start = time.perf_counter()
        # the demo's own folders: an earlier demo's runs are moved aside, never deleted
        result = train(resolve({**base, "model": model, "steps": steps, "name": key}),
                       overwrite=True)
        runs[key] = (result, time.perf_counter() - start)

    vit = load_model(runs["vit"][0].run_dir / "best.safetensors", verbose=False)
    cnn = load_model(runs["cnn"][0].run_dir / "best.safetensors", verbose=False)
    rows = []
    for key, model in (("vit", vit), ("cnn", cnn)):
        result, seconds = runs[key]
        rows.append([opts.vit if key == "vit" else opts.cnn,
                     f"{result.history[-1]['val_top1']:.3f}",
                     f"{sum(p.numel() for p in model.parameters()):,}",
                     f"{flops_per_image(model, opts.img_size) / 1e9:.3f}", f"{seconds:.0f} s",
                     str(result.history[-1]["step"])])
    header = ["model", "val top-1", "parameters", "GFLOPs / image", "training time", "steps"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        say("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))

    figures = out / "figures"
    x, pictures, boxes, labels = examples(opts, vit)
    with torch.no_grad():
        logits, maps = vit(x, return_attn=True)
    heads_last = explain.cls_attention(maps)  # (n, heads, gh, gw)
    every = torch.stack([explain.cls_attention(maps, layer=i) for i in range(len(maps))], 1)
    rollout = explain.explain_map(vit, x, "rollout", outputs=(logits, maps)).map
    chefer = explain.explain_map(vit, x, "chefer").map
    names = vit.cfg.extra.get("class_names") or [str(i) for i in range(vit.num_classes)]
    shown = []
    for i in range(len(x)):
        box = boxes[i].tolist() if boxes is not None else None
        pred, true = names[int(logits[i].argmax())], names[int(labels[i])]
        title = f"image {i}: true {true}, predicted {pred}"
        depth = len(maps) - 1
        shown.append((
            plot.save(plot.figure_heads(pictures[i], heads_last[i], depth, box=box,
                                        title=f"{title} - [CLS] attention per head, last layer"),
                      figures / f"{i}_heads.png"),
            plot.save(plot.figure_mosaic(pictures[i], every[i], box=box,
                                         title=f"{title} - layers x heads"),
                      figures / f"{i}_mosaic.png"),
            plot.save(plot.figure_methods(pictures[i], {
                "rollout": rollout[i], "Chefer (gradients)": chefer[i],
                "[CLS] last layer, mean of heads": heads_last[i].mean(0)}, box=box, title=title),
                figures / f"{i}_methods.png"),
        ))

    report = Report("vitkit demo: a ViT and a CNN on the same data")
    report.text(f"Data: {opts.data} at {opts.img_size}x{opts.img_size}. Both models trained "
                f"from scratch with the same recipe; the ViT for {opts.vit_steps} steps, the CNN "
                f"for {opts.cnn_steps} steps, batch {opts.batch_size}.")
    report.heading("Comparison")
    report.table(header, rows)
    report.heading("Training curves")
    for key in ("vit", "cnn"):
        report.image(runs[key][0].run_dir / "curves.png", f"{key.upper()}: loss and accuracy")
    report.heading("What the ViT attends to")
    report.text("Per-head [CLS] attention of the last layer (heads kept apart), every head of "
                "every layer, and maps that account for all layers: attention rollout and "
                "Chefer et al.'s gradient x attention. The green box is the digit.")
    for heads, mosaic, methods in shown:
        report.image(methods, "rollout and gradient attribution beside the last layer's map")
        report.image(heads, "per-head [CLS] attention, last layer")
        report.image(mosaic, "layers (rows) x heads (columns)")
    path = report.write(out / "report.html")
    say(f"report: {path.resolve()}")
    best = runs["vit"][0].run_dir / "best.safetensors"
    say(f"look inside the ViT in your browser: vitkit explore --checkpoint {best}")
    return path
