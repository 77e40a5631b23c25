"""The Vision Transformer, top to bottom.

An image (B, C, H, W) is cut into P x P patches, each projected to a D-dim token (B, N, D) with
N = (H/P)(W/P). Prefix tokens ([CLS], registers) are prepended, a learned position table is
added, pre-norm transformer blocks run, a final LayerNorm normalises, and a linear head
classifies the pooled vector (the [CLS] output, or the mean of the patch tokens).

Options of the one model cover the families people use: LayerScale (``init_values``; DINOv2,
DeiT-III), register tokens, a patch-only position table, a LayerNorm before the blocks
(``pre_norm``; CLIP), QuickGELU or tanh GELU (``act``), attention pooling by a learned query
(``pool="map"``; SigLIP) and a head without bias (CLIP's projection).

Parameter names follow timm (``patch_embed.proj``, ``blocks.N.attn.qkv``, ``blocks.N.ls1.gamma``,
``norm_pre``, ``attn_pool.latent``, ...), so a timm state dict is our state dict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitkit.errors import ModelError
from vitkit.models import inference, rope
from vitkit.models.arithmetic import STANDARD, Arithmetic, split_heads
from vitkit.models.config import ACTIVATION_NAMES, MLP_NAMES, ViTConfig, patch_grid
from vitkit.models.pos_embed import Pair, interpolate_pos_embed


class AttentionMaps(list):
    """Per-layer attention maps, each (B, heads, T, T), and what is needed to read them.

    A plain list of tensors to anyone who indexes or iterates it, plus:
    ``layers`` (the model layer of each entry), ``grid`` (gh, gw) of the input,
    ``num_prefix_tokens`` (T = prefix + gh*gw) and ``readout``, the token rows the head reads:
    ``(0,)`` for [CLS], ``(0, 1)`` for DeiT's [CLS] + distillation tokens, ``None`` for average
    pooling over the patch tokens; and ``pool_attention``, the MAP head's attention over every
    token (B, heads, T) for attention-pooled models (the model's readout), else ``None``.
    """

    pool_attention: torch.Tensor | None = None

    def __init__(self, maps: list[torch.Tensor], layers: list[int], grid: tuple[int, int],
                 cfg: ViTConfig | None = None, *, num_prefix_tokens: int | None = None,
                 readout: tuple[int, ...] | None = (0,)) -> None:
        super().__init__(maps)
        self.layers = list(layers)
        self.grid = tuple(grid)
        self.num_prefix_tokens = cfg.num_prefix_tokens if cfg is not None else num_prefix_tokens
        self.readout = cfg.readout_rows if cfg is not None else readout
        self.num_reg_tokens = cfg.num_reg_tokens if cfg is not None else 0  # last of the prefix

    def __getitem__(self, index):
        """An int gives that layer's tensor; a slice (``maps[-4:]``) gives ``AttentionMaps``
        that keep the layout and the model layer of each entry."""
        if isinstance(index, slice):
            out = AttentionMaps(list.__getitem__(self, index), self.layers[index], self.grid,
                                num_prefix_tokens=self.num_prefix_tokens, readout=self.readout)
            out.pool_attention, out.num_reg_tokens = self.pool_attention, self.num_reg_tokens
            return out
        return list.__getitem__(self, index)


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, gh*gw, D) with a Conv2d of kernel = stride = P."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size,
                              bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patch_grid(x.shape[-2:], self.patch_size)  # refuse to drop rows or columns
        x = self.proj(x)  # (B, D, gh, gw)
        return x.flatten(2).transpose(1, 2)  # (B, gh*gw, D)


def sdpa_attention(q, k, v, dropout_p: float = 0.0, return_attn: bool = False):
    """The attention kernel: (B, h, T, d) x3 -> ((B, h, T, d), maps or None).

    Without maps it is ``F.scaled_dot_product_attention`` (one SDPA kernel, flash attention on
    GPU). With maps it computes softmax(q k^T / sqrt(d)) explicitly and returns it per head,
    (B, h, T, T), before dropout, so each row sums to 1.
    """
    if not return_attn:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p), None
    attn = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, h, T, T)
    attn = attn.softmax(dim=-1)
    weights = F.dropout(attn, p=dropout_p) if dropout_p > 0 else attn
    return weights @ v, attn  # (B, h, T, d), (B, h, T, T)


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection: (B, T, D) -> (B, T, D).

    The one definition every path runs: the relevance rules (explain/lrp.py) swap ``kernel``
    (softmax(q k^T / sqrt(d)) v, with maps on request) for one with their backward; the ONNX
    export traces it as it is; the in-place CPU path swaps the arithmetic of its steps
    (:class:`Arithmetic`). Rotary embeddings, when the model has them, turn the patch rows of q
    and k between the projection and the kernel (``rope``: the table of the input's grid).
    """

    kernel = staticmethod(sdpa_attention)  # (q, k, v, dropout_p, return_attn) -> (out, maps)

    def __init__(
        self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
        proj_drop: float = 0.0, key_bias: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias and key_bias)
        # the query and value biases without a key bias (timm's EVA layout)
        split = qkv_bias and not key_bias
        self.q_bias = nn.Parameter(torch.zeros(dim)) if split else None
        self.v_bias = nn.Parameter(torch.zeros(dim)) if split else None
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def bias(self) -> torch.Tensor | None:
        """The qkv projection's bias (3D,), the key's zero where it has none; None without."""
        if self.q_bias is None:
            return self.qkv.bias
        return torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])

    def forward(self, x: torch.Tensor, return_attn: bool = False, rows: int | None = None,
                rope_table: RopeTable | None = None, ops: Arithmetic = STANDARD):
        """(B, T, D) -> (B, T, D); with ``rows``, only the first ``rows`` tokens ask: (B, rows, D).

        Every token still gives keys and values; ``rows`` (the readout tokens of the last
        block) saves the other rows' queries, attention outputs and projection.
        """
        q, k, v = ops.qkv(self, x, rows, rope_table is not None)
        if rope_table is not None:
            q, k = ops.rotate(rope_table, q, k)
        dropout_p = self.attn_drop if self.training else 0.0
        o, attn = ops.attend(self.kernel, q, k, v, dropout_p, return_attn)  # (B, h, R, d)
        return self.proj_drop(ops.project(self, o)), attn


