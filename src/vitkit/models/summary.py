"""A model's parameters by part and its cost per image, as plain text (``vitkit info``)."""

from __future__ import annotations

import torch

from vitkit.models.cost import Cost, flop_model, param_breakdown
from vitkit.models.registry import build_config
from vitkit.models.vit import VisionTransformer, ViTConfig


def _scaling_rows(cfg: ViTConfig) -> list[tuple[str, ViTConfig]]:
    """This config beside half/double patch size and a larger image, where they tile."""
    h, w = cfg.img_size
    p = cfg.patch_size
    bigger = 384 if (h, w) == (224, 224) else 2 * h
    candidates = [
        (f"patch {p // 2}", dict(patch_size=p // 2)),
        (f"patch {p} (this)", {}),
        (f"patch {2 * p}", dict(patch_size=2 * p)),
        (f"image {bigger}", dict(img_size=(bigger, bigger * w // h))),
    ]
    rows = []
    for label, change in candidates:
        try:
            rows.append((label, ViTConfig(**{**cfg.to_dict(), **change})))
        except ValueError:  # that patch size does not tile this image: leave the row out
            continue
    return rows


def _g(x: int) -> str:
    return f"{x / 1e9:,.3f}"


def _options(cfg: ViTConfig) -> list[str]:
    """One line per part this model adds to the plain ViT, and what it does."""
    said = [
        (cfg.init_values is not None,
         f"LayerScale: each residual branch is scaled per channel by a learned gamma (init "
         f"{cfg.init_values or 0:g}), so deep models start close to the identity (CaiT, "
         "DeiT-III, DINOv2)"),
        (cfg.num_reg_tokens > 0,
         f"{cfg.num_reg_tokens} register tokens: extra prefix tokens that give attention a "
         "place to park global information, so patches keep clean maps (Darcet et al. 2023)"),
        (cfg.no_embed_class, "patch-only position table: the prefix tokens get no position"),
        (cfg.pre_norm, "a LayerNorm on the tokens before the blocks (CLIP's ln_pre); no "
                       "patch-embedding bias" if not cfg.patch_bias else
         "a LayerNorm on the tokens before the blocks (CLIP's ln_pre)"),
        (cfg.act == "quick_gelu", "QuickGELU x * sigmoid(1.702 x) in the MLPs (OpenAI CLIP)"),
        (cfg.act == "gelu_tanh", "tanh-approximated GELU in the MLPs"),
        (cfg.pool == "map", "attention pooling (MAP head): a learned query attends over every "
                            "token, then LayerNorm and MLP; no [CLS] (SigLIP)"),
        (not cfg.head_bias, "a head without bias (CLIP's projection)"),
        (bool(cfg.rope), f"rotary position embeddings ({cfg.rope}, base "
                         f"{cfg.rope_temperature:g}) on the patch rows of q and k"
                         + ("" if cfg.abs_pos else ", no position table: any input size "
                            "without interpolation")),
        (cfg.mlp != "gelu", f"SwiGLU MLPs ({'packed' if cfg.mlp == 'glu' else 'split'} first "
                            "layer: SiLU(gate) * value)"
         + (" with a LayerNorm on the hidden layer" if cfg.mlp_norm else "")),
        (cfg.qkv_bias and not cfg.key_bias, "a query and value bias, none on the key"),
    ]
    return [f"  + {text}" for on, text in said if on]


def summary(name: str, img_size: int | None = None, patch_size: int | None = None) -> str:
    """The text ``vitkit info`` prints."""
    cfg = build_config(name, img_size, patch_size)
    with torch.device("meta"):  # shapes only: instant even for ViT-H
        model = VisionTransformer(cfg)
    parts = param_breakdown(model)
    cost: Cost = flop_model(cfg)
    gh, gw = cfg.grid_size
    per_block = (parts["block.attn"] + parts["block.mlp"] + parts["block.norms"]
                 + parts["block.layerscale"])
    lines = [
        f"{name}: image {cfg.img_size[0]}x{cfg.img_size[1]}, patch {cfg.patch_size}, "
        f"grid {gh}x{gw}, pool {cfg.pool}",
        f"width {cfg.embed_dim}, depth {cfg.depth}, heads {cfg.num_heads} "
        f"(head dim {cfg.embed_dim // cfg.num_heads}), MLP {cfg.mlp_dim}, "
        f"prefix tokens {cfg.num_prefix_tokens}, LayerNorm eps {cfg.norm_eps:g}",
        *_options(cfg),
        "",
        "Parameters",
    ]
    rows = [
        ("patch embedding", parts["patch_embed"]),
        (f"position table ({cfg.num_pos_prefix + gh * gw} x {cfg.embed_dim})" if cfg.abs_pos
         else "position table (none: rotary embeddings)", parts["pos_embed"]),
        *([("learned rotary frequencies (RoPE-Mixed)", parts["rope"])] if parts["rope"] else []),
        ("prefix tokens ([CLS], dist., registers)", parts["tokens"]),
        ("  per block: attention (qkv + proj)", parts["block.attn"]),
        ("  per block: MLP", parts["block.mlp"]),
        ("  per block: 2 LayerNorms", parts["block.norms"]),
        *([("  per block: 2 LayerScales (x * gamma)", parts["block.layerscale"])]
          if parts["block.layerscale"] else []),
        ("  per block: total", per_block),
        (f"blocks (x{cfg.depth})", parts["blocks"]),
        ("LayerNorms outside the blocks" if cfg.pre_norm else "final LayerNorm",
         parts["norm"]),
        *([("MAP head (query, keys/values, proj, MLP)", parts["attn_pool"])]
          if parts["attn_pool"] else []),
        (f"head ({cfg.num_classes} classes)", parts["head"]),
        ("total", parts["total"]),
    ]
    total = parts["total"]
    for label, n in rows:
        lines.append(f"  {label:<40}{n:>14,}  {100 * n / total:6.2f}%")

    d = cfg.embed_dim
    lines += [
        "",
        f"Cost per image: N = {cost.patches} patches, T = {cost.tokens} tokens "
        "(FLOPs = 2 x MACs)",
        f"  {'term':<40}{'GMACs':>14}{'GFLOPs':>10}   share",
    ]
    terms = [
        ("patch embedding  N*D*C*P^2", cost.patch_embed),
        (f"linear  {cfg.depth} x T*(4D^2 + 2D*Dm)", cost.linear),
        (f"attention  {cfg.depth} x 2*T^2*D", cost.attention),
        ("head  D*classes" + (" + MAP head" if cfg.pool == "map" else ""), cost.head),
        ("total", cost.macs),
    ]
    for label, macs in terms:
        lines.append(
            f"  {label:<40}{_g(macs):>14}{_g(2 * macs):>10}  {100 * macs / cost.macs:6.2f}%"
        )
    lines.append(
        "  attention / linear per block = 2T^2D / T(4D^2+2D*Dm) = "
        f"{cost.attention / cost.linear:.3f}  (D = {d}, T = {cost.tokens})"
    )

    base = cost
    lines += ["", "How the cost scales (attention grows with T^2, the rest with T)",
              f"  {'variant':<20}{'T':>7}{'attn GFLOPs':>14}{'x this':>9}"
              f"{'total GFLOPs':>15}{'x this':>9}"]
    for label, other_cfg in _scaling_rows(cfg):
        c = flop_model(other_cfg)
        lines.append(
            f"  {label:<20}{c.tokens:>7}{_g(2 * c.attention):>14}"
            f"{c.attention / base.attention:>8.2f}x{_g(c.flops):>15}{c.macs / base.macs:>8.2f}x"
        )
    return "\n".join(lines)
