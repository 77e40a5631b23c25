"""The state-dict keys of the ViT a :class:`~vitkit.models.config.ViTConfig` describes, without
building it (so without torch). ``tests/test_vit.py`` holds it equal to
``VisionTransformer(cfg).state_dict()`` for every registered model and option."""

from __future__ import annotations

from vitkit.models.config import ViTConfig


def _linear(name: str, bias: bool = True) -> list[str]:
    return [f"{name}.weight"] + ([f"{name}.bias"] if bias else [])


def state_keys(cfg: ViTConfig) -> set[str]:
    """Every key of the model's state dict."""
    keys = ["pos_embed"] if cfg.abs_pos else []
    keys += _linear("patch_embed.proj", cfg.patch_bias)
    if cfg.rope == "mixed":
        keys += ["rope.freqs"]  # learned frequencies; the fixed ones are not stored
    keys += [name for name, present in (("cls_token", cfg.class_token),
                                        ("dist_token", cfg.distilled),
                                        ("reg_token", cfg.num_reg_tokens > 0)) if present]
    if cfg.pre_norm:
        keys += _linear("norm_pre")
    for i in range(cfg.depth):
        b = f"blocks.{i}."
        keys += _linear(b + "norm1") + _linear(b + "norm2")
        keys += _linear(b + "attn.qkv", cfg.qkv_bias and cfg.key_bias) + _linear(b + "attn.proj")
        if cfg.qkv_bias and not cfg.key_bias:
            keys += [b + "attn.q_bias", b + "attn.v_bias"]
        first = ["mlp.fc1_g", "mlp.fc1_x"] if cfg.mlp == "swiglu" else ["mlp.fc1"]
        for part in first + ["mlp.fc2"] + (["mlp.norm"] if cfg.mlp_norm else []):
            keys += _linear(b + part)
        if cfg.init_values is not None:
            keys += [b + "ls1.gamma", b + "ls2.gamma"]
    keys += _linear("fc_norm" if cfg.fc_norm else "norm")
    if cfg.pool == "map":
        keys += ["attn_pool.latent"]
        for part in ("q", "kv", "proj", "norm", "mlp.fc1", "mlp.fc2"):
            keys += _linear(f"attn_pool.{part}")
    if cfg.representation_size:
        keys += _linear("pre_logits.fc")
    if cfg.num_classes > 0:
        keys += _linear("head", cfg.head_bias)
        if cfg.distilled:
            keys += _linear("head_dist", cfg.head_bias)
    return set(keys)
