"""The original JAX ``.npz`` checkpoints: google-research/vision_transformer and big_vision.

Layouts read (``prefix`` is '', ``opt/target/``, ``params/`` or ``params/img/``):
- vision_transformer: ``Transformer/encoderblock_{i}/`` with ``LayerNorm_0``, ``LayerNorm_2``,
  ``MultiHeadDotProductAttention_1``, ``MlpBlock_3``; the position table
  ``Transformer/posembed_input/pos_embedding`` has a [CLS] row when there is a ``cls``.
- big_vision: ``LayerNorm_0``, ``LayerNorm_1``, ``MultiHeadDotProductAttention_0``,
  ``MlpBlock_0``, either per block or stacked along a leading depth axis
  (``Transformer/encoderblock/``, from ``nn.scan``); ``pos_embedding`` covers the patches only.
Kernels: patch embedding HWIO -> OIHW; dense (in, out) -> (out, in); attention query/key/value
(D, heads, d) -> (heads*d, D) fused into qkv; attention out (heads, d, D) -> (D, heads*d).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vitkit.checkpoints.common import (
    ROPE_ERA_OPTIONS,
    Checkpoint,
    CheckpointError,
    StateDict,
    cnn_refusal,
    full_state,
    infer_grid,
    new_options_refusal,
    refuse,
)
from vitkit.checkpoints.timm import depth_of
from vitkit.util.files import atomic_write

NAME = "jax"
LABEL = "JAX .npz (embedding/kernel)"
DEPTH_FROM_WEIGHTS = True  # a bare file does not state its depth: blocks may be lost unseen
# The ViTConfig fields google-research/vision_transformer's layout holds: the arrays show the
# shapes, the heads (query kernels are (D, heads, d)), [CLS] or not, a MAP head, a pre-logits
# layer; LayerNorm eps and the two interpolation options go in as vitkit's own arrays. Square
# images only (the grid is read back from the table); a missing head bias is written as zeros.
HOLDS = frozenset({
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
    "mlp_dim", "pool", "class_token", "representation_size", "head_bias", "norm_eps",
    "dynamic_img_size", "pos_antialias",
})
REFUSES = frozenset({"pos_interp",
    "distilled", "num_reg_tokens", "no_embed_class", "fc_norm", "qkv_bias", "init_values",
    "pre_norm", "patch_bias", "act",
}) | ROPE_ERA_OPTIONS
_EPS_KEY = "vitkit/norm_eps"  # written only when eps is not JAX's 1e-6 (e.g. from HF's 1e-12)
# written only when true: JAX ViTs take one input size
_FLAG_KEYS = {"dynamic_img_size": "vitkit/dynamic_img_size",
              "pos_antialias": "vitkit/pos_antialias"}
_PREFIXES = ("opt/target/", "params/img/", "params/", "")


def detect(ckpt: Checkpoint) -> bool:
    return any(f"{p}embedding/kernel" in ckpt.state for p in _PREFIXES)


def _layout(state: StateDict) -> tuple[str, bool, bool]:
    """(prefix, big_vision naming, stacked blocks)."""
    prefix = next(p for p in _PREFIXES if f"{p}embedding/kernel" in state)
    stacked = f"{prefix}Transformer/encoderblock/LayerNorm_0/scale" in state
    big_vision = stacked or f"{prefix}pos_embedding" in state or prefix.startswith("params/")
    return prefix, big_vision, stacked


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    prefix, big_vision, stacked = _layout(state)
    w = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    left = set(w)

    def take(key: str, idx: int | None = None) -> torch.Tensor:
        if key not in w:
            raise CheckpointError(f"JAX checkpoint is missing {prefix + key!r}")
        left.discard(key)
        t = w[key]
        return t[idx] if idx is not None else t

    emb = take("embedding/kernel")  # (P, P, C, D) HWIO
    if emb.dim() != 4:
        raise CheckpointError(f"embedding/kernel should be HWIO (P, P, C, D), got "
                              f"{tuple(emb.shape)}; flattened (NaFlex) patch embeddings are not "
                              "supported")
    patch, in_chans, width = emb.shape[0], emb.shape[2], emb.shape[3]
    out: StateDict = {
        "patch_embed.proj.weight": emb.permute(3, 2, 0, 1),
        "patch_embed.proj.bias": take("embedding/bias"),
    }
    class_token = "cls" in w
    if class_token:
        out["cls_token"] = take("cls").reshape(1, 1, width)
    pos_key = "pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding"
    out["pos_embed"] = take(pos_key).reshape(1, -1, width)
    mha, ln2, mlp = ("MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0") if big_vision \
        else ("MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
    if stacked:
        depth = w["Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
    else:
        depth = depth_of(w, r"Transformer/encoderblock_(\d+)/") if any(
            k.startswith("Transformer/encoderblock_") for k in w) else 0
    if depth == 0:
        raise CheckpointError("JAX checkpoint has no Transformer/encoderblock_N")
    heads = None
    for i in range(depth):
        b, idx = (("Transformer/encoderblock/", i) if stacked
                  else (f"Transformer/encoderblock_{i}/", None))
        o = f"blocks.{i}."
        out[o + "norm1.weight"] = take(b + "LayerNorm_0/scale", idx)
        out[o + "norm1.bias"] = take(b + "LayerNorm_0/bias", idx)
        q = [take(f"{b}{mha}/{n}/kernel", idx) for n in ("query", "key", "value")]  # (D, h, d)
        heads = q[0].shape[1]
        out[o + "attn.qkv.weight"] = torch.cat([k.flatten(1).T for k in q], 0)
        out[o + "attn.qkv.bias"] = torch.cat(
            [take(f"{b}{mha}/{n}/bias", idx).reshape(-1) for n in ("query", "key", "value")])
        out[o + "attn.proj.weight"] = take(f"{b}{mha}/out/kernel", idx).flatten(0, 1).T  # (D, h*d)
        out[o + "attn.proj.bias"] = take(f"{b}{mha}/out/bias", idx)
        out[o + "norm2.weight"] = take(f"{b}{ln2}/scale", idx)
        out[o + "norm2.bias"] = take(f"{b}{ln2}/bias", idx)
        for j in (0, 1):
            out[o + f"mlp.fc{j + 1}.weight"] = take(f"{b}{mlp}/Dense_{j}/kernel", idx).T
            out[o + f"mlp.fc{j + 1}.bias"] = take(f"{b}{mlp}/Dense_{j}/bias", idx)
    out["norm.weight"] = take("Transformer/encoder_norm/scale")
    out["norm.bias"] = take("Transformer/encoder_norm/bias")
    pre = 0
    if "pre_logits/kernel" in w:
        out["pre_logits.fc.weight"] = take("pre_logits/kernel").T
        out["pre_logits.fc.bias"] = take("pre_logits/bias")
        pre = out["pre_logits.fc.weight"].shape[0]
    num_classes = 0
    if "head/kernel" in w:
        out["head.weight"] = take("head/kernel").T
        out["head.bias"] = take("head/bias")
        num_classes = out["head.weight"].shape[0]
    norm_eps = float(take(_EPS_KEY)) if _EPS_KEY in w else 1e-6
    flags = {name: bool(take(key)) for name, key in _FLAG_KEYS.items() if key in w}
    pool_map = "MAPHead_0/probe" in w
    if pool_map:  # big_vision's attention pooling (SigLIP): vitkit's pool="map"
        mp, mh = "MAPHead_0/", "MAPHead_0/MultiHeadDotProductAttention_0/"
        out["attn_pool.latent"] = take(mp + "probe").reshape(1, 1, width)
        out["attn_pool.q.weight"] = take(mh + "query/kernel").flatten(1).T  # (D, h, d) -> (D, D)
        out["attn_pool.q.bias"] = take(mh + "query/bias").reshape(-1)
        out["attn_pool.kv.weight"] = torch.cat(
            [take(f"{mh}{n}/kernel").flatten(1).T for n in ("key", "value")])
        out["attn_pool.kv.bias"] = torch.cat(
            [take(f"{mh}{n}/bias").reshape(-1) for n in ("key", "value")])
        out["attn_pool.proj.weight"] = take(mh + "out/kernel").flatten(0, 1).T  # (h, d, D)
        out["attn_pool.proj.bias"] = take(mh + "out/bias")
        out["attn_pool.norm.weight"] = take(mp + "LayerNorm_0/scale")
        out["attn_pool.norm.bias"] = take(mp + "LayerNorm_0/bias")
        for j in (0, 1):
            out[f"attn_pool.mlp.fc{j + 1}.weight"] = take(f"{mp}MlpBlock_0/Dense_{j}/kernel").T
            out[f"attn_pool.mlp.fc{j + 1}.bias"] = take(f"{mp}MlpBlock_0/Dense_{j}/bias")
    out.update({f"jax:{prefix}{k}": w[k] for k in left})  # reported as unexpected by the loader
    prefix_tokens = int(class_token)
    grid, has_prefix = infer_grid(out["pos_embed"].shape[1], prefix_tokens,
                                  (config or {}).get("img_size"), patch)
    kwargs = dict(
        img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=in_chans,
        num_classes=num_classes, embed_dim=width, depth=depth, num_heads=heads,
        mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0],
        pool="map" if pool_map else "cls" if class_token else "avg",
        class_token=class_token, no_embed_class=class_token and not has_prefix,
        representation_size=pre, norm_eps=norm_eps, **flags,
    )
    return out, kwargs, {"mean": [0.5] * 3, "std": [0.5] * 3}


def refusals(cfg) -> list[str]:
    """Why google-research/vision_transformer's layout cannot hold this model (empty when it
    can)."""
    if cnn_refusal(cfg):
        return cnn_refusal(cfg)
    options = [m for m in new_options_refusal(cfg) if not m.startswith("pools by attention")]
    return options + [msg for bad, msg in [
        (cfg.distilled, "has a distillation token"),
        (cfg.num_reg_tokens > 0, "has register tokens"),
        (cfg.fc_norm, "normalises after pooling (fc_norm)"),
        (cfg.pool == "avg" and cfg.class_token,
         "pools by average but has a [CLS] token (a JAX ViT has one only to read it out, so it "
         "would be read back as [CLS] pooling)"),
        (cfg.no_embed_class, "has no position row for [CLS]"),
        (not cfg.qkv_bias, "has no qkv bias (the JAX layout stores query/key/value biases)"),
        (cfg.img_size[0] != cfg.img_size[1],
         f"takes rectangular {cfg.img_size[0]}x{cfg.img_size[1]} images (an .npz stores no "
         "image size, so the grid would be read back as square)"),
    ] if bad]


def write(model, dst: Path) -> Path:
    """A ``.npz`` in google-research/vision_transformer's layout."""
    if dst.suffix != ".npz":
        raise CheckpointError(f"JAX checkpoints are .npz files; got {dst.name!r}")
    arrays = from_vitkit(model)
    return atomic_write(dst, lambda tmp: np.savez(tmp, **arrays))


