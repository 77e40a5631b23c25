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
from vitkit import CheckpointError, explain
from vitkit.models import inference
from vitkit.models.registry import _FAMILY_MODELS

from peers import logits, max_diff, perturb

# the families on timm's VisionTransformer (those on timm's Eva: tests/test_families_rope.py)
FAMILY_NAMES = [name for name, _, _, _, family, _ in _FAMILY_MODELS
                if family in ("dinov2", "reg4_dinov2", "deit3", "clip", "clip_quickgelu",
                              "siglip")]
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
def test_options_run_on_the_in_place_path_and_agree_with_timm(kw):
    model = small_vit(scale=0.1, **kw)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fused = model(x)
        assert inference.applies(model, x)  # every option: the in-place arithmetic
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
    ("hf", dict(init_values=1e-5), r"has a head \(Dinov2Model is a backbone"),
    ("jax", dict(pre_norm=True), "has a LayerNorm before the blocks"),
    ("torchvision", dict(act="quick_gelu"), "uses quick_gelu"),
    ("hf", dict(pool="map", class_token=False), r"has a head \(SiglipVisionModel"),
    ("hf", dict(pre_norm=True, patch_bias=False), "has a head with a bias"),
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
        for side in (84, 42, 70):  # other sizes: the table interpolated as Dinov2Model does
            x = torch.randn(2, 3, side, side)
            assert max_diff(model(x), peer(pixel_values=x).pooler_output) < TOL


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


# ------------------------------------------------------------------------------ hub ids
SHA = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root, repo="acme/tiny-vit", rev=SHA):
    """A hub cache in huggingface_hub's layout (models--ORG--NAME/snapshots/REV, refs/main),
    filled with a model written here: the real resolution path, with no network."""
    org, name = repo.split("/")
    base = root / "hub" / f"models--{org}--{name}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(rev)
    model = perturb(vitkit.create_model("vit_nano_patch4_32", num_classes=3))
    vitkit.export(model, base / "snapshots" / rev, to="timm")
    return model


_LOAD_BY_ID = """
import sys, torch, vitkit
x = torch.load(sys.argv[1], weights_only=True)
for source in ("hf-hub:acme/tiny-vit", "acme/tiny-vit", "hf-hub:acme/tiny-vit@" + sys.argv[2]):
    m = vitkit.load_model(source, verbose=False)
    print(m.load_record["format"], m(x).tolist())
try:
    vitkit.load_model("hf-hub:acme/missing")
except vitkit.CheckpointError as err:
    print("ERROR", err)
"""


def test_hub_ids_load_from_the_cache_offline(tmp_path):
    import os
    import subprocess
    import sys

    model = _hub_cache(tmp_path)
    x = torch.randn(1, 3, 32, 32)
    torch.save(x, tmp_path / "x.pt")
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", _LOAD_BY_ID, str(tmp_path / "x.pt"), SHA],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    expected = torch.tensor(logits(model, x).tolist())
    for line in lines[:3]:
        fmt, values = line.split(" ", 1)
        assert fmt == "timm"
        assert torch.allclose(torch.tensor(json.loads(values)), expected, atol=1e-6)
    assert "acme/missing is not in the local hub cache" in lines[3]
    assert "HF_HUB_OFFLINE is set" in lines[3] and "hf download acme/missing" in lines[3]


def test_a_missing_local_path_is_not_taken_for_a_hub_id(tmp_path, monkeypatch):
    from vitkit.checkpoints import hub

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert not hub.is_hub_id("runs/typo")
    assert not hub.is_hub_id("models/vit.pth")
    assert hub.is_hub_id("facebook/dinov2-small") and hub.is_hub_id("hf-hub:timm/vit_x.in1k")
    with pytest.raises(CheckpointError, match="no such file or folder: runs/typo"):
        vitkit.load_model("runs/typo")