class RopeTable:
    """A grid's rotary table as a block uses it: ``apply(q, k)`` rotates the patch rows (those
    after the ``prefix`` tokens); ``sin``/``cos`` are (N, d) or, per block, (h, N, d)."""

    def __init__(self, sin: torch.Tensor, cos: torch.Tensor, prefix: int, half: bool) -> None:
        self.sin, self.cos, self.prefix, self.half = sin, cos, prefix, half

    def apply(self, q: torch.Tensor, k: torch.Tensor):
        return rope.apply(q, k, (self.sin, self.cos), self.prefix, self.half)

    def layer(self, i: int) -> RopeTable:
        """The table of block ``i`` (learned per-block frequencies), else this one."""
        if self.sin.dim() == 4:
            return RopeTable(self.sin[i], self.cos[i], self.prefix, self.half)
        return self


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x), the activation of OpenAI's CLIP."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


ACTIVATIONS = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "quick_gelu": QuickGELU,
}
assert tuple(ACTIVATIONS) == ACTIVATION_NAMES  # the config's names, each built here


class Mlp(nn.Module):
    """Linear -> activation (exact GELU unless ``act`` says) -> [LayerNorm] -> Linear:
    (B, T, D) -> (B, T, D). The LayerNorm on the hidden layer (``norm``) is EVA-02's scale_mlp."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0, act: str = "gelu",
                 norm_eps: float | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = ACTIVATIONS[act]()
        self.norm = nn.LayerNorm(hidden_dim, eps=norm_eps) if norm_eps else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, ops: Arithmetic = STANDARD) -> torch.Tensor:
        h = self.drop(ops.act(self.act, ops.linear(self.fc1, x, "hidden")))
        return self.drop(ops.linear(self.fc2, self.norm(h), "branch"))


class Product(nn.Module):
    """a * b, the gate of a GLU (a module, so the relevance rules can swap its backward)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b


