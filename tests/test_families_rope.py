"""The 2025-26 families against timm's Eva (DINOv3, EVA-02, Perception Encoder core, the RoPE
ViTs): every registered name has timm's parameter count and keys (mapped by the Eva layout),
timm's weights give timm's outputs at two resolutions, the files vitkit writes are read by timm,
and what the weights cannot say is refused by name, never guessed."""

import json

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitkit
from vitkit import CheckpointError
from vitkit.checkpoints import timm_eva
from vitkit.models.registry import _FAMILY_MODELS

from peers import max_diff, perturb

ROPE_FAMILIES = ("dinov3", "eva02", "pe_core", "rope", "rope_mixed", "rope_reg_gap")
NAMES = [name for name, _, _, _, family, _ in _FAMILY_MODELS if family in ROPE_FAMILIES]
# one of each family and of each layout inside it (packed/split SwiGLU, q/v bias, split
# projections, a table beside RoPE, learned frequencies, registers without [CLS])
ONE_OF_EACH = ["vit_small_patch16_dinov3", "vit_small_plus_patch16_dinov3_qkvb",
               "eva02_tiny_patch14_224", "eva02_base_patch14_224", "vit_pe_core_tiny_patch16_384",
               "vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_ape_224",
               "vit_medium_patch16_rope_reg1_gap_256"]
TOL = 1e-4


def sharpened(model):
    """Perturbed weights with peaked attention (q and k scaled up): with the near-uniform
    attention of small random weights the rotary embeddings hardly matter, and a model that
    dropped them would pass. Returns the model in eval mode."""
    perturb(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("attn.qkv.weight", "attn.q_proj.weight", "attn.k_proj.weight")):
                p.mul_(12.0)
    return model.eval()


def _peer(name, **kw):
    return sharpened(timm.create_model(name, depth=2, **kw))


def _hub(folder, peer, name, **config):
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()},
              folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "architecture": name, "num_classes": peer.num_classes,
        "model_args": {"depth": len(peer.blocks), "dynamic_img_size": peer.dynamic_img_size},
        "pretrained_cfg": {"input_size": [3, *peer.patch_embed.img_size]}, **config}))
    return folder


def _out(model, x):
    with torch.no_grad():
        return model(x), model.forward_features(x)


@pytest.mark.parametrize("name", NAMES)
def test_parameters_and_keys_equal_timm(name):
    with torch.device("meta"):
        theirs, ours = timm.create_model(name), vitkit.create_model(name)
    assert sum(p.numel() for p in ours.parameters()) == \
        sum(p.numel() for p in theirs.parameters())
    mapped = timm_eva.to_vitkit_keys(theirs.state_dict())
    assert {k: v.shape for k, v in ours.state_dict().items()} == \
        {k: v.shape for k, v in mapped.items()}


@pytest.mark.parametrize("name", ONE_OF_EACH)
def test_timm_weights_give_timms_outputs_at_two_resolutions(name, tmp_path):
    """A timm hub folder loads to timm's logits and features; at a second resolution too
    (DINOv3 and the RoPE ViTs take any size; EVA-02 and PE move their table as timm does)."""
    peer = _peer(name, dynamic_img_size=True)
    model = vitkit.load_model(_hub(tmp_path / "hub", peer, name), verbose=False)
    assert model.cfg.rope == vitkit.create_model(name).cfg.rope != ""
    h, w = model.cfg.img_size
    p = model.cfg.patch_size
    for size in [(h, w), (h - 4 * p, w + 2 * p)]:
        x = torch.randn(2, 3, *size)
        theirs, ours = _out(peer, x), _out(model, x)
        for a, b in zip(ours, theirs, strict=True):  # 1e-4 of the outputs' scale
            assert max_diff(a, b) < TOL * max(1.0, b.abs().max().item()), size
    # the test can fail: without its rotary embeddings the model is far from timm's
    model.rope = None
    assert max_diff(_out(model, x)[0], theirs[0]) > 100 * TOL


