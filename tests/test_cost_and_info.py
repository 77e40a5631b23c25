"""The FLOP model against torch's own FLOP counter, and the `vitkit info` command."""

import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vitkit import VisionTransformer, create_model
from vitkit.cli import main
from vitkit.models.cost import flop_model


@pytest.mark.parametrize(
    "kw",
    [
        dict(img_size=32, patch_size=4, embed_dim=48, depth=2, num_heads=4, mlp_dim=96),
        dict(img_size=(32, 48), patch_size=8, embed_dim=32, depth=3, num_heads=2, mlp_dim=80,
             num_reg_tokens=2, num_classes=5),
        dict(img_size=24, patch_size=4, embed_dim=16, depth=1, num_heads=1, mlp_dim=64,
             pool="avg", class_token=False, num_classes=0),
        # SwiGLU (packed and split) and rotary embeddings: their matmuls are the MLP's three
        dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=48,
             mlp="glu", rope="axial"),
        dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=48,
             mlp="swiglu", rope="dinov3", abs_pos=False, num_reg_tokens=4),
    ],
)
def test_flop_model_equals_torch_flop_counter(kw):
    """On the maps path every matmul is explicit, so torch counts all of them."""
    model = VisionTransformer(**kw).eval()
    x = torch.randn(1, 3, *model.cfg.img_size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x, return_attn=True)
    assert counter.get_total_flops() == flop_model(model.cfg).flops


@pytest.mark.parametrize("overrides", [{}, dict(distilled=True), dict(num_reg_tokens=2),
                                       dict(pool="avg", class_token=False)],
                         ids=["cls", "distilled", "registers", "avg"])
@pytest.mark.parametrize("fused", [True, False], ids=["in-place", "standard"])
def test_readout_only_flops_equal_torch_flop_counter(overrides, fused):
    """model(x) without maps, with SDPA decomposed into matmuls (the math backend)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=48, depth=3, num_heads=4,
                              mlp_dim=96, num_classes=7, **overrides).eval()
    model.inplace_inference = fused
    with FlopCounterMode(display=False) as counter, torch.no_grad(), \
            sdpa_kernel(SDPBackend.MATH):
        model(torch.randn(2, 3, 32, 32))
    assert counter.get_total_flops() == 2 * flop_model(model.cfg, readout_only=True).flops
    if model.cfg.pool == "cls":
        assert flop_model(model.cfg, readout_only=True).flops < flop_model(model.cfg).flops


def test_vit_base_flops_split():
    cost = flop_model(create_model("vit_base_patch16_224").cfg)
    assert (cost.patches, cost.tokens) == (196, 197)
    assert cost.attention == 12 * 2 * 197**2 * 768
    assert cost.linear == 12 * 197 * 12 * 768**2  # 4D^2 + 2*D*4D = 12 D^2
    assert round(cost.macs / 1e9, 1) == 17.6  # the 17.6 "GFLOPs" of the literature are MACs


def test_attention_term_scales_with_tokens_squared():
    p16 = flop_model(create_model("vit_base_patch16_224").cfg)
    p8 = flop_model(create_model("vit_base_patch8_224").cfg)
    assert p8.attention / p16.attention == pytest.approx((785 / 197) ** 2)
    assert 15.5 < p8.attention / p16.attention < 16.0


def test_info_prints_parts_and_costs(capsys):
    assert main(["info", "vit_base_patch16_224"]) == 0
    out = capsys.readouterr().out
    for text in ["86,567,656", "85,054,464", "7,087,872", "2,362,368", "4,722,432", "590,592",
                 "151,296", "769,000", "T = 197", "12 x 2*T^2*D", "image 384", "patch 8"]:
        assert text in out, text


def test_info_honours_size_overrides(capsys):
    assert main(["info", "vit_base_patch16_224", "--img-size", "384", "--patch-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "grid 12x12" in out and "T = 145" in out


def test_info_unknown_name_lists_close_matches(capsys):
    assert main(["info", "vit_bse_patch16_224"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'vit_bse_patch16_224'" in err and "vit_base_patch16_224" in err


def test_info_non_divisible_size_is_a_clear_error(capsys):
    assert main(["info", "vit_small_patch16_224", "--img-size", "200"]) == 2
    assert "200x200 is not divisible by patch size 16" in capsys.readouterr().err


def test_list_filters(capsys):
    assert main(["list", "huge_patch14"]) == 0
    assert capsys.readouterr().out.split() == ["deit3_huge_patch14_224", "vit_huge_patch14_224"]


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "vitkit.cli", "info", "vit_nano_patch4_32"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "vit_nano_patch4_32: image 32x32, patch 4, grid 8x8" in out