class SwiGLU(nn.Module):
    """SiLU(gate) * value -> [LayerNorm] -> Linear: (B, T, D) -> (B, T, D), hidden width H.

    ``packed``: one first layer ``fc1`` (2H outputs: the gate's H, then the value's; timm's
    GluMlp/SwiGLUPacked, EVA-02 T/S); else two, ``fc1_g`` and ``fc1_x`` (timm's SwiGLU, DINOv3
    S+/H+, EVA-02 B/L with the hidden LayerNorm)."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0, packed: bool = False,
                 norm_eps: float | None = None) -> None:
        super().__init__()
        self.packed = packed
        if packed:
            self.fc1 = nn.Linear(dim, 2 * hidden_dim)
        else:
            self.fc1_g = nn.Linear(dim, hidden_dim)
            self.fc1_x = nn.Linear(dim, hidden_dim)
        self.act = nn.SiLU()
        self.gate = Product()
        self.norm = nn.LayerNorm(hidden_dim, eps=norm_eps) if norm_eps else nn.Identity()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, ops: Arithmetic = STANDARD) -> torch.Tensor:
        if self.packed:
            g, v = ops.linear(self.fc1, x, "hidden").chunk(2, dim=-1)
        else:
            g, v = ops.linear(self.fc1_g, x, "hidden"), ops.linear(self.fc1_x, x, "value")
        h = self.drop(ops.gate(self.gate, ops.act(self.act, g), v))
        return self.drop(ops.linear(self.fc2, self.norm(h), "branch"))


def make_mlp(kind: str, dim: int, hidden_dim: int, drop: float, act: str,
             norm_eps: float | None) -> nn.Module:
    """The block MLP ``kind`` names (``ViTConfig.mlp``); ``norm_eps``: a hidden LayerNorm."""
    if kind == "gelu":
        return Mlp(dim, hidden_dim, drop, act, norm_eps)
    return SwiGLU(dim, hidden_dim, drop, packed=kind == "glu", norm_eps=norm_eps)


assert MLP_NAMES == ("gelu", "glu", "swiglu")  # the config's names, each built by make_mlp


class DropPath(nn.Module):
    """Stochastic depth: drop a sample's whole residual branch with probability ``p``."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """A learned per-channel scale on a residual branch (CaiT, DeiT-III, DINOv2): x * gamma."""

    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: x + ls1(attn(LN(x))), then x + ls2(mlp(LN(x))); the
    LayerScales are identities unless ``init_values`` is given."""

    def __init__(
        self, dim: int, num_heads: int, mlp_dim: int, qkv_bias: bool = True,
        drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0, eps: float = 1e-6,
        init_values: float | None = None, act: str = "gelu", mlp: str = "gelu",
        mlp_norm: bool = False, key_bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop, key_bias)
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = make_mlp(mlp, dim, mlp_dim, drop, act, eps if mlp_norm else None)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor, return_attn: bool = False, rows: int | None = None,
                rope_table: RopeTable | None = None, ops: Arithmetic = STANDARD):
        """(B, T, D) -> (B, T, D) and maps; with ``rows``, the first ``rows`` tokens only.
        ``ops``: the arithmetic of the steps (the in-place one updates ``x`` itself)."""
        y, attn = self.attn(self.norm1(x), return_attn, rows, rope_table, ops)
        x = ops.residual(x if rows is None else x[:, :rows], y, self.ls1, self.drop_path1)
        x = ops.residual(x, self.mlp(self.norm2(x), ops), self.ls2, self.drop_path2)
        return x, attn  # (B, T or rows, D), (B, h, T or rows, T) or None


class MapHead(nn.Module):
    """Multi-head attention pooling (big_vision's MAP head, timm's ``attn_pool``): a learned
    query attends over every token, then a residual MLP on LayerNorm.
    (B, T, D) -> (B, D), and the query's attention (B, heads, T) when asked. Its attention
    runs the same swappable ``kernel`` as the blocks'."""

    kernel = staticmethod(sdpa_attention)

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, eps: float, act: str) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, mlp_dim, act=act)

    def forward(self, x: torch.Tensor, return_attn: bool = False):
        B, T, D = x.shape
        h = self.num_heads
        q = split_heads(self.q(self.latent), h).expand(B, -1, -1, -1)  # (B, h, 1, d)
        k, v = self.kv(x).reshape(B, T, 2, h, -1).permute(2, 0, 3, 1, 4).unbind(0)
        y, attn = self.kernel(q, k, v, 0.0, return_attn)  # (B, h, 1, d), (B, h, 1, T)
        y = self.proj(y.transpose(1, 2).reshape(B, 1, D))
        y = (y + self.mlp(self.norm(y)))[:, 0]  # (B, D)
        return (y, attn[:, :, 0]) if return_attn else y


