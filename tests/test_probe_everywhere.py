"""A backbone with a trained head is a classifier like any other: a headless backbone given a
linear probe by `vitkit train --freeze backbone`, and one fine-tuned with LoRA (merged on
save), are read by `attention`, `trust`, `audit`, `explore` (its session), `doctor`, `eval`
and `predict`; the headless backbone itself is refused by the audit with what to do."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sklearn.datasets
import torch
from PIL import Image
from safetensors.torch import load_file

import vitkit
from vitkit.cli import main
from vitkit.train.config import resolve
from vitkit.train.trainer import train

PHOTOS = Path(sklearn.datasets.__file__).parent / "images"
# a vit_nano_patch4_32 trained on cluttered digits (tests/data/doctor/README.md)
INIT = Path(__file__).parent / "data" / "doctor" / "demo-recipe.safetensors"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The headless backbone, and the run folders of a probe and of a LoRA fine-tune on it."""
    root = tmp_path_factory.mktemp("probes")
    headless = vitkit.save_model(vitkit.load_model(INIT, num_classes=0, verbose=False),
                                 root / "backbone.safetensors")
    base = dict(init=str(headless), data="digits:0-4", img_size=32, batch_size=32,
                data_fraction=0.25, steps=12, warmup_steps=1, out=str(root))
    probe = train(resolve({**base, "name": "probe", "freeze": "backbone", "lr": 5e-3}),
                  progress=False)
    lora = train(resolve({**base, "name": "lora", "lora_rank": 2}), progress=False)
    return headless, probe.run_dir, lora.run_dir


def test_the_probe_is_the_backbone_plus_a_head(runs):
    headless, probe, lora = runs
    backbone = load_file(headless)
    assert not any(k.startswith("head.") for k in backbone)
    for run in (probe, lora):
        saved = load_file(run / "best.safetensors")
        assert saved["head.weight"].shape == (5, backbone["norm.weight"].shape[0])
        assert saved.keys() - {"head.weight", "head.bias"} == backbone.keys()
    probe_state = load_file(probe / "best.safetensors")
    for k, v in backbone.items():  # a probe changes no weight of the backbone
        assert torch.equal(probe_state[k], v), k
    lora_state = load_file(lora / "best.safetensors")
    assert not torch.equal(lora_state["blocks.0.attn.qkv.weight"],
                           backbone["blocks.0.attn.qkv.weight"])  # the adapters, merged


@pytest.mark.parametrize("which", ["probe", "lora"])
def test_every_command_reads_it(runs, which, tmp_path, capsys):
    run = dict(zip(("probe", "lora"), runs[1:], strict=True))[which]
    ckpt = str(run / "best.safetensors")
    out = tmp_path / "attention"
    assert main(["attention", str(PHOTOS / "china.jpg"), "--checkpoint", ckpt,
                 "--method", "attnlrp", "--out", str(out)]) == 0
    assert np.load(out / "china_attnlrp.npy").shape == (8, 8)
    assert main(["trust", ckpt, str(PHOTOS), "--count", "2", "--random", "3", "--steps", "4",
                 "--sanity-images", "2", "--methods", "rollout", "--baselines",
                 "constant"]) == 0
    assert "| rollout |" in capsys.readouterr().out
    assert main(["audit", "--checkpoint", ckpt, "--data", "digits:0-4", "--limit", "48",
                 "--out", str(tmp_path / "audit")]) == 0
    record = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert record["summary"]["images"] == 48
    assert main(["eval", ckpt, "--data", "digits:0-4"]) == 0
    assert main(["predict", ckpt, str(PHOTOS / "china.jpg")]) == 0
    capsys.readouterr()
    for target in (ckpt, str(run)):
        assert main(["doctor", target, "--json"]) in (0, 1)
        text = capsys.readouterr().out
        report = json.loads(text[text.index("{"):])
        assert report["findings"], target
        assert not [f for f in report["findings"] if f["level"] == "error"
                    and f["check"] == "run.learning"], target

    from vitkit.web.session import Explorer

    explorer = Explorer(vitkit.load_model(ckpt, verbose=False))
    image = np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    view = explorer.add_image(Image.fromarray(image))
    shown = explorer.method_map(view, "attnlrp", None)
    assert shown.map.shape == (1, 8, 8)
    assert explorer.model_view(view).shape[-2:] == (8, 8)


def test_the_audit_refuses_a_headless_backbone_and_says_how_to_probe_it(runs, tmp_path,
                                                                         capsys):
    headless = runs[0]
    assert main(["audit", "--checkpoint", str(headless), "--data", "digits", "--limit", "16",
                 "--out", str(tmp_path / "audit")]) == 2
    err = capsys.readouterr().err
    assert "--freeze backbone" in err and "without a classification head" in err
    assert not (tmp_path / "audit" / "audit.json").exists()
