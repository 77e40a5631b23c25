"""A textbook pre-norm ViT built from ``nn.MultiheadAttention``, as an independent reference.

It shares no code with vitkit: only the weights are copied across (``from_vitkit``).
"""

import torch
from torch import nn


class RefBlock(nn.Module):
    def __init__(self, dim, heads, mlp_dim, eps):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x, explicit=False):
        h = self.ln1(x)
        if explicit:  # softmax(q k^T / sqrt(d)) written out, so the maps are in the graph
            y, w = self._explicit(h)
        else:
            y, w = self.mha(h, h, h, need_weights=True, average_attn_weights=False)
        x = x + y
        return x + self.mlp(self.ln2(x)), w


    def _explicit(self, h):
        b, t, d = h.shape
        heads = self.mha.num_heads
        qkv = nn.functional.linear(h, self.mha.in_proj_weight, self.mha.in_proj_bias)
        q, k, v = qkv.chunk(3, -1)
        q, k, v = (z.reshape(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
        w = torch.softmax(q @ k.transpose(-1, -2) / (d // heads) ** 0.5, dim=-1)
        y = (w @ v).transpose(1, 2).reshape(b, t, d)
        return self.mha.out_proj(y), w


class RefViT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.embed_dim
        self.cfg = cfg
        self.conv = nn.Conv2d(cfg.in_chans, d, cfg.patch_size, cfg.patch_size)
        self.prefix = nn.Parameter(torch.zeros(1, cfg.num_prefix_tokens, d))
        gh, gw = cfg.grid_size
        self.pos = nn.Parameter(torch.zeros(1, cfg.num_prefix_tokens + gh * gw, d))
        self.blocks = nn.ModuleList(
            RefBlock(d, cfg.num_heads, cfg.mlp_dim, cfg.norm_eps) for _ in range(cfg.depth)
        )
        self.ln = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.head = nn.Linear(d, cfg.num_classes)

    def forward(self, x, explicit=False):
        x = self.conv(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.prefix.expand(x.shape[0], -1, -1), x], 1) + self.pos
        maps = []
        for b in self.blocks:
            x, w = b(x, explicit)
            maps.append(w)
        p = self.cfg.num_prefix_tokens
        if self.cfg.pool == "cls":
            pooled = self.ln(x)[:, 0]
        elif self.cfg.fc_norm:
            pooled = self.ln(x[:, p:].mean(1))
        else:
            pooled = self.ln(x)[:, p:].mean(1)
        return self.head(pooled), maps

    @torch.no_grad()
    def from_vitkit(self, m):
        self.conv.load_state_dict(m.patch_embed.proj.state_dict())
        tokens = [t for t in (m.cls_token, m.reg_token) if t is not None]
        if tokens:
            self.prefix.copy_(torch.cat(tokens, 1))
        self.pos.copy_(m.pos_embed)
        for rb, b in zip(self.blocks, m.blocks, strict=True):
            rb.ln1.load_state_dict(b.norm1.state_dict())
            rb.ln2.load_state_dict(b.norm2.state_dict())
            rb.mha.in_proj_weight.copy_(b.attn.qkv.weight)
            rb.mha.in_proj_bias.copy_(b.attn.qkv.bias)
            rb.mha.out_proj.load_state_dict(b.attn.proj.state_dict())
            rb.mlp[0].load_state_dict(b.mlp.fc1.state_dict())
            rb.mlp[2].load_state_dict(b.mlp.fc2.state_dict())
        self.ln.load_state_dict((m.fc_norm if m.cfg.fc_norm else m.norm).state_dict())
        self.head.load_state_dict(m.head.state_dict())
        return self
