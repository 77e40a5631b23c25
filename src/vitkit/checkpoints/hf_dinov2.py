"""Hugging Face DINOv2 (``Dinov2Model``, ``Dinov2WithRegistersModel``): timm-like blocks with
LayerScale (``layer_scale1.lambda1``), q/k/v projections named ``q_proj``/``k_proj``/``v_proj``
(``attention.attention.query`` in transformers 4), and a position table for 518x518 (37x37) with
a [CLS] row, interpolated to every input size (bicubic in float32, antialiased for the models
with registers: vitkit's ``dynamic_img_size`` and ``pos_antialias``, the same arithmetic). With
registers the table has no register rows; vitkit folds the [CLS] row into the [CLS] token (a
constant, so the same numbers) and keeps a patch-only table, as timm does."""

from __future__ import annotations

import torch

from vitkit.checkpoints.common import Checkpoint, CheckpointError, StateDict, infer_grid
from vitkit.checkpoints.timm import depth_of

NAME = "hf-dinov2"
LABEL = "Hugging Face DINOv2 (encoder.layer.N.layer_scale1.lambda1)"
_QKV = {"q_proj": "query", "k_proj": "key", "v_proj": "value"}
_BLOCK = [("norm1", "norm1"), ("norm2", "norm2"), ("mlp.fc1", "mlp.fc1"),
          ("mlp.fc2", "mlp.fc2")]


def detect(ckpt: Checkpoint) -> bool:
    return any(k.endswith("layer_scale1.lambda1") for k in ckpt.state)


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    config = config or {}
    if config.get("use_swiglu_ffn") or any("weights_in" in k for k in state):
        raise CheckpointError("this DINOv2 (giant) uses a SwiGLU MLP, which vitkit does not "
                              "support; the small, base and large models load")
    state = {k.removeprefix("dinov2."): v for k, v in state.items()}
    state.pop("embeddings.mask_token", None)  # masked-image modelling only
    depth = depth_of(state, r"encoder\.layer\.(\d+)\.")
    out: StateDict = {
        "cls_token": state.pop("embeddings.cls_token"),
        "patch_embed.proj.weight": state.pop("embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": state.pop("embeddings.patch_embeddings.projection.bias"),
        "norm.weight": state.pop("layernorm.weight"),
        "norm.bias": state.pop("layernorm.bias"),
    }
    pos = state.pop("embeddings.position_embeddings")  # (1, 1 + N, D)
    regs = state.pop("embeddings.register_tokens", None)  # (1, R, D)
    if regs is not None:
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["reg_token"] = regs
        pos = pos[:, 1:]
    out["pos_embed"] = pos
    for i in range(depth):
        hf, o = f"encoder.layer.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            qkv = []
            for new, old in _QKV.items():
                t = state.pop(f"{hf}attention.{new}.{part}", None)
                qkv.append(t if t is not None else state.pop(
                    f"{hf}attention.attention.{old}.{part}", None))
            if all(t is not None for t in qkv):
                out[f"{o}attn.qkv.{part}"] = torch.cat(qkv, 0)
            proj = state.pop(f"{hf}attention.o_proj.{part}", None)
            out[f"{o}attn.proj.{part}"] = proj if proj is not None else \
                state.pop(f"{hf}attention.output.dense.{part}")
            for theirs, ours in _BLOCK:
                out[f"{o}{ours}.{part}"] = state.pop(f"{hf}{theirs}.{part}")
        out[f"{o}ls1.gamma"] = state.pop(f"{hf}layer_scale1.lambda1")
        out[f"{o}ls2.gamma"] = state.pop(f"{hf}layer_scale2.lambda1")
    out.update(state)
    patch = out["patch_embed.proj.weight"].shape[-1]
    grid, _ = infer_grid(pos.shape[1], 0 if regs is not None else 1, None, patch)
    kwargs = dict(
        img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch,
        in_chans=out["patch_embed.proj.weight"].shape[1], num_classes=0,
        embed_dim=out["cls_token"].shape[-1], depth=depth,
        num_heads=config.get("num_attention_heads"),
        mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0], init_values=1e-5,
        num_reg_tokens=regs.shape[1] if regs is not None else 0,
        no_embed_class=regs is not None, norm_eps=config.get("layer_norm_eps", 1e-6),
        act="gelu" if config.get("hidden_act", "gelu") == "gelu" else "gelu_tanh",
        dynamic_img_size=True,  # interpolated to every input, bicubic, as Dinov2Model does
        pos_antialias=regs is not None,  # Dinov2WithRegistersModel antialiases, Dinov2Model not
    )
    return out, kwargs, {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
