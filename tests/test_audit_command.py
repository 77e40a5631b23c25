"""``vitkit audit`` as a user runs it: the folder it writes, resuming, bad input (exit 2), image
folders with broken files, and two torchrun ranks equal to one process."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import vitkit
from vitkit.audit.report import COLUMNS
from vitkit.data.datasets import load_split

DATA = Path(__file__).parent / "data" / "audit"
CLEAN = str(DATA / "clean.safetensors")


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "vitkit.cli", "audit", *args],
                          capture_output=True, text=True, env=env)


def maps(folder):
    with np.load(Path(folder) / "maps.npz") as z:
        return z["maps"], z["index"]


def test_the_folder_holds_every_output_and_a_resume_redoes_only_what_is_missing(tmp_path):
    out = tmp_path / "a"
    args = ["--checkpoint", CLEAN, "--data", "cluttered-digits", "--limit", "300",
            "--shard-size", "128", "--batch-size", "64", "--out", str(out)]
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    assert "images/s, ETA" in first.stderr and "300/300 images (100%)" in first.stderr
    for name in ("audit.json", "audit.csv", "maps.npz", "audit.png", "report.html",
                 "audit-options.json"):
        assert (out / name).stat().st_size > 0, name
    assert sorted(p.name for p in (out / "shards").iterdir()) == [
        "00000.npz", "00001.npz", "00002.npz"]
    rows = list(csv.DictReader((out / "audit.csv").open()))
    assert tuple(rows[0]) == COLUMNS and len(rows) == 300
    suspicion = [float(r["suspicion"]) for r in rows]
    assert suspicion == sorted(suspicion, reverse=True)  # most suspicious first
    assert rows[0]["path"].startswith("cluttered-digits[val]#")
    record = json.loads((out / "audit.json").read_text())
    assert record["summary"]["images"] == 300 and record["findings"] == []
    assert all((out / p["file"]).is_file() for p in record["images"])
    page = (out / "report.html").read_text()
    assert f"vitkit explore --audit {out}" in page and "data:image/png;base64," in page
    assert "src='http" not in page and 'src="http' not in page  # self-contained
    before, index = maps(out)
    assert before.shape == (300, 8, 8) and index.tolist() == list(range(300))

    (out / "shards" / "00001.npz").unlink()  # as if interrupted during the second shard
    (out / "audit.json").unlink()
    again = cli(*args)
    assert again.returncode == 0, again.stderr
    assert "resuming, 172 of 300 images already scanned" in again.stderr
    np.testing.assert_array_equal(maps(out)[0], before)
    assert json.loads((out / "audit.json").read_text())["clusters"] == record["clusters"]

    other = cli(*args[:-2], "--method", "chefer", "--out", str(out))
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "other options" in other.stderr and "'cp-lrp' -> 'chefer'" in other.stderr


def _pictures(folder: Path, count: int) -> None:
    split = load_split("cluttered-digits", "val", 32)
    folder.mkdir(parents=True)
    for i in range(count):
        split[i][0].save(folder / f"{i:03d}.png")


def test_a_folder_without_classes_is_audited_and_a_broken_file_is_a_row(tmp_path):
    _pictures(tmp_path / "imgs", 20)
    (tmp_path / "imgs" / "broken.png").write_bytes(b"\x89PNG not really")
    r = cli("--checkpoint", CLEAN, "--data", str(tmp_path / "imgs"), "--out",
            str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    rows = {Path(row["path"]).name: row for row in csv.DictReader(
        (tmp_path / "a" / "audit.csv").open())}
    assert len(rows) == 21 and "cannot read" in rows["broken.png"]["error"]
    good = rows["000.png"]
    assert good["error"] == "" and good["label"] == "-1" and good["correct"] == ""
    assert 0 < float(good["confidence"]) <= 1 and good["in_box"] == ""  # no boxes in a folder


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    path = tmp_path_factory.mktemp("headless") / "features.safetensors"
    vitkit.save_model(vitkit.create_model("vit_nano_patch4_32", num_classes=0), path)
    return str(path)


@pytest.mark.parametrize(("case", "expected"), [
    ("no-folder", "no such folder"),
    ("empty-folder", "holds no image file"),
    ("unreadable", "none of the 2 images"),
    ("unknown-spec", "unknown dataset"),
    ("method", "does not apply to this model"),
    ("headless", "without a classification head"),
    ("limit", "--limit must be 1 or more"),
])
def test_bad_input_is_one_message_and_exit_2(tmp_path, headless, case, expected):
    data, checkpoint, extra = "cluttered-digits", CLEAN, []
    if case == "no-folder":
        data = str(tmp_path / "nowhere")
    elif case == "empty-folder":
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "notes.txt").write_text("no pictures here")
        data = str(tmp_path / "empty")
    elif case == "unreadable":
        (tmp_path / "bad").mkdir()
        for name in ("a.png", "b.jpg"):
            (tmp_path / "bad" / name).write_bytes(b"not an image")
        data = str(tmp_path / "bad")
    elif case == "unknown-spec":
        data = "imagenet-21k"
    elif case == "method":
        extra = ["--method", "map"]
    elif case == "headless":
        checkpoint = headless
    elif case == "limit":
        extra = ["--limit", "0"]
    r = cli("--checkpoint", checkpoint, "--data", data, "--out", str(tmp_path / "a"), *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert expected in r.stderr and "Traceback" not in r.stderr


def test_two_torchrun_ranks_equal_one_process(tmp_path):
    common = ["--checkpoint", CLEAN, "--data", "cluttered-digits", "--limit", "320",
              "--shard-size", "64", "--batch-size", "32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = cli(*common, "--out", str(tmp_path / "one"), env=env)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          "-m", "vitkit.cli", "audit", *common, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, env=env)
    assert two.returncode == 0, two.stderr
    assert two.stdout.count("wrote ") == 1  # rank 0 writes, once
    a, b = maps(tmp_path / "one")[0], maps(tmp_path / "two")[0]
    torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), atol=1e-6, rtol=0)
    ja = json.loads((tmp_path / "one" / "audit.json").read_text())
    jb = json.loads((tmp_path / "two" / "audit.json").read_text())
    for key in ("summary", "findings", "hypotheses", "ranked"):
        assert ja[key] == jb[key], key
    assert [(c["class"], c["size"], c["typical"]) for c in ja["clusters"]] == [
        (c["class"], c["size"], c["typical"]) for c in jb["clusters"]]


def _audit(tmp_path, checkpoint, data, split, limit):
    from vitkit.audit import store
    from vitkit.audit.report import write

    out = tmp_path / "audit"
    result = store.run(checkpoint, data, out, split=split, limit=limit, batch_size=128,
                       say=lambda line: None)
    write(result, result.split, out, store.read_options(out))
    return out


@pytest.fixture(scope="module")
def marked(tmp_path_factory):
    """An audit folder of the planted-shortcut model on 600 marked training images."""
    return _audit(tmp_path_factory.mktemp("marked"), str(DATA / "marked.safetensors"),
                  "cluttered-digits+mark:3", "train", 600)


def test_the_doctor_reports_a_confirmed_shortcut_and_nothing_on_a_clean_model(tmp_path,
                                                                               marked):
    from vitkit.diagnose import diagnose, to_text

    findings = diagnose(marked)
    warned = [f for f in findings if f.level == "warning"]
    assert any(f.check == "audit.region"
               and "relies on a fixed region for class 3" in f.summary for f in warned), \
        to_text(findings, str(marked))
    assert all("class 3" in f.summary for f in warned)
    assert "report.html" in warned[0].fix
    clean = _audit(tmp_path / "c", CLEAN, "cluttered-digits", "val", 300)
    assert [(f.check, f.level) for f in diagnose(clean)] == [("audit.shortcuts", "ok")]
    # the committed example's clean model: patterns that the tests refuted are no alarm, and
    # the titles are the audit's own
    example = Path(__file__).parents[1] / "examples" / "audit-shortcut" / "clean"
    record = json.loads((example / "audit.json").read_text())
    tmp = tmp_path / "example"
    tmp.mkdir()
    (tmp / "audit.json").write_text(json.dumps(record))
    refuted = sum(h["verdict"] == "refuted" for h in record["hypotheses"])
    unsettled = [h["title"] for h in record["hypotheses"] if h["verdict"] == "unsettled"]
    found = diagnose(tmp)
    assert record["findings"] == []
    if unsettled:
        assert [(f.check, f.level) for f in found] == [("audit.hypotheses", "unknown")]
        assert all(t in found[0].summary for t in unsettled)
    else:
        assert [(f.check, f.level) for f in found] == [("audit.shortcuts", "ok")]
        assert (f"{refuted} pattern(s) in the data were tested and refuted" in found[0].summary
                if refuted else "refuted" not in found[0].summary)


def test_a_model_that_has_not_learned_the_task_is_said_so(tmp_path):
    """An untrained model is right on about a tenth of the digits: the command, the report and
    the doctor say that its findings describe how it errs (the clean model above has no such
    warning)."""
    from vitkit.diagnose import diagnose

    model = vitkit.load_model(CLEAN)
    torch.manual_seed(0)
    for p in model.parameters():  # the same architecture, weights drawn again: untrained
        p.data = torch.randn_like(p) * 0.02
    vitkit.save_model(model, tmp_path / "untrained.safetensors")
    out = tmp_path / "a"
    done = cli("--checkpoint", str(tmp_path / "untrained.safetensors"), "--data",
               "cluttered-digits", "--split", "val", "--limit", "200", "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "audit.json").read_text())["summary"]
    assert summary["accuracy"] < 0.5
    assert f"right on {summary['accuracy']:.0%} of the 200 labelled images (chance 10%)" in (
        summary["warning"])
    assert "warning: the model is right on" in done.stderr
    assert "has not learned the task" in (out / "report.html").read_text()
    warned = [f for f in diagnose(out) if f.check == "audit.accuracy"]
    assert len(warned) == 1 and warned[0].level == "warning"


def test_the_doctor_says_an_unfinished_audit_is_unfinished(tmp_path):
    from vitkit.diagnose import diagnose
    from vitkit.errors import DataError

    (tmp_path / "audit-options.json").write_text("{}")
    with pytest.raises(DataError, match="unfinished audit"):
        diagnose(tmp_path)


def test_the_explorer_opens_an_audit_folder_flag_first(marked):
    from fastapi.testclient import TestClient

    from vitkit.web.app import create_app
    from vitkit.web.samples import sample_table
    from vitkit.web.session import Explorer

    model = vitkit.load_model(DATA / "marked.safetensors", verbose=False)
    app = create_app(Explorer(model), token="t", host="127.0.0.1", port=8765,
                     samples=sample_table(audit=marked))
    client = TestClient(app, base_url="http://127.0.0.1:8765", headers={"X-Vitkit-Token": "t"})
    info = client.get("/api/model").json()
    groups = list(dict.fromkeys(s["group"] for s in info["samples"]))
    assert groups[0].startswith("audit: the model relies on a fixed region for class 3"), groups
    assert "audit: most suspicious images" in groups
    assert any(g.startswith("audit: class 3, cluster 0") for g in groups)
    first = info["samples"][0]
    assert first["label"].startswith("#") and "predicted 3" in first["label"]
    view = client.post("/api/sample", params={"id": first["id"]})
    assert view.status_code == 200, view.text
    assert view.json()["box"] is not None  # the digit's box travels with the audit's image
    record = json.loads((marked / "audit.json").read_text())
    index = int(first["label"][1:].split()[0])
    assert index in record["findings"][0]["images"]
