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

import importlib
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitkit.diagnose import audits, foreign
from vitkit.diagnose import runs as run_checks
from vitkit.diagnose import weights as weight_checks
from vitkit.diagnose.findings import Finding, to_json, to_text, worst
from vitkit.errors import DataError
from vitkit.recipe import RunPlan

__all__ = ["RULES", "Finding", "Rule", "diagnose", "diagnose_run", "start_of_run", "to_json",
           "to_text", "worst"]


@dataclass(frozen=True)
class Rule:
    """One check: what it looks at ("model" weights, "run", "maps", "computed" maps of an
    image, token "norms", an "audit" folder) and where its function ``(subject, context) ->
    Finding | list[Finding] | None`` lives ("module:function"), imported when first run: the
    map checks need torch, which a run folder or a vitkit checkpoint never has to import."""

    name: str
    looks_at: str
    where: str

    @property
    def check(self) -> Callable:
        module, function = self.where.split(":")
        return getattr(importlib.import_module(f"vitkit.diagnose.{module}"), function)


RULES: tuple[Rule, ...] = (
    Rule("weights.trained", "model", "weights:check_trained"),
    Rule("weights.position_table", "model", "weights:check_position_table"),
    Rule("weights.input_size", "model", "weights:check_table_fits"),
    Rule("weights.load", "model", "weights:check_load_record"),
    Rule("run.small_data", "run", "runs:check_small_data"),
    Rule("run.recipe", "run", "runs:check_recipe"),
    Rule("run.learning", "run", "runs:check_learning"),
    Rule("run.overfitting", "run", "runs:check_overfitting"),
    Rule("run.stability", "run", "runs:check_stability"),
    Rule("maps.heads", "maps", "maps:check_heads"),
    Rule("maps.layers", "maps", "maps:check_layers"),
    Rule("maps.uniform", "maps", "maps:check_uniform"),
    Rule("maps.sinks", "maps", "maps:check_sinks"),
    Rule("maps.distance", "computed", "maps:check_distance"),
    Rule("maps.artifacts", "norms", "maps:check_artifacts"),
    Rule("audit.shortcuts", "audit", "audits:check_shortcuts"),
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
             data: str | None = None, model_name: str | None = None) -> list[Finding]:
    """Every check that applies to ``target``.

    ``target``: an audit folder of ``vitkit audit`` (its confirmed flags), a run folder of
    ``vitkit train`` (``config.yaml``, ``metrics.csv``, ``run.json``, ``result.json``; its
    ``last.safetensors`` is checked too), of timm's ``train.py``
    (``args.yaml``, ``summary.csv``) or of a Hugging Face Trainer (``trainer_state.json``; its
    saved model too), a checkpoint, or a maps file (``.npy``/``.npz``).
    ``img_size``: the input size the checkpoint is meant for (checks the position table).
    ``image`` or ``data`` (a data spec: a few of its validation images): compute the maps and
    token norms of the model and check them too. ``model_name``: the registered architecture
    of a bare state dict (``load_model(path, model=...)``).
    """
    path = Path(target)
    if not path.exists():
        raise DataError(f"no such run folder, checkpoint or maps file: {path}")
    if audits.is_audit(path):
        return _apply("audit", audits.read_audit(path), {})
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
        from vitkit.diagnose import maps as maps_checks  # torch, for maps files only

        return _apply("maps", maps_checks.read_maps(path), {})
    else:
        checkpoint = path
    if checkpoint is not None:
        findings += _diagnose_checkpoint(checkpoint, img_size, image, data, model_name)
    return findings


def diagnose_run(folder: str | os.PathLike) -> list[Finding]:
    """The run checks on a run folder."""
    return _apply("run", run_checks.read_run(folder), {})


def start_of_run(config: dict, plan: RunPlan) -> list[Finding]:
    """The checks ``vitkit train`` runs before its first step (small data and the recipe), on
    its configuration and the numbers it resolved from it (:func:`vitkit.recipe.plan_run`)."""
    run = run_checks.Run(None, config, plan=plan.to_dict())
    return _apply("run", run, {}, only=("run.small_data", "run.recipe"))


def _diagnose_checkpoint(path: Path, img_size, image, data,
                         model_name: str | None = None) -> list[Finding]:
    """The weight checks, on the file read without torch where it is a whole vitkit
    ``.safetensors`` and no image is asked for; else on the model the loader builds."""
    ctx = {"img_size": img_size, "source": str(path)}
    weights = None if image is not None or data is not None or model_name is not None \
        else weight_checks.Weights.read(path)
    if weights is not None:
        return _apply("model", weights, ctx)
    from vitkit.diagnose import loaded  # torch: 3 s to import, only for what needs it

    model, refusal = loaded.load(path, model_name)
    if model is None:
        return refusal
    findings = _apply("model", loaded.weights_of(model), ctx)
    x = loaded.images(model, image, data)
    if x is not None:
        findings += loaded.computed(model, x, _apply)
    return findings
