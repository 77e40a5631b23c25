"""An audit folder of ``vitkit audit`` read by the doctor: its confirmed flags are findings; a
hypothesis that masking tested and did not confirm is no finding (the "ok" line counts them),
one that masking cannot test (the border) is a "cannot tell". Plain JSON: no torch."""

from __future__ import annotations

import json
from pathlib import Path

from vitkit.diagnose.findings import Finding
from vitkit.errors import DataError

WHAT = {"fixed-region": "relies on a fixed region for class {cls}",
        "outside-box": "looks outside the object for class {cls}",
        "border": "looks at the border for class {cls}"}


def is_audit(folder: Path) -> bool:
    return folder.is_dir() and ((folder / "audit.json").is_file()
                                or (folder / "audit-options.json").is_file())


def read_audit(folder: Path) -> dict:
    """``audit.json`` of ``folder``; an audit that never finished is said so."""
    path = folder / "audit.json"
    if not path.is_file():
        raise DataError(f"{folder} holds an unfinished audit (audit-options.json, no audit.json)"
                        ": run the same `vitkit audit` command again to finish it")
    try:
        record = json.loads(path.read_text())
        record["findings"], record["hypotheses"], record["summary"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"{path} is not an audit vitkit wrote ({err}); run `vitkit audit` "
                        "again into a new --out") from err
    record["folder"] = str(folder)
    return record


def _region(flag: dict) -> str:
    region = flag.get("region")
    if not region:
        return ""
    cells = [(r, c) for r, row in enumerate(region) for c, v in enumerate(row) if v]
    return " at patch(es) " + ", ".join(f"(row {r}, col {c})" for r, c in cells[:6]) + (
        " ..." if len(cells) > 6 else "")


def check_shortcuts(record: dict, ctx: dict) -> list[Finding]:
    """One warning per confirmed flag; the patterns masking cannot test (border) as one "cannot
    tell"; "ok" when nothing was confirmed, saying how many patterns masking refuted."""
    out: list[Finding] = []
    folder = record["folder"]
    for f in record["findings"]:
        effect = f.get("effect", {})
        measured = {}
        if "removed" in effect:
            r = effect["removed"]
            measured["confidence without it"] = [r["confidence_before"], r["confidence_after"]]
        if "added" in effect:
            a = effect["added"]
            measured["other images turned to the class"] = [a["to_class_before"],
                                                            a["to_class_after"]]
        if effect.get("context_removed"):
            c, k = effect["context_removed"], effect["control"]
            measured["confidence, context filled"] = [c["confidence_before"],
                                                      c["confidence_after"]]
            measured["other classes, context filled"] = [k["confidence_before"],
                                                         k["confidence_after"]]
        out.append(Finding(
            f"audit.{f['kind']}", "warning",
            "the model " + WHAT[f["kind"]].format(cls=f["cls"]) + _region(f)
            + " (confirmed by masking)", measured=measured,
            why=f["evidence"] + "; a shortcut that holds in this data may fail on new data",
            fix=f"{f['fix']}; look at the images: open {folder}/report.html"))
    untested = [h for h in record["hypotheses"] if h.get("confirmed") is None]
    refuted = [h for h in record["hypotheses"] if h.get("confirmed") is False]
    if untested:
        names = "; ".join(WHAT[h["kind"]].format(cls=h["cls"]) for h in untested)
        out.append(Finding(
            "audit.hypotheses", "unknown",
            f"{len(untested)} pattern(s) that masking cannot test: {names}",
            why="a pattern in the maps is not evidence that the model needs it, and this kind "
                "(relevance on the border) is not masked",
            fix=f"look at the class's images in {folder}/report.html for frames or padding"))
    if not out:
        tested = (f"; {len(refuted)} pattern(s) in the maps were tested by masking and not "
                  "confirmed" if refuted else "")
        out.append(Finding("audit.shortcuts", "ok",
                           f"no shortcut confirmed in {record['summary']['images']} images "
                           f"(method {record.get('method', '?')}){tested}"))
    return out