class VisionTransformer(nn.Module):
    """A ViT classifier: (B, C, H, W) -> (B, num_classes), or (B, D) features if num_classes=0.

    Build it from keyword arguments (see :class:`ViTConfig`) or from a config object:
    ``VisionTransformer(embed_dim=192, depth=12, num_heads=3, mlp_dim=768)``.
    """

    def __init__(self, config: ViTConfig | None = None, **kwargs) -> None:
        super().__init__()
        cfg = config if config is not None else ViTConfig(**kwargs)
        if config is not None and kwargs:
            cfg = ViTConfig(**{**cfg.to_dict(), **kwargs})
        self.cfg = cfg
        D = cfg.embed_dim
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.grad_checkpointing = False
        # CPU inference without autograd computes the blocks in place (models/inference.py)
        self.inplace_inference = True

        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, D, cfg.patch_bias)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.distilled else None
        self.reg_token = (
            nn.Parameter(torch.zeros(1, cfg.num_reg_tokens, D)) if cfg.num_reg_tokens else None
        )
        gh, gw = cfg.grid_size
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_pos_prefix + gh * gw, D)) \
            if cfg.abs_pos else None
        self.rope = rope.RotaryEmbedding(cfg) if cfg.rope else None
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.norm_pre = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.pre_norm else nn.Identity()
        # stochastic depth rises linearly from 0 at the first block to drop_path_rate at the last
        rates = [cfg.drop_path_rate * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]
        self.blocks = nn.ModuleList(
            Block(D, cfg.num_heads, cfg.mlp_dim, cfg.qkv_bias, cfg.drop_rate,
                  cfg.attn_drop_rate, rate, cfg.norm_eps, cfg.init_values, cfg.act, cfg.mlp,
                  cfg.mlp_norm, cfg.key_bias)
            for rate in rates
        )
        # Pre-norm needs a final LayerNorm: on all tokens, or (fc_norm) on the pooled vector.
        self.norm = nn.Identity() if cfg.fc_norm else nn.LayerNorm(D, eps=cfg.norm_eps)
        self.fc_norm = nn.LayerNorm(D, eps=cfg.norm_eps) if cfg.fc_norm else nn.Identity()
        self.attn_pool = MapHead(D, cfg.pool_heads or cfg.num_heads, cfg.mlp_dim, cfg.norm_eps,
                                 cfg.act) \
            if cfg.pool == "map" else None
        self.pre_logits = (
            nn.Sequential(OrderedDict(fc=nn.Linear(D, cfg.representation_size), act=nn.Tanh()))
            if cfg.representation_size else nn.Identity()
        )
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = self._new_head(cfg.num_classes)
        self.head_dist = self._new_head(cfg.num_classes) if cfg.distilled else None
        if not VisionTransformer._weights_follow:
            self.init_weights()

    _weights_follow = False  # inside weights_to_be_loaded(): init_weights is left to the loader

    @staticmethod
    @contextmanager
    def weights_to_be_loaded() -> Iterator[None]:
        """Build models without :meth:`init_weights` (its truncated normals take 80% of building
        a ViT-S): for a loader that overwrites every weight, or calls ``init_weights`` itself
        before loading a state that leaves some out. Not thread-safe; nests."""
        before = VisionTransformer._weights_follow
        VisionTransformer._weights_follow = True
        try:
            yield
        finally:
            VisionTransformer._weights_follow = before

    # ----------------------------------------------------------------------------- set-up
    def init_weights(self) -> None:
        """Position table trunc-normal(0.02), tokens ~N(0, 1e-6), linears trunc-normal(0.02)."""
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for token in self._prefix_params():
            if token is not None:
                nn.init.normal_(token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, LayerScale):
                nn.init.constant_(m.gamma, m.init_values)
        if self.attn_pool is not None:
            nn.init.trunc_normal_(self.attn_pool.latent, std=self.cfg.embed_dim ** -0.5)

    def _prefix_params(self) -> list[nn.Parameter]:
        """The learned prefix tokens in sequence order: [CLS], distillation, registers."""
        return [t for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]

    def _new_head(self, num_classes: int) -> nn.Module:
        if num_classes <= 0:
            return nn.Identity()
        head = nn.Linear(self.cfg.representation_size or self.cfg.embed_dim, num_classes,
                         bias=self.cfg.head_bias)
        nn.init.trunc_normal_(head.weight, std=0.02)
        if head.bias is not None:
            nn.init.zeros_(head.bias)
        return head

    @property
    def embed_dim(self) -> int:
        return self.cfg.embed_dim

    @property
    def num_classes(self) -> int:
        return self.cfg.num_classes

    @property
    def grid_size(self) -> tuple[int, int]:
        """The patch grid (gh, gw) the position table is laid out on."""
        return self.cfg.grid_size

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in backward: less memory, same gradients."""
        self.grad_checkpointing = enable

    def set_img_size(self, img_size: Pair) -> None:
        """Move the model to a new input size, interpolating the position table in place (a
        model with rotary embeddings only has none: its rotations are computed for any grid)."""
        old_grid = self.grid_size
        new_cfg = ViTConfig(**{**self.cfg.to_dict(), "img_size": img_size})
        if self.pos_embed is not None:
            table = interpolate_pos_embed(
                self.pos_embed.data, old_grid, new_cfg.grid_size, self.cfg.num_pos_prefix,
                mode=self.cfg.pos_interp,
            )
            self.pos_embed = nn.Parameter(table)
        self.cfg = new_cfg

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the head (both heads if distilled) with fresh ones; 0 gives features."""
        self.cfg.num_classes = num_classes
        like = dict(device=self.patch_embed.proj.weight.device,
                    dtype=self.patch_embed.proj.weight.dtype)
        self.head = self._new_head(num_classes).to(**like)
        if self.head_dist is not None:
            self.head_dist = self._new_head(num_classes).to(**like)

    # ---------------------------------------------------------------------------- forward
    def _pos_embed(self, x: torch.Tensor, grid: tuple[int, int],
                   always: bool = False) -> torch.Tensor:
        """Prepend prefix tokens and add the position table: (B, N, D) -> (B, T, D).
        ``always``: interpolate the table even to its own grid (an exact identity), so a traced
        graph (the ONNX export) keeps the grid symbolic."""
        pos = self.pos_embed
        if pos is not None and (always or grid != self.grid_size):
            if not (always or self.cfg.dynamic_img_size):
                p = self.cfg.patch_size
                raise ModelError(
                    f"input of {grid[0] * p}x{grid[1] * p} gives a {grid[0]}x{grid[1]} patch "
                    f"grid, but the position table is for {self.grid_size[0]}x"
                    f"{self.grid_size[1]} ({self.cfg.img_size[0]}x{self.cfg.img_size[1]} at "
                    f"patch {p}). Resize the input, call model.set_img_size(...) or "
                    f"vitkit.interpolate_pos_embed to move the table, or build the model with "
                    f"dynamic_img_size=True to interpolate on the fly."
                )
            pos = interpolate_pos_embed(pos, self.grid_size, grid, self.cfg.num_pos_prefix,
                                        mode=self.cfg.pos_interp,
                                        antialias=self.cfg.pos_antialias, always=always)
        if pos is not None and self.cfg.no_embed_class:
            x = x + pos  # the table covers the patches only
        B = x.shape[0]
        prefix = [t.expand(B, -1, -1) for t in self._prefix_params()]
        x = torch.cat(prefix + [x], dim=1) if prefix else x  # (B, T, D), T = prefix + N
        if pos is not None and not self.cfg.no_embed_class:
            x = x + pos
        return self.pos_drop(x)

    def rope_table(self, grid: tuple[int, int]) -> RopeTable | None:
        """The rotary table of a (gh, gw) grid, as the blocks take it (None without RoPE)."""
        if self.rope is None:
            return None
        sin, cos = self.rope(grid)
        return RopeTable(sin, cos, self.num_prefix_tokens, self.cfg.rope_half)

    def embed(self, x: torch.Tensor, trace: bool = False):
        """Images (B, C, H, W) -> the tokens the first block takes (B, T, D), their patch grid
        and its rotary table (or None). ``trace``: keep the grid symbolic (see _pos_embed)."""
        grid = (x.shape[-2] // self.cfg.patch_size, x.shape[-1] // self.cfg.patch_size) \
            if trace else patch_grid(x.shape[-2:], self.cfg.patch_size)
        tokens = self.norm_pre(self._pos_embed(self.patch_embed(x), grid, always=trace))
        return tokens, grid, self.rope_table(grid)

    def _layers_with_maps(self, attn_layers: Sequence[int] | None) -> list[int]:
        if attn_layers is None:
            return list(range(len(self.blocks)))
        return [self._block_index(i, "attn_layers", "layers") for i in attn_layers]

    def _block_index(self, i: int, name: str, unit: str) -> int:
        """Block index ``i`` of argument ``name`` counted from 0 (negative ones from the end);
        a :class:`ModelError` naming the valid range when the model has no such block."""
        depth = len(self.blocks)
        if not -depth <= i < depth:
            raise ModelError(f"{name} has {i}, but the model has {depth} {unit} "
                             f"(valid: {-depth}..{depth - 1})")
        return i % depth

    def _check_images(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.cfg.in_chans:
            raise ModelError(f"expected images (B, {self.cfg.in_chans}, H, W), got shape "
                             f"{tuple(x.shape)}")

    def forward_features(
        self, x: torch.Tensor, return_attn: bool = False,
        attn_layers: Sequence[int] | None = None, *, readout_only: bool = False,
        trace: bool = False,
    ):
        """(B, C, H, W) -> tokens (B, T, D) after the final norm, and maps if asked.

        With ``return_attn`` the second value is a list of (B, heads, T, T), one per layer in
        ``attn_layers`` (all layers when ``None``), in the order asked. ``readout_only`` (a
        [CLS]-pooled model) returns only the rows the head reads, (B, R, D) with R = 1, or 2
        for DeiT's distillation token, and the last block computes only those rows (keys and
        values still from every token): the same numbers, about 1/depth less work, in
        training as in inference. ``trace`` (the ONNX export): the standard blocks on every
        row, and a grid that stays symbolic.
        """
        if readout_only and self.cfg.readout_rows is None:
            raise ModelError("readout_only needs a [CLS]-pooled model; this one pools 'avg'")
        rows = len(self.cfg.readout_rows) if readout_only else None
        if attn_layers is not None and not return_attn:
            raise ModelError("attn_layers selects which maps to return; pass return_attn=True")
        self._check_images(x)
        x, grid, table = self.embed(x, trace)
        wanted = set(self._layers_with_maps(attn_layers)) if return_attn else set()
        maps: dict[int, torch.Tensor] = {}
        last = len(self.blocks) - 1  # with ``rows``, computed for the readout rows only
        ops = STANDARD
        if not trace and inference.applies(self, x):
            ops = inference.InPlace()  # the same blocks, their steps computed in place
            x = x.contiguous()  # this forward's own tensor: the blocks update it in place
        for i, block in enumerate(self.blocks):
            only = rows if i == last and i not in wanted else None
            layer_table = table.layer(i) if table is not None else None
            if self.grad_checkpointing and torch.is_grad_enabled():
                x, attn = checkpoint(block, x, i in wanted, only, layer_table,
                                     use_reentrant=False)
            else:
                x, attn = block(x, i in wanted, only, layer_table, ops)
            if attn is not None:
                maps[i] = attn
        x = self.norm(x[:, :rows] if rows is not None else x)
        if not return_attn:
            return x
        layers = self._layers_with_maps(attn_layers)
        return x, AttentionMaps([maps[i] for i in layers], layers, grid, self.cfg)

    def _take_indices(self, indices: int | Sequence[int] | None) -> list[int]:
        """timm's ``feature_take_indices``: None -> every block, an int n -> the last n blocks,
        a sequence -> those blocks (negative ones counted from the end), counted from 0."""
        depth = len(self.blocks)
        if indices is None:
            return list(range(depth))
        if isinstance(indices, int) and not isinstance(indices, bool):
            if not 0 < indices <= depth:
                raise ModelError(f"indices={indices} asks for the last {indices} blocks, but the "
                                 f"model has {depth}: give 1..{depth}, a list of block indices "
                                 f"or None for all")
            return list(range(depth - indices, depth))
        if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence) or not indices:
            raise ModelError(f"indices takes None, an int n (the last n blocks) or a non-empty "
                             f"list of block indices; got {indices!r}")
        for i in indices:
            if not isinstance(i, int) or isinstance(i, bool):
                raise ModelError(f"indices has {i!r}, but the model has {depth} blocks "
                                 f"(valid: {-depth}..{depth - 1})")
        return [self._block_index(i, "indices", "blocks") for i in indices]

    def forward_intermediates(
        self, x: torch.Tensor, indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
        output_fmt: str = "NCHW", intermediates_only: bool = False,
    ):
        """The outputs of chosen blocks, as timm's ``forward_intermediates`` gives them.

        x (B, C, H, W); ``indices``: None (every block), an int n (the last n blocks) or block
        indices (negative ones from the end). The intermediates come in block order, one per
        block taken, whatever the order asked. Each is a block's output with the prefix
        tokens ([CLS], distillation, registers) split off: the patch tokens (B, D, gh, gw) for
        ``output_fmt="NCHW"``, (B, gh*gw, D) for ``"NLC"``; with ``return_prefix_tokens``, a
        tuple (patch tokens, prefix tokens (B, num_prefix_tokens, D)) on models with prefix
        tokens. ``norm``: the final norm (``self.norm``) applied to each. ``stop_early``: the
        blocks after the last one taken are not run.

        Returns the list with ``intermediates_only``; else (final tokens (B, T, D), list), the
        final tokens those of :meth:`forward_features` (after the final norm; with
        ``stop_early`` those of the last block run).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ModelError(f"output_fmt must be 'NCHW' (B, D, gh, gw) or 'NLC' "
                             f"(B, gh*gw, D); got {output_fmt!r}")
        take = self._take_indices(indices)
        self._check_images(x)
        x, grid, table = self.embed(x)
        last = max(take) if stop_early else len(self.blocks) - 1
        taken = []
        for i, block in enumerate(self.blocks[:last + 1]):
            # the standard arithmetic: the in-place path would overwrite the tensors kept here
            layer_table = table.layer(i) if table is not None else None
            if self.grad_checkpointing and torch.is_grad_enabled():
                x, _ = checkpoint(block, x, rope_table=layer_table, use_reentrant=False)
            else:
                x, _ = block(x, rope_table=layer_table, ops=STANDARD)
            if i in take:
                taken.append(self.norm(x) if norm else x)
        P = self.num_prefix_tokens
        patches = [y[:, P:] for y in taken]  # (B, N, D)
        if output_fmt == "NCHW":
            patches = [y.reshape(y.shape[0], *grid, -1).permute(0, 3, 1, 2).contiguous()
                       for y in patches]  # (B, D, gh, gw)
        out = list(zip(patches, [y[:, :P] for y in taken], strict=True)) \
            if return_prefix_tokens and P else patches
        if intermediates_only:
            return out
        return self.norm(x), out

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, D): the [CLS] output, the mean of the patch tokens, or attention
        pooling over every token (``pool="map"``)."""
        if self.cfg.pool == "cls":
            return x[:, 0]
        if self.cfg.pool == "map":
            return self.attn_pool(x)
        return x[:, self.num_prefix_tokens:].mean(dim=1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, T, D) -> (B, num_classes), or the pooled vector with ``pre_logits``.

        A distilled model (DeiT) averages its two heads, the [CLS] one and the distillation
        token's, as DeiT does at inference.
        """
        if self.dist_token is not None:
            cls, dist = self.head_drop(x[:, 0]), self.head_drop(x[:, 1])
            if pre_logits:
                return (cls + dist) / 2
            return (self.head(cls) + self.head_dist(dist)) / 2
        return self._classify(self.pool(x), pre_logits)

    def _classify(self, pooled: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, D) pooled vector -> (B, num_classes), or the pre-logits vector."""
        x = self.head_drop(self.pre_logits(self.fc_norm(pooled)))
        return x if pre_logits else self.head(x)

    def forward(
        self, x: torch.Tensor, return_attn: bool = False,
        attn_layers: Sequence[int] | None = None, *, distill_heads: bool = False,
    ):
        """(B, C, H, W) -> logits (B, num_classes); with ``return_attn``, (logits, maps).

        ``distill_heads`` (distilled models, for training): the [CLS] head's and the
        distillation head's logits separately, ((B, C), (B, C)), instead of their average.
        """
        if distill_heads:
            if self.dist_token is None:
                raise ModelError("distill_heads=True needs a distilled model (distilled=True)")
            x = self.forward_features(x, readout_only=True)  # (B, 2, D)
            return self.head(self.head_drop(x[:, 0])), self.head_dist(self.head_drop(x[:, 1]))
        if not return_attn:  # a [CLS] head reads its rows only: the last block skips the rest
            readout_only = self.cfg.readout_rows is not None
            return self.forward_head(
                self.forward_features(x, attn_layers=attn_layers, readout_only=readout_only))
        x, maps = self.forward_features(x, True, attn_layers)
        if self.attn_pool is not None:  # the MAP head's attention is this model's readout map
            pooled, maps.pool_attention = self.attn_pool(x, return_attn=True)
            return self._classify(pooled), maps
        return self.forward_head(x), maps
