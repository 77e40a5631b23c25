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
