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
# How far training has taken the blocks: the mean |gain - 1| of their LayerNorms, which start
# at exactly 1. Measured on vit_nano runs on the digits: 44 steps at lr 6e-5 move them 0.0004
# (the table still looks like its initial draw), 150 steps at 1e-3 0.008 (the table's std
# already 0.026, clear of the 10% band), 300 steps at 5e-3 0.046 (table std 0.117, 2-D
# structure 0.16); converged released models far more. Below this a table that has not moved
# from its initial draw is what a short run leaves, not a sign it was replaced.
TRAINED_EXTENT = 0.02


def _layernorm_at_init(*norms: torch.nn.LayerNorm) -> bool:
    return all(torch.all(n.weight == 1).item() and torch.all(n.bias == 0).item() for n in norms)


def _final_norms(model) -> list[torch.nn.LayerNorm]:
    return [m for m in (getattr(model, "norm", None), getattr(model, "fc_norm", None))
            if isinstance(m, torch.nn.LayerNorm)]


def training_extent(model) -> float:
    """Mean |gain - 1| of the blocks' LayerNorms: 0 at initialisation, growing with training."""
    gains = [(n.weight.detach().float() - 1).abs().mean()
             for b in model.blocks for n in (b.norm1, b.norm2)]
    return torch.stack(gains).mean().item() if gains else 0.0


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
    finals = _final_norms(model)
    final = bool(finals) and _layernorm_at_init(*finals)
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
    if final:
        return Finding(
            "weights.partially_loaded", "error",
            "the final LayerNorm is still at initialisation while every block is trained",
            measured,
            "The last normalisation before the head scales every feature the head reads; left "
            "at (1, 0) it is not the one the model was trained with: its weights did not load "
            "(a renamed key such as fc_norm vs norm, or a non-strict load).",
            f"load strictly to see the missing keys: vitkit.load_model('{source}', strict=True)")
    return Finding("weights.trained", "ok",
                   f"trained: the LayerNorms of all {depth} blocks moved from their initial "
                   "values", measured)


def check_position_table(model, ctx: dict) -> Finding | None:
    """A table that looks freshly initialised next to blocks trained far from theirs (the
    ``ignore_mismatched_sizes=True`` trap); next to briefly trained blocks it cannot tell a
    replaced table from one that has not moved yet, and says so."""
    if model.pos_embed is None:
        return None
    stats = table_stats(model)
    blocks_trained = not blocks_at_init(model)
    extent = training_extent(model)
    gh, gw = model.cfg.grid_size
    measured = {"grid": f"{gh}x{gw}", **stats, "blocks_layernorm_moved": extent}
    if blocks_trained and table_looks_initial(stats):
        if extent < TRAINED_EXTENT:
            return Finding(
                "weights.position_table", "unknown",
                "cannot tell: the table looks like its initial draw, and the blocks have "
                f"barely moved from theirs either (LayerNorm gains {extent:.3g} from 1)",
                measured,
                "A briefly trained model has not moved its position table yet, so this looks "
                "the same as a table replaced at load time; after longer training a trained "
                "table shows 2-D structure (neighbouring patches alike).",
                "")
        return Finding(
            "weights.position_table", "warning",
            "the position table looks freshly initialised (std ~0.02, normal, no 2-D structure) "
            f"while the blocks are trained (LayerNorm gains {extent:.3g} from 1)", measured,
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


def check_load_record(model, ctx: dict) -> list[Finding]:
    """What ``load_model`` adapted: keys left at init, keys it had no place for, a depth that
    fits no known ViT (lost last blocks), a new head, an interpolated table."""
    record = getattr(model, "load_record", None)
    if not record:
        return []
    measured = {"format": record["format"]}
    source = ctx.get("source", "CHECKPOINT")
    out = []
    if record["missing"]:
        measured["missing_keys"] = len(record["missing"])
        out.append(Finding(
            "weights.load", "error",
            f"{len(record['missing'])} keys were not in the checkpoint and kept their initial "
            f"values: {', '.join(record['missing'][:6])}", measured,
            "Those parameters are random: the model is not the one that was saved. "
            "strict=False hides this.",
            "restore the checkpoint from its source, or fix the key names; "
            f"vitkit.load_model('{source}') (strict) lists every missing key"))
    if record.get("unexpected"):
        out.append(Finding(
            "weights.load", "warning",
            f"{len(record['unexpected'])} keys in the checkpoint have no place in the model "
            f"and were ignored: {', '.join(record['unexpected'][:6])}",
            {**measured, "unexpected_keys": len(record["unexpected"])},
            "Weights the model does not use: a different architecture, extra heads, or keys "
            "renamed so they no longer match.",
            "check that the file is the architecture you meant; vitkit info shows the model"))
    if record.get("depth_suspect"):
        out.append(Finding(
            "weights.partially_loaded", "warning", record["depth_suspect"],
            {"blocks": len(model.blocks), "width": model.cfg.embed_dim},
            "A file that lost its last blocks still matches every key it has: only the depth "
            "gives it away.", "compare with the original file, or give its config.json"))
    if out:
        return out
    notes = []
    if record["head_replaced"]:
        notes.append("a new head of {1} classes replaced {0}".format(*record["head_replaced"]))
    if record["interpolated"]:
        (a, b), (c, d) = record["interpolated"]
        notes.append(f"the position table was interpolated from {a}x{b} to {c}x{d}")
    summary = "; ".join(notes) if notes else f"loaded as {record['format']}, every key matched"
    return [Finding("weights.load", "ok", summary, measured)]
