"""2-D rotary position embeddings (RoPE) for the patch tokens' queries and keys.

Each head's channels are taken in d/2 pairs; pair j of the token at patch coordinates
(c0, c1) is rotated by the angle ``c0 * f0[j] + c1 * f1[j]``, so that the score q . k of two
patches depends on their offset. Prefix tokens ([CLS], registers) are not rotated. The variants
the families use differ in three things, all options of :class:`~vitkit.models.config.ViTConfig`:

- the coordinates: patch indices plus ``rope_offset`` ("axial", "mixed"), optionally rescaled
  to the grid ``rope_ref_grid`` whatever the input's (EVA-02), or patch centres scaled to
  [-1, 1] on each axis ("dinov3"); ``rope_xy`` puts the column coordinate first;
- the frequencies (f0, f1), (2, d/2): fixed, ``rope_temperature ** -(i / (d/4))`` for the first
  d/4 pairs on the first axis and the same for the last d/4 pairs on the second ("axial",
  "dinov3" with a factor 2 pi), or learned per block and head, mixing both axes ("mixed"; the
  parameter ``rope.freqs``, (2, depth, heads, d/2));
- which channels form a pair: adjacent ones (2j, 2j+1), or halves (j, j + d/2) (``rope_half``).

The rotation is linear in q and k, so autograd, the relevance rules and the ONNX export need
nothing of their own: the table is computed from the grid with plain tensor operations (in the
exported graph too), and :func:`rotate` is a few multiplications and adds.
A RoPE model needs no position table to change resolution: its coordinates are computed for
every grid (``dinov3`` and ``rope_ref_grid`` keep them in the trained range).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """The rotation table of a patch grid: ``forward(grid) -> (sin, cos)``, each (N, d), or
    (depth, heads, N, d) for learned ("mixed") frequencies, N = gh * gw, d the head width."""

    def __init__(self, cfg) -> None:
        super().__init__()
        d = cfg.embed_dim // cfg.num_heads
        self.kind, self.half, self.xy = cfg.rope, cfg.rope_half, cfg.rope_xy
        self.offset, self.ref_grid = cfg.rope_offset, cfg.rope_ref_grid
        self.temperature, self.head_dim = cfg.rope_temperature, d
        if self.kind == "mixed":  # learned, initialised as RoPE-Mixed does: random directions
            self.freqs = nn.Parameter(self.initial_mixed(d, cfg.depth, cfg.num_heads,
                                                         self.temperature))
        else:
            self.register_buffer("freqs", self.axial_freqs(), persistent=False)
        self._last: tuple | None = None  # (key, table): fixed frequencies, the last grid

    def axial_freqs(self) -> torch.Tensor:
        """(2, d/2): the first axis turns the first d/4 pairs, the second the last d/4."""
        q = self.head_dim // 4
        bands = 1.0 / self.temperature ** (torch.arange(q, dtype=torch.float32) / q)
        if self.kind == "dinov3":  # periods temperature^(i/q) on coordinates in [-1, 1]
            bands = 2 * math.pi / self.temperature ** (torch.arange(q, dtype=torch.float32) / q)
        zeros = torch.zeros(q)
        return torch.stack([torch.cat([bands, zeros]), torch.cat([zeros, bands])])

    @staticmethod
    def initial_mixed(d: int, depth: int, heads: int, temperature: float) -> torch.Tensor:
        """(2, depth, heads, d/2): magnitudes temperature^-(4i/d), each head at a random
        direction."""
        mag = 1.0 / temperature ** (torch.arange(0, d, 4, dtype=torch.float32) / d)  # (d/4,)
        angle = torch.rand(depth, heads, 1) * 2 * math.pi
        fx = torch.cat([mag * torch.cos(angle), mag * torch.cos(angle + math.pi / 2)], -1)
        fy = torch.cat([mag * torch.sin(angle), mag * torch.sin(angle + math.pi / 2)], -1)
        return torch.stack([fx, fy])

    def coordinates(self, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The two coordinates of every patch, row-major: ((N,), (N,)), first axis first."""
        sides = [grid[1], grid[0]] if self.xy else [grid[0], grid[1]]
        dev = self.freqs.device
        if self.kind == "dinov3":  # patch centres, each axis scaled to [-1, 1]
            axes = [(torch.arange(s, device=dev, dtype=torch.float32) + 0.5 + self.offset) / s
                    for s in sides]
        else:
            axes = [torch.arange(s, device=dev, dtype=torch.float32) + self.offset
                    for s in sides]
        if self.ref_grid is not None:  # EVA-02: the trained grid's coordinates at every size
            ref = [self.ref_grid[1], self.ref_grid[0]] if self.xy else list(self.ref_grid)
            axes = [a / s * r for a, s, r in zip(axes, sides, ref, strict=True)]
        c0, c1 = torch.meshgrid(axes, indexing="xy" if self.xy else "ij")  # each (gh, gw)
        if self.kind == "dinov3":
            c0, c1 = 2.0 * c0 - 1.0, 2.0 * c1 - 1.0
        return c0.reshape(-1), c1.reshape(-1)

    def forward(self, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        # fixed frequencies on a concrete grid: the last table is reused (a traced graph's grid
        # is symbolic and learned frequencies change, so those are computed every time)
        if self.kind == "mixed" or not all(type(g) is int for g in grid) \
                or torch.compiler.is_compiling():
            return self._table(grid)
        # (an inference-mode tensor cannot enter autograd later: the mode is part of the key)
        key = (tuple(grid), self.freqs.data_ptr(), self.freqs._version, self.freqs.dtype,
               torch.is_inference_mode_enabled())
        if self._last is None or self._last[0] != key:
            self._last = (key, self._table(grid))
        return self._last[1]

    def _table(self, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        c0, c1 = self.coordinates(grid)
        f = self.freqs.float()
        if self.kind == "mixed":  # (depth, heads, N, d/2)
            angles = c0[:, None] * f[0][..., None, :] + c1[:, None] * f[1][..., None, :]
        else:
            angles = c0[:, None] * f[0] + c1[:, None] * f[1]  # (N, d/2)
        if self.half:
            return torch.cat([angles.sin()] * 2, -1), torch.cat([angles.cos()] * 2, -1)
        return angles.sin().repeat_interleave(2, -1), angles.cos().repeat_interleave(2, -1)


def rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, half: bool) -> torch.Tensor:
    """Rotate the channel pairs of x (..., N, d) by the table's angles (sin, cos broadcast to x)."""
    if half:
        a, b = x.chunk(2, dim=-1)
        turned = torch.cat([-b, a], dim=-1)
    else:
        turned = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape(x.shape)
    return x * cos + turned * sin


def apply(q: torch.Tensor, k: torch.Tensor, table, prefix: int, half: bool):
    """Rotate the patch rows of q (B, h, Tq, d) and k (B, h, T, d); the first ``prefix`` rows of
    each ([CLS], registers) are left as they are. ``table`` is (sin, cos) for the patches,
    (N, d) or (h, N, d). A q of only prefix rows (the last block's readout) is not rotated."""
    sin, cos = table
    out = []
    for t in (q, k):
        if t.shape[2] > prefix:
            t = torch.cat([t[:, :, :prefix], rotate(t[:, :, prefix:], sin, cos, half)], dim=2)
        out.append(t)
    return out[0], out[1]
