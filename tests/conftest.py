"""Shared test set-up: deterministic float32 on CPU, hypothesis without wall-clock deadlines."""

import logging
import os

import pytest
import torch
from hypothesis import settings

# Shared 2-core machines are noisy: a deadline would turn load into failures.
settings.register_profile("vitkit", deadline=None, max_examples=60, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "vitkit"))


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
