"""Property tests over image sizes, patch sizes, pooling and prefix-token counts."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from vitkit import VisionTransformer, interpolate_pos_embed

from reference import RefViT


@st.composite
def vit_and_input(draw):
    patch = draw(st.sampled_from([1, 2, 3, 4, 8]))
    gh, gw = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    pool = draw(st.sampled_from(["cls", "avg"]))
    class_token = True if pool == "cls" else draw(st.booleans())
    regs = draw(st.integers(0, 3))
    heads = draw(st.sampled_from([1, 2, 4]))
    model = VisionTransformer(
        img_size=(gh * patch, gw * patch), patch_size=patch, in_chans=draw(st.sampled_from([1, 3])),
        embed_dim=8 * heads, depth=draw(st.integers(1, 3)), num_heads=heads, mlp_dim=16,
        num_classes=draw(st.integers(0, 5)), pool=pool, class_token=class_token,
        num_reg_tokens=regs, fc_norm=pool == "avg" and draw(st.booleans()),
    ).eval()
    x = torch.randn(draw(st.integers(1, 3)), model.cfg.in_chans, gh * patch, gw * patch)
    return model, x


@given(vit_and_input())
def test_shapes_maps_and_fused_path_agree(case):
    model, x = case
    cfg = model.cfg
    gh, gw = cfg.grid_size
    t = cfg.num_prefix_tokens + gh * gw
    with torch.no_grad():
        logits = model(x)
        logits_m, maps = model(x, return_attn=True)
    out_dim = cfg.num_classes or cfg.embed_dim
    assert logits.shape == (x.shape[0], out_dim)
    torch.testing.assert_close(logits_m, logits, atol=1e-5, rtol=0)
    assert len(maps) == cfg.depth
    for m in maps:
        assert m.shape == (x.shape[0], cfg.num_heads, t, t)
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]), atol=1e-5, rtol=0)


@given(vit_and_input())
def test_equals_textbook_reference(case):
    model, x = case
    if model.cfg.num_classes == 0:  # the reference always has a head
        model.reset_classifier(3)
    ref = RefViT(model.cfg).from_vitkit(model).eval()
    with torch.no_grad():
        ref_logits, ref_maps = ref(x)
        logits, maps = model(x, return_attn=True)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
    for ours, theirs in zip(maps, ref_maps, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


@given(
    prefix=st.integers(0, 4),
    old=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    new=st.tuples(st.integers(1, 9), st.integers(1, 9)),
)
def test_interpolation_keeps_prefix_and_shapes(prefix, old, new):
    table = torch.randn(1, prefix + old[0] * old[1], 4)
    out = interpolate_pos_embed(table, old, new, num_prefix_tokens=prefix)
    assert out.shape == (1, prefix + new[0] * new[1], 4)
    assert torch.equal(out[:, :prefix], table[:, :prefix])
    if old == new:
        assert out is table
