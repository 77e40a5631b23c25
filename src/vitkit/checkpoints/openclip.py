"""OpenCLIP and OpenAI CLIP state dicts: the image tower under ``visual.`` (``conv1`` without bias,
``class_embedding``, ``positional_embedding``, ``ln_pre``, ``transformer.resblocks.N`` with an
``nn.MultiheadAttention`` (``attn.in_proj_weight`` is vitkit's fused qkv) and ``mlp.c_fc`` /
``mlp.c_proj``, ``ln_post`` and ``proj`` (D, E), a projection without bias). The text tower of a
full CLIP checkpoint is ignored, and said so.

The weights do not say the activation: OpenAI's models use QuickGELU, OpenCLIP's own GELU. An
``open_clip_config.json`` beside the weights says it (``quick_gelu``); otherwise GELU is assumed
and the log says how to choose: ``load_model(path, act="quick_gelu")``.
"""

from __future__ import annotations

import math

from vitkit.checkpoints.common import Checkpoint, CheckpointError, StateDict
from vitkit.checkpoints.timm import depth_of

NAME = "openclip"
LABEL = "OpenCLIP / OpenAI CLIP (visual.conv1, visual.transformer.resblocks)"
DEPTH_FROM_WEIGHTS = True  # a bare file does not state its depth: blocks may be lost unseen
_BLOCK = {"ln_1": "norm1", "attn.in_proj_weight": "attn.qkv.weight",
          "attn.in_proj_bias": "attn.qkv.bias", "attn.out_proj": "attn.proj", "ln_2": "norm2",
          "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}


def detect(ckpt: Checkpoint) -> bool:
    return "visual.conv1.weight" in ckpt.state


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    visual = {k[len("visual."):]: v for k, v in state.items() if k.startswith("visual.")}
    others = [k for k in state if not k.startswith("visual.")]
    if others:
        notes.append(f"a full CLIP checkpoint: the text tower ({len(others)} tensors) is "
                     "ignored, the image tower loaded")
    if "attnpool.c_proj.weight" in visual or "trunk.patch_embed.proj.weight" in visual:
        raise CheckpointError("this CLIP's image tower is not a ViT (a ModifiedResNet or a "
                              "timm trunk); vitkit loads the ViT towers")
    out: StateDict = {
        "patch_embed.proj.weight": visual.pop("conv1.weight"),
        "cls_token": visual.pop("class_embedding").reshape(1, 1, -1),
        "pos_embed": visual.pop("positional_embedding")[None],
        "norm_pre.weight": visual.pop("ln_pre.weight"), "norm_pre.bias": visual.pop("ln_pre.bias"),
        "norm.weight": visual.pop("ln_post.weight"), "norm.bias": visual.pop("ln_post.bias"),
    }
    proj = visual.pop("proj", None)
    if proj is not None:
        out["head.weight"] = proj.T.contiguous()  # (D, E) -> (E, D)
    depth = depth_of(visual, r"transformer\.resblocks\.(\d+)\.",
                     (((config or {}).get("model_cfg") or {}).get("vision_cfg") or {}).get(
                         "layers"))
    for key in list(visual):
        if key.startswith("transformer.resblocks."):
            i, rest = key[len("transformer.resblocks."):].split(".", 1)
            for theirs, ours in _BLOCK.items():
                if rest.startswith(theirs):
                    out[f"blocks.{i}.{ours}{rest[len(theirs):]}"] = visual.pop(key)
                    break
    out.update({f"visual.{k}": v for k, v in visual.items()})  # reported as unexpected
    model_cfg = (config or {}).get("model_cfg", {})
    quick = model_cfg.get("quick_gelu")
    if quick is None:
        notes.append("OpenCLIP layout: GELU assumed (the weights do not say); OpenAI's CLIP "
                     "weights use QuickGELU: load_model(path, act='quick_gelu')")
    width = out["cls_token"].shape[-1]
    vision = model_cfg.get("vision_cfg", {})
    patch = out["patch_embed.proj.weight"].shape[-1]
    kwargs = dict(
        img_size=vision.get("image_size"), patch_size=patch,
        in_chans=out["patch_embed.proj.weight"].shape[1],
        num_classes=proj.shape[1] if proj is not None else 0, embed_dim=width, depth=depth,
        num_heads=vision.get("width", width) // vision.get("head_width", 64),
        mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0], pre_norm=True, patch_bias=False,
        head_bias=False, act="quick_gelu" if quick else "gelu", norm_eps=1e-5,
    )
    if kwargs["img_size"] is None:
        side = math.isqrt(out["pos_embed"].shape[1] - 1)
        kwargs["img_size"] = side * patch
    extra = {"mean": [0.48145466, 0.4578275, 0.40821073],
             "std": [0.26862954, 0.26130258, 0.27577711]}
    return out, kwargs, extra
