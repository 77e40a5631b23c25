"""Loading each peer's own checkpoints: models built with random weights by timm, DeiT (timm),
transformers, torchvision and the JAX layout (read by timm's own npz loader), saved in the
peer's native format, loaded by vitkit, and compared on the same input."""

import numpy as np
import pytest
import timm
import torch
import torchvision
import transformers
from timm.layers import resample_abs_pos_embed
from timm.models._hub import save_for_hf
from timm.models.vision_transformer import _load_weights

import vitkit
from vitkit.checkpoints import jax as jax_format

from peers import logits, max_diff, perturb

TOL = 1e-4
SIZES = {"tiny": (192, 12, 3, 768), "small": (384, 12, 6, 1536), "base": (768, 12, 12, 3072)}




# ------------------------------------------------------------------------------------- timm
@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("vit_tiny_patch16_224", {}),
        ("vit_small_patch16_224", {}),
        ("vit_base_patch16_224", {}),
        ("vit_small_patch16_224", dict(global_pool="avg", class_token=False)),  # GAP, fc_norm
        ("vit_tiny_patch16_224", dict(reg_tokens=4)),
        ("vit_tiny_patch16_224", dict(no_embed_class=True)),
        ("vit_small_patch32_224", dict(num_classes=17)),
    ],
    ids=["Ti", "S", "B", "S-gap", "Ti-registers", "Ti-no-embed-class", "S32-17-classes"],
)
@pytest.mark.parametrize("layout", ["pth", "safetensors", "hub-folder"])
def test_timm(name, kw, layout, tmp_path, x224):
    peer = perturb(timm.create_model(name, **kw))
    if layout == "hub-folder":
        save_for_hf(peer, tmp_path / "hub")  # timm's own writer: config.json + weights
        path = tmp_path / "hub"
    elif layout == "pth":
        path = tmp_path / "model.pth"
        torch.save(peer.state_dict(), path)
    else:
        from safetensors.torch import save_file

        path = tmp_path / "model.safetensors"
        save_file(peer.state_dict(), path)
    model = vitkit.load_model(path)
    assert model.cfg.extra["source_format"] == "timm"
    assert max_diff(logits(model, x224), logits(peer, x224)) < TOL


def test_timm_384(tmp_path):
    peer = perturb(timm.create_model("vit_tiny_patch16_384"))
    torch.save(peer.state_dict(), tmp_path / "m.pth")
    model = vitkit.load_model(tmp_path / "m.pth")
    assert model.cfg.img_size == (384, 384) and model.grid_size == (24, 24)
    x = torch.randn(1, 3, 384, 384)
    assert max_diff(logits(model, x), logits(peer, x)) < TOL


# ------------------------------------------------------------------------------------- DeiT
def test_distilled_deit_averages_its_two_heads(tmp_path, x224):
    peer = perturb(timm.create_model("deit_tiny_distilled_patch16_224"))
    torch.save({"model": peer.state_dict()}, tmp_path / "deit.pth")  # DeiT's release layout
    model = vitkit.load_model(tmp_path / "deit.pth")
    assert model.cfg.distilled and model.num_prefix_tokens == 2
    assert model.cfg.extra["source_format"] == "deit"
    assert model.cfg.extra["mean"] == [0.485, 0.456, 0.406]
    assert max_diff(logits(model, x224), logits(peer, x224)) < TOL
    with torch.no_grad():
        tokens = model.forward_features(x224)
        both = (model.head(tokens[:, 0]) + model.head_dist(tokens[:, 1])) / 2
    assert max_diff(both, logits(model, x224)) < 1e-6


def test_plain_deit(tmp_path, x224):
    peer = perturb(timm.create_model("deit_small_patch16_224"))
    torch.save({"model": peer.state_dict()}, tmp_path / "deit.pth")
    assert max_diff(logits(vitkit.load_model(tmp_path / "deit.pth"), x224),
                    logits(peer, x224)) < TOL


# --------------------------------------------------------------------------- Hugging Face
def _hf_config(size, **kw):
    d, depth, heads, mlp = SIZES[size]
    return transformers.ViTConfig(hidden_size=d, num_hidden_layers=depth,
                                  num_attention_heads=heads, intermediate_size=mlp, **kw)


@pytest.mark.parametrize("size", ["tiny", "small", "base"])
def test_hf_image_classification(size, tmp_path, x224):
    labels = {i: f"class-{i}" for i in range(10)}
    peer = perturb(transformers.ViTForImageClassification(_hf_config(size, id2label=labels)))
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load_model(tmp_path / "hf")
    assert model.cfg.norm_eps == 1e-12 and model.cfg.num_heads == SIZES[size][2]
    assert model.cfg.extra["class_names"] == [f"class-{i}" for i in range(10)]
    assert max_diff(logits(model, x224), logits(peer, x224)) < TOL


