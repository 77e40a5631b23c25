"""AttnLRP and CP-LRP (vitkit.explain.lrp): equal to LXT's own rules on the peers' models
(torchvision's vit_b_16 for CP-LRP, the LXT map it ships; a Hugging Face ViT for AttnLRP, whose
attention LXT patches), conservative where the rules are, on every layout vitkit builds, and
the model left as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SMALL
from known_object import assert_object_ranked_first, object_detector, object_images

import vitkit
from vitkit import VisionTransformer, explain
from vitkit.explain import lrp

from peers import perturb

HERE = Path(__file__).parent
LAYOUTS = {
    "cls": {}, "avg": dict(pool="avg", class_token=False, fc_norm=True),
    "deit": dict(distilled=True), "registers": dict(num_reg_tokens=4),
    "map-head": dict(pool="map", class_token=False), "layerscale": dict(init_values=0.1),
    "clip": dict(pre_norm=True, act="quick_gelu", patch_bias=False),
    "tanh-gelu": dict(act="gelu_tanh"),
    # the 2025-26 blocks: rotary embeddings (DINOv3's, EVA-02's axial, learned mixed), SwiGLU
    # (packed and split, with the hidden LayerNorm), a q/v bias, PE's table + RoPE + MAP head
    "dinov3": dict(abs_pos=False, rope="dinov3", rope_half=True, num_reg_tokens=4,
                   init_values=0.1, pool="avg", class_token=True, mlp="swiglu", key_bias=False),
    "eva02": dict(rope="axial", rope_ref_grid=(4, 4), mlp="glu", pool="avg", fc_norm=True),
    "eva02-norm": dict(rope="axial", mlp="swiglu", mlp_norm=True),
    "rope-mixed": dict(abs_pos=False, rope="mixed", rope_xy=True, init_values=0.1),
    "pe": dict(rope="axial", rope_xy=True, rope_offset=1.0, pre_norm=True, patch_bias=False,
               pool="map", pool_heads=4, class_token=True),
}


def _lxt(kind: str, source: Path, x: torch.Tensor, tmp: Path) -> dict:
    torch.save(x, tmp / "x.pt")
    done = subprocess.run([sys.executable, str(HERE / "lxt_reference.py"), kind, str(source),
                           str(tmp / "x.pt"), str(tmp / "out.pt")], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(tmp / "out.pt", weights_only=True)


def _correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.flatten(1), b.flatten(1)
    a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))


def _conservation(relevance: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    chosen = logits.max(-1).values
    return (relevance.flatten(1).sum(-1) - chosen).abs() / chosen.abs()


def _assert_like_lxt(ours, theirs: dict) -> None:
    """The same logits, pixel relevance correlated >= 0.99, conservation within 1%."""
    relevance, logits, _, error = ours
    torch.testing.assert_close(logits, theirs["logits"], rtol=1e-4, atol=1e-4)
    assert (_correlation(relevance, theirs["relevance"]) >= 0.99).all()
    assert (error - _conservation(theirs["relevance"], theirs["logits"])).abs().max() < 0.01


def test_cp_lrp_equals_lxt_on_torchvision_vit_b_16(tmp_path):
    from torchvision.models import vit_b_16

    torch.manual_seed(0)
    peer = perturb(vit_b_16(), scale=0.05)
    torch.save(peer.state_dict(), tmp_path / "vit_b_16.pth")
    x = torch.randn(2, 3, 224, 224)
    theirs = _lxt("cp-torchvision", tmp_path / "vit_b_16.pth", x, tmp_path)
    model = vitkit.load_model(tmp_path / "vit_b_16.pth", verbose=False)
    _assert_like_lxt(lrp.relevance(model, x, rule="cp-lrp"), theirs)


def test_attnlrp_equals_lxt_on_a_hugging_face_vit(tmp_path):
    import transformers as T

    torch.manual_seed(0)
    peer = perturb(T.ViTForImageClassification(T.ViTConfig(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=4, num_labels=10)), scale=0.2)
    peer.save_pretrained(tmp_path / "hf")
    x = torch.randn(3, 3, 32, 32)
    theirs = _lxt("attn-hf", tmp_path / "hf", x, tmp_path)
    model = vitkit.load_model(tmp_path / "hf", verbose=False)
    _assert_like_lxt(lrp.relevance(model, x, rule="attnlrp"), theirs)


def _bias_free(**options) -> VisionTransformer:
    """A perturbed model whose biases and additive parameters (position table, prefix tokens,
    the MAP query) are zero: the logit is then a sum over the pixels alone."""
    model = perturb(VisionTransformer(**{**SMALL, **options}), scale=0.3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name in ("pos_embed", "cls_token", "dist_token",
                                                  "reg_token"):
                p.zero_()
    return model


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cp_lrp_conserves_relevance_on_every_layout(layout):
    """With the attention weights held, a bias-free ViT is linear in its pixels given them, so
    the relevance adds up to the logit (below 1%, here to float precision)."""
    model = _bias_free(**LAYOUTS[layout])
    out = explain.explain_map(model, torch.rand(2, 3, 32, 32), "cp-lrp")
    assert out.map.shape == (2, 8, 8) and out.conservation.shape == (2,)
    assert (out.conservation < 0.01).all(), out.conservation


@pytest.mark.parametrize("layout", LAYOUTS)
def test_attnlrp_runs_on_every_layout_and_reports_its_conservation(layout):
    """AttnLRP's softmax rule is the bias-free Taylor term, so some relevance stays in the
    softmax: the error is reported with every map, not assumed away."""
    model = _bias_free(**LAYOUTS[layout])
    x = torch.rand(2, 3, 32, 32)
    out = explain.explain_map(model, x, "attnlrp")
    assert out.map.shape == (2, 8, 8) and torch.isfinite(out.conservation).all()
    # batched: each image's map is the one it gets alone
    alone = explain.explain_map(model, x[1:], "attnlrp")
    torch.testing.assert_close(out.map[1:], alone.map, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", ["attnlrp", "cp-lrp"])
def test_lrp_ranks_the_known_object_first(method):
    model = object_detector()
    out = explain.explain_map(model, object_images(), method)
    assert out.target.tolist() == [0, 0]
    assert_object_ranked_first(out.map, method)


def test_the_model_is_left_as_it_was():
    model = perturb(VisionTransformer(**SMALL), scale=0.1)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
    explain.explain_map(model, x, "attnlrp")
    with pytest.raises(RuntimeError, match="boom"), lrp.relevance_mode(model):
        raise RuntimeError("boom")
    assert not any(name in m.__dict__ for m in model.modules()
                   for name in ("forward", "kernel", "_lrp_original"))
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="rule must be one of attnlrp, cp-lrp"):
        lrp.relevance(model, x, rule="lrp")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rule", ["cp-lrp", "attnlrp"])
def test_every_lrp_map_has_a_budget_that_sums_to_the_logit(layout, rule):
    """Where the logit goes, beside the pixels: the position table, the learned tokens, the
    biases and the rules' remainder, summing to the logit. CP-LRP's rules are all conservative
    (the rotation is linear, SwiGLU's gate takes the uniform rule), so its remainder is
    rounding only: with a wrong gate or rotation rule it would not be."""
    model = perturb(VisionTransformer(**{**SMALL, **LAYOUTS[layout]}), scale=0.3)
    x = torch.rand(2, 3, 32, 32)
    out = explain.explain_map(model, x, rule, budget=True)
    assert list(out.budget) == list(lrp.BUDGET_PARTS)
    logit = out.logits.gather(1, out.target[:, None])[:, 0]
    torch.testing.assert_close(sum(out.budget.values()), logit, rtol=1e-5, atol=1e-5)
    # the pixels' part is the map's own sum
    torch.testing.assert_close(out.budget["pixels"], out.map.flatten(1).sum(-1),
                               rtol=1e-4, atol=1e-4)
    if rule == "cp-lrp":
        assert (out.budget["remainder"].abs() < 1e-4 * logit.abs() + 1e-5).all(), out.budget
    # the per-image parameter shares are each image's own
    alone = explain.explain_map(model, x[1:], rule, budget=True).budget
    for part in lrp.BUDGET_PARTS:
        torch.testing.assert_close(out.budget[part][1:], alone[part], rtol=1e-4, atol=1e-5)


def test_the_gate_rule_splits_the_product_evenly():
    """SwiGLU's gate product by hand: each factor takes half of the product's relevance, and
    the two halves add up to it (the uniform rule)."""
    from vitkit.models.vit import Product

    gate = Product()
    a, b = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6, requires_grad=True)
    g = torch.randn(4, 6)
    with lrp.relevance_mode(gate):
        y = gate(a, b)
    ga, gb = torch.autograd.grad(y, [a, b], g)
    torch.testing.assert_close(a * ga, y * g / 2)
    torch.testing.assert_close(b * gb, y * g / 2)


def test_the_rotation_passes_relevance_unchanged():
    """RoPE rotates q and k: relevance (value x gradient) summed over a token's channels is the
    same before and after, as for any linear map without a bias."""
    from vitkit.models import rope

    q, k = torch.randn(2, 3, 9, 8, requires_grad=True), torch.randn(2, 3, 9, 8,
                                                                   requires_grad=True)
    angles = torch.rand(8, 4) * 6
    for half in (True, False):
        sin = torch.cat([angles.sin()] * 2, -1) if half else angles.sin().repeat_interleave(2, -1)
        cos = torch.cat([angles.cos()] * 2, -1) if half else angles.cos().repeat_interleave(2, -1)
        rq, rk = rope.apply(q, k, (sin, cos), 1, half)
        g = torch.randn_like(rq)
        (gq,) = torch.autograd.grad(rq, [q], g)
        torch.testing.assert_close((q * gq).sum(-1), (rq * g).sum(-1), rtol=1e-4, atol=1e-5)
        assert torch.equal(rq[:, :, :1], q[:, :, :1])  # the prefix token is not rotated
