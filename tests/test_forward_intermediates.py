"""VisionTransformer.forward_intermediates against timm's own, family by family.

Each family is built by timm at three blocks and a small input, with perturbed weights and
queries and keys scaled up (peaked attention, so that a rotary table given to the wrong block
shows), written as timm's hub folder and loaded by vitkit. Every output of vitkit's
forward_intermediates (both formats, the final norm on and off, the prefix tokens split off,
the intermediates alone, last-n and listed indices, stopping early) equals timm's to 1e-5, at
the model's size and at a rectangle of another size. The plain ViT, DINOv2 with registers,
DINOv3 (RoPE, [CLS] and four storage tokens), EVA-02, SigLIP (no prefix token, MAP head), DeiT
distilled and a ViT with learned per-block RoPE frequencies (rope_mixed).
"""

from __future__ import annotations

import itertools
import json

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitkit
from vitkit.errors import ModelError
from vitkit.models import inference

from peers import max_diff, perturb

DEPTH = 3
NARROW = dict(embed_dim=128, num_heads=4)  # the S/14 and S/16 widths cut to 128
# family -> (timm name, overrides): at DEPTH blocks, on a 4x4 patch grid, any size on request
FAMILIES = {
    "vit": ("vit_base_patch16_224", dict(img_size=32, patch_size=8, embed_dim=64, num_heads=4)),
    "dinov2_reg": ("vit_small_patch14_reg4_dinov2", dict(img_size=56, **NARROW)),
    "dinov3": ("vit_small_patch16_dinov3", dict(img_size=64, **NARROW)),
    "eva02": ("eva02_tiny_patch14_224", dict(img_size=56)),
    "siglip": ("vit_base_patch16_siglip_224",
               dict(img_size=32, patch_size=8, embed_dim=64, num_heads=4)),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", dict(img_size=32)),
    "rope_mixed": ("vit_small_patch16_rope_mixed_224", dict(img_size=64, **NARROW)),
}
PREFIX = {"vit": 1, "dinov2_reg": 5, "dinov3": 5, "eva02": 1, "siglip": 0,
          "deit_distilled": 2, "rope_mixed": 1}
ROPE = ("dinov3", "eva02", "rope_mixed")
ATOL = 1e-5
# (indices, stop_early): all, the last two, a list with a negative index, a list out of order
INDICES = [(None, False), (2, False), ([0, -1], False), ([-1, 1], False), ([0, 1], True)]


