"""The planted-shortcut benchmark's bookkeeping (benchmarks/audit_shortcuts.py): the specs it
trains on, and how its table counts cases, so the committed summary says what the cases say.
(Training and auditing a case are what tests/test_audit.py covers on the committed models.)"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import audit_shortcuts as bench  # noqa: E402


def _plant(cls, learned, found, top20, in_class=1.0):
    return {"kind": "k", "cls": cls, "carriers": 90, "learned": learned, "found": found,
            "top20": top20, "top20_in_class": in_class}


def _record(kind, plants, data="cluttered-digits", arch="cls", strength=1, other=(),
            audited=0.9):
    return {"case": f"{data}-{arch}-{kind}", "data": data, "arch": arch, "kind": kind,
            "strength": strength if plants else 0, "top1": 0.9, "epochs": 20,
            "audited_top1": audited,
            "findings": [], "unsettled": 0, "plants": plants, "other_findings": list(other)}


def test_the_spec_plants_every_mark_of_the_kind_on_90_percent_at_the_strength():
    assert bench.spec("fashion-boxes", "two", 2) == "fashion-boxes+mark:3:0.9:2+text:7:0.9:2"
    assert bench.spec("cluttered-digits", "cast", 1) == "cluttered-digits+cast:3:0.9:1"
    assert bench.spec("cluttered-digits", None, 1) == "cluttered-digits"
    assert bench.case_name("fashion-boxes", "map", None, 0) == "fashion-boxes-map-clean"


def test_the_summary_counts_a_case_once_and_two_plants_only_when_both_hold(tmp_path):
    records = [
        # two marks: both learned, one found -> a case learned but not found
        _record("two", [_plant(3, 0.9, ["region"], 0.5), _plant(7, 0.8, [], 0.1)]),
        _record("two", [_plant(3, 0.9, ["region"], 0.6), _plant(7, 0.7, ["region"], 0.4)],
                strength=2),
        # a cast the model did not learn: not counted against the audit
        _record("cast", [_plant(3, 0.2, [], 0.0)]),
        _record("cast", [_plant(3, 1.0, ["colour"], 0.7)], data="fashion-boxes"),
        _record("clean", [], other=["region:4"]),
        _record("clean", [], arch="map"),
        # a clean model that has not learned the task: its finding is counted, and said so
        _record("clean", [], data="fashion-boxes", arch="map", other=["outside-box:1"],
                audited=0.35),
    ]
    text, rows = bench.table(records)
    assert len(rows) == 6 + 3  # a row per plant, one per clean case
    assert "| 0.35 (warned) |" in text and text.count("(warned)") == 1
    two = next(r for r in rows if r["kind"] == "two" and r["strength"] == 1)
    assert two["top20_any"] == 0.6  # the carriers of either
    lines = {line.split(" | ")[0].strip("| "): line for line in bench.summary(rows).splitlines()}
    # two cases, both learned; both plants found in one; top-20 of either 0.6 and 1.0
    assert lines["two"].startswith("| two | 2 | 2 | 1 | 1 | 0.80 |")
    assert lines["cast"].startswith("| cast | 2 | 1 | 1 | 0 | 0.70 |")
    assert ("| clean | 3 | | 2 with a finding (1 on a model the audit warns has not learned "
            "the task) |") in lines["clean"]
    assert "digits cls s1, digits cls s2" in lines["two"]
    bench.figure(rows, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0
