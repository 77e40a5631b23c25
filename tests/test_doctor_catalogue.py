"""The doctor's catalogue (tests/doctor_catalogue.py): every planted problem caught at its
level, no healthy case alarmed, and the confusion table in docs/doctor.md as measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from doctor_catalogue import CASES, case_list, confusion, run_case

DOCS = Path(__file__).resolve().parents[1] / "docs" / "doctor.md"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("catalogue")
    return [run_case(case, root / str(i)) for i, case in enumerate(CASES)]


def test_the_catalogue_is_large_and_mixed():
    planted = [c for c in CASES if not c.healthy]
    assert len(planted) >= 30 and len(CASES) - len(planted) >= 9
    assert {c.kind for c in CASES} == {"run", "checkpoint", "maps"}
    assert sum(c.source.startswith("real run") for c in CASES) >= 10


def test_every_planted_problem_is_caught(results):
    missed = [(r.case.name, r.case.expect, [(f.check, f.level) for f in r.findings])
              for r in results if not r.case.healthy and not r.caught]
    assert not missed, missed


def test_no_healthy_case_raises_a_false_alarm(results):
    alarms = [(r.case.name, [(f.check, f.level, f.summary) for f in r.alarms])
              for r in results if r.case.healthy and r.alarms]
    assert not alarms, alarms


def test_the_docs_show_the_catalogue_as_measured(results):
    text = DOCS.read_text()
    table = re.search(r"<!-- confusion -->\n(.*?)\n<!-- /confusion -->", text, re.S)
    cases = re.search(r"<!-- cases -->\n(.*?)\n<!-- /cases -->", text, re.S)
    assert table and cases, "docs/doctor.md lacks the catalogue's markers"
    assert table.group(1) == confusion(results), "regenerate: python tests/doctor_catalogue.py"
    assert cases.group(1) == case_list()
