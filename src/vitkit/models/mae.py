"""Masked-image pre-training (MAE, He et al. 2022) of a vitkit ViT: images (B, C, H, W) -> loss.

The encoder is the ViT itself, run on a random share (1 - ``mask_ratio``) of its patch tokens,
each with its position already added, plus its [CLS] and registers. A light decoder (its own
blocks and width, and a fixed 2-D sine-cosine position table) puts one learned mask token at
every hidden position and predicts each hidden patch's pixels, normalised per patch (MAE's
``norm_pix_loss``). The loss is the mean squared error over the hidden patches only.

Fine-tuning takes ``encoder``, a plain :class:`~vitkit.models.vit.VisionTransformer`: the
trainer saves it alone, so the decoder is dropped and the checkpoint loads as any ViT's.
In eval mode the masks come from a fixed seed, so validation losses of different epochs are
measured on the same hidden patches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.errors import ConfigError
from vitkit.models.vit import Block, VisionTransformer

EVAL_SEED = 0  # the masks of every evaluation


def sincos_table(grid: tuple[int, int], dim: int) -> torch.Tensor:
    """A fixed 2-D sine-cosine position table (gh * gw, dim): half the channels code the row,
    half the column, each as sines and cosines of geometrically spaced frequencies (MAE's)."""
    gh, gw = grid
    quarter = dim // 4
    freqs = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / max(quarter, 1))
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64),
                            torch.arange(gw, dtype=torch.float64), indexing="ij")
    parts = []
    for coord in (ys.reshape(-1), xs.reshape(-1)):
        angles = coord[:, None] * freqs[None]
        parts += [angles.sin(), angles.cos()]
    table = torch.cat(parts, dim=1)
    return F.pad(table, (0, dim - table.shape[1])).float()  # (N, dim)


def patchify(x: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, P*P*C), patches in row-major grid order."""
    B, C, H, W = x.shape
    gh, gw = H // patch, W // patch
    x = x[:, :, :gh * patch, :gw * patch].reshape(B, C, gh, patch, gw, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, gh * gw, patch * patch * C)


class MaskedAutoencoder(nn.Module):
    """An MAE around ``encoder``: ``forward(images) -> loss`` (a scalar).

    ``decoder_dim``/``decoder_depth``/``decoder_heads``: the decoder (by default half the
    encoder's width, at least 32, two blocks, heads of 32 channels), as MAE's light decoder.
    """

    def __init__(self, encoder: VisionTransformer, mask_ratio: float = 0.75,
                 decoder_dim: int | None = None, decoder_depth: int = 2,
                 decoder_heads: int | None = None) -> None:
        super().__init__()
        cfg = encoder.cfg
        if cfg.rope:
            raise ConfigError(f"masked-image pre-training runs on ViTs with a position table; "
                              f"this one has rotary embeddings ({cfg.rope!r}), which the "
                              "masking would have to gather per kept patch: pre-train a ViT "
                              "with a table (e.g. vit_micro_patch4_32)")
        if not 0 < mask_ratio < 1:
            raise ConfigError(f"--mask-ratio is the share of patches hidden, in (0, 1), got "
                              f"{mask_ratio}")
        self.encoder = encoder
        self.mask_ratio = mask_ratio
        D = cfg.embed_dim
        dd = decoder_dim or max(32, D // 2)
        heads = decoder_heads or max(1, dd // 32)
        self.decoder_embed = nn.Linear(D, dd)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dd))
        nn.init.normal_(self.mask_token, std=0.02)
        self.decoder_blocks = nn.ModuleList(Block(dd, heads, 4 * dd)
                                            for _ in range(decoder_depth))
        self.decoder_norm = nn.LayerNorm(dd, eps=1e-6)
        self.decoder_pred = nn.Linear(dd, cfg.patch_size ** 2 * cfg.in_chans)

    @property
    def cfg(self):
        return self.encoder.cfg

    def _noise(self, B: int, N: int, device) -> torch.Tensor:
        if self.training:
            return torch.rand(B, N, device=device)
        generator = torch.Generator().manual_seed(EVAL_SEED)  # the same masks every time
        return torch.rand(B, N, generator=generator).to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> the mean squared error on the hidden patches."""
        enc = self.encoder
        tokens, grid, _ = enc.embed(x)  # (B, prefix + N, D), positions added
        n = enc.num_prefix_tokens
        prefix, patches = tokens[:, :n], tokens[:, n:]
        B, N, D = patches.shape
        keep = max(1, min(N - 1, round(N * (1 - self.mask_ratio))))
        order = self._noise(B, N, x.device).argsort(dim=1)  # a random permutation per image
        restore = order.argsort(dim=1)
        kept = patches.gather(1, order[:, :keep, None].expand(-1, -1, D))
        h = torch.cat([prefix, kept], dim=1)
        for block in enc.blocks:
            h, _ = block(h)
        h = self.decoder_embed(enc.norm(h))  # (B, prefix + keep, dd)
        dd = h.shape[-1]
        hidden = self.mask_token.expand(B, N - keep, dd)
        full = torch.cat([h[:, n:], hidden], dim=1).gather(
            1, restore[..., None].expand(-1, -1, dd))  # back in grid order
        full = full + sincos_table(grid, dd).to(full)
        d = torch.cat([h[:, :n], full], dim=1)
        for block in self.decoder_blocks:
            d, _ = block(d)
        pred = self.decoder_pred(self.decoder_norm(d[:, n:]))  # (B, N, P*P*C)
        target = patchify(x, enc.cfg.patch_size)
        mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
        target = (target - mean) / (var + 1e-6).sqrt()
        per_patch = ((pred.float() - target.float()) ** 2).mean(-1)  # (B, N)
        masked = torch.ones(B, N, device=x.device)
        masked[:, :keep] = 0
        masked = masked.gather(1, restore)  # 1 where hidden, in grid order
        return (per_patch * masked).sum() / masked.sum()

