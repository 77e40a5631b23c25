"""Training to convergence: --patience stops on the validation loss, --holdout keeps the
choice off the validation split (vitkit.train.stopping and the trainer)."""

import csv
import json
import math

import pytest
import torch

import vitkit
from vitkit.cli import main
from vitkit.data.datasets import load_split
from vitkit.train.config import resolve
from vitkit.train.evaluate import evaluate_checkpoint
from vitkit.train.stopping import EarlyStop, holdout_split
from vitkit.train.trainer import evaluate, nested_subset, train


def test_the_counter_stops_after_patience_evaluations_without_a_better_loss():
    stop = EarlyStop(patience=2)
    for epoch, loss in enumerate([1.0, 0.8, 0.9, 0.7, 0.75, 0.71], start=1):
        stop.update(loss, epoch)
    assert stop.stopped and stop.best_epoch == 4 and stop.best_loss == 0.7
    healthy = EarlyStop(patience=2)
    for epoch, loss in enumerate([1.0, 0.9, 0.95, 0.8, 0.85, 0.7], start=1):
        healthy.update(loss, epoch)
    assert not healthy.stopped and healthy.best_epoch == 6
    nan = EarlyStop(patience=2)  # a NaN loss is never an improvement
    for epoch, loss in enumerate([0.5, math.nan, math.nan], start=1):
        nan.update(loss, epoch)
    assert nan.stopped and nan.best_epoch == 1
    never = EarlyStop(patience=0)
    for epoch in range(1, 20):
        never.update(float(epoch), epoch)
    assert not never.stopped and never.best_epoch == 1
    again = EarlyStop.from_state(stop.state(), patience=2)
    assert again == stop


def test_the_holdout_is_the_same_images_for_every_seed_and_never_in_a_subset():
    split = load_split("digits", "train", 16)
    rest, held = holdout_split(split, 0.1)
    rest2, held2 = holdout_split(split, 0.1)
    assert held.images == held2.images and len(held) == round(0.1 * len(split))
    assert len(rest) + len(held) == len(split)
    ids = {id(x) for x in held.images}
    assert not ids & {id(x) for x in rest.images}
    for seed in (0, 1, 2):
        sub = nested_subset(rest, 0.3, seed)
        assert not ids & {id(x) for x in sub.images}
    with pytest.raises(ValueError, match="leaves none to train on"):
        holdout_split(type(split)(split.images[:1], split.labels[:1], split.classes, []), 0.5)


BASE = dict(model="vit_nano_patch4_32", data="digits:0-4", img_size=16, batch_size=32,
            holdout=0.2, eval_every=1, warmup_epochs=0.0)


@pytest.fixture(scope="module")
def overfit(tmp_path_factory):
    """The planted case: 64 images, a high learning rate and 60 epochs allowed; a ViT
    memorises them and its validation loss climbs, so patience must end the run early."""
    out = tmp_path_factory.mktemp("es")
    cfg = resolve({**BASE, "data_fraction": 0.1, "epochs": 60, "patience": 3, "lr": 4e-2,
                   "out": str(out), "name": "overfit"})
    return train(cfg, progress=False)


