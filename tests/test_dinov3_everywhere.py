"""Everything vitkit does, on a DINOv3 model (rotary embeddings, no position table, four
registers after [CLS], LayerScale, a q/v bias): every explanation method, per-head maps with the
registers off the grid, `vitkit attention`, `trust`, `doctor`, `resize`, the ONNX export at two
sizes, the audit and the explorer's session. A small DINOv3 with DINOv3's options and upstream's
[CLS] readout (a head of 10 classes), perturbed so that no map is trivial."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets
import torch
from test_families_rope import sharpened

import vitkit
from vitkit import explain
from vitkit.cli import main
from vitkit.explain.registry import applicable

from peers import max_diff

PHOTOS = Path(sklearn.datasets.__file__).parent / "images"


def dinov3():
    model = vitkit.create_model("vit_small_patch16_dinov3_qkvb", img_size=32, patch_size=4,
                                embed_dim=64, depth=2, num_heads=4, mlp_dim=128, pool="cls",
                                num_classes=10)
    return sharpened(model)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return vitkit.save_model(dinov3(), tmp_path_factory.mktemp("d3") / "dinov3.safetensors")


def test_every_method_and_per_head_maps_keep_the_registers_off_the_grid():
    model = dinov3()
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        logits, maps = model(x, return_attn=True)
    assert maps.num_prefix_tokens == 5 and maps[0].shape == (2, 4, 69, 69)
    heads = explain.cls_attention(maps)  # the [CLS] row over the 8x8 patches only
    assert heads.shape == (2, 4, 8, 8)
    torch.testing.assert_close(heads.flatten(2).sum(-1) + maps[-1][:, :, 0, :5].sum(-1),
                               torch.ones(2, 4))
    assert set(applicable(model.cfg)) >= {"cls", "rollout", "grad-rollout", "chefer", "gradcam",
                                          "attnlrp", "cp-lrp"}
    for method in applicable(model.cfg):
        out = explain.explain_map(model, x, method, budget=True)
        assert out.map.shape == (2, 8, 8) and torch.isfinite(out.map).all(), method
        assert max_diff(out.logits, logits) < 1e-5, method


def test_the_commands_run_on_it(checkpoint, tmp_path, capsys):
    out = tmp_path / "attention"
    assert main(["attention", str(PHOTOS / "china.jpg"), "--checkpoint", str(checkpoint),
                 "--method", "attnlrp", "--out", str(out)]) == 0
    assert np.load(out / "china_attnlrp.npy").shape == (8, 8)
    assert main(["trust", str(checkpoint), str(PHOTOS), "--count", "2", "--random", "3",
                 "--steps", "4", "--sanity-images", "2", "--methods", "rollout", "cp-lrp",
                 "--baselines", "constant"]) == 0
    assert "| cp-lrp |" in capsys.readouterr().out
    assert main(["doctor", str(checkpoint), "--img-size", "64", "--json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    fits = [f for f in report["findings"] if f["check"] == "weights.input_size"]
    assert fits and fits[0]["level"] == "ok" and "no position table" in fits[0]["summary"]
    assert main(["resize", str(checkpoint), str(tmp_path / "r.safetensors"),
                 "--img-size", "48"]) == 0
    resized = vitkit.load_model(tmp_path / "r.safetensors", verbose=False)
    original = vitkit.load_model(checkpoint, verbose=False)
    assert resized.cfg.img_size == (48, 48) and resized.pos_embed is None
    x = torch.rand(1, 3, 48, 48)
    with torch.no_grad():
        assert max_diff(resized(x), original(x)) == 0  # nothing was interpolated


def test_onnx_at_two_sizes(checkpoint, tmp_path):
    import onnxruntime as ort

    assert main(["convert", str(checkpoint), str(tmp_path / "d3.onnx"), "--to", "onnx",
                 "--attention"]) == 0
    session = ort.InferenceSession(str(tmp_path / "d3.onnx"), providers=["CPUExecutionProvider"])
    model = vitkit.load_model(checkpoint, verbose=False)
    for size in [(32, 32), (24, 48)]:
        x = torch.rand(2, 3, *size)
        logits, maps = session.run(None, {"pixel_values": x.numpy()})
        with torch.no_grad():
            ref, ref_maps = model(x, return_attn=True)
        assert max_diff(torch.from_numpy(logits), ref) < 1e-4, size
        assert max_diff(torch.from_numpy(maps), torch.stack(list(ref_maps), 1)) < 1e-5, size


def test_the_audit_and_the_explorer_run_on_it():
    from vitkit.audit import audit
    from vitkit.data.datasets import load_split
    from vitkit.web.session import Explorer

    model = dinov3()
    split = load_split("cluttered-digits", "val", 32, size=40)
    result = audit(model, split, method="cp-lrp", batch_size=64)
    assert len(result.rows) == len(split.labels)
    assert not any(r["error"] for r in result.rows)
    explorer = Explorer(model)
    assert explorer.grid == (8, 8)
    image = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    from PIL import Image

    view = explorer.add_image(Image.fromarray(image))
    shown = explorer.method_map(view, "attnlrp", None)
    assert shown.map.shape == (1, 8, 8) and set(shown.budget) >= {"pixels", "tokens"}
    assert explorer.model_view(view).shape[-2:] == (8, 8)


def test_train_eval_predict_audit_info_and_list_run_on_it(tmp_path, capsys):
    """The rest of the command line on DINOv3: trained from scratch for a few steps (its
    recipe's position table is none: the rotary embeddings), evaluated, predicted, audited,
    described and listed."""
    assert main(["train", "--model", "vit_small_patch16_dinov3", "--data", "digits",
                 "--img-size", "16", "--patch-size", "4", "--batch-size", "32", "--steps", "3",
                 "--warmup-steps", "1", "--out", str(tmp_path), "--name", "d3"]) == 0
    trained = tmp_path / "d3" / "best.safetensors"
    model = vitkit.load_model(trained, verbose=False)
    assert (model.cfg.rope, model.pos_embed, model.num_classes) == ("dinov3", None, 10)
    assert main(["eval", str(trained), "--data", "digits"]) == 0
    assert main(["predict", str(trained), str(PHOTOS / "china.jpg")]) == 0
    assert main(["audit", "--checkpoint", str(trained), "--data", "digits", "--limit", "64",
                 "--out", str(tmp_path / "audit")]) == 0
    assert (tmp_path / "audit" / "audit.json").stat().st_size > 0
    capsys.readouterr()
    assert main(["info", "vit_small_patch16_dinov3"]) == 0
    text = capsys.readouterr().out
    assert "rotary position embeddings (dinov3, base 100)" in text and "21,586,944" in text
    assert main(["list", "dinov3"]) == 0
    assert "vit_7b_patch16_dinov3" in capsys.readouterr().out.split()
