"""A checkpoint that lost transformer blocks is refused by every reader that infers the depth
(a gap in the block indices, or fewer blocks than its config states), never loaded as a
shallower model; a bare file whose depth fits no known ViT while a deeper one does is said;
and the doctor reports each as a partial load."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.checkpoints.common import shallower_than_known
from vitkit.diagnose import diagnose
from vitkit.errors import MissingBlocks

from peers import perturb

SMALL_TOWER = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, image_size=56,
                   patch_size=14)


def _vit():
    return perturb(vitkit.create_model("vit_nano_patch4_32", num_classes=10, depth=3))


def _drop(state: dict, pattern: str) -> dict:
    return {k: v for k, v in state.items() if not re.match(pattern, k)}


def _partial(path) -> list:
    return [f for f in diagnose(path) if f.check == "weights.partially_loaded"]


def _timm(tmp_path):
    state = _drop(_vit().state_dict(), r"blocks\.1\.")
    torch.save(state, tmp_path / "w.pth")
    return tmp_path / "w.pth"


def _exported(to: str, block: str, tmp_path):
    name = {"torchvision": "m.pth", "jax": "m.npz"}.get(to, f"m-{to}")
    out = vitkit.export(_vit(), tmp_path / name, to=to)
    weights = out if out.is_file() else next(p for p in out.iterdir()
                                             if p.suffix == ".safetensors")
    if weights.suffix in (".pth", ".pt", ".bin"):
        state = torch.load(weights, weights_only=True)
        torch.save({k: v for k, v in state.items() if block not in k}, weights)
    elif weights.suffix == ".npz":
        with np.load(weights) as z:
            arrays = {k: z[k] for k in z.files if block not in k}
        np.savez(weights, **arrays)
    else:
        save_file({k: v for k, v in load_file(weights).items() if block not in k}, weights)
    return out


def _transformers(kind: str, tmp_path):
    import transformers as T

    peer = {"dinov2": lambda: T.Dinov2Model(T.Dinov2Config(**SMALL_TOWER)),
            "clip": lambda: T.CLIPVisionModel(T.CLIPVisionConfig(**SMALL_TOWER,
                                                                 intermediate_size=128)),
            "siglip": lambda: T.SiglipVisionModel(T.SiglipVisionConfig(
                **SMALL_TOWER, intermediate_size=128))}[kind]()
    peer.save_pretrained(tmp_path / kind)
    weights = tmp_path / kind / "model.safetensors"
    last = SMALL_TOWER["num_hidden_layers"] - 1  # the config still says 3 blocks
    save_file({k: v for k, v in load_file(weights).items()
               if f"layer.{last}." not in k and f"layers.{last}." not in k}, weights)
    return tmp_path / kind


@pytest.mark.parametrize(("make", "missing"), [
    (_timm, [1]),
    (lambda t: _exported("hf", "encoder.layer.1.", t), [1]),
    (lambda t: _exported("torchvision", "encoder_layer_1.", t), [1]),
    (lambda t: _exported("jax", "encoderblock_1/", t), [1]),
    (lambda t: _exported("timm", "blocks.2.", t), [2]),  # the config.json says 3 blocks
    (lambda t: _transformers("dinov2", t), [2]),
    (lambda t: _transformers("clip", t), [2]),
    (lambda t: _transformers("siglip", t), [2]),
], ids=["timm-gap", "hf-gap", "torchvision-gap", "jax-gap", "timm-folder-last",
        "dinov2-last", "clip-last", "siglip-last"])
def test_lost_blocks_are_refused_and_diagnosed(tmp_path, make, missing):
    path = make(tmp_path)
    with pytest.raises(MissingBlocks, match=rf"lacks transformer block\(s\) {missing[0]}") as err:
        vitkit.load_model(path, verbose=False)
    assert err.value.missing == missing
    with pytest.raises(MissingBlocks):  # strict or not: a gap is never a partial model
        vitkit.load_model(path, strict=False, verbose=False)
    found = _partial(path)
    assert found and found[0].level == "error" and found[0].measured["missing_blocks"] == missing


def test_an_open_clip_file_with_a_gap_is_refused(tmp_path):
    import open_clip

    state = open_clip.create_model("ViT-B-32", pretrained=None).state_dict()
    torch.save(_drop(state, r"visual\.transformer\.resblocks\.5\."), tmp_path / "clip.pth")
    with pytest.raises(MissingBlocks, match=r"block\(s\) 5"):
        vitkit.load_model(tmp_path / "clip.pth", verbose=False)


def test_a_bare_file_that_lost_its_last_blocks_is_said(tmp_path, vitkit_log):
    """No index gap shows a lost last block: the depth does, when it fits no known ViT of that
    width while a deeper one does (vit_nano: 4 blocks of width 64)."""
    full = perturb(vitkit.create_model("vit_nano_patch4_32", num_classes=10))
    torch.save(_drop(full.state_dict(), r"blocks\.3\."), tmp_path / "short.pth")
    model = vitkit.load_model(tmp_path / "short.pth")
    assert len(model.blocks) == 3 and "ViT-nano has 4" in vitkit_log.text
    assert "blocks 3-3 are missing" in model.load_record["depth_suspect"]
    found = _partial(tmp_path / "short.pth")
    assert found[0].level == "warning" and "no known ViT has that depth" in found[0].summary
    torch.save(full.state_dict(), tmp_path / "whole.pth")  # the whole file: nothing said
    assert vitkit.load_model(tmp_path / "whole.pth").load_record["depth_suspect"] is None
    assert not _partial(tmp_path / "whole.pth")


def test_known_depths_are_not_suspected():
    assert shallower_than_known(384, 12, 1536) is None  # ViT-S
    assert shallower_than_known(384, 11, 1536).startswith("11 blocks of width 384")
    assert shallower_than_known(100, 3, 200) is None  # no ViT of that width is known
    assert json.dumps(shallower_than_known(768, 6, 3072))  # a string
