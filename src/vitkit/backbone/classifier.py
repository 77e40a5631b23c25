"""A frozen backbone and its fitted linear probe as one plain vitkit classifier checkpoint,
which ``vitkit predict``, ``attention``, ``trust`` and ``audit`` read like any other.

The head is the logistic regression itself: its weights (C, D) and biases (C,) on the pooled
embedding (the pre-logits the head reads), so the checkpoint's softmax is the probe's
``predict_proba`` and its argmax the probe's ``predict``. The probe fits the features as they
are (not standardised), so there is no scaling to fold in.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from vitkit.backbone.features import resize
from vitkit.backbone.shards import weights_sha256
from vitkit.checkpoints import load_model, save_model
from vitkit.errors import ConfigError

UNSEEN = -1e4  # the bias of a class the probe never saw: never predicted


def probe_head(clf, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A fitted ``LogisticRegression`` -> (weight (num_classes, D), bias (num_classes,)) with
    softmax(x W^T + b) = ``clf.predict_proba(x)`` on the classes it saw (a binary probe's one
    row w becomes the logits 0 and w x + b); a class it never saw gets bias :data:`UNSEEN`."""
    coef, intercept = np.asarray(clf.coef_), np.asarray(clf.intercept_)
    if len(clf.classes_) == 2 and coef.shape[0] == 1:
        coef = np.concatenate([np.zeros_like(coef), coef])
        intercept = np.concatenate([np.zeros_like(intercept), intercept])
    weight = np.zeros((num_classes, coef.shape[1]))
    bias = np.full(num_classes, UNSEEN)
    weight[clf.classes_], bias[clf.classes_] = coef, intercept
    return weight, bias


def save_probe_classifier(manifest: dict, clf, num_classes: int,
                          path: str | os.PathLike) -> Path:
    """The backbone of a features ``manifest`` (reloaded from its source, checked against the
    weights' hash, at the size it was embedded at) with ``clf`` as its head, written to
    ``path`` (a ``.safetensors`` file, vitkit's own format)."""
    source = manifest["model"]["source"]
    extra = {"model": manifest["model"]["model_option"]} if manifest["model"].get(
        "model_option") else {}
    model = load_model(source, verbose=False, **extra)
    if weights_sha256(model) != manifest["model"]["weights_sha256"]:
        raise ConfigError(f"--save-model: {source} no longer holds the weights the features "
                          f"were made with (sha256 {manifest['model']['weights_sha256'][:12]}); "
                          "embed the data again with the checkpoint you want to save")
    if not model.cfg.head_bias:
        raise ConfigError(f"--save-model: {source} builds its head without a bias, which a "
                          "logistic regression needs; probe it without --save-model")
    resize(model, tuple(manifest["preprocessing"]["img_size"]))
    weight, bias = probe_head(clf, num_classes)
    model.reset_classifier(num_classes)
    heads = [model.head] + ([model.head_dist] if model.head_dist is not None else [])
    with torch.no_grad():  # a distilled model averages its two heads: both the probe
        for head in heads:
            head.weight.copy_(torch.as_tensor(weight, dtype=head.weight.dtype))
            head.bias.copy_(torch.as_tensor(bias, dtype=head.bias.dtype))
    return save_model(model, path)
