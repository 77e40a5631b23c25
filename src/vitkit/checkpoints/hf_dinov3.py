"""Hugging Face DINOv3 (``DINOv3ViTModel``): no position table, DINOv3's rotary embeddings
(patch centres scaled to [-1, 1], ``rope_theta`` the base, channels rotated as halves), [CLS]
then ``num_register_tokens`` registers, LayerScale (``layer_scale1.lambda1``), separate
``q_proj``/``k_proj``/``v_proj`` with a bias on each as ``query_bias``/``key_bias``/
``value_bias`` say, and a GELU MLP (``up_proj``/``down_proj``) or the gated SiLU one
(``gate_proj``, ``up_proj``: vitkit's split SwiGLU). ``pooler_output`` is the [CLS] token after
the final LayerNorm: vitkit's ``pool="cls"`` with no head. The ``mask_token`` (masked-image
training only) is dropped on reading and written as zeros."""

from __future__ import annotations

import torch

from vitkit.checkpoints.common import (
    Checkpoint,
    CheckpointError,
    StateDict,
    cnn_refusal,
)
from vitkit.checkpoints.hf_common import HF_ACT, act_of, interpolation, interpolation_of
from vitkit.checkpoints.timm import depth_of
from vitkit.data.images import IMAGENET_MEAN, IMAGENET_STD

NAME = "hf-dinov3"
LABEL = "Hugging Face DINOv3 (layer.N.layer_scale1.lambda1)"
_NORMS = [("norm1", "norm1"), ("norm2", "norm2"), ("attention.o_proj", "attn.proj")]
_MLP = {"gelu": [("mlp.up_proj", "mlp.fc1"), ("mlp.down_proj", "mlp.fc2")],
        "swiglu": [("mlp.gate_proj", "mlp.fc1_g"), ("mlp.up_proj", "mlp.fc1_x"),
                   ("mlp.down_proj", "mlp.fc2")]}


def detect(ckpt: Checkpoint) -> bool:
    return (ckpt.config or {}).get("model_type") == "dinov3_vit" or any(
        k.startswith(("layer.", "model.layer.")) and k.endswith("layer_scale1.lambda1")
        for k in ckpt.state)


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    config = config or {}
    if not config:
        raise CheckpointError("a Hugging Face DINOv3 needs its config.json beside the weights "
                              "(rope_theta, the biases and the MLP are not in them): load the "
                              "folder save_pretrained wrote")
    q_bias, k_bias, v_bias = (config.get(f"{n}_bias", d) for n, d in
                              (("query", True), ("key", False), ("value", True)))
    missing = [what for bad, what in [
        (q_bias != v_bias, "a bias on only one of the query and value"),
        (k_bias and not q_bias, "a key bias without a query bias"),
        (not config.get("proj_bias", True), "no bias on the attention output"),
        (not config.get("mlp_bias", True), "no bias in the MLP"),
        (config.get("use_gated_mlp") and config.get("hidden_act", "silu") != "silu",
         f"a gated MLP with {config.get('hidden_act')} (vitkit's SwiGLU gates with SiLU)"),
    ] if bad]
    if missing:
        raise CheckpointError("this DINOv3 has what vitkit cannot express: "
                              + "; ".join(missing))
    gated = bool(config.get("use_gated_mlp"))
    # save_pretrained writes layer.N (the module's own state dict says model.layer.N)
    state = {k.removeprefix("model."): v for k, v in state.items()}
    state.pop("embeddings.mask_token", None)
    depth = depth_of(state, r"layer\.(\d+)\.", config.get("num_hidden_layers"))
    out: StateDict = {
        "cls_token": state.pop("embeddings.cls_token"),
        "patch_embed.proj.weight": state.pop("embeddings.patch_embeddings.weight"),
        "patch_embed.proj.bias": state.pop("embeddings.patch_embeddings.bias"),
        "norm.weight": state.pop("norm.weight"), "norm.bias": state.pop("norm.bias"),
    }
    regs = state.pop("embeddings.register_tokens", None)
    if regs is not None and regs.shape[1]:
        out["reg_token"] = regs
    for i in range(depth):
        hf, o = f"layer.{i}.", f"blocks.{i}."
        a = hf + "attention."
        out[o + "attn.qkv.weight"] = torch.cat([state.pop(f"{a}{p}_proj.weight") for p in "qkv"])
        if k_bias:
            out[o + "attn.qkv.bias"] = torch.cat([state.pop(f"{a}{p}_proj.bias") for p in "qkv"])
        elif q_bias:
            out[o + "attn.q_bias"] = state.pop(a + "q_proj.bias")
            out[o + "attn.v_bias"] = state.pop(a + "v_proj.bias")
        for theirs, ours in _NORMS + _MLP["swiglu" if gated else "gelu"]:
            for part in ("weight", "bias"):
                out[f"{o}{ours}.{part}"] = state.pop(f"{hf}{theirs}.{part}")
        out[o + "ls1.gamma"] = state.pop(hf + "layer_scale1.lambda1")
        out[o + "ls2.gamma"] = state.pop(hf + "layer_scale2.lambda1")
    out.update(state)  # anything left is reported as unexpected by the strict load
    img = config.get("image_size", 224)
    kwargs = dict(
        img_size=(img, img) if isinstance(img, int) else tuple(img),
        patch_size=out["patch_embed.proj.weight"].shape[-1],
        in_chans=out["patch_embed.proj.weight"].shape[1], num_classes=0,
        embed_dim=out["cls_token"].shape[-1], depth=depth,
        num_heads=config.get("num_attention_heads"),
        mlp_dim=out["blocks.0.mlp.fc2.weight"].shape[1], pool="cls",
        num_reg_tokens=out["reg_token"].shape[1] if "reg_token" in out else 0,
        qkv_bias=bool(q_bias), key_bias=bool(k_bias) or not q_bias,
        init_values=config.get("layerscale_value", 1.0),  # the learned scales are loaded
        norm_eps=config.get("layer_norm_eps", 1e-5),
        act=act_of({"hidden_act": "gelu"} if gated else config),
        mlp="swiglu" if gated else "gelu",
        abs_pos=False, rope="dinov3", rope_half=True,
        rope_temperature=float(config.get("rope_theta", 100.0)),
        **interpolation_of(config, dynamic=True),
    )
    return out, kwargs, {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}


