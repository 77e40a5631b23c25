"""``vitkit list [PATTERN]``: registered model names."""

from __future__ import annotations

import argparse
import sys

from vitkit.models.registry import list_models

NAME = "list"
HELP = "registered model names"
DESCRIPTION = "Registered model names, optionally filtered."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pattern", nargs="?", default=None, help="substring filter, e.g. base")


def run(args: argparse.Namespace) -> int:
    names = list_models(args.pattern)
    if not names:
        print(f"vitkit list: error: no registered model name contains {args.pattern!r}; "
              "`vitkit list` shows them all (e.g. vitkit list small)", file=sys.stderr)
        return 2
    print("\n".join(names))
    return 0
