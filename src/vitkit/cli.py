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
