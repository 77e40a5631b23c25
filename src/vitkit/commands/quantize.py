"""``vitkit quantize MODEL OUT.onnx --data SPEC``: int8 for the CPU, measured on the user's
data, written only when it keeps the accuracy (see :mod:`vitkit.deploy.quantize`)."""

from __future__ import annotations

import argparse

from vitkit.commands.options import add_model_option
from vitkit.data.datasets import DATASETS

NAME = "quantize"
HELP = "int8 ONNX for the CPU that keeps its accuracy (deploy extra)"
DESCRIPTION = (
    "Quantize a model to int8 with onnxruntime: the matrix products in int8, the residual adds, "
    "LayerNorm, the softmax and GELU in float, and the products whose int8 version costs the "
    "most (measured one by one) kept in float until int8 loses at most --budget points of "
    "top-1 on --data. Prints the float and int8 top-1; writes nothing over the budget unless "
    "--force. MODEL is an .onnx file from `vitkit convert --to onnx` or any checkpoint vitkit "
    "reads (exported first).")


def points(text: str) -> float:
    """'1' -> 0.01: a budget in points of top-1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 100:
        raise argparse.ArgumentTypeError(f"expected points of top-1 in [0, 100), e.g. 1 or "
                                         f"0.5, got {text!r}")
    return value / 100


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx file vitkit wrote, or a checkpoint")
    add_model_option(p)
    p.add_argument("out", help="the int8 .onnx file to write")
    p.add_argument("--data", required=True,
                   help="the data the accuracy is measured on: " + ", ".join(DATASETS))
    p.add_argument("--split", choices=["train", "val"], default="val",
                   help="the split of --data scored (default val)")
    p.add_argument("--calibration", default=None, metavar="FOLDER|SPEC",
                   help="images that calibrate the activation ranges: a folder of images (any "
                        "depth) or a data spec's training split (default: --data's)")
    p.add_argument("--calibration-images", type=int, default=256,
                   help="how many calibration images (default 256)")
    p.add_argument("--eval-images", type=int, default=2000,
                   help="images of --split scored, at most (default 2000; 0: all): half "
                        "choose the layers kept in float, the other half give the "
                        "reported top-1")
    p.add_argument("--mode", choices=["static", "dynamic"], default="static",
                   help="static: ranges calibrated once (fastest); dynamic: weights only, "
                        "ranges per batch at run time (no calibration)")
    p.add_argument("--budget", type=points, default=0.01, metavar="POINTS",
                   help="the most top-1 int8 may lose, in points (default 1)")
    p.add_argument("--max-float", type=float, default=0.5,
                   help="keep at most this share of the products in float (default 0.5)")
    p.add_argument("--force", action="store_true",
                   help="write the int8 model even when it loses more than the budget")
    p.add_argument("--data-root", default="data",
                   help="where CIFAR, Fashion-MNIST and MNIST are (default data)")


def run(args: argparse.Namespace) -> None:
    from vitkit.deploy.quantize import quantize

    r = quantize(args.model, args.out, args.data, split=args.split,
                 calibration=args.calibration, calibration_images=args.calibration_images,
                 eval_images=args.eval_images, budget=args.budget, mode=args.mode,
                 max_float=args.max_float, force=args.force, root=args.data_root,
                 model_name=args.model_name)
    print(f"{r.images} held-out images of {args.data} ({args.split}; used for no choice): "
          f"float top-1 {r.float_top1:.4f}, int8 top-1 {r.int8_top1:.4f} ({r.loss * 100:+.2f} "
          f"points lost; budget {r.budget * 100:g})")
    print(f"chosen on {r.selection_images} other images of the same split: float top-1 "
          f"{r.selection_float_top1:.4f}, int8 {r.selection_int8_top1:.4f}")
    print(f"{r.quantized} products in int8, {len(r.kept_float)} kept in float"
          + (": " + ", ".join(r.kept_float) if r.kept_float else ""))
    over = (" (over the budget on the selection images: written because of --force)"
            if r.selection_float_top1 - r.selection_int8_top1 > r.budget else "")
    print(f"wrote {r.path} ({r.int8_mb:.1f} MB; float {r.float_mb:.1f} MB){over}")