def test_timm_writes_what_timm_reads_back(tmp_path):
    """vitkit's timm export of each layout is read by timm's own Eva and gives its outputs."""
    for name in ONE_OF_EACH:
        side = 4 * vitkit.create_model(name).cfg.patch_size
        model = sharpened(vitkit.create_model(name, depth=2, img_size=side, num_classes=3))
        out = vitkit.export(model, tmp_path / name, to="timm")
        config = json.loads((out / "config.json").read_text())
        peer = timm.create_model(config["architecture"], num_classes=config["num_classes"],
                                 **config["model_args"])
        timm.models.load_checkpoint(peer, str(out / "model.safetensors"))
        x = torch.randn(2, 3, side, side)
        assert max_diff(_out(peer.eval(), x)[0], _out(model, x)[0]) < TOL, name
        back = vitkit.load_model(out, verbose=False)
        assert max_diff(_out(back, x)[0], _out(model, x)[0]) < 1e-6, name


def test_a_bare_eva_state_dict_is_refused_by_name(tmp_path):
    """The keys of timm's Eva layout do not say which rotary embeddings it uses."""
    torch.save(_peer("vit_small_patch16_dinov3").state_dict(), tmp_path / "d.pth")
    with pytest.raises(CheckpointError, match="do not say which rotary position embeddings"):
        vitkit.load_model(tmp_path / "d.pth")


def test_perception_encoder_loads_exactly_or_is_refused(tmp_path):
    """The case that loaded silently wrong: PE's bare weights look like a pre-norm ViT with
    attention pooling. Bare, they are refused; as timm's hub folder, they load exactly."""
    name = "vit_pe_core_tiny_patch16_384"
    peer = _peer(name)
    torch.save(peer.state_dict(), tmp_path / "pe.pth")
    with pytest.raises(CheckpointError, match="Perception Encoder"):
        vitkit.load_model(tmp_path / "pe.pth")
    model = vitkit.load_model(_hub(tmp_path / "hub", peer, name), verbose=False)
    assert (model.cfg.pool_heads, model.cfg.rope_offset, model.cfg.rope_xy) == (8, 1.0, True)
    x = torch.randn(1, 3, 384, 384)
    assert max_diff(_out(model, x)[0], _out(peer, x)[0]) < TOL


@pytest.mark.parametrize(("name", "feature"), [
    ("eva02_base_patch16_clip_224", "a LayerNorm inside attention"),
    ("vit_pe_spatial_tiny_patch16_512", "no LayerNorm after the blocks"),
    ("eva02_enormous_patch14_clip_224", "which vitkit does not build"),
])
def test_what_vitkit_cannot_express_is_refused_by_name(tmp_path, name, feature):
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in timm.create_model(name).state_dict().items()}
    # the keys are what decides; small real tensors of the right rank stand in for the weights
    state = {k: torch.zeros(s) for k, s in shapes.items() if s.numel() < 5e6} | {
        k: torch.zeros(s) for k, s in shapes.items() if s.numel() >= 5e6 and k.startswith(
            "blocks.0.")}
    folder = tmp_path / "hub"
    folder.mkdir()
    save_file({k: v for k, v in state.items() if not k.startswith("blocks.") or
               k.startswith(("blocks.0.", "blocks.1."))}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"architecture": name,
                                                    "model_args": {"depth": 2}}))
    with pytest.raises(CheckpointError, match=feature):
        vitkit.load_model(folder)


def test_a_rope_model_changes_resolution_without_a_table(tmp_path):
    """No table to interpolate: set_img_size only records the size, and the output at the new
    size is the one timm gives there."""
    peer = _peer("vit_small_patch16_rope_224", dynamic_img_size=True)
    model = vitkit.load_model(_hub(tmp_path / "hub", peer, "vit_small_patch16_rope_224"),
                              verbose=False)
    assert model.pos_embed is None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.set_img_size(160)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    x = torch.randn(1, 3, 160, 160)
    assert max_diff(_out(model, x)[0], _out(peer, x)[0]) < TOL


