"""`vitkit attention` end to end on real photographs shipped with scikit-learn."""

import re
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets
from PIL import Image

import vitkit
from vitkit.cli import main

PHOTOS = Path(sklearn.datasets.__file__).parent / "images"


@pytest.fixture
def checkpoint(tmp_path):
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2, num_classes=6)
    model.cfg.extra["class_names"] = ["ant", "bee", "cat", "dog", "eel", "fox"]
    return vitkit.save_model(model, tmp_path / "tiny.safetensors")


def test_writes_figures_maps_and_prints_top5(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["attention", str(PHOTOS / "china.jpg"), str(PHOTOS / "flower.jpg"),
                 "--checkpoint", str(checkpoint), "--method", "chefer", "--faithfulness",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("  5. ") == 2 and "  6. " not in text
    assert "faithfulness chefer" in text and "faithfulness random" in text
    assert re.search(r"faithfulness chefer .* beats \d+% of 20 random maps \(p [01]\.\d\d\)",
                     text), text
    for stem in ("china", "flower"):
        for suffix in ("heads.png", "mosaic.png", "chefer.png", "faithfulness.png"):
            with Image.open(out / f"{stem}_{suffix}") as img:
                img.load()  # decodes
                assert img.size[0] > 100
        assert np.load(out / f"{stem}_cls_attention.npy").shape == (2, 3, 14, 14)
        assert np.load(out / f"{stem}_chefer.npy").shape == (14, 14)


def test_layer_and_head_choices(checkpoint, tmp_path, capsys):
    assert main(["attention", str(PHOTOS / "china.jpg"), "--checkpoint", str(checkpoint),
                 "--method", "cls", "--layer", "0", "--head", "2", "--out", str(tmp_path)]) == 0
    cls_map = np.load(tmp_path / "china_cls.npy")
    all_maps = np.load(tmp_path / "china_cls_attention.npy")
    np.testing.assert_allclose(cls_map, all_maps[0, 2], atol=1e-6)


def test_gap_model_refuses_cls_and_names_what_applies(tmp_path, capsys):
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2, pool="avg")
    path = vitkit.save_model(model, tmp_path / "gap.safetensors")
    assert main(["attention", str(PHOTOS / "china.jpg"), "--checkpoint", str(path),
                 "--method", "cls", "--out", str(tmp_path / "o")]) == 2
    assert "methods that apply: rollout, grad-rollout, chefer, gradcam" in capsys.readouterr().err
    assert main(["attention", str(PHOTOS / "china.jpg"), "--checkpoint", str(path),
                 "--method", "gradcam", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "china_gradcam.png").exists()


def test_distilled_deit_checkpoint(tmp_path, capsys):
    model = vitkit.create_model("vit_tiny_patch16_224", depth=2, distilled=True)
    path = vitkit.save_model(model, tmp_path / "deit.safetensors")
    assert main(["attention", str(PHOTOS / "flower.jpg"), "--checkpoint", str(path),
                 "--method", "grad-rollout", "--out", str(tmp_path / "o")]) == 0
    assert np.load(tmp_path / "o" / "flower_grad-rollout.npy").shape == (14, 14)


def test_the_verdict_scores_the_map_once_and_reuses_its_deletion_auc(checkpoint, tmp_path,
                                                                     capsys, monkeypatch):
    from vitkit.explain import trust

    passed = []
    real = trust.random_floor

    def spy(*args, **kwargs):
        passed.append(kwargs.get("own_auc"))
        floor = real(*args, **kwargs)
        fresh = real(*args, **{**kwargs, "own_auc": None})  # the map scored again, as before
        np.testing.assert_allclose(floor.percentile.numpy(), fresh.percentile.numpy())
        return floor

    monkeypatch.setattr(trust, "random_floor", spy)
    assert main(["attention", str(PHOTOS / "china.jpg"), "--checkpoint", str(checkpoint),
                 "--method", "chefer", "--faithfulness", "--out", str(tmp_path)]) == 0
    auc = float(re.search(r"faithfulness chefer +deletion AUC ([0-9.]+)",
                          capsys.readouterr().out).group(1))
    assert len(passed) == 1 and passed[0] is not None
    assert float(passed[0][0]) == pytest.approx(auc, abs=5e-4)