def test_a_run_that_overfits_stops_on_patience_and_keeps_its_lowest_loss(overfit):
    result = overfit
    o = json.loads((result.run_dir / "result.json").read_text())
    assert o == result.outcome
    assert o["stopped"] == "patience" and o["epochs"] < 60
    with open(result.run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    losses = [float(r["val_loss"]) for r in rows]
    best = min(range(len(losses)), key=losses.__getitem__)
    assert o["best_epoch"] == best + 1 and o["epochs"] == best + 1 + 3 == len(rows)
    assert o["best_val_loss"] == pytest.approx(losses[best])
    assert all(x >= losses[best] for x in losses[best + 1:])
    # best.safetensors is that epoch: its loss on the held-out images, recomputed here
    split = load_split("digits:0-4", "train", 16)
    _, held = holdout_split(split, 0.2)
    model = vitkit.load_model(result.run_dir / "best.safetensors", verbose=False)
    from vitkit.data.transforms import Transformed, eval_transform
    loader = torch.utils.data.DataLoader(
        Transformed(held, eval_transform(16, (0.5,) * 3, (0.5,) * 3), 0), batch_size=128)
    assert evaluate(model, loader, "cpu", 5)["loss"] == pytest.approx(losses[best], rel=1e-5)
    # the validation split was evaluated once, on that checkpoint, and it overfits: train
    # top-1 far above validation
    test = evaluate_checkpoint(result.run_dir / "best.safetensors", "digits:0-4", "val",
                               img_size=16)
    assert o["test_top1"] == pytest.approx(test["top1"], abs=1e-6)
    assert o["test_images"] == len(load_split("digits:0-4", "val", 16))
    assert o["train_top1"] > o["test_top1"]
    log = (result.run_dir / "train.log").read_text()
    assert f"early stop after epoch {o['epochs']}" in log and "held out" in log


def test_a_stopped_run_resumed_trains_no_further(overfit):
    before = (overfit.run_dir / "metrics.csv").read_text()
    again = train(None, resume=overfit.run_dir, progress=False)
    assert (overfit.run_dir / "metrics.csv").read_text() == before
    assert again.outcome["stopped"] == "patience"
    assert again.outcome["epochs"] == overfit.outcome["epochs"]


def test_a_run_still_improving_runs_to_its_maximum(tmp_path):
    """The healthy case: a few epochs on the whole split, loss still falling; patience must
    leave it alone, and the outcome says it ran to the maximum."""
    cfg = resolve({**BASE, "epochs": 3, "patience": 3, "lr": 4e-3, "out": str(tmp_path),
                   "name": "healthy"})
    result = train(cfg, progress=False)
    assert result.outcome["stopped"] == "maximum" and result.outcome["epochs"] == 3
    assert len(result.history) == 3


def test_a_fixed_budget_with_a_holdout_reports_the_split_it_never_chose_on(tmp_path):
    cfg = resolve({**BASE, "steps": 6, "epochs": 1, "lr": 4e-3, "out": str(tmp_path),
                   "name": "fixed"})
    result = train(cfg, progress=False)
    assert result.outcome["stopped"] == "budget" and result.outcome["steps"] == 6
    assert "test_top1" in result.outcome


def test_the_anneal_counter_decays_to_the_floor_and_ends_the_run():
    stop = EarlyStop(patience=2, anneal_epochs=3)
    for epoch, loss in enumerate([1.0, 0.8, 0.9, 0.85], start=1):
        stop.update(loss, epoch)
    assert stop.stopped and not stop.finished(4)  # patience ran out: annealing follows
    stop.begin_anneal(4, step=40, lr=0.01)
    steps = 10  # per epoch
    lrs = [stop.lr(step, steps, 1e-5) for step in range(40, 70)]  # its 30 steps
    assert lrs[-1] == pytest.approx(1e-5)  # the last step at the floor
    assert all(a > b for a, b in zip([0.01, *lrs[:-1]], lrs, strict=True))  # falling each step
    assert lrs[14] == pytest.approx((0.01 + 1e-5) / 2)  # a cosine: half way at half time
    stop.update(0.7, 5)  # a better loss while annealing keeps it annealing
    stop.update(0.75, 6)
    assert stop.stopped and stop.best_epoch == 5 and not stop.finished(6)
    assert stop.finished(7) and stop.best_before_anneal == 0.8
    assert EarlyStop.from_state(stop.state(), 2, 3) == stop
    plain = EarlyStop(patience=2)  # no annealing: patience ends it
    for epoch, loss in enumerate([1.0, 1.1, 1.2], start=1):
        plain.update(loss, epoch)
    assert plain.finished(3)


@pytest.fixture(scope="module")
def annealed(tmp_path_factory):
    """The overfitting case again, with --anneal-epochs 3 after patience runs out."""
    out = tmp_path_factory.mktemp("anneal")
    cfg = resolve({**BASE, "data_fraction": 0.1, "epochs": 60, "patience": 3, "lr": 4e-2,
                   "anneal_epochs": 3, "min_lr": 1e-6, "out": str(out), "name": "annealed"})
    return train(cfg, progress=False)


def test_patience_then_anneal_decays_the_rate_and_keeps_the_lowest_loss(annealed):
    o = annealed.outcome
    assert json.loads((annealed.run_dir / "result.json").read_text()) == o
    assert o["stopped"] == "patience" and o["annealed"] and o["anneal_epochs"] == 3
    stop_epoch = o["anneal_from_epoch"]
    with open(annealed.run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == o["epochs"] == stop_epoch + 3 < 60
    losses = [float(r["val_loss"]) for r in rows]
    # patience ran out at the stop: 3 evaluations after the best before it
    before = losses[:stop_epoch]
    assert min(range(stop_epoch), key=before.__getitem__) + 1 + 3 == stop_epoch
    assert o["best_val_loss_before_anneal"] == pytest.approx(min(before))
    # the best of the whole run, annealing included, is what best.safetensors holds
    best = min(range(len(losses)), key=losses.__getitem__)
    assert o["best_epoch"] == best + 1 and o["best_val_loss"] == pytest.approx(losses[best])
    # the learning rate of each annealing epoch's last step falls from the stop's to the floor
    lrs = [float(r["lr"]) for r in rows]
    anneal = lrs[stop_epoch:]
    assert o["anneal_from_lr"] == pytest.approx(lrs[stop_epoch - 1], rel=0.05)
    assert all(a > b for a, b in zip([o["anneal_from_lr"], *anneal[:-1]], anneal, strict=True))
    assert anneal[-1] == pytest.approx(1e-6)  # --min-lr
    log = (annealed.run_dir / "train.log").read_text()
    assert f"early stop after epoch {stop_epoch}" in log and "annealing: 3 more epochs" in log
    assert "annealed for 3 epochs" in log
    again = train(None, resume=annealed.run_dir, progress=False)  # finished: nothing more
    assert len(again.history) == len(rows) and again.outcome["epochs"] == o["epochs"]


@pytest.mark.parametrize("flags, message", [
    (["--holdout", "0.7"], "holdout must be at most 0.5"),
    (["--patience", "-1"], "patience must be 0 or more"),
    (["--anneal-epochs", "3"], "this run has no --patience"),
    (["--patience", "2", "--anneal-epochs", "-1"], "anneal_epochs must be 0 or more"),
])
def test_bad_stopping_options_are_named(tmp_path, capsys, flags, message):
    assert main(["train", "--out", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err
