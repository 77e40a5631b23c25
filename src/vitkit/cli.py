"""The ``vitkit`` command: builds the parser from ``vitkit.commands``, sets up logging, runs the
chosen command and turns a user's mistake into a message (exit code 2), never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import sys
import traceback

import vitkit
from vitkit import commands
from vitkit.errors import VitkitError


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


def describe_os_error(err: OSError) -> str:
    """One line for an operating-system error: what failed, where, and what to do."""
    where = err.filename or "a file"
    if err.errno == errno.ENOSPC:
        return (f"no space left on the device while writing {where}; files written before are "
                "intact (writes are atomic: a run's last good checkpoint stays). Free some "
                "space and run again (a training run continues with --resume RUN_FOLDER)")
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"cannot write or read {where}: {err.strerror.lower()}. Choose a place you can "
                "write to (e.g. --out in your home folder), or fix the permissions")
    if err.errno == errno.ENOENT:
        return f"no such file or folder: {where}"
    if err.errno == errno.EEXIST:
        return (f"{where} already exists and is not a folder; a folder was expected there: "
                "give another path, or move the file")
    if err.errno == errno.EISDIR:
        return f"{where} is a folder where a file was expected"
    if err.errno == errno.ENOTDIR:
        return f"{where} is a file where a folder was expected"
    return f"{err.strerror or err} ({where})"


WEB_MODULES = ("fastapi", "uvicorn", "starlette", "multipart", "python_multipart")
MISSING: dict[str, ImportError] = {}  # commands whose optional dependencies are not installed
PARSERS: dict[str, argparse.ArgumentParser] = {}  # each command's own parser


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``vitkit`` parser. ``only``: the command being run; the others get a bare entry and
    their modules are not imported (each imports its library: ``vitkit doctor RUN`` then starts
    without torch)."""
    parser = argparse.ArgumentParser(
        prog="vitkit", description="Vision Transformers: build, inspect, load, train, explain."
    )
    parser.add_argument("--version", action="version", version=f"vitkit {vitkit.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    MISSING.clear()
    PARSERS.clear()
    for name in commands.COMMANDS:
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        try:
            module = commands.load(name)
        except ImportError as err:  # an extra is not installed: say which, when it is used
            sub.add_parser(name, help=f"(needs an extra: {err.name} is not installed)")
            MISSING[name] = err
            continue
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
        PARSERS[module.NAME] = p
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv and argv[0] in commands.COMMANDS else None)
    if argv and argv[0] in MISSING:
        err = MISSING[argv[0]]
        extra = "web" if err.name in WEB_MODULES else "train,viz"
        print(f"vitkit {argv[0]}: error: this command needs {err.name}, which is not "
              f"installed; install the extras from vitkit's folder with: "
              f"pip install '.[{extra}]'", file=sys.stderr)
        return 2
    if argv and argv[0] in PARSERS:  # files before or after the options, as the user types
        args = PARSERS[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
    else:
        args = parser.parse_args(argv)
    setup_logging()
    for stream in (sys.stdout, sys.stderr):  # file names that are not UTF-8 still print
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
    try:
        return args.run(args) or 0
    except VitkitError as err:  # bad input from the user: vitkit's own errors only
        print(f"vitkit {args.command}: error: {err}", file=sys.stderr)
    except OSError as err:  # the user's files and disks: missing, not writable, full
        print(f"vitkit {args.command}: error: {describe_os_error(err)}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"vitkit {args.command}: interrupted; files already written are complete "
              "(every write is atomic)", file=sys.stderr)
        return 130
    except Exception:  # a bug in vitkit: show everything, and ask for a report
        traceback.print_exc()
        print(f"vitkit {args.command}: this is a bug in vitkit {vitkit.__version__}; please "
              "report it with the command you ran and the traceback above", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
