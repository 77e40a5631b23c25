"""Nothing already done is lost: a finished run folder is never silently reused (refused, or
moved aside with --overwrite), two processes never write one folder, an output is replaced only
by a complete new one, one bad file never spoils a batch, and a stopped run resumes exactly."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets
import torch
import yaml
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.train import runfolder

PHOTOS = Path(sklearn.datasets.__file__).parent / "images"
TINY = ["--data", "digits", "--img-size", "16", "--model", "vit_nano_patch4_32",
        "--batch-size", "32", "--warmup-steps", "1"]


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run folder, runs/base."""
    out = tmp_path_factory.mktemp("runs")
    assert main(["train", *TINY, "--steps", "3", "--out", str(out), "--name", "base"]) == 0
    return out / "base"


def test_a_new_run_into_a_finished_run_folder_is_refused(finished, capsys):
    before = _digests(finished)
    code = main(["train", *TINY, "--steps", "2", "--out", str(finished.parent),
                 "--name", "base"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"{finished} already holds a run" in err
    for choice in (f"--resume {finished}", "another --name", "--overwrite"):
        assert choice in err
    assert _digests(finished) == before  # best, last, state, config, metrics, log: untouched


def test_overwrite_moves_the_old_run_aside_and_deletes_nothing(tmp_path, capsys):
    assert main(["train", *TINY, "--steps", "2", "--out", str(tmp_path), "--name", "b"]) == 0
    old = _digests(tmp_path / "b")
    assert main(["train", *TINY, "--steps", "3", "--out", str(tmp_path), "--name", "b",
                 "--overwrite"]) == 0
    (aside,) = tmp_path.glob("b.replaced-*")
    assert _digests(aside) == old
    assert yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())["steps"] == 3
    assert "moved the run that was in" in capsys.readouterr().err
    assert not (tmp_path / "b" / runfolder.LOCK).exists()  # released at the end


def test_a_folder_locked_by_a_live_process_is_refused_at_once(tmp_path, capsys):
    folder = tmp_path / "busy"
    folder.mkdir()
    (folder / runfolder.LOCK).write_text(f"{os.getpid()} {os.uname().nodename}\n")
    start = time.perf_counter()
    assert main(["train", *TINY, "--steps", "2", "--out", str(tmp_path), "--name", "busy"]) == 2
    err = capsys.readouterr().err
    assert f"being written by another vitkit train (PID {os.getpid()}" in err
    assert time.perf_counter() - start < 20  # refused before any data or model is loaded
    assert list(folder.iterdir()) == [folder / runfolder.LOCK]  # nothing written, lock kept


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = tmp_path / "stale"
    folder.mkdir()
    (folder / runfolder.LOCK).write_text(f"{gone.pid} {os.uname().nodename}\n")
    assert main(["train", *TINY, "--steps", "2", "--out", str(tmp_path), "--name", "stale"]) == 0
    assert (folder / "last.safetensors").exists() and not (folder / runfolder.LOCK).exists()


def test_two_trains_started_together_on_one_folder_never_mix(tmp_path):
    argv = [sys.executable, "-m", "vitkit", "train", *TINY, "--steps", "20", "--out",
            str(tmp_path), "--name", "same"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert "being written by another vitkit train" in refused or "already holds a run" in refused
    assert "Traceback" not in refused
    history = [r for r in (tmp_path / "same" / "metrics.csv").read_text().splitlines()[1:]]
    assert history and int(history[-1].split(",")[1]) == 20  # one whole run, not two mixed
    assert not (tmp_path / "same" / runfolder.LOCK).exists()


def test_predict_never_replaces_an_earlier_file_with_a_failed_run(tmp_path, capsys):
    model = vitkit.create_model("vit_nano_patch4_32", num_classes=3)
    vitkit.save_model(model, tmp_path / "vit.safetensors")
    kept = tmp_path / "kept.csv"
    kept.write_text("image,class1\nearlier,result\n")
    (tmp_path / "zero.png").write_bytes(b"")
    assert main(["predict", str(tmp_path / "vit.safetensors"), str(tmp_path / "zero.png"),
                 "--out", str(kept)]) == 2
    assert kept.read_text() == "image,class1\nearlier,result\n"
    assert f"{kept} was not written" in capsys.readouterr().err


@pytest.fixture
def images(tmp_path):
    """Three different pictures sharing the stem x, and one with a name that is not UTF-8."""
    model = vitkit.create_model("vit_nano_patch4_32", num_classes=3)
    vitkit.save_model(model, tmp_path / "vit.safetensors")
    for i, rel in enumerate(("a/x.png", "b/x.png", "x.jpg", os.fsdecode(b"a/caf\xe9.png"))):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        photo = Image.open(PHOTOS / ("china.jpg" if i % 2 else "flower.jpg"))
        photo.rotate(90 * i).resize((48, 40)).save(tmp_path / rel)
    return tmp_path


def test_attention_gives_every_input_its_own_outputs(images, capsys):
    out = images / "out"
    assert main(["attention", str(images / "a"), str(images / "b"), str(images / "x.jpg"),
                 "--checkpoint", str(images / "vit.safetensors"), "--out", str(out)]) == 0
    maps = sorted(str(p.relative_to(out)) for p in out.rglob("*_rollout.npy"))
    assert maps == ["a/caf\\xe9_rollout.npy", "a/x_rollout.npy", "b/x_rollout.npy",
                    "x_rollout.npy"]
    sums = {float(np.load(out / m).sum()) for m in maps}
    assert len(sums) == 4  # four different pictures, four maps
    assert "Traceback" not in capsys.readouterr().err


def test_one_image_that_fails_to_draw_spoils_nothing(images, capsys, monkeypatch):
    """A failure anywhere from reading to writing is that image's alone: it is reported, leaves
    no partial outputs, and the others are done."""
    from vitkit.viz import plot

    real = plot.figure_methods

    def broken(picture, panels, title="", **kw):
        if "x.jpg" in title:
            raise ValueError("the drawing failed")
        return real(picture, panels, title=title, **kw)

    monkeypatch.setattr(plot, "figure_methods", broken)
    out = images / "out"
    assert main(["attention", str(images / "a"), str(images / "x.jpg"),
                 "--checkpoint", str(images / "vit.safetensors"), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "x.jpg: skipped: ValueError: the drawing failed" in printed.err
    assert not list(out.glob("x_*")) and not list(out.glob(".staging-*"))
    assert (out / "a" / "x_rollout.png").exists()


# ------------------------------------------------------------------------------- resuming
@pytest.fixture
def stopped(tmp_path):
    """A finished run folder of 6 steps (its state saved every 2 steps and at the end)."""
    assert main(["train", *TINY, "--steps", "6", "--checkpoint-every", "2", "--out",
                 str(tmp_path), "--name", "r", "--eval-every", "100"]) == 0
    return tmp_path / "r"


def test_a_resume_after_config_yaml_was_edited_lists_what_changed(stopped, capsys):
    cfg = yaml.safe_load((stopped / "config.yaml").read_text())
    cfg.update(batch_size=16, epochs=20, workers=0)
    (stopped / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--resume", str(stopped)]) == 2
    err = capsys.readouterr().err
    assert "config.yaml was edited after the run saved its state" in err
    assert "batch_size 32 -> 16" in err and "epochs 10 -> 20" in err
    assert "Traceback" not in err


def test_a_resume_of_another_programs_state_is_refused(stopped, capsys):
    torch.save({"weights": torch.zeros(3)}, stopped / "state.pt")
    assert main(["train", "--resume", str(stopped)]) == 2
    err = capsys.readouterr().err
    assert "state.pt is not a vitkit training state" in err and "Traceback" not in err
    assert "--init" in err  # the rescue: last.safetensors is intact


def test_a_resume_says_which_steps_it_does_again(stopped):
    state = torch.load(stopped / "state.pt", weights_only=True)
    (stopped / ".progress").write_text(f"{state['step'] + 3}\n")  # the run got 3 steps further
    assert main(["train", "--resume", str(stopped)]) == 0
    log = (stopped / "train.log").read_text()
    assert f"step {state['step']}" in log and "the 3 steps run after it" in log


def test_a_leftover_is_resumed_only_when_it_is_the_same_run(stopped, tmp_path):
    """What a planned run (a study's arm, a benchmark's case) does with a folder an earlier
    attempt left: resume it when its state was saved with the very same config, else remove it."""
    from vitkit.train import config as config_io
    from vitkit.train.resume import leftover

    cfg = config_io.load(stopped / "config.yaml")
    assert leftover(tmp_path / "nothing-here", cfg) is None
    assert leftover(stopped, cfg) == stopped and (stopped / "state.pt").exists()
    other = config_io.resolve({"lr": cfg.lr * 2}, str(stopped / "config.yaml"))
    assert leftover(stopped, other) is None and not stopped.exists()  # another recipe: removed
    half = tmp_path / "half"  # a run stopped before its first state: nothing to resume
    half.mkdir()
    config_io.save(cfg, half / "config.yaml")
    assert leftover(half, cfg) is None and not half.exists()


def test_ctrl_c_saves_the_state_and_the_run_resumes(tmp_path):
    """SIGINT stops a run after its current step with its state saved; the resume does no step
    twice and ends where an uninterrupted run ends."""
    argv = [sys.executable, "-m", "vitkit", "train", *TINY, "--steps", "120", "--out",
            str(tmp_path), "--name", "i", "--eval-every", "1000"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress = tmp_path / "i" / ".progress"
    deadline = time.monotonic() + 300
    while not progress.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=300)
    err = proc.stderr.read()
    assert code == 130, err
    assert "Traceback" not in err
    state = torch.load(tmp_path / "i" / "state.pt", weights_only=True)
    assert 0 < state["step"] < 120
    assert f"interrupted at step {state['step']}" in (tmp_path / "i" / "train.log").read_text()
    assert main(["train", "--resume", str(tmp_path / "i")]) == 0
    log = (tmp_path / "i" / "train.log").read_text()
    assert "no step is done again" in log
    metrics = (tmp_path / "i" / "metrics.csv").read_text().splitlines()
    assert int(metrics[-1].split(",")[1]) == 120
    assert json.loads((tmp_path / "i" / "run.json").read_text())["total_steps"] == 120


def test_each_error_has_one_meaning(tmp_path, monkeypatch):
    """A held lock, a dead study worker and int8 over its budget are not configuration
    mistakes: each has its own type, and the study's "busy" is the lock's type only."""
    from vitkit import errors
    from vitkit.train import study

    folder = tmp_path / "held"
    folder.mkdir()
    (folder / runfolder.LOCK).write_text(f"{os.getpid()} {os.uname().nodename}\n")
    with pytest.raises(errors.LockHeld) as held:
        runfolder.lock(folder)
    assert not isinstance(held.value, errors.ConfigError)
    for kind in (errors.LockHeld, errors.WorkerFailed, errors.OverBudget):
        assert issubclass(kind, errors.VitkitError) and not issubclass(kind, errors.ConfigError)
    # a study worker that finds a run claimed skips it (None); a configuration mistake inside
    # the lock is not taken for "busy"
    s = study.Study(study.StudyPlan(out=str(tmp_path / "s")))
    (tmp_path / "s" / "claims" / "r").mkdir(parents=True)
    (tmp_path / "s" / "claims" / "r" / runfolder.LOCK).write_text(
        f"{os.getpid()} {os.uname().nodename}\n")
    assert s._claim("r") is None

    def broken(folder):
        raise errors.ConfigError("a mistake, not a held lock")

    monkeypatch.setattr(runfolder, "lock", broken)
    with pytest.raises(errors.ConfigError):
        s._claim("x")
