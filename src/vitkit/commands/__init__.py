"""The CLI's commands, one module each. A command module defines ``NAME``, ``HELP``,
``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args)``: it parses, calls the library and
prints. Adding a command is one module plus one line in ``COMMANDS``.

Modules are imported only when the parser is built, so ``import vitkit`` never pays for them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# The order is the order of ``vitkit --help``.
COMMANDS = ("info", "list", "convert", "resize", "quantize", "attention", "trust", "dense", "audit",
            "features", "probe",
            "train", "eval", "predict", "doctor", "explore", "demo", "study", "bench")


def load(name: str) -> ModuleType:
    """The module of command ``name``."""
    return importlib.import_module(f"vitkit.commands.{name}")
