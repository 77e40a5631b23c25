"""Checks on a model's weights: never trained or not loaded, partially loaded, a position table
that looks freshly initialised, a table that does not fit the input size, and what the loader
adapted. Each check is one function ``(model, context) -> Finding | None``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitkit.diagnose.findings import Finding
from vitkit.models.pos_embed import as_pair

# Every ViT codebase (timm, vitkit, Hugging Face, torchvision, big_vision) initialises LayerNorm
# to weight 1 and bias 0 exactly; the first optimiser step moves them. So a block whose four
# LayerNorm tensors are still exactly (1, 0) never saw a gradient or was never loaded.
# Source: timm vision_transformer.init_weights / nn.LayerNorm defaults; HF ViTPreTrainedModel.
INIT_STD = 0.02  # trunc_normal(std=0.02) of timm, vitkit and HF (initializer_range) for tables
INIT_STD_TOLERANCE = 0.1  # a table within 10% of that std (and normal-shaped) looks untouched
INIT_KURTOSIS_TOLERANCE = 0.5  # |excess kurtosis| of a normal sample of thousands: ~0.1
# Position-table structure: mean cosine similarity of grid neighbours minus that of far-apart
# positions. Random tables score ~0 (+-1/sqrt(D * pairs)); trained ones clearly positive
# (Dosovitskiy et al. 2021, Fig. 7: neighbouring patches get similar embeddings).
STRUCTURE_MIN = 0.05


def _layernorm_at_init(*norms: torch.nn.LayerNorm) -> bool:
    return all(torch.all(n.weight == 1).item() and torch.all(n.bias == 0).item() for n in norms)


def blocks_at_init(model) -> list[int]:
    """Indices of the blocks whose LayerNorms are exactly at their initial values."""
    return [i for i, b in enumerate(model.blocks) if _layernorm_at_init(b.norm1, b.norm2)]


def table_stats(model) -> dict:
    """Std, excess kurtosis and 2-D structure score of the patch rows of the position table."""
    cfg = model.cfg
    table = model.pos_embed.detach()[0, cfg.num_pos_prefix:].float()  # (gh*gw, D)
    gh, gw = cfg.grid_size
    flat = table.flatten()
    std = flat.std().item()
    z = (flat - flat.mean()) / flat.std().clamp_min(1e-12)
    kurtosis = (z**4).mean().item() - 3.0
    unit = F.normalize(table, dim=-1)
    cos = unit @ unit.T  # (N, N)
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    cheb = torch.maximum((ys[:, None] - ys[None]).abs(), (xs[:, None] - xs[None]).abs())
    near = cheb == 1
    far = cheb >= max(2, max(gh, gw) // 2)
    structure = (cos[near].mean() - cos[far].mean()).item() if far.any() else 0.0
    return {"std": std, "excess_kurtosis": kurtosis, "structure": structure}


def table_looks_initial(stats: dict) -> bool:
    return (abs(stats["std"] - INIT_STD) < INIT_STD_TOLERANCE * INIT_STD
            and abs(stats["excess_kurtosis"]) < INIT_KURTOSIS_TOLERANCE
            and stats["structure"] < STRUCTURE_MIN)


def filter_smoothness(model) -> float:
    """Mean correlation of horizontally and vertically adjacent pixels inside the patch
    embedding's filters (over filters and input channels): ~0 for random filters, positive for
    the smooth, edge-like filters training gives."""
    w = model.patch_embed.proj.weight.detach().float()  # (D, C, P, P)
    if w.shape[-1] < 2:
        return 0.0
    w = w - w.mean(dim=(-1, -2), keepdim=True)
    pairs = [(w[..., :, 1:], w[..., :, :-1]), (w[..., 1:, :], w[..., :-1, :])]
    corr = []
    for a, b in pairs:
        a, b = a.flatten(2), b.flatten(2)
        num = (a * b).sum(-1)
        den = (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-12)
        corr.append((num / den).mean())
    return torch.stack(corr).mean().item()


# ---------------------------------------------------------------------------------- checks
def check_trained(model, ctx: dict) -> Finding:
    """Never trained / not loaded (every block at init), or partially loaded (some blocks)."""
    at_init = blocks_at_init(model)
    depth = len(model.blocks)
    final = _layernorm_at_init(model.norm)
    tokens = [t for t in model._prefix_params()]
    token_std = max((t.detach().float().std().item() for t in tokens if t.numel() > 1),
                    default=float("nan"))
    linear_std = torch.stack([b.mlp.fc1.weight.detach().float().std() for b in model.blocks])
    measured = {"blocks_at_init": len(at_init), "blocks": depth,
                "mlp_weight_std": linear_std.mean().item(),
                "final_norm_at_init": final, "patch_filter_smoothness": filter_smoothness(model),
                "prefix_token_std": token_std}
    source = ctx.get("source", "CHECKPOINT")
    if len(at_init) == depth and final:
        return Finding(
            "weights.trained", "error",
            "this model was never trained, or its weights did not load: every LayerNorm is "
            "still exactly at its initial value (weight 1, bias 0)", measured,
            "A model at initialisation predicts at chance and its attention maps mean nothing; "
            "a ViT trained from scratch on little data is the usual cause of 'worse than my "
            "ResNet' when the weights silently never loaded.",
            f"check the file you meant to load; load it with vitkit.load_model('{source}') "
            "(strict: it lists every missing key), or train: vitkit train --init CHECKPOINT")
    if at_init:
        shown = ", ".join(map(str, at_init[:12])) + (" ..." if len(at_init) > 12 else "")
        return Finding(
            "weights.partially_loaded", "error",
            f"blocks {shown} are still at initialisation while the others are trained",
            measured,
            "Blocks at init pass noise through the residual stream: the model is a different, "
            "broken one. This is what strict=False or a renamed key does silently.",
            f"load strictly to see the missing keys: vitkit.load_model('{source}', strict=True)")
    return Finding("weights.trained", "ok",
                   f"trained: the LayerNorms of all {depth} blocks moved from their initial "
                   "values", measured)


def check_position_table(model, ctx: dict) -> Finding | None:
    """A table that looks freshly initialised next to trained blocks (the
    ``ignore_mismatched_sizes=True`` trap), or a table with 2-D structure."""
    if model.pos_embed is None:
        return None
    stats = table_stats(model)
    blocks_trained = not blocks_at_init(model)
    gh, gw = model.cfg.grid_size
    measured = {"grid": f"{gh}x{gw}", **stats}
    if blocks_trained and table_looks_initial(stats):
        return Finding(
            "weights.position_table", "warning",
            "the position table looks freshly initialised (std ~0.02, normal, no 2-D structure) "
            "while the blocks are trained", measured,
            "This is what Hugging Face's ignore_mismatched_sizes=True does to a table of another "
            "size: it is replaced by random numbers, and the model loses where each patch is "
            "('breaks at 384' becomes 'worse than my ResNet').",
            "interpolate the trained table instead: vitkit resize ORIGINAL.pth OUT.safetensors "
            "--img-size S (or vitkit.load_model(path, img_size=S))")
    words = "2-D structure: neighbouring patches have similar embeddings" \
        if stats["structure"] >= STRUCTURE_MIN else \
        "little 2-D structure yet (usual for a short training run)"
    return Finding("weights.position_table", "ok", words, measured)


def check_table_fits(model, ctx: dict) -> Finding | None:
    """The rows the table has against the rows ``--img-size`` needs."""
    img_size = ctx.get("img_size")
    if img_size is None:
        return None
    cfg = model.cfg
    h, w = as_pair(img_size)
    p = cfg.patch_size
    have = model.pos_embed.shape[1]
    source = ctx.get("source", "CHECKPOINT")
    if h % p or w % p:
        return Finding(
            "weights.input_size", "error",
            f"{h}x{w} is not a multiple of the patch size {p}", {"patch_size": p},
            "The patches would not tile the image: rows or columns would be dropped.",
            f"use a multiple of {p}, e.g. {h // p * p}x{w // p * p}")
    need = cfg.num_pos_prefix + (h // p) * (w // p)
    gh, gw = cfg.grid_size
    measured = {"table_rows": have, "rows_needed": need, "grid": f"{gh}x{gw}",
                "grid_needed": f"{h // p}x{w // p}"}
    if need == have:
        return Finding("weights.input_size", "ok",
                       f"the position table fits {h}x{w} ({have} rows)", measured)
    size = f"{h}" if h == w else f"{h}x{w}"
    return Finding(
        "weights.input_size", "warning",
        f"the position table has {have} rows ({gh}x{gw} grid); {h}x{w} needs {need} "
        f"({h // p}x{w // p} grid)", measured,
        f"model(x) at {h}x{w} is refused until the table is interpolated; "
        f"vitkit.load_model(path, img_size={size}) interpolates it bicubic from {gh}x{gw} to "
        f"{h // p}x{w // p} (timm's resample_abs_pos_embed), and fine-tuning at the new size "
        "recovers the accuracy (DeiT-B 81.8 -> 83.1 at 384).",
        f"vitkit resize {source} resized.safetensors --img-size {size}")


def check_load_record(model, ctx: dict) -> Finding | None:
    """What ``load_model`` adapted: keys left at init, a new head, an interpolated table."""
    record = getattr(model, "load_record", None)
    if not record:
        return None
    measured = {"format": record["format"]}
    if record["missing"]:
        measured["missing_keys"] = len(record["missing"])
        return Finding(
            "weights.load", "error",
            f"{len(record['missing'])} keys were not in the checkpoint and kept their initial "
            f"values: {', '.join(record['missing'][:6])}", measured,
            "strict=False hides this: those parameters are random.",
            "load with strict=True and fix the checkpoint or the architecture")
    notes = []
    if record["head_replaced"]:
        notes.append("a new head of {1} classes replaced {0}".format(*record["head_replaced"]))
    if record["interpolated"]:
        (a, b), (c, d) = record["interpolated"]
        notes.append(f"the position table was interpolated from {a}x{b} to {c}x{d}")
    summary = "; ".join(notes) if notes else f"loaded as {record['format']}, every key matched"
    return Finding("weights.load", "ok", summary, measured)
