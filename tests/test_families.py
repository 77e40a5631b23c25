"""The families built on the plain ViT (DINOv2, DeiT-III, CLIP's image tower, SigLIP) against
timm: every registered name has timm's parameters and state-dict keys, and timm's weights give
timm's outputs."""

import json

import pytest
import timm
import torch
from conftest import small_vit
from safetensors.torch import save_file

import vitkit
from vitkit import CheckpointError
from vitkit.models import inference
from vitkit.models.registry import _FAMILY_MODELS

from peers import logits, max_diff, perturb

FAMILY_NAMES = [name for name, *_ in _FAMILY_MODELS]
# the smallest of each family, for the forward comparisons (DINOv2 at 224: same arithmetic)
ONE_PER_FAMILY = ["vit_small_patch14_dinov2", "vit_small_patch14_reg4_dinov2",
                  "deit3_small_patch16_224", "vit_base_patch32_clip_224",
                  "vit_base_patch32_clip_quickgelu_224", "vit_base_patch16_siglip_224"]
TOL = 1e-4


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_parameters_and_keys_equal_timm(name):
    with torch.device("meta"):
        theirs, ours = timm.create_model(name), vitkit.create_model(name)
    assert sum(p.numel() for p in ours.parameters()) == \
        sum(p.numel() for p in theirs.parameters())
    assert {k: v.shape for k, v in ours.state_dict().items()} == \
        {k: v.shape for k, v in theirs.state_dict().items()}


def _peer(name):
    size = dict(img_size=224) if "dinov2" in name else {}
    return perturb(timm.create_model(name, **size)), size


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_timm_weights_give_timms_outputs(name, tmp_path):
    """A timm hub folder (config.json + model.safetensors) loads to timm's logits/features."""
    peer, size = _peer(name)
    folder = tmp_path / "hub"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()},
              folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "architecture": name, "num_classes": peer.num_classes,
        "pretrained_cfg": {"input_size": [3, *peer.patch_embed.img_size]}}))
    model = vitkit.load_model(folder)
    assert (model.cfg.act, model.cfg.pre_norm, model.cfg.pool) == \
        (vitkit.create_model(name, **size).cfg.act, vitkit.create_model(name).cfg.pre_norm,
         vitkit.create_model(name).cfg.pool)
    x = torch.randn(2, 3, 224, 224)
    assert max_diff(logits(model, x), logits(peer, x)) < TOL
    with torch.no_grad():
        assert max_diff(model.forward_features(x), peer.forward_features(x)) < TOL


def test_a_bare_clip_state_dict_loads_and_says_what_it_assumed(tmp_path, vitkit_log):
    peer, _ = _peer("vit_base_patch32_clip_224")
    torch.save(peer.state_dict(), tmp_path / "clip.pth")
    model = vitkit.load_model(tmp_path / "clip.pth")
    assert model.cfg.pre_norm and not model.cfg.patch_bias
    assert "eps 1e-5 and GELU assumed; OpenAI CLIP weights use QuickGELU" in vitkit_log.text
    assert model.cfg.norm_eps == 1e-5  # not in the weights: CLIP's, said in the log
    x = torch.randn(1, 3, 224, 224)
    assert max_diff(logits(model, x), logits(peer, x)) < TOL


@pytest.mark.parametrize("kw", [dict(init_values=1e-5), dict(act="quick_gelu"),
                                dict(act="gelu_tanh"), dict(pre_norm=True, patch_bias=False),
                                dict(pool="map", class_token=False)],
                         ids=["layerscale", "quickgelu", "gelu-tanh", "pre-norm", "map"])
def test_options_run_on_the_standard_path_and_agree_with_timm(kw):
    model = small_vit(scale=0.1, **kw)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fused = model(x)
        assert inference.applies(model, x) == ("init_values" not in kw and "act" not in kw)
    with torch.enable_grad():
        standard = model(x)
    torch.testing.assert_close(fused, standard.detach(), atol=1e-5, rtol=1e-5)
    twin = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=4, embed_dim=48, depth=3, num_heads=4, mlp_ratio=2.0,
        num_classes=7, init_values=kw.get("init_values"), pre_norm=kw.get("pre_norm", False),
        act_layer=kw.get("act", "gelu"), class_token=kw.get("class_token", True),
        global_pool="map" if kw.get("pool") == "map" else "token").eval()
    twin.load_state_dict(model.state_dict())
    assert max_diff(logits(twin, x), fused) < 1e-5


def test_map_head_attention_is_a_readout_map_that_sums_to_one():
    model = small_vit(scale=0.1, pool="map", class_token=False)
    with torch.no_grad():
        tokens = model.forward_features(torch.randn(3, 3, 32, 32))
        pooled, attn = model.attn_pool(tokens, return_attn=True)
    assert attn.shape == (3, 4, 64)
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, 4))
    torch.testing.assert_close(pooled, model.attn_pool(tokens))


def test_timm_export_of_the_new_options_round_trips(tmp_path):
    for kw in (dict(pre_norm=True, patch_bias=False, head_bias=False, act="quick_gelu"),
               dict(pool="map", class_token=False, init_values=1e-4)):
        model = small_vit(scale=0.1, **kw)
        vitkit.export(model, tmp_path / "t", to="timm")
        back = vitkit.load_model(tmp_path / "t")
        x = torch.randn(2, 3, 32, 32)
        assert max_diff(logits(back, x), logits(model, x)) < 1e-6


@pytest.mark.parametrize(("to", "kw", "reason"), [
    ("hf", dict(init_values=1e-5), "has LayerScale"),
    ("jax", dict(pre_norm=True), "has a LayerNorm before the blocks"),
    ("torchvision", dict(act="quick_gelu"), "uses quick_gelu"),
    ("hf", dict(pool="map", class_token=False), "pools by attention"),
    ("timm", dict(pre_norm=True), "timm's pre-norm ViT has no patch bias"),
])
def test_layouts_refuse_what_they_cannot_hold(tmp_path, to, kw, reason):
    model = small_vit(**kw)
    dst = {"hf": "hf", "jax": "m.npz", "torchvision": "m.pth", "timm": "m.pth"}[to]
    with pytest.raises(CheckpointError, match=reason):
        vitkit.export(model, tmp_path / dst, to=to)
