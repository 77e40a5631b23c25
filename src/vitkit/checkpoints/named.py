"""A checkpoint read as a registered architecture (``load_model(path, model=NAME)``), and the
config overrides ``load_model`` takes.

The weights fix a ViT's shapes (width, depth, patch, tokens, position table, MLP, biases,
LayerScale, pooling head); a bare state dict does not say the rest (the rotary variant, the
heads, the activation, the LayerNorm eps, [CLS] or average pooling). A name gives the rest and
is checked against every field the weights fix, and against every key and shape of the model it
builds: a name that does not fit is refused with each mismatch and the registered names whose
shapes do fit, and never loads with a different output. A file with a config of its own (a hub
folder, vitkit's format) is checked against the name the same way, its stated options included.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import MISSING, fields
from functools import lru_cache

import torch

from vitkit.errors import CheckpointError, ModelError
from vitkit.models.registry import MODEL_ARGS, build_config
from vitkit.models.vit import VisionTransformer, ViTConfig

__all__ = ["OPTIONS", "check_options", "fit", "named_config", "override"]

# The ViTConfig fields load_model takes as overrides (num_classes and img_size adapt the loaded
# model: a new head, an interpolated table; the others are set, or refused when the weights'
# shapes say otherwise)
OPTIONS = tuple(f.name for f in fields(ViTConfig) if f.name != "extra")
ADAPTED = ("num_classes", "img_size")
# Fields that change the output at the checkpoint's own size but none of its shapes: a bare file
# takes them from the name; a file that states them must agree with it (unless asked for)
STATED = ("num_heads", "act", "norm_eps", "pool", "rope", "rope_temperature", "rope_offset",
          "rope_xy", "rope_half", "rope_ref_grid", "pool_heads")
_DEFAULTS = {f.name: f.default for f in fields(ViTConfig) if f.default is not MISSING}


def check_options(options: dict) -> None:
    """Refuse a keyword that is no ViTConfig field, naming the close ones."""
    for name in options:
        if name not in OPTIONS:
            close = difflib.get_close_matches(name, OPTIONS, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ModelError(f"load_model got an unknown option {name!r}{hint}; it takes "
                             f"create_model's: {', '.join(OPTIONS)}")


def named_config(name: str, options: dict) -> ViTConfig:
    """The config ``name`` stands for with ``options`` (but the adapted ones) applied."""
    return build_config(name, **{k: v for k, v in options.items() if k not in ADAPTED})


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


@lru_cache(maxsize=256)
def _shapes_of(config_json: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    with torch.device("meta"):
        model = VisionTransformer(ViTConfig(**json.loads(config_json)))
    return tuple((k, tuple(v.shape)) for k, v in model.state_dict().items())


def shapes(kwargs: dict) -> dict[str, tuple[int, ...]]:
    """The state-dict keys and shapes of the ViT ``kwargs`` builds (on the meta device)."""
    plain = {k: _plain(v) for k, v in kwargs.items() if k != "extra"}
    return dict(_shapes_of(json.dumps(plain, sort_keys=True)))


def _fixes_shapes(kwargs: dict, field: str, value) -> bool:
    """Whether setting ``field`` to ``value`` changes the weights (or cannot be built at all)."""
    try:
        return shapes({**kwargs, field: value}) != shapes(kwargs)
    except ModelError:
        return True


def _grid(kwargs: dict) -> str:
    h, w = kwargs["img_size"]
    p = kwargs["patch_size"]
    return f"{h}x{w} (a {h // p}x{w // p} position table)"


def _mismatch(name: str, pairs: list[tuple[str, object, object]], asked: set[str],
              where: str) -> str:
    """'NAME has a=1, b=2 where the weights have a=3, b=4' (an asked value marked so)."""
    ours = ", ".join(f"{f}={v!r}" + (" (asked)" if f in asked else "") for f, v, _ in pairs)
    return f"{name} has {ours} where {where} " + ", ".join(f"{f}={v!r}" for f, _, v in pairs)


def _grid_mismatch(name: str, target: dict, found: dict) -> str:
    side = found["img_size"][0] if found["img_size"][0] == found["img_size"][1] \
        else tuple(found["img_size"])
    return (f"{name} is built at {_grid(target)}, the weights at {_grid(found)}: pass "
            f"img_size={side!r} to load them at their size, or another img_size to "
            "interpolate their table")


def _signature(kwargs: dict, depth: bool) -> tuple:
    keys = ("patch_size", "in_chans", "embed_dim", "mlp_dim", "class_token", "distilled",
            "num_reg_tokens", "qkv_bias", "key_bias", "pre_norm", "patch_bias", "abs_pos",
            "mlp", "mlp_norm", "fc_norm") + (("depth",) if depth else ())
    return tuple(kwargs[k] for k in keys) + (
        kwargs["init_values"] is None, kwargs["pool"] == "map", kwargs["rope"] == "mixed")


def fitting_names(found: dict) -> list[str]:
    """Registered names whose shapes fit the weights (of any depth when none has theirs)."""
    for depth in (True, False):
        names = [n for n, args in MODEL_ARGS.items()
                 if _signature({**_DEFAULTS, **args}, depth) == _signature(found, depth)]
        if names:
            return names[:4]
    return []


def _key_mismatch(name: str, ours: dict, state: dict, strict: bool) -> list[str]:
    lacking = [k for k in ours if k not in state and strict]
    unknown = [k for k in state if k not in ours and strict]
    shaped = [f"{k} {tuple(state[k].shape)} (its {ours[k]})" for k in ours
              if k in state and tuple(state[k].shape) != ours[k]]
    out = [f"the weights lack {', '.join(lacking[:6])}" + (" ..." if len(lacking) > 6 else "")
           ] if lacking else []
    if unknown:
        out.append(f"the weights have {', '.join(unknown[:6])}"
                   + (" ..." if len(unknown) > 6 else "") + f", which {name} has not")
    if shaped:
        out.append("mis-shaped: " + ", ".join(shaped[:6]))
    return out


def fit(name: str, named: ViTConfig, found: dict, state: dict, *, bare: bool,
        asked: set[str], resize: bool, strict: bool = True) -> dict:
    """The config to build for weights read as ``name``, or a :class:`CheckpointError` naming
    every mismatch.

    ``named`` is the name's config with the asked options (``asked``) applied; ``found`` the
    config keywords the format's reader gave; ``state`` the weights in vitkit's keys; ``bare``
    whether the file has no config of its own (the name then gives what the weights do not
    say); ``resize`` whether an img_size was asked (the weights' table is then interpolated,
    not compared); ``strict=False`` lets keys be missing or unexpected, as ``load_state``.
    """
    found = {**_DEFAULTS, **{k: v for k, v in found.items() if k != "extra"}}
    found["img_size"] = tuple(found["img_size"]) if not isinstance(found["img_size"], int) \
        else (found["img_size"],) * 2
    target = {k: v for k, v in named.to_dict().items() if k != "extra"}
    # the head is the weights' own (num_classes= replaces it after loading)
    target.update(num_classes=found["num_classes"], head_bias=found["head_bias"])
    if resize or not found["abs_pos"]:  # interpolated after loading, or no table to fit
        target["img_size"] = found["img_size"]
    shaped, stated, problems = [], [], []
    for field in OPTIONS:
        ours, theirs = _plain(target[field]), _plain(found[field])
        if ours == theirs:
            continue
        if field == "img_size" and _fixes_shapes(target, field, found[field]):
            problems.append(_grid_mismatch(name, target, found))
        elif _fixes_shapes(target, field, found[field]):
            shaped.append((field, ours, theirs))
        elif field in STATED and not bare and field not in asked:
            stated.append((field, ours, theirs))
    problems[:0] = [_mismatch(name, pairs, asked, where) for pairs, where in (
        (shaped, "the weights have"), (stated, "the checkpoint's config says")) if pairs]
    final = target if bare else {**found, **{k: target[k] for k in asked if k in target}}
    if not problems:
        problems = _key_mismatch(name, shapes(final), state, strict)
    if problems:
        fitting = fitting_names(found)
        names = [n for n in fitting if n != name]
        hint = f"; did you mean {' or '.join(names)}?" if names else "" if fitting else \
            "; no registered name has these shapes (`vitkit list` names them all)"
        raise CheckpointError("the weights do not fit: " + "; ".join(problems) + hint)
    return final


def override(found: dict, options: dict) -> dict:
    """``found`` (a reader's config keywords) with ``options`` set; an option that would change
    the weights' shapes is a :class:`CheckpointError` naming it and what the weights have."""
    out = dict(found)
    base = {**_DEFAULTS, **{k: v for k, v in found.items() if k != "extra"}}
    for field, value in options.items():
        if _plain(base.get(field)) == _plain(value):
            continue
        if shapes({**base, field: value}) != shapes(base):  # an impossible value: ModelError
            raise CheckpointError(
                f"{field}={value!r} contradicts the weights, which have {field}="
                f"{_plain(base[field])!r}: a different architecture. Leave it out (the weights "
                "say it), or load a checkpoint of that architecture")
        out[field] = value
    return out
