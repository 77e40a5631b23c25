"""The in-place CPU inference path (models/inference.py) against the standard blocks and timm."""

import pytest
import timm
import torch
from conftest import small_vit

from vitkit import VisionTransformer
from vitkit.models import inference

from peers import perturb

CONFIGS = {
    "cls": {},
    "avg": dict(pool="avg", class_token=False),
    "registers": dict(num_reg_tokens=2),
    "distilled": dict(distilled=True),
    "no-qkv-bias": dict(qkv_bias=False),
    "no-embed-class": dict(no_embed_class=True),
    "rectangular": dict(img_size=(32, 48)),
    "layerscale": dict(init_values=0.3),
    "dinov2-registers": dict(init_values=0.3, num_reg_tokens=4, no_embed_class=True),
    "clip-pre-norm": dict(pre_norm=True, patch_bias=False, head_bias=False),
    "siglip-map": dict(pool="map", class_token=False),
}


def model_with_biases(**kw) -> VisionTransformer:
    """Fresh models have zero biases; the fused path folds biases, so make them count."""
    return small_vit(scale=0.5, **kw)


def both_paths(model, x, **kw):
    """(fused float32, standard float32, standard float64) outputs of the same model."""
    with torch.no_grad():
        fused = model(x, **kw)
        model.inplace_inference = False
        try:
            standard = model(x, **kw)
            exact = model.double()(x.double(), **kw)
        finally:
            model.float().inplace_inference = True
    return fused, standard, exact


def assert_as_accurate(fused, standard, exact):
    """The fused path's float32 error against float64 is of the standard path's size."""
    err_fused = (fused.double() - exact).abs().max().item()
    err_standard = (standard.double() - exact).abs().max().item()
    assert err_fused <= 3 * err_standard + 1e-6, (err_fused, err_standard)


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_fused_path_equals_standard_blocks(overrides):
    model = model_with_biases(**overrides)
    x = torch.randn(3, 3, *model.cfg.img_size)
    assert not inference.applies(model, x)  # autograd is on out here
    fused, standard, exact = both_paths(model, x)
    assert_as_accurate(fused, standard, exact)


@pytest.mark.parametrize("layers", [None, [2, 0]])
def test_fused_path_maps_equal_standard_maps(layers):
    model = model_with_biases()
    x = torch.randn(2, 3, 32, 32)
    (fused, fused_maps), (standard, standard_maps), (exact, exact_maps) = both_paths(
        model, x, return_attn=True, attn_layers=layers)
    assert_as_accurate(fused, standard, exact)
    assert fused_maps.layers == standard_maps.layers
    for a, b, c in zip(fused_maps, standard_maps, exact_maps, strict=True):
        assert_as_accurate(a, b, c)


def test_fused_path_equals_timm_with_real_biases(x224):
    peer = perturb(timm.create_model("vit_small_patch16_224"), scale=0.05)
    model = VisionTransformer(embed_dim=384, depth=12, num_heads=6, mlp_dim=1536).eval()
    model.load_state_dict(peer.state_dict())
    with torch.inference_mode():
        assert inference.applies(model, x224)
        torch.testing.assert_close(model(x224), peer(x224), atol=1e-4, rtol=1e-4)


def test_fused_path_leaves_weights_and_earlier_outputs_alone():
    model = model_with_biases()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 32, 32)
    x_copy = x.clone()
    with torch.no_grad():
        first = model(x)
        kept = first.clone()
        model(torch.randn(2, 3, 32, 32))  # reuses no buffer that `first` lives in
    assert torch.equal(first, kept)
    assert torch.equal(x, x_copy)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_standard_path_is_taken_where_fusing_would_change_behaviour():
    model = model_with_biases()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert inference.applies(model, x)
        model.train()
        assert not inference.applies(model, x)  # dropout, stochastic depth
        model.eval()
        model.inplace_inference = False
        assert not inference.applies(model, x)
        model.inplace_inference = True
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not inference.applies(model, x)  # autocast picks dtypes per op
    assert not inference.applies(model, x)  # autograd on


def test_hooks_on_parts_still_fire():
    model = model_with_biases()
    seen = []
    handle = model.blocks[1].mlp.fc1.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    try:
        with torch.no_grad():
            assert not inference.applies(model, torch.randn(1, 3, 32, 32))
            model(torch.randn(2, 3, 32, 32))
    finally:
        handle.remove()
    assert seen == [torch.Size([2, 65, 96])]
    assert inference.applies(model, torch.randn(1, 3, 32, 32)) is False  # grad on here
    with torch.no_grad():
        assert inference.applies(model, torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize("overrides", [{}, dict(distilled=True), dict(num_reg_tokens=2)],
                         ids=["cls", "distilled", "registers"])
def test_readout_only_last_block_equals_all_rows(overrides):
    model = model_with_biases(**overrides)
    x = torch.randn(3, 3, 32, 32)
    rows = len(model.cfg.readout_rows)
    with torch.no_grad():
        full = model.forward_features(x)  # every token through the last block
        read = model.forward_features(x, readout_only=True)  # the readout rows only
    assert read.shape == (3, rows, 48)
    torch.testing.assert_close(read, full[:, :rows], atol=1e-5, rtol=1e-5)


def test_readout_only_needs_a_cls_model():
    model = model_with_biases(pool="avg", class_token=False)
    with pytest.raises(ValueError, match="readout_only needs a \\[CLS\\]-pooled model"):
        model.forward_features(torch.randn(1, 3, 32, 32), readout_only=True)


@pytest.mark.parametrize("overrides", [{}, dict(distilled=True), dict(qkv_bias=False)],
                         ids=["cls", "distilled", "no-qkv-bias"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_readout_only_training_gives_the_full_paths_gradients(overrides, checkpointing):
    """model(x) skips the last block's other rows under autograd too: same loss, same grads."""
    model = model_with_biases(**overrides).train().double()  # float64: exact up to 1e-12
    model.set_grad_checkpointing(checkpointing)
    x, y = torch.randn(3, 3, 32, 32, dtype=torch.float64), torch.tensor([0, 3, 6])

    def grads(logits):
        model.zero_grad()
        torch.nn.functional.cross_entropy(logits, y).backward()
        return {k: p.grad.clone() for k, p in model.named_parameters()}

    full = grads(model.forward_head(model.forward_features(x)))  # every row of every block
    read = grads(model(x))  # readout rows only in the last block
    for k in full:
        torch.testing.assert_close(read[k], full[k], atol=1e-12, rtol=1e-10, msg=k)
    assert full["blocks.2.mlp.fc1.weight"].abs().sum() > 0


def test_separate_query_and_value_biases_are_joined_once_per_block(monkeypatch):
    """A model whose q and v have their own biases (BEiT, EVA) joins them per block; the
    in-place path needs the joined bias twice (qkv, and the value bias folded into the
    projection) and computes it once."""
    from vitkit.models.vit import Attention

    model = model_with_biases(key_bias=False)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_bias.normal_()
            block.attn.v_bias.normal_()
    x = torch.randn(2, 3, *model.cfg.img_size)
    calls = []
    real = Attention.bias
    monkeypatch.setattr(Attention, "bias", lambda self: calls.append(1) or real(self))
    with torch.inference_mode():
        assert inference.applies(model, x)
        model(x)
    assert len(calls) == model.cfg.depth
    monkeypatch.setattr(Attention, "bias", real)
    fused, standard, exact = both_paths(model, x)
    assert_as_accurate(fused, standard, exact)
