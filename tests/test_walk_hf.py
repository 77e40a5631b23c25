"""The walk over the Hugging Face vision families on the ViT layout: each class, saved by
save_pretrained at a small size with perturbed weights and sharpened attention, loads into
vitkit with its outputs or is refused with a message naming what it is; none loads with other
outputs. ViT-MAE shuffles its patches in every forward (masking 0 here): its tokens are
compared in their own order (``ids_restore``)."""

from __future__ import annotations

import pytest
import torch
import transformers as T
from test_families_rope import sharpened

import vitkit
from vitkit import CheckpointError

from peers import max_diff

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             image_size=32, patch_size=8)
# class -> (config class, options beside SMALL, what a refusal must name; None: it loads)
FAMILIES = {
    "ViTModel": ("ViTConfig", {}, None),
    "ViTForImageClassification": ("ViTConfig", dict(num_labels=5), None),
    "ViTMSNModel": ("ViTMSNConfig", {}, None),
    "ViTMAEModel": ("ViTMAEConfig", dict(mask_ratio=0.0), None),
    "Dinov2Model": ("Dinov2Config", {}, None),
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig", dict(num_register_tokens=2), None),
    "DINOv3ViTModel": ("DINOv3ViTConfig", dict(num_register_tokens=2), None),
    "CLIPVisionModel": ("CLIPVisionConfig", {}, None),
    "CLIPVisionModelWithProjection": ("CLIPVisionConfig", dict(projection_dim=16), None),
    "SiglipVisionModel": ("SiglipVisionConfig", {}, None),
    "Siglip2VisionModel": ("Siglip2VisionConfig", dict(num_patches=16), None),
    "DeiTModel": ("DeiTConfig", {}, "Hugging Face's DeiT layout"),
    "DeiTForImageClassificationWithTeacher": ("DeiTConfig", dict(num_labels=5),
                                              "Hugging Face's DeiT layout"),
    "BeitModel": ("BeitConfig", dict(use_relative_position_bias=True), "relative position bias"),
    "Data2VecVisionModel": ("Data2VecVisionConfig", {}, "relative position bias"),
    "IJepaModel": ("IJepaConfig", {}, "I-JEPA"),
}


def _reference(name, peer, x):
    """What the Hugging Face model answers that vitkit's model(x) (or, for a tower without a
    pooled output, forward_features) must equal."""
    if name == "Siglip2VisionModel":
        from test_families_rope import _naflex

        pixels, shapes, mask = _naflex(list(x), 8, 16)
        return peer(pixel_values=pixels, spatial_shapes=shapes,
                    pixel_attention_mask=mask).pooler_output, False
    out = peer(pixel_values=x)
    for field in ("logits", "image_embeds", "pooler_output"):
        if getattr(out, field, None) is not None:
            return getattr(out, field), False
    hidden = out.last_hidden_state
    if name == "ViTMAEModel":  # its patches come shuffled: put them back in order
        order = out.ids_restore[..., None].expand(-1, -1, hidden.shape[-1])
        hidden = torch.cat([hidden[:, :1], hidden[:, 1:].gather(1, order)], dim=1)
    return hidden, True


@pytest.mark.parametrize("name", FAMILIES)
def test_every_hugging_face_vit_loads_with_its_outputs_or_is_refused(name, tmp_path):
    config, options, refusal = FAMILIES[name]
    peer = sharpened(getattr(T, name)(getattr(T, config)(**SMALL, **options)))
    peer.save_pretrained(tmp_path)
    if refusal:
        with pytest.raises(CheckpointError, match=refusal):
            vitkit.load_model(tmp_path)
        return
    model = vitkit.load_model(tmp_path, verbose=False)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference, tokens = _reference(name, peer, x)
        ours = model.forward_features(x) if tokens else model(x)
    assert max_diff(ours, reference) < 1e-4, name
