"""`vitkit study` and `vitkit demo`, end to end at toy sizes."""

import base64
import csv
import io
import json
import math
import os
import re
import socket
import statistics

import pytest
import torch
import yaml
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.recipe import study_warmup
from vitkit.train import study, study_report
from vitkit.train import study as engine


def test_crossover_interpolates_in_log_size():
    assert study_report.crossover([10, 100], [0.2, 0.6], [0.4, 0.4]) == pytest.approx(10 ** 1.5)
    above = study_report.crossover([10, 100, 1000], [0.5, 0.6, 0.7], [0.4, 0.5, 0.6])
    assert above is None
    assert study_report.crossover([10, 100], [0.1, 0.2], [0.4, 0.5]) is None  # never


def test_a_difference_of_means_carries_its_standard_error():
    # two arms of three seeds: the standard error of the difference is
    # sqrt(sa^2/na + sb^2/nb), checked against statistics on the raw values
    a, b = [0.90, 0.92, 0.94], [0.88, 0.89, 0.93]
    rows = [{"arm": arm, "images": 100, "top1": v} for arm, vals in (("x", a), ("y", b))
            for v in vals]
    table = study_report.summarise(rows)
    se = (statistics.variance(a) / 3 + statistics.variance(b) / 3) ** 0.5
    assert study_report.difference(table["x"][100], table["y"][100]) == \
        f"{statistics.fmean(a) - statistics.fmean(b):+.3f} ± {se:.3f}"
    # one seed on either side: no error to give, the difference alone
    assert study_report.difference((0.9, 0.0, 1), table["y"][100]) == \
        f"{0.9 - statistics.fmean(b):+.3f}"


# narrow CNNs keep it fast; the default ResNet-18 is the same code path at a larger width
TINY = ["study", "--data", "digits:0-4", "--source", "digits:5-9", "--fractions", "0.5",
        "--seeds", "2", "--epochs", "1", "--min-steps", "2", "--source-steps", "2",
        "--resolution-steps", "2", "--batch-size", "32", "--cnn", "resnet18_w16",
        "--cnn-small", "resnet18_w16"]
LABELS = study.StudyPlan(cnn="resnet18_w16", cnn_small="resnet18_w16")


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    """Every arm of the data study on a tiny budget, weights kept for the checks."""
    out = tmp_path_factory.mktemp("study") / "s"
    assert main([*TINY, "--out", str(out), "--keep-checkpoints"]) == 0
    with open(out / "study.csv") as f:
        return out, list(csv.DictReader(f))


def test_every_arm_runs_and_csv_markdown_and_plot_agree(tiny_study):
    out, rows = tiny_study
    arms = {r["arm"] for r in rows}
    assert arms == {"cnn", "cnn-small", "vit", "vit-deit", "vit-distilled", "vit-pretrained",
                    "cnn-pretrained", "source-vit", "source-cnn", "sweep-light", "sweep-heavy",
                    "res-low", "res-2x", "res-naive"}
    point = [r for r in rows if r["arm"] in study_report.SCRATCH + study_report.PRETRAINED]
    assert len(point) == 2 * 7  # seeds x arms
    md = (out / "study.md").read_text()
    # the table's cells against the CSV's rows, averaged here (not by the report's writer)
    for arm in {r["arm"] for r in point}:
        values = [float(r["top1"]) for r in point if r["arm"] == arm]
        name = study.arm_label(arm, LABELS)
        line = next(x for x in md.splitlines() if x.startswith(f"| {name} |"))
        mean, std = sum(values) / 2, abs(values[0] - values[1]) / 2 ** 0.5
        assert len(values) == 2 and f"{mean:.3f} ± {std:.3f}" in line, (line, values)
    # and the CSV's top-1 against the kept model, scored again by `vitkit eval`'s function
    from vitkit.train.evaluate import evaluate_checkpoint

    run = next(r for r in point if r["arm"] == "vit" and r["seed"] == "0")
    again = evaluate_checkpoint(out / "vit-f0.5-s0" / "last.safetensors", "digits:0-4")
    assert again["top1"] == pytest.approx(float(run["top1"]), abs=1e-6)
    # seeds differ: different subsets and initialisations, so different training losses
    losses = {(out / f"vit-f0.5-s{s}" / "metrics.csv").read_text() for s in (0, 1)}
    assert len(losses) == 2
    for claim in ("## (a)", "## (b)", "## (c)", "## (d)", "augmentation sweep"):
        assert claim in md
    with Image.open(out / "study.png") as img:
        assert img.size[0] > 1000
    plan = json.loads((out / "plan.json").read_text())
    assert plan["budget_rule"].startswith("1 epochs of the subset, at least 2 steps")


