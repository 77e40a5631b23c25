"""Explainability: maps against the block's own weights, rollout against a direct reference,
gradients against a textbook model's autograd, layer by layer."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import small_vit
from known_object import assert_object_ranked_first, object_detector, object_images

from vitkit import explain
from vitkit.explain.attention import Layout

from reference import RefViT


def small(**kw):
    return small_vit(scale=0.2, **kw)


@pytest.mark.parametrize("kw", [
    {}, dict(init_values=0.5, pre_norm=True, patch_bias=False, num_reg_tokens=2,
             no_embed_class=True, act="quick_gelu"),
    dict(pool="map", class_token=False, act="gelu_tanh"),
], ids=["plain", "dinov2-clip-options", "siglip-options"])
def test_maps_equal_softmax_qk_from_the_blocks_own_weights(kw):
    model = small(**kw)
    x = torch.randn(2, 3, 32, 32)
    inputs = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0]))
             for b in model.blocks]
    with torch.no_grad():
        _, maps = model(x, return_attn=True)
    for h in hooks:
        h.remove()
    for block, tokens, ours in zip(model.blocks, inputs, maps, strict=True):
        qkv = F.linear(tokens, block.attn.qkv.weight, block.attn.qkv.bias)  # (B, T, 3D)
        q, k, _ = qkv.reshape(2, -1, 3, 4, 12).permute(2, 0, 3, 1, 4)
        manual = torch.softmax(q @ k.transpose(-1, -2) / np.sqrt(12), dim=-1)
        torch.testing.assert_close(ours, manual, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "kw", [{}, dict(img_size=(24, 40)), dict(num_reg_tokens=3), dict(distilled=True)],
    ids=["square", "rectangle", "registers", "distilled"],
)
def test_cls_attention_reads_the_grid_from_the_model(kw):
    model = small(**kw)
    with torch.no_grad():
        _, maps = model(torch.randn(2, 3, *model.cfg.img_size), return_attn=True)
    gh, gw = model.grid_size
    p = model.num_prefix_tokens
    every = explain.cls_attention(maps)
    assert every.shape == (2, 4, gh, gw)
    torch.testing.assert_close(every, maps[-1][:, :, 0, p:].reshape(2, 4, gh, gw))
    torch.testing.assert_close(explain.cls_attention(maps, layer=0, head=2),
                               maps[0][:, 2, 0, p:].reshape(2, gh, gw))
    torch.testing.assert_close(explain.cls_attention(maps, head="mean"), every.mean(1))
    torch.testing.assert_close(explain.cls_attention(maps, head="max"), every.amax(1))


def test_cls_attention_errors_say_what_to_do():
    model = small(pool="avg", class_token=False)
    with torch.no_grad():
        _, maps = model(torch.randn(1, 3, 32, 32), return_attn=True)
    with pytest.raises(ValueError, match="methods that apply: rollout, grad-rollout, chefer"):
        explain.cls_attention(maps)
    plain = list(maps)
    with pytest.raises(ValueError, match="pass grid="):
        explain.cls_attention(plain)
    with pytest.raises(ValueError, match=r"maps have 64 tokens, but 1 prefix tokens \+ a 8x8"):
        explain.cls_attention(plain, grid=8, num_prefix_tokens=1)
    with pytest.raises(ValueError, match="head fusion must be"):
        explain.fuse_heads(maps[0], "median")


# ------------------------------------------------------------------------------- rollout
def reference_rollout(maps, residual, fusion, discard, protect):
    """Loop-by-loop, image by image, in numpy (heads fused and ranked in float32 like the
    maps, so near-ties at the discard cut-off fall the same way; the products in float64)."""
    out = []
    for b in range(maps[0].shape[0]):
        t = maps[0].shape[-1]
        r = np.eye(t)
        for layer in maps:
            a = getattr(np, fusion)(layer[b].numpy(), axis=0)
            if discard:
                keep = np.zeros((t, t), bool)
                if protect:
                    keep[0, :] = keep[:, 0] = True
                candidates = np.flatnonzero(~keep.ravel())
                k = int(len(candidates) * discard)
                order = candidates[np.argsort(a.ravel()[candidates], kind="stable")[:k]]
                a = a.copy().ravel()
                a[order] = 0
                a = a.reshape(t, t)
            a = (1 - residual) * a.astype(np.float64) + residual * np.eye(t)
            a = a / a.sum(axis=1, keepdims=True)
            r = a @ r
        out.append(r)
    return np.stack(out)


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize(("grid", "prefix"), [((4, 4), 1), ((3, 5), 2), ((2, 6), 0)])
@pytest.mark.parametrize(("residual", "discard"), [(0.5, 0.0), (0.3, 0.0), (0.5, 0.4)])
def test_rollout_equals_direct_reference(fusion, grid, prefix, residual, discard):
    g = torch.Generator().manual_seed(7)
    t = prefix + grid[0] * grid[1]
    maps = [torch.softmax(torch.randn(3, 2, t, t, generator=g) * 3, -1) for _ in range(4)]
    readout = (0,) if prefix else None
    ours = explain.attention_rollout(maps, residual, fusion, discard, num_prefix_tokens=prefix)
    ref = reference_rollout(maps, residual, fusion, discard, protect=readout is not None)
    np.testing.assert_allclose(ours.double().numpy(), ref, atol=1e-5)
    torch.testing.assert_close(ours.sum(-1), torch.ones(3, t), atol=1e-5, rtol=0)


def test_rollout_start_layer_and_readout_grid():
    g = torch.Generator().manual_seed(1)
    maps = [torch.softmax(torch.randn(2, 3, 13, 13, generator=g), -1) for _ in range(3)]
    later = explain.attention_rollout(maps, start_layer=1)
    torch.testing.assert_close(later, explain.attention_rollout(maps[1:]))
    layout = Layout((3, 4), 1, (0,))
    assert explain.readout_grid(later, layout).shape == (2, 3, 4)
    torch.testing.assert_close(explain.readout_grid(later, layout),
                               later[:, 0, 1:].reshape(2, 3, 4))
    gap = Layout((3, 4), 1, None)
    torch.testing.assert_close(explain.readout_grid(later, gap),
                               later[:, 1:, 1:].mean(1).reshape(2, 3, 4))


def test_discard_keeps_cls_and_works_on_every_image():
    fused = torch.rand(3, 5, 5)
    out = explain.discard_lowest(fused, 0.5, protect_cls=True)
    torch.testing.assert_close(out[:, 0], fused[:, 0])
    torch.testing.assert_close(out[:, :, 0], fused[:, :, 0])
    assert all((out[b, 1:, 1:] == 0).sum() == 8 for b in range(3))  # 16 candidates * 0.5


def test_rollout_refuses_a_subset_of_layers():
    model = small()
    with torch.no_grad():
        _, maps = model(torch.randn(1, 3, 32, 32), return_attn=True, attn_layers=[0, 2])
    with pytest.raises(ValueError, match=r"layers \[0, 2\]; call model"):
        explain.attention_rollout(maps)


# ----------------------------------------------------------------------------- gradients
def _reference_grads(model, x, target):
    ref = RefViT(model.cfg).from_vitkit(model).eval()
    logits, maps = ref(x, explicit=True)
    score = logits.gather(1, target[:, None]).sum()
    return torch.autograd.grad(score, maps), [m.detach() for m in maps]


def test_each_layers_gradient_belongs_to_that_layer():
    model = small()
    x = torch.randn(2, 3, 32, 32)
    attr = explain.attention_gradients(model, x)
    ref_grads, ref_maps = _reference_grads(model, x, attr.target)
    for i, (ours, theirs) in enumerate(zip(attr.grads, ref_grads, strict=True)):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-4, msg=f"layer {i}")
    # the layers are distinguishable: pairing them in reverse would change the answer
    for i in range(len(ref_grads)):
        j = len(ref_grads) - 1 - i
        if i != j:
            assert not torch.allclose(attr.grads[i], ref_grads[j], atol=1e-5)

    r = torch.eye(ref_maps[0].shape[-1]).expand(2, -1, -1)
    for a, g in zip(ref_maps, ref_grads, strict=True):
        r = r + (g * a).clamp(min=0).mean(1) @ r
    torch.testing.assert_close(explain.chefer(attr), r, atol=1e-6, rtol=1e-4)
    wrong = torch.eye(ref_maps[0].shape[-1]).expand(2, -1, -1)
    for a, g in zip(ref_maps, reversed(ref_grads), strict=True):
        wrong = wrong + (g * a).clamp(min=0).mean(1) @ wrong
    assert not torch.allclose(explain.chefer(attr), wrong, atol=1e-5)


def test_grad_rollout_uses_relu_of_head_mean_of_grad_times_attention():
    model = small()
    x = torch.randn(2, 3, 32, 32)
    attr = explain.attention_gradients(model, x, target=3)
    assert attr.target.tolist() == [3, 3]
    fused = [(g * a).mean(1).clamp(min=0) for a, g in zip(attr.maps, attr.grads, strict=True)]
    expected = explain.rollout_fused(fused, 0.5, 0.0)
    torch.testing.assert_close(explain.grad_rollout(attr), expected)


def test_token_gradcam_against_a_manual_pass():
    model = small()
    x = torch.randn(2, 3, 32, 32)
    cam, logits = explain.token_gradcam(model, x, target=torch.tensor([1, 4]))
    tokens = model._pos_embed(model.patch_embed(x), model.grid_size)
    for block in model.blocks[:-1]:
        tokens, _ = block(tokens)
    tokens = tokens.detach().requires_grad_(True)
    out = model.forward_head(model.norm(model.blocks[-1](tokens)[0]))
    torch.testing.assert_close(out, logits)
    (grad,) = torch.autograd.grad(out[0, 1] + out[1, 4], tokens)
    w = grad[:, 1:].mean(1, keepdim=True)
    manual = (tokens[:, 1:] * w).sum(-1).clamp(min=0).reshape(2, 8, 8)
    torch.testing.assert_close(cam, manual.detach())


@pytest.mark.parametrize("method", explain.METHODS)
def test_every_method_is_batched_and_shaped_like_the_grid(method):
    pooling = dict(pool="map", class_token=False) if method == "map" else {}
    model = small(img_size=(24, 40), **pooling)
    x = torch.randn(3, 3, 24, 40)
    batch = explain.explain_map(model, x, method).map
    assert batch.shape == (3, 6, 10)
    single = explain.explain_map(model, x[1:2], method).map
    torch.testing.assert_close(batch[1:2], single, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", ["cls", "rollout"])
def test_attention_methods_reuse_outputs_already_computed(method):
    model = small()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        outputs = model(x, return_attn=True)
    calls = []
    handle = model.register_forward_hook(lambda m, i, o: calls.append(1))
    try:
        reused = explain.explain_map(model, x, method, outputs=outputs)
    finally:
        handle.remove()
    assert calls == []  # the model did not run again
    torch.testing.assert_close(reused.map, explain.explain_map(model, x, method).map)


def test_gap_and_distilled_models_read_out_their_own_tokens():
    """A GAP model's map is the mean of every patch row (it has no [CLS]); DeiT's averages the
    [CLS] and distillation rows, as it averages its two heads."""
    x = torch.randn(2, 3, 32, 32)
    gap = small(pool="avg", class_token=False)
    with torch.no_grad():
        _, maps = gap(x, return_attn=True)
    matrix = explain.attention_rollout(maps)  # (2, 64, 64): no prefix tokens
    torch.testing.assert_close(explain.explain_map(gap, x, "rollout").map,
                               matrix.mean(1).reshape(2, 8, 8))
    assert not torch.allclose(matrix.mean(1), matrix[:, 0], atol=1e-4)  # not one row alone
    attr = explain.attention_gradients(gap, x)
    torch.testing.assert_close(explain.explain_map(gap, x, "chefer").map,
                               explain.chefer(attr).mean(1).reshape(2, 8, 8))
    # Grad-CAM written out for average pooling: every token is a patch (no prefix), and the
    # score's gradient reaches each through the mean
    tokens = gap._pos_embed(gap.patch_embed(x), gap.grid_size)
    for block in gap.blocks[:-1]:
        tokens, _ = block(tokens)
    tokens = tokens.detach().requires_grad_(True)
    out = gap.forward_head(gap.norm(gap.blocks[-1](tokens)[0]))
    target = out.argmax(-1)
    (grad,) = torch.autograd.grad(out.gather(1, target[:, None]).sum(), tokens)
    manual = (tokens * grad.mean(1, keepdim=True)).sum(-1).clamp(min=0).reshape(2, 8, 8)
    gradcam = explain.explain_map(gap, x, "gradcam")
    assert torch.equal(gradcam.target, target) and tokens.shape[1] == 64
    torch.testing.assert_close(gradcam.map, manual.detach())
    with pytest.raises(ValueError, match="methods that apply"):
        explain.explain_map(gap, x, "cls")
    deit = small(distilled=True)
    with torch.no_grad():
        _, maps = deit(x, return_attn=True)
    assert maps.readout == (0, 1) and maps.num_prefix_tokens == 2
    matrix = explain.attention_rollout(maps)
    rows = matrix[:, :2, 2:]  # [CLS] and distillation rows over the patch columns
    assert not torch.allclose(rows[:, 0], rows[:, 1], atol=1e-4)
    torch.testing.assert_close(explain.explain_map(deit, x, "rollout").map,
                               rows.mean(1).reshape(2, 8, 8))
    attr = explain.attention_gradients(deit, x)
    torch.testing.assert_close(explain.explain_map(deit, x, "chefer").map,
                               explain.chefer(attr)[:, :2, 2:].mean(1).reshape(2, 8, 8))


# ------------------------------------------------------------ a model whose answer is known
# Token Grad-CAM is left out: on this model it gives an all-zero map. The tokens entering the
# last block reach the logit only through its LayerNorm, which is blind to their scale, so the
# object's token gets (almost) no weight along its own direction.
@pytest.mark.parametrize("method", ["chefer", "grad-rollout", "rollout", "cls"])
def test_maps_rank_the_object_patch_first(method):
    model = object_detector()
    x = object_images()
    out = explain.explain_map(model, x, method)
    assert out.target.tolist() == [0, 0] and (out.logits[:, 0] > 1).all()  # it sees the object
    assert_object_ranked_first(out.map, method)


def test_frozen_weights_still_get_gradient_maps():
    model = object_detector()
    x = object_images()
    trainable = explain.explain_map(model, x, "chefer").map
    model.requires_grad_(False)
    frozen = explain.explain_map(model, x, "chefer").map
    assert_object_ranked_first(frozen, "chefer")
    torch.testing.assert_close(frozen, trainable, atol=0, rtol=0)


# ------------------------------------------------------- maps from anywhere, methods anywhere
def test_attention_maps_keep_their_layout_when_sliced():
    model = small(num_reg_tokens=2)
    with torch.no_grad():
        _, maps = model(torch.randn(2, 3, 32, 32), return_attn=True)
    last_two = maps[-2:]
    assert type(last_two) is type(maps)
    assert (last_two.layers, last_two.grid, last_two.num_prefix_tokens, last_two.readout) == \
        ([1, 2], (8, 8), 3, (0,))
    torch.testing.assert_close(explain.cls_attention(last_two), explain.cls_attention(maps))
    torch.testing.assert_close(explain.attention_rollout(last_two),
                               explain.attention_rollout(maps, start_layer=1))
    assert isinstance(maps[0], torch.Tensor)


def test_rollout_and_rows_take_hugging_face_attentions_as_they_are(tmp_path, vitkit_log):
    """outputs.attentions from transformers' own ViT (a tuple, no grid attached) give the same
    rollout, [CLS] maps and token rows as vitkit's maps of the same weights."""
    import transformers

    model = small(num_classes=3)
    vitkit_export = tmp_path / "hf"
    from vitkit import export

    export(model, vitkit_export, to="hf")
    peer = transformers.ViTForImageClassification.from_pretrained(
        vitkit_export, attn_implementation="eager").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        theirs = peer(pixel_values=x, output_attentions=True).attentions
        _, ours = model(x, return_attn=True)
    assert isinstance(theirs, tuple)
    torch.testing.assert_close(explain.attention_rollout(theirs, discard_ratio=0.3),
                               explain.attention_rollout(ours, discard_ratio=0.3), atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(explain.token_attention(theirs, token=17, layer=1),
                               explain.token_attention(ours, token=17, layer=1), atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(explain.cls_attention(theirs, head="max"),
                               explain.cls_attention(ours, head="max"), atol=1e-5, rtol=0)
    assert "read as 1 [CLS] token + a 8x8 patch grid" in vitkit_log.text
    with pytest.raises(ValueError, match="token 65 does not exist: these maps have 65 tokens"):
        explain.token_attention(theirs, token=65)


@pytest.mark.parametrize("method", list(explain.METHODS))
def test_every_method_keeps_to_the_device_of_its_inputs(method):
    """On the meta device every tensor a method makes must follow its inputs' device: a
    torch.eye built on the CPU (which breaks on CUDA) fails here, on a CPU-only machine."""
    with torch.device("meta"):
        model = small_vit(**(dict(pool="map", class_token=False) if method == "map" else {}))
        x = torch.randn(2, 3, 32, 32)
    out = explain.explain_map(model, x, method, discard_ratio=0.2)
    assert out.map.device.type == "meta"
    assert out.map.shape == (2, 8, 8)


def test_the_registry_drives_the_errors_and_the_cli():
    import argparse

    from vitkit.commands.attention import add_arguments

    assert set(explain.METHODS) == {"cls", "map", "rollout", "grad-rollout", "chefer",
                                    "gradcam", "attnlrp", "cp-lrp"}
    assert all(m.summary and m.compute for m in explain.METHODS.values())
    p = argparse.ArgumentParser()
    add_arguments(p)
    choices = next(a.choices for a in p._actions if a.dest == "method")
    assert list(choices) == list(explain.METHODS)
    gap = small(pool="avg", class_token=False)
    with pytest.raises(ValueError, match="'cls' explains a \\[CLS\\] readout, and this model "
                                         "pools by average; methods that apply: rollout, "
                                         "grad-rollout, chefer, gradcam"):
        explain.explain_map(gap, torch.randn(1, 3, 32, 32), "cls")


# ------------------------------------------------------------- attention pooling, registers
def test_a_map_model_is_explained_through_its_readout_attention():
    """SigLIP-style models: the MAP head's attention is the readout map, rollout and gradient
    methods weigh the token rows by it, and a [CLS] map is refused with the methods that apply."""
    model = small(pool="map", class_token=False)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        logits, maps = model(x, return_attn=True)
        tokens = model.forward_features(x)
        _, weights = model.attn_pool(tokens, return_attn=True)
    torch.testing.assert_close(logits, model(x))
    torch.testing.assert_close(maps.pool_attention, weights)
    readout = explain.pool_attention(maps, head="mean")  # (B, 8, 8), sums to 1 over the grid
    torch.testing.assert_close(readout.sum((-1, -2)), torch.ones(2))
    rollout = explain.explain_map(model, x, "rollout", outputs=(logits, maps)).map
    matrix = explain.attention_rollout(maps)
    torch.testing.assert_close(
        rollout, torch.einsum("bt,btn->bn", weights.mean(1), matrix).reshape(2, 8, 8))
    assert explain.explain_map(model, x, "chefer").map.shape == (2, 8, 8)
    with pytest.raises(ValueError, match="'cls' explains a \\[CLS\\] readout, and this model "
                                         "pools by attention.*apply: map, rollout"):
        explain.explain_map(model, x, "cls")
    assert maps[-2:].pool_attention is maps.pool_attention


def test_register_tokens_are_kept_apart_and_shown():
    model = small(num_reg_tokens=3)
    with torch.no_grad():
        _, maps = model(torch.randn(2, 3, 32, 32), return_attn=True)
    regs = explain.register_attention(maps)
    assert regs["from_registers"].shape == (2, 3, 4, 8, 8)
    torch.testing.assert_close(regs["from_registers"][:, 0], maps[-1][:, :, 1, 4:].reshape(
        2, 4, 8, 8))
    torch.testing.assert_close(regs["to_registers"], maps[-1][:, :, 4:, 1:4].mean(2))
    assert explain.cls_attention(maps).shape == (2, 4, 8, 8)  # registers are not on the grid
    with torch.no_grad():
        _, plain = small()(torch.randn(1, 3, 32, 32), return_attn=True)
    with pytest.raises(ValueError, match="no register tokens"):
        explain.register_attention(plain)
