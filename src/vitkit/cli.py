"""The ``vitkit`` command: parse arguments, call the library, print."""

from __future__ import annotations

import argparse
import sys

import vitkit


def _cmd_info(args: argparse.Namespace) -> None:
    from vitkit.info import describe

    print(describe(args.name, img_size=args.img_size, patch_size=args.patch_size))


def _size(text: str) -> int | tuple[int, int]:
    """'384' -> 384, '384x512' -> (384, 512)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts, default=0) <= 0:
        raise argparse.ArgumentTypeError(f"expected a size like 384 or 384x512, got {text!r}")
    return parts[0] if len(parts) == 1 else (parts[0], parts[1])


def _cmd_convert(args: argparse.Namespace) -> None:
    from vitkit.checkpoints import convert

    convert(args.src, args.dst, to=args.to, img_size=args.img_size, num_classes=args.num_classes)


def _head(text: str) -> int | str:
    if text in ("mean", "max", "min"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a head index or mean/max/min, got {text!r}") from None


def _cmd_attention(args: argparse.Namespace) -> None:
    from vitkit.checkpoints import load_model
    from vitkit.explain.run import explain_images

    model = load_model(args.checkpoint)
    reports = explain_images(model, args.images, args.out, method=args.method, layer=args.layer,
                             head=args.head, faithfulness=args.faithfulness, top_k=args.top_k)
    for r in reports:
        print(f"{r.path}:")
        for rank, (name, p) in enumerate(r.top, 1):
            print(f"  {rank}. {name}  {p:.3f}")
        for name, scores in r.faithfulness.items():
            print(f"  faithfulness {name:<12} deletion AUC {scores['deletion_auc']:.3f}  "
                  f"insertion AUC {scores['insertion_auc']:.3f}")
        print("  wrote " + ", ".join(str(f) for f in r.files))


def _cmd_train(args: argparse.Namespace) -> None:
    from vitkit.train.config import resolve
    from vitkit.train.trainer import train

    overrides = {k: v for k, v in vars(args).items()
                 if k not in ("command", "func", "config", "resume")}
    if args.resume:
        if overrides:
            raise ValueError("--resume continues a run exactly as it was configured; drop "
                             f"the other options ({', '.join(sorted(overrides))})")
        result = train(None, resume=args.resume)
    else:
        result = train(resolve(overrides, args.config))
    print(f"best validation top-1 {result.best_top1:.4f}; run folder {result.run_dir}")


def _cmd_eval(args: argparse.Namespace) -> None:
    from vitkit.train.evaluation import evaluate_checkpoint

    r = evaluate_checkpoint(args.checkpoint, args.data, split=args.split, out=args.out,
                            root=args.data_root)
    print(f"{r['images']} images of {r['data']} ({r['split']}): top-1 {r['top1']:.4f}, "
          f"top-5 {r['top5']:.4f}")
    for name, acc in r["per_class"].items():
        print(f"  {name:<20} {acc:.4f}")
    if args.out:
        print(f"wrote {args.out}/eval.json and {args.out}/confusion.png")


def _cmd_predict(args: argparse.Namespace) -> None:
    from vitkit.train.evaluation import predict

    for r in predict(args.checkpoint, args.inputs, top_k=args.top_k, out=args.out):
        if "error" in r:
            print(f"{r['image']}: {r['error']}")
        else:
            best = ", ".join(f"{t['class']} {t['probability']:.3f}" for t in r["top"])
            print(f"{r['image']}: {best}")
    if args.out:
        print(f"wrote {args.out}")


def _add_train_options(p: argparse.ArgumentParser) -> None:
    from dataclasses import fields

    from vitkit.train.config import TrainConfig, field_types

    types = field_types()
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        t = types[f.name]
        default = f.default
        helptext = f"(default: {default})"
        if t is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction,
                           default=argparse.SUPPRESS, help=helptext)
        elif t is tuple:
            p.add_argument(flag, type=float, nargs=3, default=argparse.SUPPRESS, help=helptext)
        else:
            p.add_argument(flag, type=t, default=argparse.SUPPRESS, help=helptext)


def _cmd_demo(args: argparse.Namespace) -> None:
    from vitkit.demo import DemoOptions, run_demo

    chosen = {k: v for k, v in vars(args).items()
              if k not in ("command", "func", "quick") and v is not None}
    run_demo(DemoOptions.quick(**chosen) if args.quick else DemoOptions(**chosen))


def _cmd_study(args: argparse.Namespace) -> None:
    from pathlib import Path

    from vitkit import study

    chosen = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
              if k not in ("command", "func", "mode") and v is not None}
    opts = study.StudyOptions(**chosen)
    if args.mode == "data":
        files = study.write_data_report(study.run_data_study(opts), opts, Path(opts.out))
    else:
        files = study.write_patch_report(study.run_patch_study(opts), opts, Path(opts.out))
    print("wrote " + ", ".join(str(p) for p in files.values()))


def _cmd_bench(args: argparse.Namespace) -> None:
    from vitkit.bench import bench, describe

    print(describe(bench(args.name, batch=args.batch, img_size=args.img_size, train=args.train,
                         attn=args.attn, compile=args.compile, dtype=args.dtype,
                         device=args.device, steps=args.steps, warmup=args.warmup)))


def _cmd_list(args: argparse.Namespace) -> None:
    print("\n".join(vitkit.list_models(args.pattern)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vitkit", description="Vision Transformers: build, inspect, load, train, explain."
    )
    parser.add_argument("--version", action="version", version=f"vitkit {vitkit.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="parameters by part and FLOPs per image of a model",
                       description="Parameters by part and cost per image of a registered model.")
    p.add_argument("name", help="a registered name, e.g. vit_base_patch16_224 (see `vitkit list`)")
    p.add_argument("--img-size", type=int, default=None, help="input side in pixels (square)")
    p.add_argument("--patch-size", type=int, default=None, help="patch side in pixels")
    p.set_defaults(func=_cmd_info)

    formats = ["vitkit", "timm", "hf", "jax", "torchvision"]
    for name, doc in [
        ("convert", "convert a checkpoint between formats, resolutions and class counts"),
        ("resize", "move a checkpoint to a new resolution (interpolates the position table)"),
    ]:
        p = sub.add_parser(name, help=doc, description=doc[0].upper() + doc[1:] + ". SRC is any "
                           "format vitkit loads: timm/DeiT, Hugging Face, torchvision, JAX .npz, "
                           "vitkit.")
        p.add_argument("src", help="checkpoint file or folder")
        p.add_argument("dst", help="output file (or folder for hf and timm hub style)")
        p.add_argument("--img-size", type=_size, required=name == "resize",
                       help="new input size, e.g. 384 or 384x512")
        p.add_argument("--num-classes", type=int, default=None,
                       help="new class count (puts a fresh head on)")
        p.add_argument("--to", choices=formats, default="vitkit" if name == "convert" else None,
                       help="output format (convert: vitkit; resize: the source's format)")
        p.set_defaults(func=_cmd_convert)

    from vitkit.explain.methods import METHODS

    p = sub.add_parser(
        "attention", help="what a model attends to: per-head maps, rollout, gradients",
        description="Top-5 prediction, per-head [CLS] maps, a layers x heads mosaic and a chosen "
                    "method's map for each image; PNG figures and raw .npy maps in --out.")
    p.add_argument("images", nargs="+", help="image files (any format PIL reads)")
    p.add_argument("--checkpoint", required=True, help="any checkpoint vitkit loads")
    p.add_argument("--layer", type=int, default=-1, help="layer of the per-head figure (-1: last)")
    p.add_argument("--head", type=_head, default=None,
                   help="head index or mean/max/min for the single cls map (default: mean, "
                        "said in the figure); the per-head figure shows every head")
    p.add_argument("--method", choices=METHODS, default="rollout",
                   help="attribution method (default: rollout)")
    p.add_argument("--faithfulness", action="store_true",
                   help="also run deletion/insertion against a random map and plot the curves")
    p.add_argument("--top-k", type=int, default=5, help="predictions to print (default 5)")
    p.add_argument("--out", required=True, help="folder for the figures and .npy maps")
    p.set_defaults(func=_cmd_attention)

    p = sub.add_parser(
        "train", help="train or fine-tune a ViT or CNN (DeiT recipe, distillation, torchrun)",
        description="Train from scratch (--recipe deit), fine-tune (--recipe finetune --init "
                    "CHECKPOINT) or distil (--distill hard --teacher CHECKPOINT). Every option "
                    "can also come from --config FILE.yaml; flags override the file, which "
                    "overrides the recipe. Runs under torchrun unchanged.")
    p.add_argument("--config", default=None, help="YAML file of options (names as below)")
    p.add_argument("--resume", default=None, help="run folder to continue exactly")
    _add_train_options(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="top-1/top-5, per-class accuracy, confusion matrix",
                       description="Score a checkpoint on a dataset split.")
    p.add_argument("checkpoint")
    p.add_argument("--data", required=True, help="digits, cluttered-digits, imagefolder:PATH, "
                                                 "cifar10, cifar100")
    p.add_argument("--split", choices=["train", "val"], default="val")
    p.add_argument("--data-root", default="data", help="where CIFAR lives")
    p.add_argument("--out", default=None, help="folder for eval.json and confusion.png")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("predict", help="top-k classes for image files or folders",
                       description="Top-k classes for each image; --out writes CSV or JSON.")
    p.add_argument("checkpoint")
    p.add_argument("inputs", nargs="+", help="image files or folders")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--out", default=None, help="predictions.csv or predictions.json")
    p.set_defaults(func=_cmd_predict)

    p = sub.add_parser(
        "demo", help="train a ViT and a CNN, compare them, draw attention, write report.html",
        description="The whole library in one command (about 5 minutes on 2 CPU cores).")
    p.add_argument("--data", default=None, help="cluttered-digits (default) or imagefolder:PATH")
    p.add_argument("--img-size", type=int, default=None, help="input side (default 32)")
    p.add_argument("--vit", default=None, help="ViT to train (default vit_micro_patch4_32)")
    p.add_argument("--cnn", default=None, help="CNN to train (default resnet18)")
    p.add_argument("--vit-steps", type=int, default=None, help="ViT steps (default 375)")
    p.add_argument("--cnn-steps", type=int, default=None, help="CNN steps (default 150)")
    p.add_argument("--images", type=int, default=None, help="images to explain (default 4)")
    p.add_argument("--batch-size", type=int, default=None, help="default 64")
    p.add_argument("--out", default=None, help="output folder (default runs/demo)")
    p.add_argument("--quick", action="store_true", help="a tiny smoke run of about a minute")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser(
        "study", help="when does a ViT beat a CNN? accuracy against data size or patch size",
        description="--mode data: a plain ViT, a ViT with DeiT augmentation, a ViT distilled "
                    "from the CNN, and the CNN, on nested subsets with the same step budget. "
                    "--mode patch: one ViT per patch size (and image size), accuracy vs FLOPs.")
    p.add_argument("--mode", choices=["data", "patch"], default="data")
    p.add_argument("--data", default=None, help="default digits")
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
    p.add_argument("--out", default=None, help="default runs/study")
    p.set_defaults(func=_cmd_study)

    p = sub.add_parser(
        "bench", help="time a model: images/s, ms/image, memory, share of the matmul peak",
        description="Warm-up, then timed steps (synchronised on GPU); median and spread.")
    p.add_argument("name", help="a registered model name")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--img-size", type=int, default=None)
    p.add_argument("--train", action="store_true", help="time forward + backward + AdamW")
    p.add_argument("--attn", action="store_true", help="inference with all-layer maps")
    p.add_argument("--compile", action="store_true", help="torch.compile the model first")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("list", help="registered model names",
                       description="Registered model names, optionally filtered.")
    p.add_argument("pattern", nargs="?", default=None, help="substring filter, e.g. base")
    p.set_defaults(func=_cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ValueError as err:  # bad input from the user: the message says what to do
        print(f"vitkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
