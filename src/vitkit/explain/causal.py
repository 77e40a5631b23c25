"""Which parts mattered, causally: attention is a hypothesis, an intervention tests it.

- ``logit_lens``: every layer's tokens read out through the final norm and the head: at which
  layer does the prediction form? (nostalgebraist 2020; for ViTs, e.g. ViT-Prisma.)
- ``head_importance``: the drop in a class's logit (or probability) when one head's output is
  zeroed before the attention projection (Michel et al. 2019, "Are Sixteen Heads Really Better
  Than One?"), for every layer and head.
- ``head_importance_estimate``: the same drops estimated to first order by attribution patching
  (Nanda 2023; Syed et al. 2023, "Attribution Patching Outperforms Automated Circuit
  Discovery"): one forward and one backward instead of one forward per layer; the explorer
  shows it at once, labelled as the linear estimate, and the exact ablation on request.

Both work for every readout vitkit builds: [CLS], DeiT's two heads, average pooling and
attention pooling (the head is the model's own ``forward_head``).
"""

from __future__ import annotations

import torch

from vitkit.errors import ExplainError
from vitkit.explain.gradients import targets

MEASURES = ("logit", "prob")


@torch.no_grad()
def hidden_states(model, x: torch.Tensor) -> list[torch.Tensor]:
    """The token stream after every block, first block first: a list of (B, T, D)."""
    states: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda m, args, out: states.append(out[0]))
             for b in model.blocks]
    try:
        model.forward_features(x)  # every row of every block (no readout-only shortcut)
    finally:
        for h in hooks:
            h.remove()
    return states


@torch.no_grad()
def logit_lens(model, x: torch.Tensor) -> torch.Tensor:
    """Logits read out after every layer -> (layers, B, num_classes).

    Layer ``l``'s tokens go through the model's final norm and its head, exactly as the last
    layer's do, so the last entry equals ``model(x)``.
    """
    return torch.stack([model.forward_head(model.norm(h)) for h in hidden_states(model, x)])


def _score(logits: torch.Tensor, target: torch.Tensor, measure: str) -> torch.Tensor:
    if measure == "prob":
        logits = logits.softmax(-1)
    return logits.gather(1, target[:, None])[:, 0]


@torch.no_grad()
def head_importance(model, x: torch.Tensor, target=None, measure: str = "logit",
                    progress=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The drop in the target's score when each head's output is zeroed -> (B, layers, heads),
    with the targets (B,) (each image's prediction unless ``target`` is given).

    ``measure``: "logit" (the target logit) or "prob" (its softmax probability). Positive
    values: the head helped the class; negative: it worked against it. One forward per layer,
    the heads of that layer batched; the head's slice of the projection input is zeroed, which
    is the same as removing its columns from the projection. ``progress(fraction)`` is called
    after each layer (the explorer's jobs cancel through it).
    """
    if measure not in MEASURES:
        raise ExplainError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    b = x.shape[0]
    h, d = model.cfg.num_heads, model.cfg.embed_dim // model.cfg.num_heads
    base = model(x)
    target = targets(base, target)
    base_score = _score(base, target, measure)  # (B,)
    mask = torch.ones(h, 1, h * d, dtype=x.dtype, device=x.device)
    for i in range(h):
        mask[i, :, i * d:(i + 1) * d] = 0
    mask = mask.repeat(b, 1, 1)  # (B*h, 1, D): copy i of each image silences head i
    xs = x.repeat_interleave(h, 0)  # (B*h, C, H, W)
    drops = []
    for block in model.blocks:
        handle = block.attn.proj.register_forward_pre_hook(lambda m, args: (args[0] * mask,))
        try:
            scores = _score(model(xs), target.repeat_interleave(h), measure)  # (B*h,)
        finally:
            handle.remove()
        drops.append(base_score[:, None] - scores.reshape(b, h))
        if progress is not None:
            progress(len(drops) / len(model.blocks))
    return torch.stack(drops, 1), target


def head_importance_estimate(model, x: torch.Tensor, target=None, measure: str = "logit"
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`head_importance` estimated by attribution patching -> (B, layers, heads), with
    the targets (B,).

    Zeroing head ``i``'s slice ``z_i`` of the projection's input changes the score by about
    ``-grad_i . z_i`` (first order), so the drop is estimated as ``grad_i . z_i`` summed over
    the tokens: one forward and one backward for every head of every layer. Exact for a score
    linear in ``z``; a head whose removal the rest of the network compensates for (through
    LayerNorm, the softmax, later layers) is where the estimate and the ablation differ.
    """
    if measure not in MEASURES:
        raise ExplainError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    b = x.shape[0]
    h = model.cfg.num_heads
    inputs: list[torch.Tensor] = []
    handles = [blk.attn.proj.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
               for blk in model.blocks]
    try:
        with torch.enable_grad():
            logits = model(x.detach().clone().requires_grad_(True))
            target = targets(logits.detach(), target)
            grads = torch.autograd.grad(_score(logits, target, measure).sum(), inputs)
    finally:
        for handle in handles:
            handle.remove()
    drops = [(z * g).reshape(b, -1, h, z.shape[-1] // h).sum((1, 3)).detach()
             for z, g in zip(inputs, grads, strict=True)]
    return torch.stack(drops, 1), target
