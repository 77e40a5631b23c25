"""The doctor: the three ViT failures that each look like something else, diagnosed.

1. "ViT is worse than my ResNet": from scratch on small data, weights that never loaded, a CNN
   recipe.
2. "The attention maps are meaningless": averaged heads, the final layer only.
3. "It works at 224 but breaks at 384": the position table has the wrong number of rows.

``diagnose(target)`` takes a run folder, a checkpoint of any format ``load_model`` reads, or a
maps file, runs the checks of :data:`RULES` that apply, and returns :class:`Finding` s. A check is
one function in ``weights``, ``runs`` or ``maps`` (its thresholds named there, with their
sources); adding one is that function plus one line in ``RULES``.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vitkit.checkpoints import load_model
from vitkit.data.datasets import load_split
from vitkit.data.images import Preprocess, load_image, preprocessing
from vitkit.diagnose import foreign
from vitkit.diagnose import maps as maps_checks
from vitkit.diagnose import runs as run_checks
from vitkit.diagnose import weights as weight_checks
from vitkit.diagnose.findings import Finding, to_json, to_text, worst
from vitkit.errors import DataError, MissingBlocks
from vitkit.explain.stats import token_norms
from vitkit.models.cnn import is_cnn
from vitkit.recipe import RunPlan

__all__ = ["RULES", "Finding", "Rule", "diagnose", "diagnose_run", "start_of_run", "to_json",
           "to_text", "worst"]


@dataclass(frozen=True)
class Rule:
    """One check: what it looks at ("model", "run", "maps", "computed" maps of an image) and
    the function ``(subject, context) -> Finding | list[Finding] | None``."""

    name: str
    looks_at: str
    check: Callable


RULES: tuple[Rule, ...] = (
    Rule("weights.trained", "model", weight_checks.check_trained),
    Rule("weights.position_table", "model", weight_checks.check_position_table),
    Rule("weights.input_size", "model", weight_checks.check_table_fits),
    Rule("weights.load", "model", weight_checks.check_load_record),
    Rule("run.small_data", "run", run_checks.check_small_data),
    Rule("run.recipe", "run", run_checks.check_recipe),
    Rule("run.learning", "run", run_checks.check_learning),
    Rule("run.overfitting", "run", run_checks.check_overfitting),
    Rule("run.stability", "run", run_checks.check_stability),
    Rule("maps.heads", "maps", maps_checks.check_heads),
    Rule("maps.layers", "maps", maps_checks.check_layers),
    Rule("maps.uniform", "maps", maps_checks.check_uniform),
    Rule("maps.sinks", "maps", maps_checks.check_sinks),
    Rule("maps.distance", "computed", maps_checks.check_distance),
    Rule("maps.artifacts", "norms", maps_checks.check_artifacts),
)


def _apply(looks_at: str, subject, ctx: dict, only: tuple[str, ...] | None = None,
           ) -> list[Finding]:
    out: list[Finding] = []
    for rule in RULES:
        if rule.looks_at != looks_at or (only is not None and rule.name not in only):
            continue
        result = rule.check(subject, ctx)
        if result is None:
            continue
        out += result if isinstance(result, list) else [result]
    return out


def _is_maps_file(path: Path) -> bool:
    if path.suffix == ".npy":
        return True
    if path.suffix != ".npz":
        return False
    try:
        with np.load(path, allow_pickle=False) as z:  # a JAX checkpoint names its arrays a/b/c
            return not any("/" in k for k in z.files)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):
        return False  # not an array archive: the checkpoint reader says what it is


def diagnose(target: str | os.PathLike, img_size=None, image: str | os.PathLike | None = None,
             data: str | None = None) -> list[Finding]:
    """Every check that applies to ``target``.

    ``target``: a run folder of ``vitkit train`` (``config.yaml``, ``metrics.csv``,
    ``train.log``; its ``last.safetensors`` is checked too), of timm's ``train.py``
    (``args.yaml``, ``summary.csv``) or of a Hugging Face Trainer (``trainer_state.json``; its
    saved model too), a checkpoint, or a maps file (``.npy``/``.npz``).
    ``img_size``: the input size the checkpoint is meant for (checks the position table).
    ``image`` or ``data`` (a data spec: a few of its validation images): compute the maps and
    token norms of the model and check them too.
    """
    path = Path(target)
    if not path.exists():
        raise DataError(f"no such run folder, checkpoint or maps file: {path}")
    findings: list[Finding] = []
    checkpoint = None
    kind = foreign.kind(path) if path.is_dir() else None
    if kind is not None:
        findings += diagnose_run(path)
        if kind == "vitkit" and (path / "last.safetensors").exists():
            checkpoint = path / "last.safetensors"
        elif kind == "hf" and (path / "model.safetensors").exists():
            checkpoint = path  # save_model's folder: config.json and model.safetensors
    elif path.is_file() and _is_maps_file(path):
        return _apply("maps", maps_checks.read_maps(path), {})
    else:
        checkpoint = path
    if checkpoint is not None:
        findings += _diagnose_checkpoint(checkpoint, img_size, image, data)
    return findings


def diagnose_run(folder: str | os.PathLike) -> list[Finding]:
    """The run checks on a run folder."""
    return _apply("run", run_checks.read_run(folder), {})


def start_of_run(config: dict, plan: RunPlan) -> list[Finding]:
    """The checks ``vitkit train`` runs before its first step (small data and the recipe), on
    its configuration and the numbers it resolved from it (:func:`vitkit.recipe.plan_run`)."""
    run = run_checks.Run(None, config, plan=plan.to_dict())
    return _apply("run", run, {}, only=("run.small_data", "run.recipe"))


def _diagnose_checkpoint(path: Path, img_size, image, data) -> list[Finding]:
    try:  # not strict: what is missing or extra becomes a finding, not a refusal
        model = load_model(path, strict=False, verbose=False)
    except MissingBlocks as err:
        return [Finding(
            "weights.partially_loaded", "error",
            f"transformer block(s) {', '.join(map(str, err.missing[:12]))} are missing from "
            f"the file ({err.found} present)", {"missing_blocks": err.missing[:12],
                                                 "blocks_present": err.found},
            "A model built from what is there would be a different, shallower one; every "
            "loader in vitkit refuses it.", "restore the file from its source")]
    if is_cnn(model):
        return [Finding("weights.trained", "ok",
                        f"a CNN ({model.cfg.arch}): the doctor's checks are for ViTs")]
    ctx = {"img_size": img_size, "source": str(path)}
    findings = _apply("model", model, ctx)
    x = _images(model, image, data)
    if x is not None:
        findings += _diagnose_images(model, x)
    return findings


def _images(model, image, data) -> torch.Tensor | None:
    size, mean, std = preprocessing(model)
    if image is not None:
        return load_image(image, size, mean, std)[0][None]
    if data is not None:
        split = load_split(data, "val", size[0])
        prep = Preprocess(size, mean, std)
        return torch.stack([prep(split[i][0]) for i in range(min(8, len(split)))])
    return None


def _diagnose_images(model, x: torch.Tensor) -> list[Finding]:
    with torch.no_grad():
        _, maps = model(x, return_attn=True)
        norms = token_norms(model, x)
    ctx = {"layout": {"grid": tuple(maps.grid), "patch_size": model.cfg.patch_size,
                      "num_prefix_tokens": maps.num_prefix_tokens}}
    m = maps_checks.Maps(torch.stack(list(maps)), "layers x heads", True)
    return (_apply("maps", m, ctx, only=("maps.uniform", "maps.sinks"))
            + _apply("computed", list(maps), ctx) + _apply("norms", norms, ctx))