def test_hf_384_without_qkv_bias(tmp_path):
    peer = perturb(transformers.ViTForImageClassification(
        _hf_config("tiny", image_size=384, qkv_bias=False, num_labels=3)))
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load_model(tmp_path / "hf")
    x = torch.randn(1, 3, 384, 384)
    assert model.grid_size == (24, 24) and not model.cfg.qkv_bias
    assert max_diff(logits(model, x), logits(peer, x)) < TOL


def test_hf_vit_model_pooler_kept_or_dropped(tmp_path, x224):
    peer = perturb(transformers.ViTModel(_hf_config("tiny")))
    peer.save_pretrained(tmp_path / "hf")
    with torch.no_grad():
        out = peer(x224)
    kept = vitkit.load_model(tmp_path / "hf")
    assert kept.cfg.representation_size == 192 and kept.num_classes == 0
    assert max_diff(logits(kept, x224), out.pooler_output) < TOL
    dropped = vitkit.load_model(tmp_path / "hf", keep_pre_logits=False)
    assert max_diff(logits(dropped, x224), out.last_hidden_state[:, 0]) < TOL


# ---------------------------------------------------------------------------- torchvision
@pytest.mark.parametrize("size", ["tiny", "small", "base"])
def test_torchvision(size, tmp_path, x224):
    d, depth, heads, mlp = SIZES[size]
    peer = perturb(torchvision.models.VisionTransformer(224, 16, depth, heads, d, mlp))
    torch.save(peer.state_dict(), tmp_path / "tv.pth")
    model = vitkit.load_model(tmp_path / "tv.pth")
    assert model.cfg.num_heads == heads
    assert max_diff(logits(model, x224), logits(peer, x224)) < TOL


def test_torchvision_vit_b_16_builder_and_prelogits(tmp_path, x224):
    peer = perturb(torchvision.models.vit_b_32(num_classes=5))
    torch.save(peer.state_dict(), tmp_path / "b32.pth")
    assert max_diff(logits(vitkit.load_model(tmp_path / "b32.pth"), x224),
                    logits(peer, x224)) < TOL
    peer = perturb(torchvision.models.VisionTransformer(224, 32, 2, 3, 192, 768,
                                                        num_classes=7, representation_size=100))
    torch.save(peer.state_dict(), tmp_path / "pre.pth")
    model = vitkit.load_model(tmp_path / "pre.pth")
    assert model.cfg.representation_size == 100
    assert max_diff(logits(model, x224), logits(peer, x224)) < TOL


# ------------------------------------------------------------------------------------- JAX
def _timm_twin(model):
    c = model.cfg
    return timm.models.vision_transformer.VisionTransformer(
        img_size=c.img_size, patch_size=c.patch_size, embed_dim=c.embed_dim, depth=c.depth,
        num_heads=c.num_heads, mlp_ratio=c.mlp_dim / c.embed_dim, num_classes=c.num_classes,
        global_pool="token" if c.pool == "cls" else "avg", class_token=c.class_token,
        no_embed_class=c.no_embed_class, fc_norm=False,
    ).eval()


def _big_vision_layout(arrays: dict, depth: int) -> dict:
    """Rewrite vision_transformer's npz layout as big_vision's: stacked blocks under params/."""
    out = {}
    for key, value in arrays.items():
        if not key.startswith("Transformer/encoderblock_"):
            key = key.replace("Transformer/posembed_input/pos_embedding", "pos_embedding")
            out["params/" + key] = value
    for key in [k for k in arrays if k.startswith("Transformer/encoderblock_0/")]:
        rest = key.split("/", 2)[2]
        new = (rest.replace("LayerNorm_2", "LayerNorm_1").replace("MlpBlock_3", "MlpBlock_0")
               .replace("MultiHeadDotProductAttention_1", "MultiHeadDotProductAttention_0"))
        out[f"params/Transformer/encoderblock/{new}"] = np.stack(
            [arrays[f"Transformer/encoderblock_{i}/{rest}"] for i in range(depth)])
    return out


