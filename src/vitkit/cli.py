"""The ``vitkit`` command: parse arguments, call the library, print."""

from __future__ import annotations

import argparse
import sys

import vitkit


def _cmd_info(args: argparse.Namespace) -> None:
    from vitkit.info import describe

    print(describe(args.name, img_size=args.img_size, patch_size=args.patch_size))


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
