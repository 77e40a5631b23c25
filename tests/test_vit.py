"""The model against two independent references: a textbook nn.MultiheadAttention ViT and timm."""

import pytest
import timm
import torch
from conftest import SMALL, small_vit
from timm.layers import resample_abs_pos_embed
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit import VisionTransformer, create_model
from vitkit.models.keys import state_keys
from vitkit.models.registry import build_config

from reference import RefViT

CONFIGS = {
    "cls": {},
    "avg": dict(pool="avg", class_token=False),
    "avg-fc-norm": dict(pool="avg", class_token=False, fc_norm=True),
    "avg-with-cls": dict(pool="avg", class_token=True),
    "cls-registers": dict(num_reg_tokens=2),
    "rectangular": dict(img_size=(32, 48)),
}


def small(**kw) -> VisionTransformer:
    return small_vit(**kw)


def images(model, batch=2):
    return torch.randn(batch, 3, *model.cfg.img_size)


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_forward_and_maps_equal_textbook_reference(overrides):
    model = small(**overrides)
    ref = RefViT(model.cfg).from_vitkit(model).eval()
    x = images(model)
    with torch.no_grad():
        ref_logits, ref_maps = ref(x)
        logits = model(x)
        logits_m, maps = model(x, return_attn=True)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits_m, ref_logits, atol=1e-5, rtol=0)
    assert len(maps) == model.cfg.depth
    for ours, theirs in zip(maps, ref_maps, strict=True):
        t = model.pos_embed.shape[1]
        assert ours.shape == theirs.shape == (2, 4, t, t)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def _timm_twin(model: VisionTransformer):
    cfg = model.cfg
    pool = {"cls": "token", "avg": "avg"}[cfg.pool]
    twin = timm.models.vision_transformer.VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, embed_dim=cfg.embed_dim,
        depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_dim / cfg.embed_dim,
        num_classes=cfg.num_classes, global_pool=pool, class_token=cfg.class_token,
        reg_tokens=cfg.num_reg_tokens, fc_norm=cfg.fc_norm, dynamic_img_size=cfg.dynamic_img_size,
    )
    twin.load_state_dict(model.state_dict(), strict=True)  # same names, same shapes
    return twin.eval()


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(pool="avg", class_token=False, fc_norm=True), dict(num_reg_tokens=3),
     dict(img_size=(32, 48))],
    ids=["cls", "avg-fc-norm", "registers", "rectangular"],
)
def test_logits_equal_timm_with_the_same_state_dict(overrides):
    model = small(**overrides)
    twin = _timm_twin(model)
    x = images(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x), atol=1e-5, rtol=0)


def test_dynamic_img_size_matches_timm_on_a_rectangle():
    """timm built at the new size, its table resized by timm's own resampler (no antialias)."""
    model = small(dynamic_img_size=True)
    x = torch.randn(2, 3, 48, 64)  # a 12x16 grid from an 8x8 table
    twin = _timm_twin(small(img_size=(48, 64)))
    state = model.state_dict()
    state["pos_embed"] = resample_abs_pos_embed(
        state["pos_embed"], (12, 16), (8, 8), num_prefix_tokens=1, antialias=False
    )
    twin.load_state_dict(state, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x), atol=1e-5, rtol=0)


def test_dynamic_img_size_equals_moving_the_table_with_set_img_size():
    model = small(dynamic_img_size=True)
    x = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        dynamic = model(x)
        model.set_img_size((40, 24))
        assert model.grid_size == (10, 6) and model.pos_embed.shape == (1, 61, 48)
        torch.testing.assert_close(model(x), dynamic, atol=0, rtol=0)


def test_maps_rows_sum_to_one_and_heads_stay_apart():
    model = small()
    _, maps = model(images(model), return_attn=True)
    for m in maps:
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]), atol=1e-5, rtol=0)
        # heads are distinct patterns, never an average of one another
        assert not torch.allclose(m[:, 0], m[:, 1])


