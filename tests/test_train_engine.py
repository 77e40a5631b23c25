"""The compact training loop: schedule shape, learning on a small real task, determinism."""

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.data import digits_split
from vitkit.train import evaluate, fit
from vitkit.train.engine import cosine_lr


def test_warmup_then_cosine():
    lrs = [cosine_lr(s, 100, 10, 1.0) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert lrs[-1] < 0.01


def _digits(split, n):
    x, y = digits_split(split)
    x = F.interpolate(x[:n, None], size=16, mode="bilinear").expand(-1, 3, -1, -1).contiguous()
    return x, y[:n]


def test_fit_learns_real_digits_and_is_deterministic():
    x, y = _digits("train", 512)
    xv, yv = _digits("val", 200)

    def run():
        torch.manual_seed(0)
        model = vitkit.create_model("vit_nano_patch4_32", img_size=16, num_classes=10)
        history = fit(model, x, y, epochs=10, batch_size=32, lr=3e-3, progress=False)
        return model, history

    model, history = run()
    assert history[-1]["loss"] < history[0]["loss"] - 0.5
    assert evaluate(model, xv, yv) > 0.3  # chance is 0.1
    again, _ = run()
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
