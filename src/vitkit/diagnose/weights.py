"""Checks on a model's weights: never trained or not loaded, partially loaded, a position table
that looks freshly initialised, a table that does not fit the input size, and what the loader
adapted. Each check is one function ``(weights, context) -> Finding | list[Finding] | None`` on
a :class:`Weights` view: numpy arrays under vitkit's keys and the config, read from a vitkit
``.safetensors`` without torch (:meth:`Weights.read`) or taken from a loaded model
(:meth:`Weights.of_model`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

from vitkit.diagnose.findings import Finding
from vitkit.models.config import ViTConfig, as_pair
from vitkit.models.keys import state_keys

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
# A second witness that the blocks were trained, which does not depend on the LayerNorms: the
# attention's query and key projections. A random matrix's largest singular value sits at the
# Marchenko-Pastur edge, std * (sqrt(rows) + sqrt(cols)) (ratio ~1: 0.97-1.02 measured on fresh
# and 20- and 60-step vit_nano/vit_micro models); training grows a few directions far past it
# (the spikes of Martin & Mahoney 2021, "Implicit self-regularization in deep neural
# networks"): 2.5 on the catalogue's 300-step run, 2.75 and 3.8 on the demo recipe's nano and
# micro ViTs, whose LayerNorms moved only 0.016 and 0.014. Past this ratio (median over the
# blocks' q and k) the blocks are trained, whatever their LayerNorms say. Measured on vit_nano
# runs on the digits, a model's own table still looks initial only while the ratio is at most
# 1.20 (50 steps at lr 8e-3; at 100 steps, 1.33, it has moved out of the band), so 2.0 keeps a
# wide margin from a briefly trained model's own table (150 steps at 8e-3: 1.51, cannot tell).
SPECTRUM_TRAINED = 2.0
POWER_STEPS = 30  # power iterations for the largest singular value (a spike converges fast)


@dataclass
class Weights:
    """A ViT's weights as numpy arrays (vitkit's keys), its config and the load record."""

    state: dict[str, np.ndarray]
    cfg: ViTConfig
    record: dict | None = None

    @classmethod
    def of_model(cls, model) -> Weights:
        state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
        return cls(state, model.cfg, getattr(model, "load_record", None))

    @classmethod
    def read(cls, path: str | Path) -> Weights | None:
        """A vitkit ``.safetensors`` (its config in the metadata) read without torch; None when
        the file is anything else, or is not whole (the loader then says what is wrong)."""
        path = Path(path)
        if path.suffix != ".safetensors" or not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata() or {}
            cfg = ViTConfig(**json.loads(meta["vitkit_config"]))
            state = load_file(str(path))
        except (KeyError, TypeError, ValueError, OSError, json.JSONDecodeError):
            return None  # not a vitkit ViT file, an older config, or damaged: the slow path
        expected = state_keys(cfg)
        gh, gw = cfg.grid_size
        if not expected <= set(state) or (cfg.abs_pos and state["pos_embed"].shape[1:] != (
                cfg.num_pos_prefix + gh * gw, cfg.embed_dim)):
            return None  # missing keys or another shape: load_model reports them exactly
        unexpected = sorted(set(state) - expected)
        record = {"source": str(path), "format": "vitkit", "missing": [],
                  "unexpected": unexpected, "notes": [], "head_replaced": None,
                  "interpolated": None, "depth_suspect": None}
        return cls({k: v.astype(np.float32) for k, v in state.items() if k in expected}, cfg,
                   record)

    def block_norms(self, i: int) -> list[tuple[np.ndarray, np.ndarray]]:
        b = f"blocks.{i}."
        return [(self.state[b + n + ".weight"], self.state[b + n + ".bias"])
                for n in ("norm1", "norm2")]

    def final_norms(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(self.state[n + ".weight"], self.state[n + ".bias"])
                for n in ("norm", "fc_norm") if n + ".weight" in self.state]

    def prefix_tokens(self) -> list[np.ndarray]:
        return [self.state[k] for k in ("cls_token", "dist_token", "reg_token")
                if k in self.state]


def _at_init(norms: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    return all(bool(np.all(w == 1)) and bool(np.all(b == 0)) for w, b in norms)


def training_extent(w: Weights) -> float:
    """Mean |gain - 1| of the blocks' LayerNorms: 0 at initialisation, growing with training."""
    gains = [np.abs(g - 1).mean() for i in range(w.cfg.depth) for g, _ in w.block_norms(i)]
    return float(np.mean(gains)) if gains else 0.0


