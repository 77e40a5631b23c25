"""Numbers that describe attention maps and tokens, per layer and head.

- ``attention_entropy``: how spread each head's rows are (ln T when uniform).
- ``mean_attention_distance``: how far, in pixels, each head looks (Dosovitskiy et al. 2021,
  Fig. 7: trained ViTs have local heads in their early layers; an untrained one does not).
- ``sink_share``: how much of every row a few columns absorb (attention sinks, registers);
  ``sunk_rows``: in how many rows they absorb most of it.
- ``token_norms`` and ``outlier_tokens``: high-norm artifact tokens (Darcet et al. 2023).

Maps are any sequence of (B, heads, T, T) tensors; results are (layers, heads) tensors averaged
over the batch and the query rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitkit.explain.attention import check_maps


def _stack(maps: Sequence[torch.Tensor]) -> torch.Tensor:
    check_maps(maps)
    return torch.stack([m.float() for m in maps])  # (L, B, heads, T, T)


def attention_entropy(maps: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention rows -> (layers, heads); uniform rows over
    T tokens give ln T."""
    a = _stack(maps).clamp_min(1e-12)
    return -(a * a.log()).sum(-1).mean(dim=(1, 3))


def mean_attention_distance(maps: Sequence[torch.Tensor], grid: tuple[int, int],
                            patch_size: int, num_prefix_tokens: int) -> torch.Tensor:
    """Mean distance in pixels between a patch and the patches it attends to, weighted by the
    attention (renormalised over the patches) -> (layers, heads)."""
    a = _stack(maps)[..., num_prefix_tokens:, num_prefix_tokens:]  # patch rows and columns
    a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    pos = torch.stack([ys.flatten(), xs.flatten()], -1).float() * patch_size  # (N, 2)
    dist = torch.cdist(pos, pos)  # (N, N)
    return (a * dist).sum(-1).mean(dim=(1, 3))


def uniform_distance(grid: tuple[int, int], patch_size: int) -> float:
    """The mean attention distance of uniform attention over the grid: what a head that looks
    everywhere alike scores."""
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    pos = torch.stack([ys.flatten(), xs.flatten()], -1).float() * patch_size
    return torch.cdist(pos, pos).mean().item()


def sink_share(maps: Sequence[torch.Tensor], k: int = 1) -> torch.Tensor:
    """Share of each row's attention taken by the ``k`` columns that take the most over the
    whole layer -> (layers,). Near k/T for spread attention; near 1 when a few tokens absorb
    every row (sinks)."""
    a = _stack(maps)  # (L, B, H, T, T)
    column_mass = a.mean(dim=(1, 2, 3))  # (L, T): how much each token receives on average
    top = column_mass.topk(k, dim=-1).values.sum(-1)  # (L,)
    return top


def sunk_rows(maps: Sequence[torch.Tensor], k: int = 1, share: float = 0.5) -> torch.Tensor:
    """Per layer and image, the fraction of rows (queries of every head) that give more than
    ``share`` of their attention to the ``k`` columns receiving the most in that image ->
    (layers, B). A sink takes that share of nearly every row; an object that many tokens look
    at takes it of some rows only."""
    a = _stack(maps)  # (L, B, H, T, T)
    columns = a.mean(dim=(2, 3)).topk(k, dim=-1).indices  # (L, B, k)
    idx = columns[:, :, None, None, :].expand(*a.shape[:4], k)
    taken = a.gather(-1, idx).sum(-1)  # (L, B, H, T)
    return (taken > share).float().mean(dim=(2, 3))


@torch.no_grad()
def token_norms(model, x: torch.Tensor) -> torch.Tensor:
    """The L2 norm of every token at the output of every block -> (layers, B, T)."""
    norms: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda m, args, out: norms.append(out[0].norm(dim=-1)))
             for b in model.blocks]
    try:
        model.forward_features(x, return_attn=True)  # the standard blocks, every row
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(norms)


def outlier_tokens(norms: torch.Tensor, k: float = 8.0) -> torch.Tensor:
    """Indices of tokens whose norm exceeds median + ``k`` x MAD (scaled to a standard
    deviation) among the tokens of ``norms`` (T,) -> (n,) indices, highest norm first."""
    median = norms.median()
    mad = (norms - median).abs().median() * 1.4826
    limit = median + k * mad.clamp_min(1e-6 * median.abs().clamp_min(1e-12))
    idx = (norms > limit).nonzero().flatten()
    return idx[norms[idx].argsort(descending=True)]
