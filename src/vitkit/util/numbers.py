"""The one check of numeric options: a count of at least one, a number of at least zero (with
what zero means), a positive finite number. Every command and builder calls it, so a bad number
gets the same words everywhere: ``--steps must be 1 or more, got 0``."""

from __future__ import annotations

import math
from collections.abc import Iterable

from vitkit.errors import ConfigError, VitkitError


def option(name: str) -> str:
    """A Python name as the command-line option a user typed: ``batch_size`` -> ``--batch-size``
    (a name that is already an option, or a config key such as ``lr`` in a YAML, is given as
    the caller wants it shown)."""
    return name if name.startswith("-") else f"--{name.replace('_', '-')}"


def check_number(name: str, value, *, least: float | None = 1, positive: bool = False,
                 below: float | None = None, zero_means: str | None = None,
                 error: type[VitkitError] = ConfigError):
    """``value`` when it is a finite number that is at least ``least`` (``positive``: above
    zero instead; ``below``: and under that); else ``error`` saying what was expected and what
    was found. ``zero_means`` names what 0 stands for (``"all"``, ``"no cap"``) when 0 is
    allowed. NaN and infinities always fail."""
    if positive:
        rule = "a positive finite number" + (f" below {_shown(below)}" if below is not None
                                             else "")
        ok = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    else:
        shown = f"0 ({zero_means})" if zero_means and least == 0 else _shown(least)
        rule = f"{shown} or more"
        ok = isinstance(value, (int, float)) and math.isfinite(value) and value >= least
    if ok and below is not None:
        ok = value < below
    if not ok or isinstance(value, bool):
        raise error(f"{name} must be {rule}, got {value}")
    return value


def check_counts(pairs: Iterable[tuple[str, object]], *, least: int = 1, cli: bool = True,
                 error: type[VitkitError] = ConfigError) -> None:
    """:func:`check_number` over (name, value) pairs, each a count of at least ``least``; the
    names shown as options (``--batch-size``) when ``cli``, else as they are."""
    for name, value in pairs:
        check_number(option(name) if cli else name, value, least=least, error=error)


def _shown(number: float) -> str:
    return f"{number:,.0f}" if float(number).is_integer() else f"{number:g}"
