"""Typed, validated reads of a request's query parameters.

A :class:`Query` wraps the parameters (any mapping of names to text) and reads each one as
text, a whole number (optionally within a range), a finite number (optionally within an
interval) or one of fixed choices. An absent or empty parameter takes its default, or is
refused when it has none and a hint says what to send. Every refusal is a :class:`BadQuery`,
which the app answers with 400 and the message.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from vitkit.errors import VitkitError

SECRET = "token"  # never echoed back (see Query.settings)


class BadQuery(VitkitError):
    """A query parameter that is missing or malformed; the message names it and what it
    should be."""


class Query:
    """The query parameters of one request (``params``: name -> text, e.g. Starlette's
    ``request.query_params``)."""

    def __init__(self, params: Mapping[str, str]) -> None:
        self.params = params

    def raw(self, name: str) -> str | None:
        """The parameter as sent; None when absent or empty."""
        value = self.params.get(name)
        return value if value else None

    def _missing(self, name: str, hint: str | None, default):
        if hint is not None:
            raise BadQuery(f"{name} is missing: {hint}")
        return default

    def text(self, name: str, default: str | None = None, *, missing: str | None = None
             ) -> str | None:
        """The parameter's text; ``default`` when absent, or refused with the ``missing``
        hint when one is given."""
        value = self.raw(name)
        return self._missing(name, missing, default) if value is None else value

    def integer(self, name: str, default: int | None = None, *, lo: int | None = None,
                hi: int | None = None, label: str | None = None,
                missing: str | None = None) -> int | None:
        """A whole number, within ``lo..hi`` (both included) when they are given. ``label``
        names it in messages (default: ``name``)."""
        label = label or name
        value = self.raw(name)
        if value is None:
            return self._missing(name, missing, default)
        try:
            number = int(value)
        except ValueError:
            raise BadQuery(f"{label} must be a whole number, got {value!r}") from None
        if (lo is not None and number < lo) or (hi is not None and number > hi):
            raise BadQuery(f"{label} must be {_bound(lo)}..{_bound(hi)}, got {number}")
        return number

    def number(self, name: str, default: float, *, lo: float | None = None,
               hi: float | None = None, hi_open: bool = False, what: str = "") -> float:
        """A finite number (NaN and infinities are refused), within [lo, hi] (or [lo, hi) with
        ``hi_open``) when the bounds are given. ``what`` describes it in the message of a
        value outside them ("discard must be a discard ratio in [0, 1)")."""
        value = self.raw(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise BadQuery(f"{name} must be a number, got {value!r}") from None
        if lo is None and hi is None:
            if not math.isfinite(number):
                raise BadQuery(f"{name} must be a finite number, got {value}")
            return number
        low, high = -math.inf if lo is None else lo, math.inf if hi is None else hi
        inside = low <= number < high if hi_open else low <= number <= high  # NaN: never
        if not (inside and math.isfinite(number)):
            raise BadQuery(f"{name} must be {what + ' ' if what else ''}in "
                           f"{_interval(lo, hi, hi_open)}, got {value}")
        return number

    def choice(self, name: str, choices: Collection[str], default: str | None = None) -> str:
        """One of ``choices``; ``default`` when absent (refused when there is none)."""
        value = self.raw(name)
        if value is None and default is not None:
            return default
        if value not in choices:
            raise BadQuery(f"{name} must be one of {', '.join(choices)}, got "
                           f"{self.params.get(name)!r}")
        return value

    def settings(self) -> dict[str, str]:
        """Every parameter as sent (the last of a repeated one), but the session token."""
        return {k: v for k, v in self.params.items() if k != SECRET}


def _bound(value: float | None) -> str:
    """A bound as a message shows it: 2, 0.5, or nothing for no bound."""
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _interval(lo: float | None, hi: float | None, hi_open: bool) -> str:
    """[0, 1], [0, 1) or, without a bound, (-inf, 1] and [0, inf)."""
    left = "(-inf" if lo is None else f"[{_bound(lo)}"
    right = "inf)" if hi is None else f"{_bound(hi)}{')' if hi_open else ']'}"
    return f"{left}, {right}"