@pytest.mark.parametrize("options", [
    dict(num_register_tokens=4),
    dict(num_register_tokens=2, use_gated_mlp=True, hidden_act="silu", key_bias=True),
    dict(query_bias=False, value_bias=False),
], ids=["registers", "gated-mlp-key-bias", "no-biases"])
def test_hugging_face_dinov3_folders_give_its_features_and_are_written_back(tmp_path, options):
    import transformers as T

    peer = sharpened(T.DINOv3ViTModel(T.DINOv3ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=64, patch_size=16, **options)))
    peer.save_pretrained(tmp_path / "hf")
    model = vitkit.load_model(tmp_path / "hf", verbose=False)
    assert (model.cfg.rope, model.cfg.pool, model.cfg.num_reg_tokens) == \
        ("dinov3", "cls", options["num_register_tokens"] if "num_register_tokens" in options
         else 0)
    for size in [(64, 64), (48, 96)]:
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            theirs = peer(pixel_values=x)
            assert max_diff(model(x), theirs.pooler_output) < TOL, size
            assert max_diff(model.forward_features(x), theirs.last_hidden_state) < TOL, size
    out = vitkit.export(model, tmp_path / "back", to="hf")
    again = T.AutoModel.from_pretrained(out).eval()
    assert type(again).__name__ == "DINOv3ViTModel"
    with torch.no_grad():
        assert max_diff(again(pixel_values=x).pooler_output, model(x)) < TOL


def _naflex(images, patch, max_patches):
    """SigLIP 2's own input for a list of (C, H, W) images: (B, max_patches, P*P*C) patches in
    its processor's order, the spatial shapes and the padding mask."""
    from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    pixels, shapes, mask = [], [], []
    for image in images:
        patches = convert_image_to_patches(image, patch)
        n = patches.shape[0]
        pixels.append(torch.cat([patches, torch.zeros(max_patches - n, patches.shape[1])]))
        shapes.append([image.shape[1] // patch, image.shape[2] // patch])
        mask.append(torch.arange(max_patches) < n)
    return torch.stack(pixels), torch.tensor(shapes), torch.stack(mask).long()


def test_siglip2_naflex_runs_each_image_at_its_aspect_ratio(tmp_path):
    """A Siglip2VisionModel folder loads (it was refused as 'patch size 768' before); each image
    runs at its own aspect ratio, and equals SigLIP 2 on a padded batch of mixed shapes."""
    import transformers as T

    peer = sharpened(T.Siglip2VisionModel(T.Siglip2VisionConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        patch_size=8, num_patches=16)))
    peer.save_pretrained(tmp_path / "s2")
    model = vitkit.load_model(tmp_path / "s2", verbose=False)
    assert (model.cfg.pos_interp, model.cfg.img_size, model.cfg.pool) == \
        ("bilinear", (32, 32), "map")
    images = [torch.randn(3, 32, 32), torch.randn(3, 24, 64), torch.randn(3, 48, 16)]
    pixels, shapes, mask = _naflex(images, 8, 48)
    with torch.no_grad():
        theirs = peer(pixel_values=pixels, spatial_shapes=shapes,
                      pixel_attention_mask=mask).pooler_output
        ours = torch.cat([model(image[None]) for image in images])
    assert max_diff(ours, theirs) < TOL
    # and written back as a Siglip2VisionModel that transformers reads to the same outputs
    out = vitkit.export(model, tmp_path / "back", to="hf")
    again = T.AutoModel.from_pretrained(out).eval()
    assert type(again).__name__ == "Siglip2VisionModel"
    with torch.no_grad():
        assert max_diff(again(pixel_values=pixels, spatial_shapes=shapes,
                              pixel_attention_mask=mask).pooler_output, theirs) < TOL


def test_the_rotary_table_is_reused_only_where_it_is_the_same():
    """A fixed-frequency table is computed once per grid and reused; another grid, learned
    frequencies, or a table made under inference mode then needed by autograd get their own."""
    model = sharpened(vitkit.create_model("vit_small_patch16_dinov3", depth=1, img_size=32))
    first = model.rope((2, 2))
    assert model.rope((2, 2)) is first and model.rope((2, 3)) is not first
    with torch.inference_mode():
        model(torch.rand(1, 3, 32, 32))
    x = torch.rand(1, 3, 32, 32, requires_grad=True)
    model(x).sum().backward()  # no inference tensor reaches autograd
    assert x.grad is not None
    mixed = vitkit.create_model("vit_small_patch16_rope_mixed_224", depth=1)
    assert mixed.rope((2, 2)) is not mixed.rope((2, 2))