def _largest_singular(m: np.ndarray) -> float:
    """The largest singular value of ``m`` by power iteration from a fixed start: a lower bound
    that a spike well above the rest reaches in a few steps."""
    v = np.random.default_rng(0).standard_normal(m.shape[1])
    for _ in range(POWER_STEPS):
        v = m.T @ (m @ v)
        v /= max(np.linalg.norm(v), 1e-30)
    return float(np.linalg.norm(m @ v))


def attention_spectrum(w: Weights) -> float:
    """Median over blocks of the query's and key's largest singular value over the random
    matrix edge (see SPECTRUM_TRAINED): ~1 at initialisation, well above once trained."""
    D = w.cfg.embed_dim
    ratios = []
    for i in range(w.cfg.depth):
        qkv = w.state.get(f"blocks.{i}.attn.qkv.weight")
        if qkv is None:
            continue
        for part in (qkv[:D], qkv[D:2 * D]):
            part = part.astype(np.float64)
            edge = part.std() * (math.sqrt(part.shape[0]) + math.sqrt(part.shape[1]))
            if edge > 0:
                ratios.append(_largest_singular(part) / edge)
    return float(np.median(ratios)) if ratios else 0.0


def blocks_at_init(w: Weights) -> list[int]:
    """Indices of the blocks whose LayerNorms are exactly at their initial values."""
    return [i for i in range(w.cfg.depth) if _at_init(w.block_norms(i))]


def table_stats(w: Weights) -> dict:
    """Std, excess kurtosis and 2-D structure score of the patch rows of the position table."""
    cfg = w.cfg
    table = w.state["pos_embed"][0, cfg.num_pos_prefix:].astype(np.float64)  # (gh*gw, D)
    gh, gw = cfg.grid_size
    flat = table.ravel()
    std = float(flat.std(ddof=1))
    z = (flat - flat.mean()) / max(std, 1e-12)
    kurtosis = float((z**4).mean() - 3.0)
    unit = table / np.maximum(np.linalg.norm(table, axis=-1, keepdims=True), 1e-12)
    cos = unit @ unit.T  # (N, N)
    ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    ys, xs = ys.ravel(), xs.ravel()
    cheb = np.maximum(np.abs(ys[:, None] - ys[None]), np.abs(xs[:, None] - xs[None]))
    near = cheb == 1
    far = cheb >= max(2, max(gh, gw) // 2)
    structure = float(cos[near].mean() - cos[far].mean()) if far.any() and near.any() else 0.0
    return {"std": std, "excess_kurtosis": kurtosis, "structure": structure}


def table_looks_initial(stats: dict) -> bool:
    return (abs(stats["std"] - INIT_STD) < INIT_STD_TOLERANCE * INIT_STD
            and abs(stats["excess_kurtosis"]) < INIT_KURTOSIS_TOLERANCE
            and stats["structure"] < STRUCTURE_MIN)


def filter_smoothness(w: Weights) -> float:
    """Mean correlation of horizontally and vertically adjacent pixels inside the patch
    embedding's filters (over filters and input channels): ~0 for random filters, positive for
    the smooth, edge-like filters training gives."""
    f = w.state["patch_embed.proj.weight"].astype(np.float64)  # (D, C, P, P)
    if f.shape[-1] < 2:
        return 0.0
    f = f - f.mean(axis=(-1, -2), keepdims=True)
    corr = []
    for a, b in ((f[..., :, 1:], f[..., :, :-1]), (f[..., 1:, :], f[..., :-1, :])):
        a, b = a.reshape(*a.shape[:2], -1), b.reshape(*b.shape[:2], -1)
        num = (a * b).sum(-1)
        den = np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)
        corr.append((num / den).mean())
    return float(np.mean(corr))


# ---------------------------------------------------------------------------------- checks
def check_trained(w: Weights, ctx: dict) -> Finding:
    """Never trained / not loaded (every block at init), or partially loaded (some blocks, or
    the final norm)."""
    at_init = blocks_at_init(w)
    depth = w.cfg.depth
    finals = w.final_norms()
    final = bool(finals) and _at_init(finals)
    token_std = max((float(t.std(ddof=1)) for t in w.prefix_tokens() if t.size > 1),
                    default=float("nan"))
    linear_std = np.mean([w.state[f"blocks.{i}.mlp.fc1.weight"].std(ddof=1)
                          for i in range(depth)])
    measured = {"blocks_at_init": len(at_init), "blocks": depth,
                "mlp_weight_std": float(linear_std), "final_norm_at_init": final,
                "patch_filter_smoothness": filter_smoothness(w), "prefix_token_std": token_std}
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


