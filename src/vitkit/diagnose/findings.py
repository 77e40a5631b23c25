"""What the doctor reports: one :class:`Finding` per check, and how findings are shown."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from vitkit.errors import DataError

LEVELS = ("error", "warning", "unknown", "ok")


@dataclass
class Finding:
    """One check's verdict.

    ``level``: "error" (this will not work / is wrong), "warning" (likely to hurt), "unknown"
    (the check cannot tell from what it has: too few steps, a shape that fits two readings;
    ``why`` says what would let it tell), "ok".
    ``measured``: the numbers the verdict rests on. ``why``: one or two sentences on why it
    matters. ``fix``: a command or a line of code (empty when there is nothing to do).
    """

    check: str
    level: str
    summary: str
    measured: dict = field(default_factory=dict)
    why: str = ""
    fix: str = ""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise DataError(f"level must be one of {LEVELS}, got {self.level!r}")


def worst(findings: list[Finding]) -> str:
    """The most serious level among ``findings`` ("ok" when there are none)."""
    return min((f.level for f in findings), key=LEVELS.index, default="ok")


def _number(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_number(x) for x in v) + "]"
    return str(v)


def to_text(findings: list[Finding], target: str) -> str:
    """The report ``vitkit doctor`` prints: errors first, then warnings, then what is fine."""
    lines = [f"vitkit doctor: {target}"]
    order = sorted(findings, key=lambda f: LEVELS.index(f.level))
    for f in order:
        lines.append(f"[{f.level}] {f.check}: {f.summary}")
        if f.measured:
            lines.append("    measured: " + ", ".join(f"{k} {_number(v)}"
                                                     for k, v in f.measured.items()))
        if f.why and f.level != "ok":
            lines.append(f"    why: {f.why}")
        if f.fix and f.level != "ok":
            lines.append(f"    fix: {f.fix}")
    counts = {level: sum(f.level == level for f in findings) for level in LEVELS}
    unknown = f", {counts['unknown']} cannot tell" if counts["unknown"] else ""
    lines.append(f"{counts['error']} error(s), {counts['warning']} warning(s){unknown}, "
                 f"{counts['ok']} fine")
    return "\n".join(lines)


def to_json(findings: list[Finding], target: str) -> str:
    return json.dumps({"target": target, "worst": worst(findings),
                       "findings": [asdict(f) for f in findings]}, indent=2)