def refusals(cfg) -> list[str]:
    """Why ``DINOv3ViTModel`` cannot hold this model (empty when it can)."""
    return cnn_refusal(cfg) or [msg for bad, msg in [
        (cfg.rope != "dinov3" or not cfg.rope_half or cfg.rope_offset or cfg.rope_xy
         or cfg.rope_ref_grid, "does not use DINOv3's rotary embeddings"),
        (cfg.abs_pos, "has a position table (DINOv3ViTModel has none)"),
        (cfg.init_values is None, "has no LayerScale"),
        (cfg.pool != "cls" or cfg.distilled or not cfg.class_token,
         "does not pool its [CLS] token alone (DINOv3ViTModel's pooler_output is [CLS])"),
        (cfg.num_classes > 0, "has a head (DINOv3ViTModel is a backbone: export num_classes=0)"),
        (cfg.representation_size, "has a pre-logits layer"),
        (cfg.pre_norm or not cfg.patch_bias, "has CLIP options (pre-norm, no patch bias)"),
        (cfg.mlp == "glu" or cfg.mlp_norm, "has a packed SwiGLU or a LayerNorm in its MLP"),
        (cfg.mlp == "gelu" and cfg.act not in HF_ACT, f"uses {cfg.act}"),
        (cfg.mlp == "swiglu" and cfg.act != "gelu", f"sets act={cfg.act} beside SwiGLU"),
        (cfg.pool_heads, "has a MAP head"),
        (cfg.img_size[0] != cfg.img_size[1], "takes rectangular images"),
    ] if bad]


def from_vitkit(model) -> tuple[StateDict, dict]:
    """vitkit model -> (state dict, config.json) of ``DINOv3ViTModel``."""
    cfg = model.cfg
    s = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    D = cfg.embed_dim
    out: StateDict = {
        "embeddings.cls_token": s["cls_token"], "embeddings.mask_token": torch.zeros(1, 1, D),
        "embeddings.register_tokens": s.get("reg_token", torch.zeros(1, 0, D)),
        "embeddings.patch_embeddings.weight": s["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.bias": s["patch_embed.proj.bias"],
        "norm.weight": s["norm.weight"], "norm.bias": s["norm.bias"],
    }
    for i in range(cfg.depth):
        hf, o = f"layer.{i}.", f"blocks.{i}."
        a = hf + "attention."
        for p, w in zip("qkv", s[o + "attn.qkv.weight"].chunk(3), strict=True):
            out[f"{a}{p}_proj.weight"] = w.contiguous()
        if o + "attn.qkv.bias" in s:
            for p, b in zip("qkv", s[o + "attn.qkv.bias"].chunk(3), strict=True):
                out[f"{a}{p}_proj.bias"] = b.contiguous()
        elif o + "attn.q_bias" in s:
            out[a + "q_proj.bias"], out[a + "v_proj.bias"] = s[o + "attn.q_bias"], \
                s[o + "attn.v_bias"]
        for theirs, ours in _NORMS + _MLP[cfg.mlp]:
            for part in ("weight", "bias"):
                out[f"{hf}{theirs}.{part}"] = s[f"{o}{ours}.{part}"]
        out[hf + "layer_scale1.lambda1"] = s[o + "ls1.gamma"]
        out[hf + "layer_scale2.lambda1"] = s[o + "ls2.gamma"]
    config = {
        "architectures": ["DINOv3ViTModel"], "model_type": "dinov3_vit",
        "hidden_size": D, "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads, "image_size": cfg.img_size[0],
        "patch_size": cfg.patch_size, "num_channels": cfg.in_chans,
        "layer_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_temperature,
        "query_bias": cfg.qkv_bias, "value_bias": cfg.qkv_bias,
        "key_bias": cfg.qkv_bias and cfg.key_bias, "proj_bias": True, "mlp_bias": True,
        "layerscale_value": cfg.init_values, "use_gated_mlp": cfg.mlp == "swiglu",
        "hidden_act": "silu" if cfg.mlp == "swiglu" else HF_ACT[cfg.act],
        "num_register_tokens": cfg.num_reg_tokens,
        "pos_embed_shift": None, "pos_embed_jitter": None, "pos_embed_rescale": None,
        **interpolation(cfg, dynamic=True),
    }
    return out, config