def check_position_table(w: Weights, ctx: dict) -> Finding | None:
    """A table that looks freshly initialised next to blocks trained far from theirs (the
    ``ignore_mismatched_sizes=True`` trap); next to briefly trained blocks it cannot tell a
    replaced table from one that has not moved yet, and says so. A model without a table
    (rotary embeddings only) has nothing to check."""
    if "pos_embed" not in w.state:
        return None
    stats = table_stats(w)
    blocks_trained = not blocks_at_init(w)
    extent = training_extent(w)
    gh, gw = w.cfg.grid_size
    measured = {"grid": f"{gh}x{gw}", **stats, "blocks_layernorm_moved": extent}
    if blocks_trained and table_looks_initial(stats):
        spectrum = attention_spectrum(w)
        measured["attention_spectrum"] = spectrum
        if extent < TRAINED_EXTENT and spectrum < SPECTRUM_TRAINED:
            return Finding(
                "weights.position_table", "unknown",
                "cannot tell: the table looks like its initial draw, and the blocks have "
                f"barely moved from theirs either (LayerNorm gains {extent:.3g} from 1, the "
                f"attention's largest singular values {spectrum:.2f}x a random matrix's)",
                measured,
                "A briefly trained model has not moved its position table yet, so this looks "
                "the same as a table replaced at load time; after longer training a trained "
                "table shows 2-D structure (neighbouring patches alike).",
                "")
        evidence = (f"LayerNorm gains {extent:.3g} from 1" if extent >= TRAINED_EXTENT else
                    f"the attention's largest singular values {spectrum:.1f}x a random "
                    f"matrix's, though the LayerNorms moved only {extent:.3g}")
        return Finding(
            "weights.position_table", "warning",
            "the position table looks freshly initialised (std ~0.02, normal, no 2-D structure) "
            f"while the blocks are trained ({evidence})", measured,
            "This is what Hugging Face's ignore_mismatched_sizes=True does to a table of another "
            "size: it is replaced by random numbers, and the model loses where each patch is "
            "('breaks at 384' becomes 'worse than my ResNet').",
            "interpolate the trained table instead: vitkit resize ORIGINAL.pth OUT.safetensors "
            "--img-size S (or vitkit.load_model(path, img_size=S))")
    words = "2-D structure: neighbouring patches have similar embeddings" \
        if stats["structure"] >= STRUCTURE_MIN else \
        "little 2-D structure yet (usual for a short training run)"
    return Finding("weights.position_table", "ok", words, measured)


def check_table_fits(w: Weights, ctx: dict) -> Finding | None:
    """The rows the table has against the rows ``--img-size`` needs."""
    img_size = ctx.get("img_size")
    if img_size is None:
        return None
    cfg = w.cfg
    table = w.state.get("pos_embed")
    h, w = as_pair(img_size)
    p = cfg.patch_size
    source = ctx.get("source", "CHECKPOINT")
    if h % p or w % p:
        return Finding(
            "weights.input_size", "error",
            f"{h}x{w} is not a multiple of the patch size {p}", {"patch_size": p},
            "The patches would not tile the image: rows or columns would be dropped.",
            f"use a multiple of {p}, e.g. {h // p * p}x{w // p * p}")
    if table is None:  # rotary embeddings only: nothing to interpolate
        return Finding(
            "weights.input_size", "ok",
            f"no position table to move: the rotary embeddings ({cfg.rope}) are computed for "
            f"the {h // p}x{w // p} grid of {h}x{w}, so the model runs at that size as it is",
            {"rope": cfg.rope, "grid_needed": f"{h // p}x{w // p}"},
            "Do not interpolate anything (there is no table); a RoPE model's accuracy at a new "
            "size depends on the range of coordinates it was trained on, which fine-tuning at "
            "the new size extends.")
    have = table.shape[1]
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


def check_load_record(weights: Weights, ctx: dict) -> list[Finding]:
    """What ``load_model`` adapted: keys left at init, keys it had no place for, a depth that
    fits no known ViT (lost last blocks), a new head, an interpolated table."""
    record = weights.record
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
            {"blocks": weights.cfg.depth, "width": weights.cfg.embed_dim},
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
