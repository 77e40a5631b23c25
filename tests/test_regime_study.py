"""`vitkit study --mode regime` (train/regime_study.py) on a tiny budget: every arm runs, the
pre-trained arms start from their sources, claim (d) fine-tunes at the larger size with the table
interpolated, the equal-compute arm gets the FLOPs it is owed, and the report's verdicts are the
paired differences of the CSV's rows."""

import csv
import json
import math
import statistics

import pytest
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.train import regime_report
from vitkit.train.regime_study import FINETUNED, REGIME_ARMS

TINY = ["study", "--mode", "regime", "--data", "digits:5-9", "--source", "digits:0-4@both",
        "--mae-source", "digits:0-4@both", "--mae-all", "digits@both-but:5-9",
        "--target-images", "40", "--seeds", "2", "--img-size", "8", "--vit",
        "vit_nano_patch4_32", "--cnn-small", "resnet18_w16", "--max-epochs", "2",
        "--patience", "1", "--anneal-epochs", "1", "--source-epochs", "2",
        "--finetune-epochs", "1", "--resolution-images", "60", "--low-size", "8",
        "--high-size", "16", "--resolution-patch", "2", "--batch-size", "16", "--holdout",
        "0.2"]


@pytest.fixture(scope="module")
def regime(tmp_path_factory):
    out = tmp_path_factory.mktemp("regime") / "r"
    assert main([*TINY, "--out", str(out), "--keep-checkpoints"]) == 0
    with open(out / "study_regime.csv") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.update(seed=int(r["seed"]), top1=float(r["top1"]), images=int(r["images"]))
    return out, rows


def test_every_arm_of_the_plan_runs_once_per_seed(regime):
    out, rows = regime
    per_seed = [a for a in REGIME_ARMS if not a.startswith("source-")]
    for arm in per_seed:
        assert sorted(r["seed"] for r in rows if r["arm"] == arm) == [0, 1], arm
    for arm in FINETUNED.values():  # each source pre-trained once
        assert [r["seed"] for r in rows if r["arm"] == arm] == [0], arm
    target = [r for r in rows if r["arm"] == "vit"]
    assert {r["images"] for r in target} == {40}  # the target size asked for


def test_the_pretrained_arms_start_from_their_sources(regime):
    out, _ = regime
    for arm, source in FINETUNED.items():
        cfg = json.loads((out / f"{arm}-n40-s0" / "run.json").read_text())
        config = (out / f"{arm}-n40-s0" / "config.yaml").read_text()
        assert f"init: {out / source / 'best.safetensors'}" in config, arm
        assert cfg["train_images"] == 40
    mae = (out / "source-mae" / "config.yaml").read_text()
    assert "objective: mae" in mae and "data: digits:0-4@both" in mae
    assert "data: digits@both-but:5-9" in (out / "source-mae-all" / "config.yaml").read_text()
    # the MAE source's checkpoint is an encoder: a plain ViT without the decoder
    encoder = vitkit.load_model(out / "source-mae" / "best.safetensors", verbose=False)
    assert encoder.cfg.embed_dim == 64
    for name in ("vit-n40-s0", "source-vit", "res-low-s0"):  # stop-and-anneal everywhere
        assert "anneal_epochs: 1" in (out / name / "config.yaml").read_text(), name


def test_claim_d_fine_tunes_at_the_larger_size_with_the_same_patches(regime):
    out, rows = regime
    low = vitkit.load_model(out / "res-low-s0" / "best.safetensors", verbose=False)
    high = vitkit.load_model(out / "res-ft-high-s0" / "best.safetensors", verbose=False)
    assert low.cfg.patch_size == high.cfg.patch_size == 2
    assert low.cfg.img_size == (8, 8) and high.cfg.img_size == (16, 16)
    assert high.pos_embed.shape[1] == 1 + 8 * 8  # the table interpolated to the 8x8 grid
    scratch = json.loads((out / "res-scratch-high-s0" / "result.json").read_text())
    low_epochs = json.loads((out / "res-low-s0" / "result.json").read_text())["epochs"]
    from vitkit.models.cost import flops_per_image

    ratio = flops_per_image(low, 8) / flops_per_image(high, 16)
    assert scratch["max_epochs"] == math.ceil(1 + low_epochs * ratio)  # equal compute
    naive = [r for r in rows if r["arm"] == "res-naive"]
    assert all(r["images"] == 60 for r in naive)


def test_the_report_gives_each_claim_the_paired_difference_of_the_csv(regime):
    out, rows = regime
    md = (out / "study_regime.md").read_text()
    by = {(r["arm"], r["seed"]): r["top1"] for r in rows}
    diffs = [by[("vit-pretrained", s)] - by[("vit", s)] for s in (0, 1)]
    mean, se = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(2)
    line = next(x for x in md.splitlines() if "supervised pre-training helps the ViT" in x)
    assert f"{mean:+.3f} ± {se:.3f}" in line
    assert line.rstrip(" |").endswith(regime_report.verdict((mean, se, 2)))
    gains = [(by[("vit-pretrained", s)] - by[("vit", s)])
             - (by[("cnn-pretrained", s)] - by[("cnn", s)]) for s in (0, 1)]
    line = next(x for x in md.splitlines() if "more than the CNN" in x)
    assert f"{statistics.fmean(gains):+.3f}" in line
    assert "patience followed by 1 epochs of annealing" in md
    with Image.open(out / "study_regime.png") as img:
        assert img.size[0] > 600


def test_verdicts_need_two_standard_errors():
    assert regime_report.verdict((0.05, 0.02, 3)) == "holds"
    assert regime_report.verdict((-0.05, 0.02, 3)) == "does not hold"
    assert regime_report.verdict((0.03, 0.02, 3)) == "not settled"
    assert regime_report.verdict(None) == "not measured"


def test_regime_options_belong_to_the_regime_mode(capsys):
    from vitkit.train.regime_study import REGIME_OPTIONS

    assert main(["study", "--target-images", "150"]) == 2
    assert "--target-images is an option of --mode regime" in capsys.readouterr().err
    for flag, kind, _ in REGIME_OPTIONS:  # each of the regime's own flags, refused alike
        value = "fashion-mnist" if kind is str else "2"
        assert main(["study", f"--{flag}", value]) == 2, flag
        assert f"--{flag} is an option of --mode regime" in capsys.readouterr().err
    assert main(["study", "--mode", "regime", "--low-size", "15", "--resolution-patch",
                 "2"]) == 2
    assert "multiples of the patch 2" in capsys.readouterr().err