def test_attn_layers_selects_layers_in_the_order_asked():
    model = small()
    x = images(model)
    with torch.no_grad():
        logits_all, all_maps = model(x, return_attn=True)
        logits, maps = model(x, return_attn=True, attn_layers=[-1, 0])
    torch.testing.assert_close(logits, logits_all, atol=1e-6, rtol=0)
    assert len(maps) == 2
    torch.testing.assert_close(maps[0], all_maps[2], atol=1e-6, rtol=0)
    torch.testing.assert_close(maps[1], all_maps[0], atol=1e-6, rtol=0)


def test_only_the_layers_asked_leave_the_fused_path():
    """An explicit q k^T costs batched matmuls (bmm); the fused SDPA path does not show them."""
    model = small()
    x = images(model, batch=1)
    t, d = model.pos_embed.shape[1], model.embed_dim
    per_layer = 2 * (2 * t * t * d)  # FLOPs of q k^T and attn @ v
    for layers, expected in [(None, 0), ([-1], 1), ([0, 2], 2)]:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            if layers is None:
                model(x)
            else:
                model(x, return_attn=True, attn_layers=layers)
        bmm = sum(v for k, v in counter.get_flop_counts()["Global"].items() if "bmm" in str(k))
        assert bmm == expected * per_layer


def test_bad_attn_layers_are_refused():
    model = small()
    x = images(model)
    with pytest.raises(ValueError, match="model has 3 layers"):
        model(x, return_attn=True, attn_layers=[3])
    with pytest.raises(ValueError, match="return_attn=True"):
        model(x, attn_layers=[0])


def test_non_divisible_input_is_refused_with_both_sizes():
    model = small(dynamic_img_size=True)
    with pytest.raises(ValueError, match=r"image size 30x32 is not divisible by patch size 4"):
        model(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match=r"224x225 is not divisible by patch size 16"):
        create_model("vit_tiny_patch16_224", img_size=(224, 225))


def test_grid_mismatch_names_both_grids_and_the_way_out():
    model = small()
    with pytest.raises(ValueError) as err:
        model(torch.randn(1, 3, 48, 48))
    msg = str(err.value)
    assert "12x12 patch grid" in msg and "8x8" in msg
    assert "interpolate_pos_embed" in msg and "dynamic_img_size=True" in msg


def test_wrong_channels_are_refused():
    expected = r"expected images \(B, 3, H, W\), got shape \(2, 1, 32, 32\)"
    with pytest.raises(ValueError, match=expected):
        small()(torch.randn(2, 1, 32, 32))


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_gradients_reach_every_parameter(overrides):
    model = small(**overrides).train()
    model(images(model)).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_grad_checkpointing_gives_identical_gradients():
    model = small().train()
    x = images(model)

    def grads():
        model.zero_grad()
        model(x).square().sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    model.set_grad_checkpointing(True)
    checkpointed = grads()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], atol=1e-6, rtol=0)


@pytest.mark.parametrize("overrides", [{}, dict(pool="avg", class_token=False, fc_norm=True)],
                         ids=["cls", "avg-fc-norm"])
def test_num_classes_zero_returns_features(overrides):
    """Without a head the model returns the pooled vector the head would have read: the
    normed [CLS] token, or the fc-normed mean of the patch tokens (as timm's pre-logits)."""
    model = small_vit(scale=0.1, num_classes=0, **overrides)
    x = images(model)
    with torch.no_grad():
        features = model(x)
        tokens = model.forward_features(x)
    assert features.shape == (2, 48)
    pooled = tokens[:, 0] if model.cfg.pool == "cls" else model.fc_norm(tokens.mean(1))
    torch.testing.assert_close(features, pooled, atol=1e-6, rtol=0)
    twin = _timm_twin(model)
    with torch.no_grad():
        torch.testing.assert_close(features, twin.forward_head(twin.forward_features(x),
                                                               pre_logits=True),
                                   atol=1e-5, rtol=0)