@pytest.mark.parametrize(("name", "kw", "says"), [
    ("beit_base_patch16_224", {}, "relative position bias (BEiT"),
    ("vit_base_patch16_224", dict(qk_norm=True), "query/key normalisation"),
])
def test_variants_vitkit_cannot_express_are_refused_with_what_is_missing(tmp_path, name, kw,
                                                                        says):
    peer = timm.create_model(name, depth=1, **{"embed_dim": 64, "num_heads": 2, **kw})
    torch.save(peer.state_dict(), tmp_path / "m.pth")
    with pytest.raises(CheckpointError, match=r"a ViT variant vitkit cannot express: it has .*"
                                              + says.replace("(", r"\(")):
        vitkit.load_model(tmp_path / "m.pth")


def test_a_big_vision_map_head_npz_is_read_like_timm_reads_it(tmp_path):
    """SigLIP-style .npz with a MAPHead_0: written by vitkit, read by timm's own npz reader
    and by vitkit, the same logits."""
    import numpy as np
    from timm.models.vision_transformer import _load_weights

    from vitkit.checkpoints import jax as jax_format

    model = small_vit(scale=0.1, pool="map", class_token=False)
    np.savez(tmp_path / "siglip.npz", **jax_format.from_vitkit(model))
    peer = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=4, embed_dim=48, depth=3, num_heads=4, mlp_ratio=2.0,
        num_classes=7, class_token=False, global_pool="map").eval()
    _load_weights(peer, str(tmp_path / "siglip.npz"))
    back = vitkit.load_model(tmp_path / "siglip.npz")
    assert back.cfg.pool == "map"
    x = torch.randn(2, 3, 32, 32)
    assert max_diff(logits(peer, x), logits(model, x)) < 1e-5
    assert max_diff(logits(back, x), logits(model, x)) < 1e-6


@pytest.mark.parametrize(("kw", "peer_class"), [
    (dict(init_values=0.5, num_classes=0), "Dinov2Model"),
    (dict(init_values=0.5, num_reg_tokens=4, no_embed_class=True, num_classes=0),
     "Dinov2WithRegistersModel"),
    (dict(pre_norm=True, patch_bias=False, head_bias=False, act="quick_gelu", norm_eps=1e-5),
     "CLIPVisionModelWithProjection"),
    (dict(pool="map", class_token=False, num_classes=0, act="gelu_tanh"), "SiglipVisionModel"),
], ids=["dinov2", "dinov2-registers", "clip", "siglip"])
def test_hf_export_of_the_families_loads_in_transformers(tmp_path, kw, peer_class):
    import transformers as T

    model = small_vit(scale=0.1, **kw)
    vitkit.export(model, tmp_path / "hf", to="hf")
    peer = getattr(T, peer_class).from_pretrained(tmp_path / "hf").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = peer(pixel_values=x)
    theirs = getattr(out, "image_embeds", None)
    theirs = theirs if theirs is not None else out.pooler_output
    assert max_diff(theirs, logits(model, x)) < TOL
    assert max_diff(logits(vitkit.load_model(tmp_path / "hf"), x), logits(model, x)) < 1e-6


@pytest.mark.parametrize("name", ["deit3_small_patch16_224", "vit_base_patch32_clip_224",
                                  "vit_base_patch16_siglip_224"])
def test_after_a_resize_the_families_equal_timm(tmp_path, name):
    """Loaded at another size, the table is resampled as timm's resample_abs_pos_embed
    (bicubic, antialias off) does: the same logits as timm's model built at that size."""
    from timm.layers import resample_abs_pos_embed

    peer = perturb(timm.create_model(name))
    torch.save(peer.state_dict(), tmp_path / "m.pth")
    (tmp_path / "hub").mkdir()
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()},
              tmp_path / "hub" / "model.safetensors")
    (tmp_path / "hub" / "config.json").write_text(json.dumps({"architecture": name}))
    model = vitkit.load_model(tmp_path / "hub", img_size=288, verbose=False)
    state = peer.state_dict()
    patch = peer.patch_embed.patch_size[0]
    old, new = 224 // patch, 288 // patch
    state["pos_embed"] = resample_abs_pos_embed(
        state["pos_embed"], (new, new), (old, old), num_prefix_tokens=0 if peer.no_embed_class
        else peer.num_prefix_tokens, interpolation="bicubic", antialias=False)
    resized = timm.create_model(name, img_size=288).eval()
    resized.load_state_dict(state)
    x = torch.randn(2, 3, 288, 288)
    assert max_diff(logits(model, x), logits(resized, x)) < TOL


