"""`vitkit study` and `vitkit demo`, end to end at toy sizes."""

import base64
import csv
import io
import re

import pytest
from PIL import Image

from vitkit.cli import main
from vitkit.commands import study


def test_crossover_interpolates_in_log_size():
    assert study.crossover([10, 100], [0.2, 0.6], [0.4, 0.4]) == pytest.approx(10 ** 1.5)
    assert study.crossover([10, 100, 1000], [0.5, 0.6, 0.7], [0.4, 0.5, 0.6]) is None  # above
    assert study.crossover([10, 100], [0.1, 0.2], [0.4, 0.5]) is None  # never


def test_tiny_data_study_writes_consistent_csv_markdown_and_plot(tmp_path):
    out = tmp_path / "study"
    assert main(["study", "--fractions", "0.1", "0.3", "--steps", "3", "--batch-size", "32",
                 "--out", str(out)]) == 0
    with open(out / "study.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and {r["arm"] for r in rows} == set(study.ARMS)
    sizes = sorted({int(r["images"]) for r in rows})
    assert len(sizes) == 2 and sizes[0] < sizes[1]
    md = (out / "study.md").read_text()
    assert f"| {sizes[0]} images | {sizes[1]} images |" in md
    for r in rows:  # every number in the CSV is in the table
        label = study.ARMS[r["arm"]][0]
        line = next(x for x in md.splitlines() if x.startswith(f"| {label} |"))
        assert f"{float(r['top1']):.3f}" in line
    with Image.open(out / "study.png") as img:
        img.load()


def test_the_study_resumes_and_keeps_weights_only_where_needed(tmp_path, monkeypatch, capsys):
    out = tmp_path / "study"
    argv = ["study", "--fractions", "0.1", "--steps", "2", "--batch-size", "32", "--out",
            str(out)]
    trained = []
    real_train = study.train
    monkeypatch.setattr(study, "train", lambda cfg: trained.append(cfg.name) or real_train(cfg))
    assert main(argv) == 0
    assert sorted(trained) == sorted(f"{arm}-f0.1-s0" for arm in study.ARMS)
    printed = capsys.readouterr().out
    assert "[1/4] ResNet-18, 10%" in printed and "elapsed, about" in printed
    assert "[4/4] ViT distilled from the CNN" in printed
    # the teacher's weights went once its student trained; every run kept config and metrics
    assert not list(out.rglob("*.safetensors")) and not list(out.rglob("state.pt"))
    for arm in study.ARMS:
        assert (out / f"{arm}-f0.1-s0" / "config.yaml").exists()
        assert (out / f"{arm}-f0.1-s0" / "metrics.csv").exists()
    first = (out / "study.csv").read_text()

    trained.clear()  # run again: nothing to do, the same report
    assert main(argv) == 0
    assert trained == [] and "done before" in capsys.readouterr().out
    assert (out / "study.csv").read_text() == first

    (out / "results" / "vit-f0.1-s0.json").unlink()  # a crash during that run
    assert main(argv) == 0
    assert trained == ["vit-f0.1-s0"]


def test_a_study_resumed_before_its_student_retrains_the_missing_teacher(tmp_path, monkeypatch):
    out = tmp_path / "study"
    argv = ["study", "--fractions", "0.1", "--steps", "2", "--batch-size", "32", "--out",
            str(out), "--keep-checkpoints"]
    assert main(argv) == 0
    assert len(list(out.rglob("best.safetensors"))) == 4  # --keep-checkpoints keeps them all
    (out / "results" / "vit-distilled-f0.1-s0.json").unlink()
    for f in (out / "cnn-f0.1-s0").glob("*.safetensors"):
        f.unlink()
    trained = []
    real_train = study.train
    monkeypatch.setattr(study, "train", lambda cfg: trained.append(cfg.name) or real_train(cfg))
    assert main(argv[:-1]) == 0
    assert trained == ["cnn-f0.1-s0", "vit-distilled-f0.1-s0"]


def test_tiny_patch_study(tmp_path):
    out = tmp_path / "p"
    assert main(["study", "--mode", "patch", "--patch-sizes", "4", "8", "--steps", "2",
                 "--batch-size", "32", "--out", str(out)]) == 0
    md = (out / "patch_study.md").read_text()
    assert "| 4 | 16 | 17 |" in md and "| 8 | 16 | 5 |" in md  # tokens = 1 + (16/P)^2
    with Image.open(out / "patch_study.png") as img:
        img.load()


def test_quick_demo_writes_a_report_with_every_section(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "report:" in printed and "vit_micro_patch4_32" in printed and "resnet18" in printed
    assert f"vitkit explore --checkpoint {out / 'vit' / 'best.safetensors'}" in printed
    page = (out / "report.html").read_text()
    for section in ("Comparison", "Training curves", "What the ViT attends to"):
        assert f"<h2>{section}</h2>" in page
    for header in ("val top-1", "parameters", "GFLOPs / image", "training time"):
        assert header in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 2 + 3 * 2  # two curves, three figures for each of two images
    for data in images:
        with Image.open(io.BytesIO(base64.b64decode(data))) as img:
            img.load()
            assert img.size[0] > 100