def test_stochastic_depth_rises_linearly_and_is_off_in_eval():
    model = small(drop_path_rate=0.2, depth=5)
    rates = [b.drop_path1.p for b in model.blocks]
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    x = images(model)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), model.eval()(x))
        model.train()
        assert not torch.allclose(model(x), model(x))


def test_dropout_changes_training_outputs_only():
    model = small(drop_rate=0.5, attn_drop_rate=0.5)
    x = images(model)
    with torch.no_grad():
        model.train()
        assert not torch.allclose(model(x), model(x))
        model.eval()
        torch.testing.assert_close(model(x), model(x), atol=0, rtol=0)


def test_layernorm_eps_is_a_constructor_argument():
    model = small(norm_eps=1e-12)
    assert {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-12}


def test_exact_gelu_and_position_table_init():
    model = create_model("vit_small_patch16_224")
    assert model.blocks[0].mlp.act.approximate == "none"
    std = model.pos_embed.std().item()
    assert abs(std - 0.02) < 1e-3  # trunc-normal(std=0.02), cut far out at +-2 as timm does
    assert model.pos_embed.abs().max() <= 2.0


def test_reset_classifier_and_bad_configs():
    model = small()
    model.reset_classifier(3)
    assert model(images(model)).shape == (2, 3)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        small(num_heads=5)
    with pytest.raises(ValueError, match="pool must be"):
        small(pool="max")
    with pytest.raises(ValueError, match="needs class_token=True"):
        small(class_token=False)


# ------------------------------------------------------------------------ stochastic depth
def test_drop_path_keeps_the_expected_output_equal_to_the_input():
    """Each sample's branch is dropped or scaled by 1/keep, so E[DropPath(x)] = x; without the
    rescaling every residual branch would shrink by keep in training."""
    from vitkit.models.vit import DropPath

    drop = DropPath(0.25).train()
    x = torch.ones(200_000, 3)
    y = drop(x)
    kept = y[:, 0] != 0
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.75))
    assert abs(y.mean().item() - 1.0) < 0.01
    assert abs(kept.float().mean().item() - 0.75) < 0.01
    assert torch.equal(drop.eval()(x), x)


def test_a_block_with_drop_path_equals_timms_under_the_same_seed():
    from timm.models.vision_transformer import Block as TimmBlock

    model = small_vit(scale=0.1, drop_path_rate=0.4)
    ours = model.blocks[-1].train()
    assert ours.drop_path1.p == pytest.approx(0.4)
    theirs = TimmBlock(48, 4, mlp_ratio=2.0, qkv_bias=True, drop_path=0.4).train()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(16, 65, 48)
    torch.manual_seed(3)
    y_ours, _ = ours(x)
    torch.manual_seed(3)
    y_theirs = theirs(x)
    torch.testing.assert_close(y_ours, y_theirs, atol=1e-6, rtol=1e-5)
    torch.manual_seed(4)
    assert not torch.allclose(ours(x)[0], y_ours)  # the seed matters: the masks are drawn


@pytest.mark.parametrize("name", vitkit.list_models())
def test_the_state_keys_of_a_config_are_the_models(name):
    """models/keys.py lists the keys without building the model (the doctor reads a checkpoint
    without torch with it): they must be the model's own, for every registered model ..."""
    with torch.device("meta"):  # the structure only: no memory, no initialisation
        model = VisionTransformer(build_config(name))
    assert state_keys(model.cfg) == set(model.state_dict())


@pytest.mark.parametrize("options", [
    dict(pool="avg", fc_norm=True, class_token=False), dict(distilled=True, head_bias=False),
    dict(pool="map", class_token=False, num_reg_tokens=4), dict(representation_size=32),
    dict(pre_norm=True, patch_bias=False, qkv_bias=False, init_values=1e-5),
    dict(num_classes=0), dict(no_embed_class=True, num_reg_tokens=2)])
def test_the_state_keys_follow_every_option(options):
    """... and for every option that adds or removes a parameter."""
    model = VisionTransformer(**{**SMALL, **options})
    assert state_keys(model.cfg) == set(model.state_dict())
