"""The explanation benchmarks against the peers (benchmarks/explain_boxes.py and
benchmarks/explain_speed.py) run their code paths on tiny models, so the committed tables can
always be regenerated; the peers' maps land on the model's patch grid."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from doctor_catalogue import TRAINED

import vitkit
from vitkit.explain import explain_map
from vitkit.explain.registry import applicable
from vitkit.viz import plot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import peer_maps  # noqa: E402


def _run(script: str, *args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_boxes_benchmark_scores_vitkit_and_the_peers_alike(tmp_path):
    _run("explain_boxes.py", "--models", str(TRAINED), "--eval", "3", "--random", "2",
         "--steps", "2", "--sanity-images", "2",
         "--peers", "captum-ixg,grad-cam:GradCAM,lxt-attnlrp,chefer-official",
         "--out", str(tmp_path), cwd=tmp_path)
    text = (tmp_path / "explain_boxes.md").read_text()
    assert "## Summary: vitkit's best against the best peer" in text
    assert "chefer-official (no clone of hila-chefer/Transformer-Explainability" in text
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "explain_boxes.csv"))}
    assert set(applicable(vitkit.load_model(TRAINED).cfg)) < set(rows)
    assert {"captum-ixg", "grad-cam:GradCAM", "lxt-attnlrp", "random"} < set(rows)
    assert rows["grad-cam:GradCAM"]["by"] == "pytorch-grad-cam"
    # LXT's AttnLRP, run in its own process on the exported model, orders the patches as
    # vitkit's does: every score agrees
    for key in ("deletion_constant", "insertion_blur", "pointing", "mass_in_box"):
        assert float(rows["lxt-attnlrp"][key]) == pytest.approx(float(rows["attnlrp"][key]),
                                                                abs=1e-4), key
    assert (tmp_path / "explain_boxes.png").stat().st_size > 0


def test_the_speed_benchmark_times_every_method_and_peer(tmp_path):
    out = tmp_path / "speed.md"
    _run("explain_speed.py", "--model", "vit_micro_patch4_32", "--batch", "2", "--repeats", "1",
         "--out", str(out), cwd=tmp_path)
    text = out.read_text()
    model = vitkit.create_model("vit_micro_patch4_32")
    for name in ["forward + backward", *applicable(model.cfg), "captum-ig", "grad-cam:GradCAM",
                 "lxt-attnlrp"]:
        assert f"| {name} |" in text, name
    assert "Not timed: chefer-official" in text


def test_peer_maps_land_on_the_patch_grid_and_follow_the_evidence():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_micro_patch4_32", num_classes=3).eval()
    images = torch.rand(2, 3, 32, 32)
    target = torch.tensor([0, 2])
    for peer in ("captum-ixg", "grad-cam:GradCAM"):
        maps, seconds = peer_maps.peer_maps(peer, model, images, target)
        assert maps.shape == (2, 8, 8) and torch.isfinite(maps).all() and seconds > 0
    # Input x Gradient summed per patch is vitkit's own gradient x input, patch by patch
    x = images.clone().requires_grad_(True)
    model(x).gather(1, target[:, None]).sum().backward()
    expected = peer_maps.to_grid((x * x.grad).sum(1), (8, 8))
    torch.testing.assert_close(peer_maps.peer_maps("captum-ixg", model, images, target)[0],
                               expected, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="unknown peer"):
        peer_maps.peer_maps("shap", model, images, target)
    assert "register tokens" in peer_maps.applies(
        "lxt-attnlrp", vitkit.create_model("vit_micro_patch4_32_reg4"))
    assert explain_map(model, images, "attnlrp").map.shape == (2, 8, 8)


def test_to_grid_sums_each_patch():
    pixels = torch.arange(16.0).reshape(1, 4, 4)
    assert peer_maps.to_grid(pixels, (2, 2)).tolist() == [[[10.0, 18.0], [42.0, 50.0]]]


def test_grouped_bars_draw_one_bar_per_label_and_group():
    fig = plot.figure_grouped_bars({"a": {"x": 0.1, "y": 0.2}, "b": {"x": 0.3}}, ylabel="auc")
    ax = fig.axes[0]
    assert len(ax.patches) == 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["x", "y"]
