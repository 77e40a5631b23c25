"""The ``vitkit`` command: builds the parser from ``vitkit.commands``, sets up logging, runs the
chosen command and turns a user's mistake into a message (exit code 2), never a traceback."""

from __future__ import annotations

import argparse
import logging
import sys

import vitkit
from vitkit import commands


class _StderrHandler(logging.Handler):
    """'vitkit: message' on whatever ``sys.stderr`` is at the time (pytest swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(f"vitkit: {self.format(record)}", file=sys.stderr, flush=True)
        except Exception:  # a logging handler must never raise
            self.handleError(record)


def setup_logging(level: int = logging.INFO) -> None:
    """Show the library's log lines (``logging.getLogger("vitkit")``) on stderr, once."""
    logger = logging.getLogger("vitkit")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
    logger.setLevel(level)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vitkit", description="Vision Transformers: build, inspect, load, train, explain."
    )
    parser.add_argument("--version", action="version", version=f"vitkit {vitkit.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in commands.COMMANDS:
        module = commands.load(name)
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    try:
        args.run(args)
    except ValueError as err:  # bad input from the user: the message says what to do
        print(f"vitkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
