"""Shared test set-up: deterministic float32 on CPU, hypothesis without wall-clock deadlines, and
the small ViT most tests build (``SMALL``, ``small_vit``; test modules import them from here)."""

import logging
import os

import pytest
import torch
from hypothesis import settings

from vitkit import VisionTransformer

from peers import perturb


def fashion_mnist_installed() -> bool:
    """Whether Fashion-MNIST's IDX files are on this machine (Debian's dataset-fashion-mnist,
    or ./data): the tests that read it skip without them, and say how to get them."""
    from vitkit.data.idx import find_idx_folder
    from vitkit.errors import DataError

    try:
        find_idx_folder("fashion-mnist", "data")
    except DataError:
        return False
    return True


needs_fashion_mnist = pytest.mark.skipif(
    not fashion_mnist_installed(),
    reason="needs Fashion-MNIST: sudo apt-get install dataset-fashion-mnist (.ci/run does)")

# Shared 2-core machines are noisy: a deadline would turn load into failures.
settings.register_profile("vitkit", deadline=None, max_examples=60, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "vitkit"))


# 32x32 images, 4x4 patches (64 tokens), 3 blocks of width 48: every code path, in milliseconds.
SMALL = dict(img_size=32, patch_size=4, embed_dim=48, depth=3, num_heads=4, mlp_dim=96,
             num_classes=7)


def small_vit(scale: float = 0.0, **overrides) -> VisionTransformer:
    """A ``SMALL`` ViT with ``overrides``, in eval mode; ``scale > 0`` adds that much noise to
    every weight (fresh models have zero biases and unit LayerNorms, which hide mistakes)."""
    model = VisionTransformer(**{**SMALL, **overrides})
    return perturb(model, scale=scale) if scale else model.eval()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def x224():
    """Two fixed 224x224 images."""
    return torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def vitkit_log(caplog):
    """What the library logs on the ``vitkit`` logger during a test (``.text``, ``.messages``)."""
    caplog.set_level(logging.INFO, logger="vitkit")
    return caplog
