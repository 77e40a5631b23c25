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


# ------------------------------------------------------- the layouts users download them in
X56 = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(0))
SMALL_TOWER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=56,
                   patch_size=14)


@pytest.mark.parametrize("registers", [0, 4], ids=["dinov2", "dinov2-registers"])
def test_hugging_face_dinov2_folders_give_its_features(tmp_path, registers):
    import transformers as T

    if registers:
        peer = T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(
            **SMALL_TOWER, num_register_tokens=registers))
    else:
        peer = T.Dinov2Model(T.Dinov2Config(**SMALL_TOWER))
    perturb(peer).save_pretrained(tmp_path)
    model = vitkit.load_model(tmp_path)
    assert (model.cfg.num_reg_tokens, model.cfg.init_values is not None) == (registers, True)
    with torch.no_grad():
        theirs = peer(pixel_values=X56)
        assert max_diff(model(X56), theirs.pooler_output) < TOL
        assert max_diff(model.forward_features(X56), theirs.last_hidden_state) < TOL


def test_hugging_face_clip_and_siglip_towers_give_their_embeddings(tmp_path, vitkit_log):
    import transformers as T

    clip = perturb(T.CLIPVisionModelWithProjection(T.CLIPVisionConfig(
        **SMALL_TOWER, intermediate_size=128, projection_dim=32)))
    clip.save_pretrained(tmp_path / "clip")
    model = vitkit.load_model(tmp_path / "clip")
    assert (model.cfg.act, model.cfg.head_bias, model.num_classes) == ("quick_gelu", False, 32)
    with torch.no_grad():
        assert max_diff(model(X56), clip(pixel_values=X56).image_embeds) < TOL
    siglip = perturb(T.SiglipVisionModel(T.SiglipVisionConfig(**SMALL_TOWER,
                                                               intermediate_size=128)))
    siglip.save_pretrained(tmp_path / "siglip")
    model = vitkit.load_model(tmp_path / "siglip")
    assert (model.cfg.pool, model.cfg.act, model.cfg.class_token) == ("map", "gelu_tanh", False)
    with torch.no_grad():
        assert max_diff(model(X56), siglip(pixel_values=X56).pooler_output) < TOL
    full = perturb(T.CLIPModel(T.CLIPConfig(
        vision_config=dict(SMALL_TOWER, intermediate_size=128),
        text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64), projection_dim=16)))
    full.save_pretrained(tmp_path / "full")
    model = vitkit.load_model(tmp_path / "full")
    assert "the text tower" in vitkit_log.text and "is ignored" in vitkit_log.text
    with torch.no_grad():
        embeds = full.get_image_features(pixel_values=X56)  # a tensor in transformers 4
        embeds = getattr(embeds, "pooler_output", embeds)
        assert max_diff(model(X56), embeds) < TOL


@pytest.mark.parametrize(("arch", "act"), [("ViT-B-32", "gelu"),
                                           ("ViT-B-32-quickgelu", "quick_gelu")])
def test_open_clip_state_dicts_give_its_image_embeddings(tmp_path, arch, act, vitkit_log):
    import open_clip

    peer = perturb(open_clip.create_model(arch, pretrained=None))
    torch.save(peer.state_dict(), tmp_path / "clip.pth")
    model = vitkit.load_model(tmp_path / "clip.pth", act=act)
    assert "the text tower" in vitkit_log.text
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert max_diff(model(x), peer.encode_image(x)) < TOL
    if act == "gelu":
        assert "GELU assumed" in vitkit_log.text
        (tmp_path / "hub").mkdir()
        torch.save(peer.state_dict(), tmp_path / "hub" / "open_clip_pytorch_model.bin")
        (tmp_path / "hub" / "open_clip_config.json").write_text(json.dumps(
            {"model_cfg": {"quick_gelu": False, "vision_cfg": {"image_size": 224}}}))
        assert vitkit.load_model(tmp_path / "hub").cfg.act == "gelu"