def test_the_budget_rule_in_the_plan_is_what_ran(tiny_study):
    out, rows = tiny_study
    for r in rows:
        if r["arm"] in study_report.SCRATCH:
            cfg = yaml.safe_load((out / f"{r['arm']}-f{float(r['fraction']):g}-s{r['seed']}"
                                  / "config.yaml").read_text())
            want = max(2, math.ceil(1 * int(r["images"]) / 32))
            assert cfg["steps"] == want == int(r["steps"]), r
            assert cfg["warmup_steps"] == max(1, round(0.1 * want)), r


def test_the_2x_arm_interpolates_the_table_and_the_naive_resize_is_refused(tiny_study):
    out, rows = tiny_study
    cfg = yaml.safe_load((out / "res-2x-s0" / "config.yaml").read_text())
    assert cfg["img_size"] == 32 and cfg["init"].endswith("vit-f0.5-s0/best.safetensors")
    low = vitkit.load_model(out / "vit-f0.5-s0" / "best.safetensors", verbose=False)
    high = vitkit.load_model(out / "res-2x-s0" / "best.safetensors", verbose=False)
    assert low.pos_embed.shape[1] == 1 + 4 * 4 and high.pos_embed.shape[1] == 1 + 8 * 8
    with pytest.raises(ValueError, match="position table is for 4x4"):
        low(torch.zeros(1, 3, 32, 32))  # the naive resize: the model refuses it
    naive = next(r for r in rows if r["arm"] == "res-naive" and r["seed"] == "0")
    moved = vitkit.load_model(out / "vit-f0.5-s0" / "best.safetensors", img_size=32,
                              verbose=False)
    assert moved.pos_embed.shape[1] == 1 + 8 * 8 and int(naive["steps"]) == 0
    # the 2x run started from the low table, bicubically interpolated (torch's own resize as
    # the reference); two steps at lr 1.25e-4 move it by far less than a fresh table's 0.02
    d = low.pos_embed.shape[-1]
    grid = low.pos_embed[:, 1:].reshape(1, 4, 4, d).permute(0, 3, 1, 2)
    want = torch.nn.functional.interpolate(grid, size=(8, 8), mode="bicubic",
                                           align_corners=False)
    want = torch.cat([low.pos_embed[:, :1], want.permute(0, 2, 3, 1).reshape(1, 64, d)], 1)
    assert (moved.pos_embed - want).abs().max() < 1e-6
    assert (high.pos_embed - want).abs().max() < 5e-3
    # the naive row is the interpolated table's accuracy at 2x, computed here independently
    from vitkit.data.datasets import load_split
    from vitkit.data.images import preprocess
    val = load_split("digits:0-4", "val", 32)
    x = torch.stack([preprocess(val[i][0], (32, 32), (0.5,) * 3, (0.5,) * 3)[0]
                     for i in range(len(val))])
    y = torch.tensor([val[i][1] for i in range(len(val))])
    with torch.no_grad():
        top1 = (moved(x).argmax(-1) == y).float().mean().item()
    assert top1 == pytest.approx(float(naive["top1"]), abs=1e-4)


SMALLEST = ["study", "--data", "digits:0-4", "--source", "none", "--no-resolution",
            "--augmentation", "light", "--fractions", "0.1", "--seeds", "1", "--epochs", "1",
            "--min-steps", "2", "--batch-size", "32", "--cnn", "resnet18_w16", "--cnn-small",
            "resnet18_w16"]