@pytest.mark.parametrize("kw", [
    dict(init_values=0.5, num_reg_tokens=4, no_embed_class=True),
    dict(init_values=0.5, no_embed_class=True),
    dict(pre_norm=True, patch_bias=False, head_bias=False, act="quick_gelu"),
    dict(pool="map", class_token=False, act="gelu_tanh"),
], ids=["dinov2-registers", "deit3", "clip", "siglip"])
def test_every_applicable_method_and_the_metrics_work_for_each_family(kw):
    from vitkit.explain import perturb
    from vitkit.explain.methods import applicable

    model = small_vit(scale=0.2, **kw)
    x = torch.randn(2, 3, 32, 32)
    methods = applicable(model.cfg)
    assert ("cls" in methods) == ("class_token" not in kw)
    assert ("map" in methods) == (kw.get("pool") == "map")
    with torch.no_grad():
        logits = model(x)
    for method in methods:
        out = explain.explain_map(model, x, method)
        assert out.map.shape == (2, 8, 8) and torch.isfinite(out.map).all(), method
        torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=0, msg=method)
        assert torch.equal(out.target, logits.argmax(-1)), method
        # a map that ranks the patches: not constant (nor all zero) within an image, and each
        # image its own (no map copied across the batch)
        spread = out.map.flatten(1).amax(1) - out.map.flatten(1).amin(1)
        assert (spread > 1e-3 * out.map.abs().amax()).all(), method
        assert not torch.allclose(out.map[0], out.map[1]), method
    # the curves are the model's own probabilities: deletion starts from the image and ends at
    # the baseline (zeros), insertion ends at the image; both are probabilities
    curves = perturb.deletion_insertion(model, x, out.map, out.target, baseline="constant")
    with torch.no_grad():
        p_image = model(x).softmax(-1).gather(1, out.target[:, None])[:, 0]
        p_zeros = model(torch.zeros_like(x)).softmax(-1).gather(1, out.target[:, None])[:, 0]
    torch.testing.assert_close(curves.deletion[:, 0], p_image, atol=1e-5, rtol=0)
    torch.testing.assert_close(curves.deletion[:, -1], p_zeros, atol=1e-5, rtol=0)
    torch.testing.assert_close(curves.insertion[:, -1], p_image, atol=1e-5, rtol=0)
    assert ((curves.deletion >= 0) & (curves.deletion <= 1)).all()
    assert ((0 <= curves.deletion_auc) & (curves.deletion_auc <= 1)).all()


def test_a_bare_dinov2_giant_with_its_swiglu_gives_timms_outputs(tmp_path):
    """DINOv2-giant's packed SwiGLU (timm's SwiGLUPacked) is vitkit's mlp="glu": the bare state
    dict, refused before, loads exactly."""
    peer = perturb(timm.create_model("vit_giant_patch14_dinov2", depth=1, embed_dim=96,
                                     num_heads=2, img_size=28), scale=0.1)
    torch.save(peer.state_dict(), tmp_path / "g.pth")
    model = vitkit.load_model(tmp_path / "g.pth", num_heads=2, verbose=False)
    assert model.cfg.mlp == "glu"
    x = torch.randn(2, 3, 28, 28)
    assert max_diff(logits(model, x), logits(peer, x)) < TOL
