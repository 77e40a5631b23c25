"""What every format module shares: the error type, what was read from disk, head-count and
grid inference, and the refusal every ViT-only layout makes of a CNN."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from vitkit.errors import CheckpointError
from vitkit.models.cnn import is_cnn
from vitkit.models.pos_embed import as_pair
from vitkit.models.registry import VARIANTS

StateDict = dict[str, torch.Tensor]
__all__ = ["Checkpoint", "CheckpointError", "StateDict", "cnn_refusal", "full_state",
           "infer_grid", "infer_num_heads", "new_options_refusal", "refuse",
           "shallower_than_known", "strip_prefix"]


@dataclass
class Checkpoint:
    """Tensors read from disk, the config that came with them, and where they came from."""

    state: StateDict
    config: dict | None
    path: Path
    vitkit_config: dict | None = None  # present in files vitkit wrote


def refuse(fmt: str, problems: list[str], advice: str = "") -> None:
    """Raise the one error every exporter gives: the format, every reason, what to do."""
    if problems:
        raise CheckpointError(f"cannot export to {fmt}: the model " + "; ".join(problems)
                              + ". " + (advice or "Export with --to vitkit."))


def full_state(model) -> StateDict:
    """The model's state dict with a zero head bias where the model has none (CLIP's
    projection), on DeiT's distillation head too: layouts whose heads always have a bias hold
    them exactly that way."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    for head in ("head", "head_dist"):
        if f"{head}.weight" in state and f"{head}.bias" not in state:
            state[f"{head}.bias"] = torch.zeros(state[f"{head}.weight"].shape[0])
    return state


# The options of the 2025-26 families (DINOv3, EVA-02, Perception Encoder, RoPE ViTs) that only
# vitkit's own format and timm's Eva layout hold; every other layout declares them in REFUSES
ROPE_ERA_OPTIONS = frozenset({
    "abs_pos", "rope", "rope_temperature", "rope_offset", "rope_xy", "rope_half",
    "rope_ref_grid", "mlp", "mlp_norm", "key_bias", "pool_heads",
})


def rope_era_refusal(cfg) -> list[str]:
    """What a layout without the 2025-26 options (:data:`ROPE_ERA_OPTIONS`) cannot hold."""
    defaults = type(cfg)()
    return [f"has {name}={getattr(cfg, name)!r}" for name in sorted(ROPE_ERA_OPTIONS)
            if getattr(cfg, name) != getattr(defaults, name)]


def bilinear_refusal(cfg) -> list[str]:
    """A table moved bilinearly (SigLIP 2): only vitkit's format and SigLIP 2 hold it."""
    if cfg.pos_interp != "bicubic":
        return [f"moves its position table {cfg.pos_interp} (SigLIP 2's NaFlex; this layout "
                "is read bicubic)"]
    return []


def new_options_refusal(cfg) -> list[str]:
    """The options of DINOv2, DeiT-III, CLIP and SigLIP (and of the 2025-26 families) that the
    classic layouts (Hugging Face ViT, torchvision, JAX vision_transformer) cannot hold."""
    return rope_era_refusal(cfg) + bilinear_refusal(cfg) + [msg for bad, msg in [
        (cfg.init_values is not None, "has LayerScale (DINOv2/DeiT-III)"),
        (cfg.pre_norm, "has a LayerNorm before the blocks (CLIP)"),
        (cfg.act != "gelu", f"uses {cfg.act} instead of exact GELU"),
        (cfg.pool == "map", "pools by attention (a MAP head)"),
        (not cfg.patch_bias, "has no patch-embedding bias"),
    ] if bad]


def cnn_refusal(cfg) -> list[str]:
    """[reason] when ``cfg`` is a CNN's (ViT layouts cannot hold one), else []."""
    if is_cnn(cfg):
        return [f"is a CNN ({cfg.arch}); a CNN can be written as vitkit (.safetensors) only"]
    return []


def exact_variant(width: int, depth: int, mlp_dim: int) -> bool:
    """Whether (width, depth, MLP) is one of the family table's sizes exactly."""
    return any((d, n, m) == (width, depth, mlp_dim) for d, n, _, m in VARIANTS.values())


def infer_num_heads(width: int, depth: int, mlp_dim: int, notes: list[str]) -> int:
    """Heads are not stored in timm/torchvision/DeiT weights: take them from the family table.

    A (width, depth, MLP) that matches a known variant gets that variant's heads; any other
    width gets 64-dim heads (the family's convention), and ``notes`` says so.
    """
    for d, n_layers, heads, mlp in VARIANTS.values():
        if (d, n_layers, mlp) == (width, depth, mlp_dim):
            return heads
    for d, _, heads, _ in VARIANTS.values():
        if d == width:
            notes.append(f"heads inferred from width {width}: {heads} (pass num_heads= if not)")
            return heads
    if width % 64:
        raise CheckpointError(
            f"cannot infer the number of heads for width {width} (not in the ViT family table "
            f"and not a multiple of 64); pass num_heads=... to load_model"
        )
    notes.append(f"heads inferred as width/64 = {width // 64} (pass num_heads= if not)")
    return width // 64


def shallower_than_known(width: int, depth: int, mlp_dim: int) -> str | None:
    """A warning when ``depth`` (inferred from the blocks a file holds) fits no ViT of this
    width and MLP while a deeper one does: the file may have lost its last blocks, which no
    index gap can show. None when the shape is a known one or unlike any."""
    if any((d, n, m) == (width, depth, mlp_dim) for d, n, _, m in VARIANTS.values()):
        return None
    deeper = [(name, n) for name, (d, n, _, m) in VARIANTS.items()
              if (d, m) == (width, mlp_dim) and n > depth]
    if not deeper:
        return None
    name, n = deeper[0]
    return (f"{depth} blocks of width {width}: no known ViT has that depth, ViT-{name} has {n}; "
            f"if blocks {depth}-{n - 1} are missing from this file, the model is shallower than "
            "the one saved (give its config.json, e.g. timm's with its architecture, to have the "
            "depth checked)")


def infer_grid(rows: int, prefix: int, img_size=None, patch_size: int | None = None,
               ) -> tuple[tuple[int, int], bool]:
    """Patch grid and whether the table has prefix rows, from a position table's row count.

    Returns ((gh, gw), table_has_prefix_rows). A square grid is assumed unless ``img_size``
    (with ``patch_size``) says otherwise.
    """
    if img_size is not None and patch_size:
        h, w = as_pair(img_size)
        grid = (h // patch_size, w // patch_size)
        n = grid[0] * grid[1]
        if rows in (n, n + prefix):
            return grid, rows == n + prefix and prefix > 0
    for n, has_prefix in ((rows - prefix, prefix > 0), (rows, False)):
        side = math.isqrt(max(n, 0))
        if n > 0 and side * side == n:
            return (side, side), has_prefix
    raise CheckpointError(
        f"cannot infer the patch grid from a position table of {rows} rows with {prefix} prefix "
        f"token(s): neither {rows - prefix} nor {rows} is a square. Pass img_size=(H, W) of the "
        f"checkpoint's training resolution."
    )


def strip_prefix(state: StateDict, prefix: str) -> StateDict:
    """Remove ``prefix`` from every key that has it (``module.`` from DDP, ``vit.`` from HF)."""
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
