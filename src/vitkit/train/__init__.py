"""Training: a compact loop (AdamW, warmup + cosine) used by benchmarks and the CLI."""

from vitkit.train.engine import evaluate, fit

__all__ = ["evaluate", "fit"]