def sharpened(model: torch.nn.Module, factor: float = 4.0) -> torch.nn.Module:
    """Perturbed weights, queries and keys scaled by ``factor`` (peaked attention, values left
    as they are); in eval mode."""
    perturb(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("attn.qkv.weight"):  # (3D, D): the rows of q and k
                p[: 2 * p.shape[1]].mul_(factor)
            elif name.endswith(("attn.q_proj.weight", "attn.k_proj.weight")):
                p.mul_(factor)
    return model.eval()


_BUILT: dict[str, tuple] = {}


@pytest.fixture
def pair(request, tmp_path_factory):
    """(family, timm's model, vitkit's model loaded from its hub folder) of the family asked
    for; built once per family."""
    family = request.param
    if family not in _BUILT:
        name, overrides = FAMILIES[family]
        args = dict(overrides, depth=DEPTH, dynamic_img_size=True)
        peer = sharpened(timm.create_model(name, **args))
        folder = tmp_path_factory.mktemp(family)
        save_file({k: v.contiguous() for k, v in peer.state_dict().items()},
                  folder / "model.safetensors")
        config = {"architecture": name, "num_classes": peer.num_classes,
                  "model_args": dict(args, num_heads=peer.blocks[0].attn.num_heads),
                  "pretrained_cfg": {"input_size": [3, *peer.patch_embed.img_size]},
                  # timm's dynamic_img_size resamples its table with antialias; vitkit's
                  # reader assumes it for DINOv2 only
                  "pos_antialias": True}
        (folder / "config.json").write_text(json.dumps(config))
        _BUILT[family] = peer, vitkit.load_model(folder, verbose=False)
    return (family, *_BUILT[family])


def assert_same(ours, theirs, what: str) -> None:
    """The same nesting of tuples and lists, tensors of the same shape within ATOL."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and ours.shape == theirs.shape, what
        assert max_diff(ours, theirs) < ATOL, f"{what}: {max_diff(ours, theirs):.3g} apart"
        return
    assert type(ours) is type(theirs) and len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert_same(a, b, f"{what}[{i}]")


def sizes(model) -> list[tuple[int, int]]:
    """The model's input size, and a rectangle of 5x7 patches (another size: the position
    table interpolated, the rotary tables computed for that grid)."""
    p = model.cfg.patch_size
    return [tuple(model.cfg.img_size), (5 * p, 7 * p)]


@pytest.mark.parametrize("pair", list(FAMILIES), indirect=True)
def test_every_output_equals_timms(pair):
    _, peer, model = pair
    for size in sizes(model):
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0))
        for (indices, stop_early), norm, fmt, prefix, only in itertools.product(
                INDICES, (False, True), ("NCHW", "NLC"), (False, True), (False, True)):
            kw = dict(indices=indices, stop_early=stop_early, norm=norm, output_fmt=fmt,
                      return_prefix_tokens=prefix, intermediates_only=only)
            with torch.no_grad():
                theirs = peer.forward_intermediates(x, **kw)
                ours = model.forward_intermediates(x, **kw)
            assert_same(ours, theirs, f"{size} {kw}")


@pytest.mark.parametrize("pair", list(FAMILIES), indirect=True)
def test_shapes_and_final_features(pair):
    """Patch tokens (B, D, gh, gw) or (B, N, D), prefix tokens (B, P, D), block order; the
    final tokens are forward_features' (its in-place path, taken here, changes none of the
    intermediates kept)."""
    family, _, model = pair
    D, p = model.cfg.embed_dim, model.cfg.patch_size
    x = torch.randn(2, 3, 5 * p, 7 * p)
    with torch.no_grad():
        tokens, _, _ = model.embed(x)
        assert inference.applies(model, tokens)
        final, inter = model.forward_intermediates(x, indices=[-1, 0], output_fmt="NLC",
                                                   return_prefix_tokens=True)
        nchw = model.forward_intermediates(x, indices=1, intermediates_only=True)
        features = model.forward_features(x)
    P = PREFIX[family]
    assert model.num_prefix_tokens == P
    assert max_diff(final, features) < ATOL
    assert nchw[0].shape == (2, D, 5, 7)
    if P:
        (first, first_prefix), (last, last_prefix) = inter
        assert first_prefix.shape == last_prefix.shape == (2, P, D)
    else:  # no prefix token: the patch tokens alone, as timm gives them
        first, last = inter
    assert first.shape == last.shape == (2, 35, D)
    assert max_diff(last.transpose(1, 2).reshape(2, D, 5, 7), nchw[0]) == 0
    # block 0 first: its output is not the last block's (nor overwritten by it)
    assert max_diff(first, last) > 100 * ATOL


@pytest.mark.parametrize("pair", ROPE, indirect=True)
def test_the_comparison_sees_the_rotary_tables(pair):
    """The test can fail: without its rotary embeddings (or with one block's table given to
    every block) the intermediates are far from timm's."""
    _, peer, model = pair
    x = torch.randn(2, 3, *model.cfg.img_size)
    with torch.no_grad():
        theirs = peer.forward_intermediates(x, intermediates_only=True)
        rope, model.rope = model.rope, None
        try:
            ours = model.forward_intermediates(x, intermediates_only=True)
        finally:
            model.rope = rope
    assert max_diff(ours[-1], theirs[-1]) > 100 * ATOL


def test_gradients_and_checkpointing():
    """With autograd the same intermediates, gradients reach the patch embedding; gradient
    checkpointing gives the same outputs and gradients."""
    model = vitkit.create_model("vit_nano_patch4_32")
    perturb(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model.forward_intermediates(x, indices=[0, -1], norm=True)
    grads = []
    for checkpointing in (False, True):
        model.zero_grad()
        model.set_grad_checkpointing(checkpointing)
        final, inter = model.forward_intermediates(x, indices=[0, -1], norm=True)
        assert_same((final, inter), expected, f"checkpointing={checkpointing}")
        (final.square().mean() + sum(t.square().mean() for t in inter)).backward()
        grads.append(model.patch_embed.proj.weight.grad.clone())
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("kwargs, message", [
    (dict(indices=0), r"indices=0 asks for the last 0 blocks, but the model has 3"),
    (dict(indices=4), r"indices=4 .* give 1\.\.3"),
    (dict(indices=[0, 3]), r"indices has 3, but the model has 3 blocks \(valid: -3\.\.2\)"),
    (dict(indices=[-4]), r"indices has -4"),
    (dict(indices=[]), r"non-empty list of block indices; got \[\]"),
    (dict(indices=True), r"got True"),
    (dict(indices="1"), r"got '1'"),
    (dict(indices=[1.0]), r"indices has 1\.0"),
    (dict(output_fmt="NHWC"), r"output_fmt must be 'NCHW' .* or 'NLC' .*; got 'NHWC'"),
])
def test_bad_arguments_are_refused(kwargs, message):
    model = vitkit.create_model("vit_nano_patch4_32", depth=3)
    with pytest.raises(ModelError, match=message):
        model.forward_intermediates(torch.randn(1, 3, 32, 32), **kwargs)


def test_bad_images_are_refused():
    model = vitkit.create_model("vit_nano_patch4_32")
    with pytest.raises(ModelError, match=r"expected images \(B, 3, H, W\), got shape \(3, 32"):
        model.forward_intermediates(torch.randn(3, 32, 32))