# the teacher first, then the ViT arms, the other CNN last
POINT = ("cnn", "vit", "vit-deit", "vit-distilled", "cnn-small")


def test_the_study_resumes_and_keeps_weights_only_where_needed(tmp_path, monkeypatch, capsys):
    out = tmp_path / "study"
    argv = [*SMALLEST, "--out", str(out)]
    trained = []
    real_train = engine.train
    monkeypatch.setattr(engine, "train", lambda cfg, resume=None: trained.append(cfg.name)
                        or real_train(cfg, resume=resume))
    assert main(argv) == 0
    assert trained == [f"{arm}-f0.1-s0" for arm in POINT]
    printed = capsys.readouterr().err  # progress lines: the vitkit log, on stderr
    assert "[1/5] resnet18_w16, 10%" in printed and "elapsed, about" in printed
    assert "[4/5] ViT distilled from resnet18_w16" in printed
    # the teacher's weights went once its student trained; every run kept config and metrics
    assert not list(out.rglob("*.safetensors")) and not list(out.rglob("state.pt"))
    for arm in POINT:
        assert (out / f"{arm}-f0.1-s0" / "config.yaml").exists()
        assert (out / f"{arm}-f0.1-s0" / "metrics.csv").exists()
    first = (out / "study.csv").read_text()

    trained.clear()  # run again: nothing to do, the same report
    assert main(argv) == 0
    assert trained == [] and "done before" in capsys.readouterr().err
    assert (out / "study.csv").read_text() == first

    (out / "results" / "vit-f0.1-s0.json").unlink()  # a crash during that run
    assert main(argv) == 0
    assert trained == ["vit-f0.1-s0"]


def test_a_run_interrupted_before_its_record_is_resumed_not_retrained(tmp_path, monkeypatch,
                                                                      capsys):
    out = tmp_path / "study"
    argv = [*SMALLEST, "--out", str(out), "--keep-checkpoints"]
    assert main(argv) == 0
    record = out / "results" / "vit-f0.1-s0.json"
    first = json.loads(record.read_text())
    resumed = []
    real_train = engine.train
    monkeypatch.setattr(engine, "train", lambda cfg, resume=None: resumed.append(
        (cfg.name, resume)) or real_train(cfg, resume=resume))
    # the run's folder holds its config and state but no record (the process died after its
    # last checkpoint): it is continued from its state, and ends where it ended
    record.unlink()
    capsys.readouterr()
    assert main(argv) == 0
    assert resumed == [("vit-f0.1-s0", out / "vit-f0.1-s0")]
    assert "vit-f0.1-s0 stopped before it finished: resuming it" in capsys.readouterr().err
    again = json.loads(record.read_text())
    assert again["top1"] == first["top1"] and again["steps"] == first["steps"]
    # a leftover of another plan (here another learning rate) is not resumed: trained again
    record.unlink()
    cfg = out / "vit-f0.1-s0" / "config.yaml"
    cfg.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "lr": 0.5}))
    resumed.clear()
    assert main(argv) == 0
    assert resumed == [("vit-f0.1-s0", None)]
    assert "training it again" in capsys.readouterr().err


def test_a_resumed_study_skips_what_is_done_and_retrains_a_missing_teacher(tiny_study,
                                                                          monkeypatch):
    out, _ = tiny_study  # runs after the checks above: it edits the study's records
    argv = [*TINY, "--out", str(out), "--keep-checkpoints"]
    first = (out / "study.csv").read_text()
    trained = []
    real_train = engine.train
    monkeypatch.setattr(engine, "train", lambda cfg, resume=None: trained.append(cfg.name)
                        or real_train(cfg, resume=resume))
    assert main(argv) == 0
    assert trained == [] and (out / "study.csv").read_text() == first
    (out / "results" / "vit-distilled-f0.5-s0.json").unlink()  # crashed before the student
    for f in (out / "cnn-f0.5-s0").glob("*.safetensors"):
        f.unlink()
    assert main(argv) == 0
    assert trained == ["cnn-f0.5-s0", "vit-distilled-f0.5-s0"]


