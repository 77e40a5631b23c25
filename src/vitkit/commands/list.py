"""``vitkit list [PATTERN]``: registered model names."""

from __future__ import annotations

import argparse

from vitkit.models.registry import list_models

NAME = "list"
HELP = "registered model names"
DESCRIPTION = "Registered model names, optionally filtered."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pattern", nargs="?", default=None, help="substring filter, e.g. base")


def run(args: argparse.Namespace) -> None:
    print("\n".join(list_models(args.pattern)))
