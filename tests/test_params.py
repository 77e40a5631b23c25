"""Parameter counts: the literature's numbers for ViT-B/16, and timm's for every registered name."""

import re

import pytest
import timm
import torch

import vitkit
from vitkit.models.cost import param_breakdown
from vitkit.models.registry import model_args

PLAIN = r"vit_(tiny|small|base|large|huge)_patch(8|14|16|32)_(224|384)"
# the plain ViTs (the families built on them are pinned in test_families.py)
STANDARD = [n for n in vitkit.list_models() if re.fullmatch(PLAIN, n)]


def test_vit_base_patch16_224_counts_to_the_unit():
    with torch.device("meta"):
        parts = param_breakdown(vitkit.create_model("vit_base_patch16_224"))
    assert parts == {
        "patch_embed": 590_592,
        "pos_embed": 151_296,
        "tokens": 768,
        "block.attn": 2_362_368,
        "block.mlp": 4_722_432,
        "block.norms": 3_072,
        "block.layerscale": 0,
        "blocks": 85_054_464,
        "norm": 1_536,
        "attn_pool": 0,
        "rope": 0,
        "head": 769_000,
        "total": 86_567_656,
    }
    assert parts["block.attn"] + parts["block.mlp"] + parts["block.norms"] == 7_087_872


def test_registry_covers_every_timm_name_of_the_family():
    timm_names = {n for n in timm.list_models("vit_*") if re.fullmatch(PLAIN, n)}
    assert timm_names == set(STANDARD)


@pytest.mark.parametrize("name", STANDARD)
@pytest.mark.parametrize("num_classes", [1000, 0])
def test_every_variant_matches_timm_tensor_by_tensor(name, num_classes):
    with torch.device("meta"):
        ours = vitkit.create_model(name, num_classes=num_classes)
        theirs = timm.create_model(name, num_classes=num_classes)
    shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert shapes == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert param_breakdown(ours)["total"] == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize("name", vitkit.list_models())
@pytest.mark.parametrize("overrides", [{}, {"pool": "avg"}, {"num_reg_tokens": 4}])
def test_parts_add_up_to_the_total(name, overrides):
    with torch.device("meta"):
        parts = param_breakdown(vitkit.create_model(name, **overrides))
    summed = sum(parts[k] for k in ("patch_embed", "pos_embed", "rope", "tokens", "blocks",
                                    "norm", "attn_pool", "head"))
    assert summed == parts["total"]
    assert parts["blocks"] == model_args(name)["depth"] * (
        parts["block.attn"] + parts["block.mlp"] + parts["block.norms"]
        + parts["block.layerscale"]
    )


@pytest.mark.parametrize(
    ("timm_name", "ours", "kw"),
    [
        ("deit_tiny_distilled_patch16_224", "vit_tiny_patch16_224", dict(distilled=True)),
        ("vit_base_patch16_gap_224", "vit_base_patch16_224",
         dict(pool="avg", fc_norm=True, num_heads=16)),
        ("vit_small_patch16_224", "vit_small_patch16_224", dict(num_reg_tokens=4)),
    ],
)
def test_token_and_pooling_options_match_timm(timm_name, ours, kw):
    timm_kw = {"reg_tokens": 4} if "num_reg_tokens" in kw else {}
    with torch.device("meta"):
        parts = param_breakdown(vitkit.create_model(ours, **kw))
        theirs = timm.create_model(timm_name, num_classes=1000, **timm_kw)
    assert parts["total"] == sum(p.numel() for p in theirs.parameters())


def test_every_names_pretrained_normalisation_is_timms():
    """PRETRAINED_NORM (what a bare state dict loaded by name is preprocessed with) is the
    mean and std of timm's pretrained_cfg for the name's default weights, for every registered
    name timm has; the rest take the original ViT's 0.5."""
    from timm.models import get_pretrained_cfg

    from vitkit.models.registry import MODEL_ARGS, PRETRAINED_NORM

    checked = 0
    for name in MODEL_ARGS:
        cfg = get_pretrained_cfg(name)
        if cfg is None:  # vitkit's own nano and micro models
            assert name not in PRETRAINED_NORM
            continue
        mean, std = PRETRAINED_NORM.get(name, ((0.5,) * 3, (0.5,) * 3))
        assert mean == pytest.approx(cfg.mean, abs=1e-7), name
        assert std == pytest.approx(cfg.std, abs=1e-7), name
        checked += 1
    assert checked >= 90