def from_vitkit(model) -> dict[str, np.ndarray]:
    """vitkit model -> arrays in google-research/vision_transformer's npz layout."""
    cfg = model.cfg
    refuse("jax", refusals(cfg), "Export with --to timm or vitkit.")
    s = {k: v.float().cpu() for k, v in full_state(model).items()}
    h, d = cfg.num_heads, cfg.embed_dim // cfg.num_heads
    out = {
        "embedding/kernel": s["patch_embed.proj.weight"].permute(2, 3, 1, 0),
        "embedding/bias": s["patch_embed.proj.bias"],
        "Transformer/posembed_input/pos_embedding": s["pos_embed"],
        "Transformer/encoder_norm/scale": s["norm.weight"],
        "Transformer/encoder_norm/bias": s["norm.bias"],
    }
    if cfg.class_token:
        out["cls"] = s["cls_token"]
    for i in range(cfg.depth):
        b, o = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        mha = b + "MultiHeadDotProductAttention_1/"
        for ln, norm in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            out[f"{b}{ln}/scale"] = s[f"{o}{norm}.weight"]
            out[f"{b}{ln}/bias"] = s[f"{o}{norm}.bias"]
        for n, wt, bs in zip(("query", "key", "value"), s[o + "attn.qkv.weight"].chunk(3),
                             s[o + "attn.qkv.bias"].chunk(3), strict=True):
            out[mha + f"{n}/kernel"] = wt.T.reshape(cfg.embed_dim, h, d)
            out[mha + f"{n}/bias"] = bs.reshape(h, d)
        out[mha + "out/kernel"] = s[o + "attn.proj.weight"].T.reshape(h, d, cfg.embed_dim)
        out[mha + "out/bias"] = s[o + "attn.proj.bias"]
        for j in (0, 1):
            out[b + f"MlpBlock_3/Dense_{j}/kernel"] = s[o + f"mlp.fc{j + 1}.weight"].T
            out[b + f"MlpBlock_3/Dense_{j}/bias"] = s[o + f"mlp.fc{j + 1}.bias"]
    if cfg.representation_size:
        out["pre_logits/kernel"] = s["pre_logits.fc.weight"].T
        out["pre_logits/bias"] = s["pre_logits.fc.bias"]
    if cfg.num_classes:
        out["head/kernel"] = s["head.weight"].T
        out["head/bias"] = s["head.bias"]
    if cfg.pool == "map":  # big_vision's MAPHead_0, as timm's npz reader expects it
        mp, mh = "MAPHead_0/", "MAPHead_0/MultiHeadDotProductAttention_0/"
        out[mp + "probe"] = s["attn_pool.latent"]
        q, (k, v) = s["attn_pool.q.weight"], s["attn_pool.kv.weight"].chunk(2)
        qb, (kb, vb) = s["attn_pool.q.bias"], s["attn_pool.kv.bias"].chunk(2)
        for n, wt, bs in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            out[f"{mh}{n}/kernel"] = wt.T.reshape(cfg.embed_dim, h, d)
            out[f"{mh}{n}/bias"] = bs.reshape(h, d)
        out[mh + "out/kernel"] = s["attn_pool.proj.weight"].T.reshape(h, d, cfg.embed_dim)
        out[mh + "out/bias"] = s["attn_pool.proj.bias"]
        out[mp + "LayerNorm_0/scale"] = s["attn_pool.norm.weight"]
        out[mp + "LayerNorm_0/bias"] = s["attn_pool.norm.bias"]
        for j in (0, 1):
            out[f"{mp}MlpBlock_0/Dense_{j}/kernel"] = s[f"attn_pool.mlp.fc{j + 1}.weight"].T
            out[f"{mp}MlpBlock_0/Dense_{j}/bias"] = s[f"attn_pool.mlp.fc{j + 1}.bias"]
    if cfg.norm_eps != 1e-6:
        out[_EPS_KEY] = torch.tensor(cfg.norm_eps, dtype=torch.float64)
    for name, key in _FLAG_KEYS.items():
        if getattr(cfg, name):
            out[key] = torch.tensor(True)
    return {k: v.contiguous().numpy() for k, v in out.items()}
