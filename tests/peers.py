"""Helpers for checkpoint tests: perturb a peer's random weights so no tensor is trivial."""

import torch


def perturb(model: torch.nn.Module, scale: float = 0.02) -> torch.nn.Module:
    """Add noise to every parameter (zero-initialised heads, unit LayerNorms) and set eval."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A model's output without gradients; HF models' ``.logits`` unwrapped."""
    with torch.no_grad():
        out = model(x)
    return getattr(out, "logits", out)
