"""The causal tools (logit lens, head importance) and the layers x heads readout maps, checked
against models cut or edited by hand: a truncated model, a projection with a head's columns
removed."""

import copy

import pytest
import torch
from conftest import small_vit

from vitkit import explain

READOUTS = {
    "cls": {},
    "avg": dict(pool="avg", class_token=False),
    "map": dict(pool="map"),
    "distilled": dict(distilled=True),
    "registers": dict(num_reg_tokens=2),
    "fc_norm": dict(pool="avg", class_token=False, fc_norm=True),
}


@pytest.fixture(params=list(READOUTS))
def model(request):
    return small_vit(scale=0.3, **READOUTS[request.param])


def test_logit_lens_equals_truncated_models(model):
    x = torch.randn(2, 3, 32, 32)
    lens = explain.logit_lens(model, x)
    assert lens.shape == (3, 2, 7)
    with torch.no_grad():
        torch.testing.assert_close(lens[-1], model(x), rtol=1e-5, atol=1e-5)
        for depth in (1, 2):
            cut = copy.deepcopy(model)
            cut.blocks = cut.blocks[:depth]
            torch.testing.assert_close(lens[depth - 1], cut(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("measure", ["logit", "prob"])
def test_head_importance_equals_removing_the_heads_columns(model, measure):
    x = torch.randn(2, 3, 32, 32)
    drops, target = explain.head_importance(model, x, measure=measure)
    assert drops.shape == (2, 3, 4)
    with torch.no_grad():
        base = model(x)
        assert torch.equal(target, base.argmax(-1))
        d = model.cfg.embed_dim // model.cfg.num_heads
        for layer, head in [(0, 0), (1, 3), (2, 1)]:
            edited = copy.deepcopy(model)
            edited.blocks[layer].attn.proj.weight[:, head * d:(head + 1) * d] = 0
            out = edited(x)
            if measure == "prob":
                base_s, out_s = base.softmax(-1), out.softmax(-1)
            else:
                base_s, out_s = base, out
            want = base_s.gather(1, target[:, None])[:, 0] - out_s.gather(1, target[:, None])[:, 0]
            torch.testing.assert_close(drops[:, layer, head], want, rtol=1e-4, atol=1e-5)
    assert drops.abs().sum() > 0  # a perturbed model's heads matter


def test_head_importance_of_a_chosen_class_and_bad_measure():
    model = small_vit(scale=0.3)
    x = torch.randn(1, 3, 32, 32)
    drops, target = explain.head_importance(model, x, target=5)
    assert target.tolist() == [5]
    other, _ = explain.head_importance(model, x, target=2)
    assert not torch.allclose(drops, other)
    with pytest.raises(ValueError, match="measure must be one of logit, prob"):
        explain.head_importance(model, x, measure="loss")


def test_readout_attention_is_every_heads_readout_rows():
    x = torch.randn(2, 3, 32, 32)
    cls = small_vit(scale=0.3)
    with torch.no_grad():
        _, maps = cls(x, return_attn=True)
    got = explain.readout_attention(maps)
    assert got.shape == (2, 3, 4, 8, 8)
    for layer in range(3):
        torch.testing.assert_close(got[:, layer], explain.cls_attention(maps, layer=layer))

    avg = small_vit(scale=0.3, pool="avg", class_token=False)
    with torch.no_grad():
        _, maps = avg(x, return_attn=True)
    want = maps[1].mean(2).reshape(2, 4, 8, 8)  # every patch row, averaged
    torch.testing.assert_close(explain.readout_attention(maps)[:, 1], want)

    deit = small_vit(scale=0.3, distilled=True)
    with torch.no_grad():
        _, maps = deit(x, return_attn=True)
    want = maps[2][:, :, :2, 2:].mean(2).reshape(2, 4, 8, 8)  # [CLS] and distillation rows
    torch.testing.assert_close(explain.readout_attention(maps)[:, 2], want)

    siglip = small_vit(scale=0.3, pool="map")
    with torch.no_grad():
        _, maps = siglip(x, return_attn=True)
    w = maps.pool_attention.mean(1)  # (B, T): how much the MAP head reads each token
    want = torch.einsum("bt,bhtn->bhn", w, maps[0][..., 1:]).reshape(2, 4, 8, 8)
    torch.testing.assert_close(explain.readout_attention(maps)[:, 0], want)


def test_readout_attention_of_hugging_face_style_maps():
    maps = [torch.rand(1, 2, 17, 17).softmax(-1) for _ in range(2)]  # 1 [CLS] + 4x4, inferred
    got = explain.readout_attention(maps)
    torch.testing.assert_close(got[0, 1, 0], maps[1][0, 0, 0, 1:].reshape(4, 4))


def test_attribution_patching_is_the_first_order_of_the_ablation(model):
    """Scaling a head's output by (1 - eps) changes the score by eps x the estimate, to first
    order: the estimate is the derivative of the ablation, for every readout."""
    from vitkit.explain.causal import head_importance_estimate

    m = copy.deepcopy(model).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    est, target = head_importance_estimate(m, x, measure="logit")
    layer, head, eps = len(m.blocks) - 2, 1, 1e-6
    d = m.cfg.embed_dim // m.cfg.num_heads
    scale = torch.ones(m.cfg.embed_dim, dtype=torch.float64)
    scale[head * d:(head + 1) * d] = 1 - eps
    with torch.no_grad():
        base = m(x).gather(1, target[:, None])[:, 0]
        handle = m.blocks[layer].attn.proj.register_forward_pre_hook(
            lambda mod, args: (args[0] * scale,))
        try:
            moved = m(x).gather(1, target[:, None])[:, 0]
        finally:
            handle.remove()
    torch.testing.assert_close((base - moved) / eps, est[:, layer, head], rtol=1e-4, atol=1e-6)


def test_attribution_patching_ranks_heads_as_the_ablation_does_on_trained_models():
    """On the trained nano ViTs of the audit tests, the linear estimate orders each image's
    heads as the exact ablation does (Spearman, median over 8 images, at least 0.75)."""
    from pathlib import Path

    from scipy.stats import spearmanr

    import vitkit
    from vitkit.audit.analysis import transform_for
    from vitkit.data.datasets import load_split
    from vitkit.explain.causal import head_importance, head_importance_estimate

    split = load_split("cluttered-digits", "val", 32)
    for name in ("clean", "marked"):
        m = vitkit.load_model(Path(__file__).parent / "data" / "audit" / f"{name}.safetensors",
                              verbose=False)
        t = transform_for(m)
        x = torch.stack([t(split[i][0]) for i in range(8)])
        exact, _ = head_importance(m, x)
        estimate, _ = head_importance_estimate(m, x)
        rho = [spearmanr(exact[i].flatten(), estimate[i].flatten()).statistic for i in range(8)]
        assert sorted(rho)[4] >= 0.75, (name, rho)
