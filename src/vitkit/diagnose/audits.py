"""An audit folder of ``vitkit audit`` read by the doctor: its findings (patterns every test
confirmed) are warnings; hypotheses the tests could not settle are one "cannot tell"; refuted
ones are counted in the "ok" line. The titles are the audit's own (``audit.json``). Plain
JSON: no torch."""

from __future__ import annotations

import json
from pathlib import Path

from vitkit.diagnose.findings import Finding
from vitkit.errors import DataError


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


def _measured(effect: dict) -> dict:
    """The numbers a finding rests on, before -> after."""
    out = {}
    if "removed" in effect:
        r = effect["removed"]
        out["class confidence, pattern removed"] = [r["confidence_before"],
                                                    r["confidence_after"]]
        out["other classes' confidence, the same change"] = [
            r["control_confidence_before"], r["control_confidence_after"]]
    if "added" in effect:
        a = effect["added"]
        out["other images turned to the class"] = [a["to_class_before"], a["to_class_after"]]
    if effect.get("context_removed"):
        c, k = effect["context_removed"], effect["control"]
        out["confidence, context filled"] = [c["confidence_before"], c["confidence_after"]]
        if k:  # None: no image of another class to compare
            out["other classes, context filled"] = [k["confidence_before"],
                                                    k["confidence_after"]]
    return out


def check_shortcuts(record: dict, ctx: dict) -> list[Finding]:
    """One warning per finding; the hypotheses the tests could not settle as one "cannot
    tell"; "ok" when there is no finding, saying how many hypotheses the tests refuted; and a
    warning when the audited model is wrong on most of its images."""
    out: list[Finding] = []
    folder = record["folder"]
    for f in record["findings"]:
        out.append(Finding(
            f"audit.{f['kind']}", "warning", f["title"] + _region(f) + " (confirmed by tests)",
            measured=_measured(f.get("effect", {})),
            why=f["evidence"] + "; a shortcut that holds in this data may fail on new data",
            fix=f"{f['fix']}; look at the images: open {folder}/report.html"))
    unsettled = [h for h in record["hypotheses"] if h.get("verdict") == "unsettled"]
    refuted = [h for h in record["hypotheses"] if h.get("verdict") == "refuted"]
    if unsettled:
        out.append(Finding(
            "audit.hypotheses", "unknown",
            f"{len(unsettled)} pattern(s) the tests could not settle: "
            + "; ".join(h["title"] for h in unsettled),
            why="one test passed and another did not (e.g. an object part that is needed and "
                "enough but differs from image to image): a pattern in the maps is not evidence "
                "that the model needs it",
            fix=f"look at their images in {folder}/report.html"))
    if not out:
        tested = (f"; {len(refuted)} pattern(s) in the data were tested and refuted"
                  if refuted else "")
        out.append(Finding("audit.shortcuts", "ok",
                           f"no shortcut confirmed in {record['summary']['images']} images "
                           f"(method {record.get('method', '?')}){tested}"))
    if record["summary"].get("warning"):
        out.append(Finding(
            "audit.accuracy", "warning",
            f"the audited model is right on {record['summary']['accuracy']:.0%} of the images",
            why=record["summary"]["warning"], fix="train it further, then audit it again"))
    return out