@pytest.mark.parametrize(
    ("name", "kw"),
    [("vit_tiny_patch16_224", {}), ("vit_small_patch16_224", {}),
     ("vit_base_patch16_224", {}), ("vit_tiny_patch16_224", dict(pool="avg")),
     ("vit_tiny_patch16_384", {})],
    ids=["Ti", "S", "B", "Ti-gap", "Ti-384"],
)
def test_jax_npz_read_like_timms_own_loader(name, kw, tmp_path):
    source = perturb(vitkit.create_model(name, **kw))
    np.savez(tmp_path / "vit.npz", **jax_format.from_vitkit(source))
    peer = _timm_twin(source)
    _load_weights(peer, str(tmp_path / "vit.npz"))  # timm's npz reader, not ours
    model = vitkit.load_model(tmp_path / "vit.npz")
    assert model.cfg.pool == source.cfg.pool and model.cfg.num_heads == source.cfg.num_heads
    x = torch.randn(2, 3, *source.cfg.img_size)
    assert max_diff(logits(model, x), logits(peer, x)) < TOL


def test_big_vision_stacked_layout_with_patch_only_position_table(tmp_path):
    source = perturb(vitkit.create_model("vit_tiny_patch16_224", no_embed_class=True, depth=4))
    arrays = _big_vision_layout(_export_allowing_no_embed_class(source), depth=4)
    np.savez(tmp_path / "bv.npz", **arrays)
    peer = _timm_twin(source)
    _load_weights(peer, str(tmp_path / "bv.npz"))
    model = vitkit.load_model(tmp_path / "bv.npz")
    assert model.cfg.no_embed_class and model.cfg.depth == 4
    x = torch.randn(2, 3, 224, 224)
    assert max_diff(logits(model, x), logits(peer, x)) < TOL


def _export_allowing_no_embed_class(model):
    """big_vision keeps [CLS] out of the position table; our exporter writes the original
    layout, so export a twin with a [CLS] row and then drop that row."""
    twin = vitkit.VisionTransformer(**{**model.cfg.to_dict(), "no_embed_class": False})
    state = model.state_dict()
    state["pos_embed"] = torch.cat([torch.zeros(1, 1, model.embed_dim), state["pos_embed"]], 1)
    twin.load_state_dict(state)
    arrays = jax_format.from_vitkit(twin)
    key = "Transformer/posembed_input/pos_embedding"
    arrays[key] = arrays[key][:, 1:]
    return arrays


def test_jax_pre_logits_round_trip(tmp_path):
    source = perturb(vitkit.create_model("vit_tiny_patch16_224", representation_size=192, depth=2))
    np.savez(tmp_path / "vit.npz", **jax_format.from_vitkit(source))
    model = vitkit.load_model(tmp_path / "vit.npz")
    assert model.cfg.representation_size == 192
    x = torch.randn(1, 3, 224, 224)
    assert max_diff(logits(model, x), logits(source, x)) == 0


# ------------------------------------------------------------------------ new resolution
def test_resize_224_to_384_equals_timm_resample(tmp_path, vitkit_log):
    peer224 = perturb(timm.create_model("vit_small_patch16_224"))
    torch.save(peer224.state_dict(), tmp_path / "s224.pth")
    model = vitkit.load_model(tmp_path / "s224.pth", img_size=384)
    assert "from a 14x14 grid (224x224) to 24x24 (384x384)" in vitkit_log.text
    state = peer224.state_dict()
    state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], (24, 24), (14, 14),
                                                num_prefix_tokens=1, interpolation="bicubic",
                                                antialias=False)
    peer384 = timm.create_model("vit_small_patch16_384").eval()
    peer384.load_state_dict(state)
    x = torch.randn(2, 3, 384, 384)
    assert max_diff(logits(model, x), logits(peer384, x)) < TOL


def test_new_class_count_replaces_the_head_and_says_so(tmp_path, vitkit_log):
    peer = perturb(timm.create_model("vit_tiny_patch16_224"))
    torch.save(peer.state_dict(), tmp_path / "t.pth")
    model = vitkit.load_model(tmp_path / "t.pth", num_classes=10)
    said = vitkit_log.messages
    assert len(said) == 1
    assert "head replaced: the checkpoint has 1000 classes, the new head has 10" in said[0]
    assert model.head.weight.shape == (10, 192)
    torch.testing.assert_close(model.blocks[5].attn.qkv.weight, peer.blocks[5].attn.qkv.weight)


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_torchvision_resnet_state_dict_loads_as_a_cnn(arch, tmp_path, x224):
    peer = perturb(getattr(torchvision.models, arch)(num_classes=7))
    torch.save(peer.state_dict(), tmp_path / "cnn.pth")
    model = vitkit.load_model(tmp_path / "cnn.pth")
    assert model.cfg.arch == arch and model.cfg.extra["source_format"] == "torchvision-resnet"
    assert max_diff(logits(model, x224), logits(peer, x224)) < TOL
