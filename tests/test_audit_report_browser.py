"""The audit's report as a person reads it, opened in Chromium: findings first, then the
hypotheses the tests could not settle, the refuted ones behind a toggle with their numbers; each
flag shows its own images with the region outlined, and the pixel test is a bounded share."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from vitkit.audit.analysis import Audit
from vitkit.audit.flags import Flag
from vitkit.audit.report import write
from vitkit.data.datasets import load_split

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--disable-gpu", "--disable-quic", "--disable-sync", "--disable-background-networking"]
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None


def _effect(needed: bool, enough: bool, variation: float | None) -> dict:
    removed = {"images": 30, "control_images": 30, "confidence_before": 0.9,
               "confidence_after": 0.5 if needed else 0.88, "flipped": 0.4 if needed else 0.0,
               "control_confidence_before": 0.9, "control_confidence_after": 0.89,
               "control_flipped": 0.0, "needed": needed}
    added = {"images": 30, "to_class_before": 0.0, "to_class_after": 0.6 if enough else 0.02,
             "to_class_control": 0.0, "enough": enough}
    out = {"removed": removed, "added": added}
    if variation is not None:
        out |= {"pixel_variation": variation, "same": variation <= 0.25}
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report of four hand-made flags on 120 digits: a finding about class 3, two unsettled
    clusters of class 4 with disjoint members, a refuted colour hypothesis about class 5."""
    split = load_split("cluttered-digits", "val", 32)
    n = 120
    g = torch.Generator().manual_seed(0)
    maps = torch.rand(n, 8, 8, generator=g).numpy()
    rows = [{"index": i, "label": int(split.labels[i]), "prediction": int(split.labels[i]),
             "confidence": 0.9, "correct": True, "error": "", "cluster": 0,
             "suspicion": float(i % 7) / 7, "in_box": 0.5} for i in range(n)]
    of = {c: [i for i in range(n) if split.labels[i] == c] for c in (3, 4, 5)}
    corner = torch.zeros(8, 8, dtype=torch.bool)
    corner[0, 6:] = True
    left = torch.zeros(8, 8, dtype=torch.bool)
    left[:, 0] = True
    half = len(of[4]) // 2
    flags = [
        Flag("region", 3, "class 3 puts 49% on 2 patches", "remove it", region=corner,
             verdict="finding", effect=_effect(True, True, 0.1), members=of[3]),
        Flag("region", 4, "cluster 1 of class 4", "look", cluster=1, region=left,
             verdict="unsettled", effect=_effect(True, True, 0.9), members=of[4][:half]),
        Flag("region", 4, "cluster 2 of class 4", "look", cluster=2, region=corner,
             verdict="unsettled", effect=_effect(True, False, 1.0), members=of[4][half:]),
        Flag("colour", 5, "class 5's predictions may rest on the colour", "balance",
             verdict="refuted", effect=_effect(False, False, None), members=of[5]),
    ]
    result = Audit("cp-lrp", rows, maps, clusters=[], flags=flags)
    out = tmp_path_factory.mktemp("report")
    write(result, split, out, {"checkpoint": "model.safetensors", "data": "cluttered-digits",
                               "split": "val"})
    return out, flags


def test_the_record_keeps_verdicts_titles_and_each_flags_own_images(report):
    out, flags = report
    record = json.loads((out / "audit.json").read_text())
    assert [f["verdict"] for f in record["findings"]] == ["finding"]
    assert [f["verdict"] for f in record["hypotheses"]] == ["unsettled", "unsettled", "refuted"]
    summary = record["summary"]
    assert (summary["findings"], summary["unsettled"], summary["refuted"]) == (1, 2, 1)
    one, two = record["hypotheses"][:2]
    assert one["title"] != two["title"] and "cluster 1" in one["title"]
    assert set(one["images"]) <= set(flags[1].members)  # each cluster shows its own members
    assert set(two["images"]) <= set(flags[2].members) and not set(one["images"]) & set(
        two["images"])


@pytest.mark.skipif(not (sync_playwright and shutil.which(CHROMIUM)),
                    reason=f"needs Playwright and {CHROMIUM}")
def test_the_page_puts_findings_first_and_hides_refuted_hypotheses_behind_a_toggle(report):
    out, _ = report
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        problems = []
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto((out / "report.html").as_uri())
        headings = page.locator("h2").all_inner_texts()
        assert headings.index("Findings (1)") < next(
            i for i, h in enumerate(headings) if h.startswith("Hypotheses the tests could not"))
        refuted = page.locator("details .refuted h3")
        assert refuted.count() == 1 and not refuted.is_visible()
        page.click("details summary")
        assert refuted.is_visible()
        assert "colour, brightness and contrast for class 5" in refuted.inner_text()
        assert "0.90 -> 0.88" in page.locator("details .refuted").inner_text()  # its numbers
        # every flag has a picture of its own, and every picture decodes
        sources = page.evaluate("[...document.querySelectorAll('.finding img, .unsettled img,"
                                " .refuted img')].map(i => i.src)")
        assert len(sources) == 4 and len(set(sources)) == 4
        assert all(page.evaluate("[...document.images].map(i => i.complete && i.naturalWidth)"))
        text = page.inner_text("body")
        shares = [int(v) for v in re.findall(r"the pixels there vary (\d+)% as much", text)]
        assert sorted(shares) == [10, 90, 100]  # bounded, as a share
        assert "Where:" in text and "rows 0-7 and columns 0-0" in text
        browser.close()
    assert not problems, problems
