"""The walk over every ViT-family name of the installed timm (and the Hugging Face vision
families): each one loads into vitkit with timm's outputs or is refused with a message; none
loads with other outputs.

Two passes. Every name, at full size on the meta device (no memory, no time): its state dict and
architecture, as timm's hub folder gives them, go through vitkit's reader, which either refuses
them by name or builds a model whose keys and shapes are exactly those (a strict load). Then one
name of each distinct structure (the reader's decision with the sizes left out: the options it
chose, or its refusal) is built for real at one block and a small input, with perturbed weights
and sharpened attention so that a missing rotary embedding or a misread option shows, and its
outputs are compared with timm's. Names that share a structure differ only in sizes, which the
first pass checks for each.
"""

from __future__ import annotations

import json

import pytest
import timm
import torch
from safetensors.torch import save_file
from test_families_rope import sharpened

import vitkit
from vitkit import CheckpointError, VisionTransformer
from vitkit.checkpoints.common import Checkpoint
from vitkit.checkpoints.io import _to_vitkit, detect_format, load_state

from peers import max_diff

# the modules of timm's ViT family: the plain ViT and everything on its layout
MODULES = ("vision_transformer", "eva", "deit", "beit", "vision_transformer_relpos",
           "vision_transformer_hybrid", "vision_transformer_sam", "naflexvit")
NAMES = sorted({n for m in MODULES for n in timm.list_models(module=m)})
SIZES = {"img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_dim", "num_classes",
         "in_chans", "extra", "rope_ref_grid"}
TOL = 1e-4


def _config(name: str, model, **model_args) -> dict:
    size = getattr(getattr(model, "patch_embed", None), "img_size", None) or (224, 224)
    return {"architecture": name, "num_classes": getattr(model, "num_classes", 0),
            "model_args": model_args, "pretrained_cfg": {"input_size": [3, *size]}}


def decide(name: str) -> tuple[str, object]:
    """("refused", message) or ("loads", the options the reader chose, sizes left out), from
    the full-size model's keys and shapes on the meta device; a model the reader builds must
    take them strictly."""
    with torch.device("meta"):
        peer = timm.create_model(name)
    ckpt = Checkpoint(peer.state_dict(), _config(name, peer), None)
    try:
        fmt = detect_format(ckpt)
        state, kwargs = _to_vitkit(ckpt, fmt, [], True, None, None)
        with torch.device("meta"):
            model = VisionTransformer(**kwargs)
        load_state(model, state, strict=True, verbose=False)  # every key, every shape
    except (CheckpointError, ValueError) as e:
        assert str(e).strip()
        return "refused", type(e).__name__
    # what the keys do not show, against timm's own model: the heads and the LayerNorm eps
    eps = next(m.eps for m in peer.modules() if isinstance(m, torch.nn.LayerNorm))
    assert (model.cfg.num_heads, model.cfg.norm_eps) == (peer.blocks[0].attn.num_heads, eps), \
        f"{name} would load with other heads or eps"
    return "loads", tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k not in SIZES))


DECISIONS = {name: decide(name) for name in NAMES}
# one name of each structure the reader loads, checked for outputs
REPRESENTATIVES = sorted({d: n for n, d in sorted(DECISIONS.items(), reverse=True)
                          if d[0] == "loads"}.values())


def test_the_walk_covers_the_family():
    assert len(NAMES) > 250
    assert {"vit_small_patch16_dinov3", "eva02_tiny_patch14_224", "vit_pe_core_tiny_patch16_384",
            "vit_small_patch16_rope_mixed_224", "deit_tiny_distilled_patch16_224",
            "vit_giant_patch14_dinov2"} <= {n for n, d in DECISIONS.items() if d[0] == "loads"}
    # what vitkit cannot express is refused, not loaded
    assert {"beit_base_patch16_224", "eva02_base_patch16_clip_224",
            "vit_pe_spatial_tiny_patch16_512"} <= {n for n, d in DECISIONS.items()
                                                   if d[0] == "refused"}


def _small(name: str):
    """timm's model at one block and an input of four patches a side where timm takes it."""
    with torch.device("meta"):
        patch = timm.create_model(name).patch_embed.patch_size
    patch = patch[0] if isinstance(patch, tuple) else patch
    for kwargs in (dict(depth=1, img_size=4 * patch), dict(depth=1)):
        try:
            return sharpened(timm.create_model(name, **kwargs)), kwargs
        except Exception:  # noqa: BLE001 - timm refuses some overrides: try the next
            continue
    raise AssertionError(f"timm cannot build {name} at one block")


@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_each_structure_loads_with_timms_outputs(name, tmp_path):
    peer, kwargs = _small(name)
    folder = tmp_path / "hub"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()},
              folder / "model.safetensors")
    # at one block no size is standard: the heads (checked at full size above) are told
    heads = peer.blocks[0].attn.num_heads
    (folder / "config.json").write_text(json.dumps(_config(name, peer, num_heads=heads,
                                                           **kwargs)))
    model = vitkit.load_model(folder, verbose=False)
    x = torch.randn(2, 3, *model.cfg.img_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs, ours = peer(x), model(x)
    assert ours.shape == theirs.shape
    assert max_diff(ours, theirs) < TOL * max(1.0, theirs.abs().max().item()), (
        f"{name} loads with other outputs: {max_diff(ours, theirs):.3g} apart")