def test_tiny_patch_study(tmp_path):
    out = tmp_path / "p"
    assert main(["study", "--mode", "patch", "--patch-sizes", "4", "8", "--steps", "2",
                 "--batch-size", "32", "--out", str(out)]) == 0
    md = (out / "patch_study.md").read_text()
    assert "| 4 | 16 | 17 |" in md and "| 8 | 16 | 5 |" in md  # tokens = 1 + (16/P)^2
    # the patch study's runs warm up as the data study's do (one rule: vitkit.recipe)
    cfg = yaml.safe_load((out / "patch4-img16" / "config.yaml").read_text())
    assert cfg["warmup_steps"] == study_warmup(2) == 1 and cfg["warmup_epochs"] == 0
    with Image.open(out / "patch_study.png") as img:
        img.load()


def test_quick_demo_writes_a_report_with_every_section(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().err  # the demo's progress: the vitkit log
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


CONVERGE = ["study", "--budget", "converge", "--data", "digits:0-4", "--source", "none",
            "--fractions", "0.5", "1.0", "--seeds", "1", "--max-epochs", "3", "--patience", "1",
            "--resolution-epochs", "1", "--augmentation", "light", "--distill", "hard", "soft",
            "--teacher", "cnn-small", "--cnn", "resnet18_w16", "--cnn-small", "resnet18_w16",
            "--cnn-fractions", "0.5", "--vit", "vit_nano_patch4_32", "--batch-size", "32"]


def test_a_converge_study_stops_on_the_held_out_loss_and_says_how_each_run_ended(tmp_path):
    out = tmp_path / "c"
    assert main([*CONVERGE, "--out", str(out)]) == 0
    with open(out / "study.csv") as f:
        rows = list(csv.DictReader(f))
    arms = {(r["arm"], r["fraction"]) for r in rows}
    # both distillations from the small CNN; ResNet-18 (--cnn) only at --cnn-fractions
    assert {("vit-soft", "0.5"), ("vit-soft", "1.0"), ("vit-distilled", "1.0")} <= arms
    assert ("cnn", "0.5") in arms and ("cnn", "1.0") not in arms
    for r in rows:
        if r["arm"] == "res-naive":
            continue
        run = out / (r["arm"] + (f"-f{float(r['fraction']):g}" if not r["arm"].startswith(
            "res-") else "") + f"-s{r['seed']}")
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        outcome = json.loads((run / "result.json").read_text())
        # the reported top-1 is the best epoch's on the validation split, chosen on the
        # held-out share of the training split
        assert float(r["top1"]) == pytest.approx(outcome["test_top1"])
        assert int(r["epochs"]) == outcome["epochs"] <= 3 and r["stopped"] == \
            outcome["stopped"]
        assert cfg["holdout"] == 0.05 and cfg["eval_every"] == 1
        if r["arm"].startswith("res-"):  # (d): the same extra epochs, no early stop
            assert cfg["patience"] == 0 and cfg["epochs"] == 1
        else:
            assert cfg["patience"] == 1 and cfg["epochs"] == 3
            assert cfg["warmup_epochs"] == pytest.approx(0.3)
        if r["arm"] == "vit-soft":
            assert cfg["distill"] == "soft" and cfg["distill_tau"] == 3.0
            assert "cnn-small-f" in cfg["teacher"]
    md = (out / "study.md").read_text()
    assert "Epochs trained" in md and "train minus validation top-1" in md
    assert "ViT soft-distilled from resnet18_w16 minus the plain ViT" in md
    plan = json.loads((out / "plan.json").read_text())
    assert plan["budget_rule"].startswith("until the validation loss on 5% of the training")


def test_the_converge_patch_study_uses_the_same_rules(tmp_path):
    out = tmp_path / "p"
    assert main(["study", "--mode", "patch", "--patch-sizes", "8", "--budget", "converge",
                 "--max-epochs", "2", "--patience", "1", "--batch-size", "32",
                 "--out", str(out)]) == 0
    cfg = yaml.safe_load((out / "patch8-img16" / "config.yaml").read_text())
    assert cfg["patience"] == 1 and cfg["holdout"] == 0.05 and cfg["epochs"] == 2
    assert cfg["warmup_epochs"] == pytest.approx(0.2)
    assert "| 8 | 16 | 5 |" in (out / "patch_study.md").read_text()


@pytest.mark.parametrize("flags, message", [
    (["--full", "--converged"], "two presets"),
    (["--budget", "converge", "--holdout", "0.9"], "--holdout is the share"),
    (["--distill", "soft", "--distill-tau", "0"], "--distill-tau must be a positive"),
])
def test_bad_converge_options_are_named(tmp_path, capsys, flags, message):
    assert main(["study", "--out", str(tmp_path / "s"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_two_workers_share_a_study_and_train_every_run_once(tmp_path, capfd):
    out = tmp_path / "w"
    assert main([*CONVERGE, "--workers", "2", "--out", str(out)]) == 0
    printed = capfd.readouterr().err  # every worker's lines: the vitkit log, on stderr
    trained = re.findall(
        r"^vitkit: worker (\d): \[\d+/\d+\] (.+?), (\d+)% \(\d+ images\), seed (\d)",
        printed, re.MULTILINE)
    runs = [(label, pct, seed) for _, label, pct, seed in trained]
    assert len(runs) == len(set(runs)), "a run was trained twice"
    assert {w for w, *_ in trained} == {"0", "1"}, "one worker did all the work"
    records = {p.stem for p in (out / "results").glob("*.json")}
    with open(out / "study.csv") as f:
        assert {r["arm"] for r in csv.DictReader(f)} >= {"vit", "vit-soft", "res-2x"}
    assert len(records) == len(runs) + 1  # + the 2x evaluation without training
    assert not list((out / "claims").iterdir())  # every claim released
    assert not list(out.rglob("*.safetensors"))  # weights went once nothing needed them


def test_a_run_held_by_a_live_worker_is_skipped_and_a_dead_ones_taken_over(tmp_path):
    plan = study.StudyPlan(data="digits:0-4", out=str(tmp_path))
    one = engine.Study(plan, say=lambda _: None)
    claim = tmp_path / "claims" / "vit-f1-s0"
    claim.mkdir(parents=True)
    lock = claim / ".vitkit-train.lock"
    lock.write_text(f"{os.getpid()} {socket.gethostname()}\n")  # a live process holds it
    assert one._claim("vit-f1-s0") is None
    assert one.run_one("vit-f1-s0", "vit", 0, 1.0, {"steps": 1}) is None
    dead = int(open("/proc/sys/kernel/pid_max").read()) + 1
    lock.write_text(f"{dead} {socket.gethostname()}\n")  # its process is gone
    held = one._claim("vit-f1-s0")
    assert held is not None and lock.read_text().split()[0] == str(os.getpid())
    held.release()


def test_workers_must_be_one_or_more(tmp_path, capsys):
    assert main(["study", "--workers", "0", "--out", str(tmp_path / "s")]) == 2
    assert "--workers must be 1 or more" in capsys.readouterr().err


def test_a_study_answers_before_it_runs(tmp_path):
    """Study's attributes are set when it is made: sweep() before run() gives the plan's
    augmentation (or None and no scores for a sweep not run yet), never an AttributeError."""
    named = engine.Study(engine.StudyPlan(out=str(tmp_path / "a"), augmentation="heavy"))
    assert named.sweep() == "heavy" and named.sweep_scores is None and named.rows == []
    swept = engine.Study(engine.StudyPlan(out=str(tmp_path / "b"), augmentation="sweep"))
    assert swept.level is None and swept.sweep_scores is None and swept.total == 0


def test_the_time_left_waits_for_a_target_run_and_is_shared_by_the_workers():
    from types import SimpleNamespace

    from vitkit.train.study import Study

    state = SimpleNamespace(trained=0, spent=0.0, total=10, done=1, workers=2)
    assert "known after the first run" in Study._left(state)  # a source run is no measure
    state.trained, state.spent, state.done = 2, 240.0, 4  # 2 min a run, 6 left, 2 workers
    assert Study._left(state) == "about 6.0 min left"
