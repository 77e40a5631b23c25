"""Checks on attention maps: averaged heads, the final layer only, rows near uniform, attention
sinks, high-norm artifact tokens, and where heads look (mean attention distance).

Maps come as a (layers, heads, T, T) array (or (heads, T, T), (T, T), with an optional batch
axis after the layer axis), from a file or computed from a model on an image.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitkit.diagnose.findings import Finding
from vitkit.errors import DataError
from vitkit.explain import stats

UNIFORM = 0.95  # mean row entropy above 0.95 ln T: rows near uniform, the map says nothing
SINK = 0.5  # a few columns (2% of tokens, at least 1) taking half of every row: a sink
SINK_SHARE_OF_TOKENS = 0.02
SINK_ROWS = 0.9  # "every row": at least 90% of the rows of a layer, in every image given
ARTIFACT_MAD = 8.0  # token norm above median + 8 MAD (Darcet et al. 2023: artifact tokens have
# norms ~10x the others in large ViTs)
LOCAL_HEADS = 0.75  # an early head looking closer than 0.75x uniform attention is local
# (Dosovitskiy et al. 2021, Fig. 7: trained early layers mix local and global heads)


@dataclass
class Maps:
    """Per-layer maps (layers, B, heads, T, T) and what is known about their shape."""

    maps: torch.Tensor
    given_as: str  # "layers x heads", "one layer (heads)", "one map"
    heads_distinct: bool


def read_maps(path: str | Path) -> Maps:
    """A ``.npy`` / ``.npz`` of attention maps as :class:`Maps`."""
    path = Path(path)
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                keys = list(z.files)
                if not keys:
                    raise DataError(f"{path} holds no arrays")
                arrays = [z[k] for k in keys]
            array = np.stack(arrays) if len(arrays) > 1 and all(
                a.shape == arrays[0].shape for a in arrays) else arrays[0]
        else:
            array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        # numpy's own text suggests loading the file unsafely: never pass that advice on
        reason = ("it holds Python objects, which are never loaded" if "pickle" in str(err)
                  else "it is not a .npy/.npz array file, or it is damaged")
        raise DataError(f"cannot read {path} as attention maps: {reason} (expected the "
                        "*_maps.npy `vitkit attention` writes)") from err
    if array.dtype.kind not in "fiub":  # strings, dates, structured records: not weights
        raise DataError(f"cannot read {path} as attention maps: it holds {array.dtype} values, "
                        "not numbers (expected the float weights of the *_maps.npy `vitkit "
                        "attention` writes)")
    return as_maps(torch.from_numpy(np.asarray(array, dtype=np.float32)), str(path))


def as_maps(array: torch.Tensor, name: str = "the maps") -> Maps:
    """(T, T), (heads, T, T), (layers, heads, T, T) or (layers, B, heads, T, T) -> Maps."""
    if array.dim() < 2 or array.shape[-1] != array.shape[-2]:
        raise DataError(f"{name} has shape {tuple(array.shape)}; expected attention maps of "
                        "shape (layers, heads, T, T), (heads, T, T) or (T, T) (the files "
                        "`vitkit attention` writes as *_maps.npy)")
    rows = array.sum(-1)
    if not torch.allclose(rows, torch.ones_like(rows), atol=1e-2):
        raise DataError(f"the rows of {name} do not sum to 1 (they sum to "
                        f"{rows.min():.3g}..{rows.max():.3g}); expected softmax attention "
                        "maps (T, T) per head, not a map on the patch grid")
    given = {2: "one map", 3: "one layer (heads)", 4: "layers x heads", 5: "layers x heads"}
    if array.dim() > 5:
        raise DataError(f"{name} has {array.dim()} axes; expected at most 5")
    kind = given[array.dim()]
    while array.dim() < 4:
        array = array.unsqueeze(0)
    if array.dim() == 4:
        array = array.unsqueeze(1)  # (L, B=1, H, T, T)
    distinct = array.shape[2] > 1 and not torch.allclose(
        array[:, :, :1].expand_as(array), array, atol=1e-6)
    return Maps(array, kind, distinct)


# ---------------------------------------------------------------------------------- checks
_HEADS_WHY = ("Heads specialise (local, global, one object part); their mean blurs them into a "
              "map that shows none of them: 'the maps are meaningless' is nearly always this.")


def check_heads(m: Maps, ctx: dict) -> Finding:
    """Heads averaged (a single map given, or every head identical)."""
    heads = m.maps.shape[2]
    if m.given_as == "one layer (heads)":
        return Finding(
            "maps.heads", "warning",
            f"a 3-D array ({heads}, T, T): one layer's heads, or every layer with its heads "
            "averaged (the shape cannot tell)", {"entries": heads},
            _HEADS_WHY,
            "save every layer and head as (layers, heads, T, T): vitkit attention writes "
            "*_maps.npy; in Python torch.stack(list(maps))[:, 0]")
    if heads == 1 or not m.heads_distinct:
        what = "a single map per layer" if heads == 1 else f"{heads} identical heads"
        return Finding(
            "maps.heads", "warning", f"heads averaged: {what}", {"heads": heads},
            _HEADS_WHY,
            "look at every head: vitkit attention IMG --checkpoint C --out DIR (per-head "
            "figure), or explain.cls_attention(maps, head=None)")
    return Finding("maps.heads", "ok", f"{heads} distinct heads per layer", {"heads": heads})


def check_layers(m: Maps, ctx: dict) -> Finding:
    """Only the final layer given (a 3-D array cannot say whether it is one layer)."""
    layers = m.maps.shape[0]
    if m.given_as == "one layer (heads)":
        return Finding(
            "maps.layers", "unknown",
            f"cannot tell: a 3-D array ({m.maps.shape[2]}, T, T) is one layer's heads or every "
            "layer with its heads averaged", {"entries": m.maps.shape[2]},
            "Either way something is lost (the other layers, or the heads: see maps.heads); "
            "save (layers, heads, T, T) to have both checked.",
            "vitkit attention writes *_maps.npy as (layers, heads, T, T)")
    if layers == 1:
        return Finding(
            "maps.layers", "warning", "one layer only", {"layers": layers},
            "The last layer's attention mixes tokens that earlier layers already mixed: alone "
            "it does not say which patches the prediction used.",
            "use every layer: explain.attention_rollout(maps), or a gradient method "
            "(vitkit attention IMG --checkpoint C --method chefer --out DIR)")
    return Finding("maps.layers", "ok", f"{layers} layers", {"layers": layers})


def check_uniform(m: Maps, ctx: dict) -> Finding:
    """Rows near uniform: mean entropy above UNIFORM x ln T."""
    t = m.maps.shape[-1]
    entropy = stats.attention_entropy(list(m.maps))  # (L, H)
    share = (entropy / math.log(t)).mean().item()
    measured = {"entropy_over_ln_T": share, "tokens": t}
    if share > UNIFORM:
        return Finding(
            "maps.uniform", "warning",
            f"rows are near uniform (entropy {share:.2f} x ln T)", measured,
            "Attention that spreads evenly over every token carries no information: an "
            "untrained (or not loaded) model looks like this.",
            "check the weights: vitkit doctor CHECKPOINT")
    return Finding("maps.uniform", "ok", f"rows are peaked (entropy {share:.2f} x ln T)",
                   measured)


def check_sinks(m: Maps, ctx: dict) -> Finding:
    """A few columns absorbing most of nearly every row (attention sinks), in every image."""
    t = m.maps.shape[-1]
    k = max(1, round(SINK_SHARE_OF_TOKENS * t))
    rows = stats.sunk_rows(list(m.maps), k, SINK)  # (L, B)
    sunk = [i for i, r in enumerate(rows.min(dim=1).values.tolist()) if r >= SINK_ROWS]
    column_mass = m.maps.float().mean(dim=(1, 2, 3))  # (L, T)
    tops = sorted({int(c) for i in sunk for c in column_mass[i].topk(k).indices})
    measured = {"max_sunk_rows": rows.max().item(), "columns": k, "images": rows.shape[1]}
    if sunk:
        return Finding(
            "maps.sinks", "warning",
            f"attention sinks: {k} token(s) ({tops[:8]}) take over {SINK:.0%} of at least "
            f"{SINK_ROWS:.0%} of the rows in layers {sunk}", measured,
            "Sinks (often background patches, Darcet et al. 2023) dominate [CLS] maps and "
            "rollout, hiding where the model looks.",
            "read the map without those tokens, or use a model with registers "
            "(vit_small_patch14_reg4_dinov2); gradient methods weigh them down")
    return Finding("maps.sinks", "ok", "no attention sinks", measured)


def check_distance(maps: list[torch.Tensor], ctx: dict) -> Finding | None:
    """Mean attention distance per layer: trained ViTs have local heads in early layers."""
    layout = ctx.get("layout")
    if layout is None:
        return None
    dist = stats.mean_attention_distance(maps, layout["grid"], layout["patch_size"],
                                         layout["num_prefix_tokens"])  # (L, H)
    uniform = stats.uniform_distance(layout["grid"], layout["patch_size"])
    early = dist[: max(1, len(maps) // 3)]
    local = (early < LOCAL_HEADS * uniform).sum().item()
    measured = {"per_layer_px": [round(v, 1) for v in dist.mean(1).tolist()],
                "uniform_px": round(uniform, 1), "local_early_heads": local}
    if local == 0:
        return Finding(
            "maps.distance", "warning",
            "no local heads in the early layers: every head looks as far as uniform attention",
            measured,
            "Trained ViTs learn local heads early (like a CNN's first layers); without them the "
            "model has not learned locality, usually too little data or training.",
            "train longer or on more data, fine-tune a pre-trained model, or distil from a CNN")
    return Finding("maps.distance", "ok",
                   f"{local} local head(s) in the early layers", measured)


def check_artifacts(norms: torch.Tensor | None, ctx: dict) -> Finding | None:
    """High-norm artifact tokens in the last layer's output (Darcet et al. 2023)."""
    if norms is None:
        return None
    last = norms[-1].mean(0)  # (T,)
    p = ctx["layout"]["num_prefix_tokens"] if ctx.get("layout") else 0
    outliers = stats.outlier_tokens(last[p:], ARTIFACT_MAD) + p
    measured = {"median_norm": last[p:].median().item(), "max_norm": last[p:].max().item(),
                "outliers": outliers.tolist()[:8]}
    if len(outliers):
        return Finding(
            "maps.artifacts", "warning",
            f"{len(outliers)} patch token(s) with outlying norms: {outliers.tolist()[:8]}",
            measured,
            "Large ViTs repurpose background patches as global scratch space; those tokens "
            "draw attention and make maps spiky (Darcet et al. 2023).",
            "use a model with registers (e.g. vit_small_patch14_reg4_dinov2), or ignore those "
            "tokens when reading maps")
    return Finding("maps.artifacts", "ok", "no high-norm artifact tokens", measured)
