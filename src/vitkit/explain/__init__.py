"""Seeing what a ViT attends to, and measuring how far a map can be trusted.

- ``cls_attention``: [CLS] attention per head on the patch grid (never averaged by default).
- ``attention_rollout``, ``readout_grid``: rollout over layers and its map on the grid.
- ``attention_gradients``, ``grad_rollout``, ``chefer``, ``token_gradcam``: gradient methods.
- ``token_attention``: any token's attention row (no grid needed); ``pool_attention``: a MAP
  head's readout map (SigLIP); ``register_attention``: registers kept apart from the grid.
- ``readout_attention``: every head of every layer, the readout's rows on the grid (model view).
- ``causal``: ``logit_lens`` (the prediction read out after every layer) and
  ``head_importance`` (the class score lost when one head is zeroed).
- ``stats``: entropy and mean attention distance per head, high-norm artifact tokens.
- ``dense``: the patch features' pictures: ``feature_pca`` (PCA to RGB, DINOv2's recipe),
  ``patch_similarity``, ``best_matches`` (correspondence), ``artifact_mask``.
- ``explain_map``: any method registered in ``METHODS`` by name -> (B, gh, gw).
- ``metrics``: deletion / insertion, pointing game, mass in box. Figures live in ``vitkit.viz``.

Every function takes what ``model(x, return_attn=True)`` returns or any sequence of
(B, heads, T, T) tensors (a Hugging Face ``outputs.attentions`` tuple, a list).
"""

from vitkit.explain.attention import (
    cls_attention,
    fuse_heads,
    layout_of,
    pool_attention,
    readout_attention,
    readout_grid,
    register_attention,
    token_attention,
)
from vitkit.explain.causal import head_importance, logit_lens
from vitkit.explain.gradients import (
    Attribution,
    attention_gradients,
    chefer,
    grad_rollout,
    token_gradcam,
)
from vitkit.explain.methods import METHODS, Explanation, Method, explain_map, register
from vitkit.explain.rollout import attention_rollout, discard_lowest, rollout_fused

__all__ = [
    "METHODS", "Attribution", "Explanation", "Method", "attention_gradients",
    "attention_rollout", "chefer", "cls_attention", "discard_lowest", "explain_map",
    "fuse_heads", "grad_rollout", "head_importance", "layout_of", "logit_lens",
    "pool_attention", "readout_attention", "readout_grid", "register",
    "register_attention", "rollout_fused",
    "token_attention", "token_gradcam",
]
