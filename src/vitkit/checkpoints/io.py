"""Read any supported checkpoint safely, build the model it describes, and write checkpoints.

The layouts are those of :data:`~vitkit.checkpoints.formats.FORMATS` (``formats.supported()``
lists them); the ones vitkit writes are :data:`~vitkit.checkpoints.formats.EXPORTS`. Only safe
readers are used: safetensors, ``numpy.load(allow_pickle=False)`` and
``torch.load(weights_only=True)``; nothing in a checkpoint is ever executed. Every write goes
to a temporary file in the destination folder and is renamed into place, so a crash never
leaves a half-written checkpoint. What the loader adapts (a new head, an interpolated position
table, keys left at their initial values) is logged on the ``vitkit`` logger.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import pickle
import zipfile
from dataclasses import fields
from pathlib import Path

import numpy as np
import safetensors
import torch

from vitkit.checkpoints import formats, hub
from vitkit.checkpoints.common import (
    Checkpoint,
    CheckpointError,
    StateDict,
    exact_variant,
    infer_num_heads,
    shallower_than_known,
    strip_prefix,
)
from vitkit.checkpoints.formats import EXPORTS, FORMATS
from vitkit.checkpoints.named import check_options, fit, named_config, override
from vitkit.models.cnn import CNN, CNNConfig, is_cnn
from vitkit.models.pos_embed import Pair, as_pair
from vitkit.models.registry import PRETRAINED_NORM
from vitkit.models.vit import VisionTransformer, ViTConfig
from vitkit.util.files import atomic_write

__all__ = ["EXPORTS", "FORMATS", "Checkpoint", "atomic_write", "convert", "detect_format",
           "export", "from_checkpoint", "load_model", "load_state", "read_checkpoint",
           "save_model"]
log = logging.getLogger("vitkit")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_model.safetensors")
_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz", ".ckpt")


def say(message: str, verbose: bool = True, level: int = logging.INFO) -> None:
    """Log what the loader did (``verbose=False`` keeps it quiet)."""
    if verbose:
        log.log(level, message)


# ----------------------------------------------------------------------------------- reading
def _read_safetensors(path: Path) -> tuple[StateDict, dict]:
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            return {k: f.get_tensor(k) for k in f.keys()}, metadata  # noqa: SIM118
    except Exception as err:  # the Rust reader raises its own types for every corruption
        raise CheckpointError(
            f"cannot read {path} as safetensors ({os.path.getsize(path):,} bytes): the file is "
            f"truncated or corrupt ({err}). Download or copy it again."
        ) from err


def _read_npz(path: Path) -> StateDict:
    if not zipfile.is_zipfile(path):  # numpy would try it as a pickle, and advise unsafe loading
        raise CheckpointError(f"cannot read {path} as .npz: it is not a complete .npz archive "
                              f"(no zip directory in its {path.stat().st_size:,} bytes): the "
                              "file is truncated or corrupt, or another kind of file. Download "
                              "or copy it again.")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {k: torch.from_numpy(np.ascontiguousarray(arrays[k])) for k in arrays.files}
    except ValueError as err:
        raise CheckpointError(f"refused {path}: it holds pickled Python objects (object "
                              "arrays), which vitkit never loads. Save plain arrays with "
                              "numpy.savez.") from err
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        raise CheckpointError(f"cannot read {path} as .npz: the file is truncated or corrupt "
                              f"({err}). Download or copy it again.") from err


def _read_torch(path: Path) -> StateDict:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if not _looks_like_pickle(path) and "global" not in str(err).lower():
            raise CheckpointError(
                f"{path} ({os.path.getsize(path):,} bytes) is not a valid checkpoint: it is "
                "neither a PyTorch file nor a pickle of tensors (truncated, corrupt, or another "
                "kind of file). Download or copy it again."
            ) from err
        raise CheckpointError(
            f"refused {path}: loading it would execute code stored in the file (a pickle that "
            f"needs more than tensors and plain containers). vitkit loads with "
            f"torch.load(weights_only=True) only. If you trust the file, re-save just its "
            f"tensors where it was made: safetensors.torch.save_file(state_dict, "
            f"'model.safetensors')."
        ) from err
    except (RuntimeError, EOFError, KeyError, zipfile.BadZipFile, ValueError) as err:
        raise CheckpointError(
            f"cannot read {path} ({os.path.getsize(path):,} bytes): the file is truncated or "
            f"corrupt, or not a PyTorch checkpoint ({err}). Download or copy it again."
        ) from err
    except Exception as err:  # the unpickler raises anything on arbitrary bytes
        # (IndexError, UnicodeDecodeError, ...): whatever it is, the file is not a checkpoint
        raise CheckpointError(
            f"{path} ({os.path.getsize(path):,} bytes) is not a valid checkpoint: reading it "
            f"failed with {type(err).__name__}: {err}. Download or copy it again."
        ) from err
    return _unwrap(obj, path)


def _looks_like_pickle(path: Path) -> bool:
    """A PyTorch zip archive, or a raw pickle (PROTO opcode 0x80 and a protocol 2-5)."""
    with open(path, "rb") as f:
        head = f.read(2)
    return head == b"PK" or (len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def _unwrap(obj, path: Path) -> StateDict:
    """Find the state dict inside a training checkpoint (``{"model": ...}`` and the like)."""
    for _ in range(3):
        if not isinstance(obj, dict):
            break
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return strip_prefix(obj, "module.")
        inner = next((obj[k] for k in ("state_dict", "model", "module", "model_state_dict")
                      if isinstance(obj.get(k), dict)), None)
        if inner is None:
            break
        obj = inner
    found = sorted(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
    raise CheckpointError(f"{path} holds no state dict of tensors (found {found}); expected a "
                          "dict of tensors, possibly under 'model' or 'state_dict'")


def _read_file(path: Path) -> tuple[StateDict, dict]:
    """Tensors and safetensors metadata (empty for other formats)."""
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    if path.suffix == ".npz":
        return _read_npz(path), {}
    return _read_torch(path), {}


def _read_json(path: Path, what: str = "JSON") -> dict:
    """A JSON file as a dict, or a :class:`CheckpointError` naming the file and the line."""
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path} is not a text file ({err})") from err
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid {what}: {err.msg} at line {err.lineno}, "
                              f"column {err.colno}") from err
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(loaded).__name__}")
    return loaded


def _weights_in(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():  # sharded Hugging Face checkpoint
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no weight_map naming the shards")
        shards = sorted(set(weight_map.values()))
        return [folder / s for s in shards]
    for name in _WEIGHT_FILES:
        if (folder / name).exists():
            return [folder / name]
    candidates = sorted(p for p in folder.iterdir() if p.suffix in _SUFFIXES)
    if len(candidates) == 1:
        return candidates
    raise CheckpointError(
        f"{folder} has {'no' if not candidates else len(candidates)} weight files; expected "
        f"one of {', '.join(_WEIGHT_FILES)}, or a single {'/'.join(_SUFFIXES)} file"
        + (f" (found {', '.join(p.name for p in candidates)})" if candidates else "")
    )


def read_checkpoint(source: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint file or folder (or a hub id, see :mod:`vitkit.checkpoints.hub`) into
    tensors plus its config, safely."""
    path = hub.resolve(str(source)) if hub.is_hub_id(source) else Path(source)
    if not path.exists():
        raise CheckpointError(f"no such file or folder: {path}")
    config = None
    if path.is_dir():
        files = _weights_in(path)
        for name in ("config.json", "open_clip_config.json"):
            if config is None and (path / name).exists():
                config = _read_json(path / name)
        if (path / "preprocessor_config.json").exists() and config is not None:
            config["preprocessor"] = _read_json(path / "preprocessor_config.json")
    else:
        files = [path]
    state: StateDict = {}
    metadata: dict = {}
    for f in files:
        part, meta = _read_file(f)
        state.update(part)
        metadata.update(meta)
    vitkit_config = None
    if "vitkit_config" in metadata:
        try:
            vitkit_config = json.loads(metadata["vitkit_config"])
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{path}: its vitkit_config metadata is not valid JSON "
                                  f"({err.msg}); the file was damaged or edited") from err
    return Checkpoint(state, config, path, vitkit_config)


def detect_format(ckpt: Checkpoint) -> str:
    """The ``NAME`` of the first format in :data:`FORMATS` that recognises the keys and
    files (``[f.NAME for f in FORMATS]`` are the possible answers)."""
    for fmt in FORMATS:
        if fmt.detect(ckpt):
            return fmt.NAME
    sample = ", ".join(sorted(ckpt.state)[:6])
    raise CheckpointError(
        f"{ckpt.path} is not a checkpoint vitkit knows (keys start: {sample}). Supported: "
        + formats.supported()
    )


# ----------------------------------------------------------------------------------- loading
def load_state(model: VisionTransformer, state: StateDict, strict: bool = True,
               verbose: bool = True) -> tuple[list[str], list[str]]:
    """Copy ``state`` into ``model``, refusing every missing, unexpected or mis-shaped key.

    Shapes must always agree. With ``strict=False`` missing keys keep their initial values and
    unexpected keys are ignored, each logged; nothing is ever loaded misaligned. Returns the
    (missing, unexpected) keys.
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    misshaped = [f"  {k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
                 for k in expected if k in state and state[k].shape != expected[k].shape]
    if misshaped or (strict and (missing or unexpected)):
        lines = ["the checkpoint does not fit the model it describes:"]
        if misshaped:
            lines += ["mis-shaped keys:"] + misshaped
        if missing and strict:
            lines += ["missing keys:"] + [f"  {k}" for k in missing]
        if unexpected and strict:
            lines += ["unexpected keys:"] + [f"  {k}" for k in unexpected]
        lines.append("A different resolution or class count is handled by img_size= and "
                     "num_classes=; anything else means a different architecture.")
        raise CheckpointError("\n".join(lines))
    if missing:
        say(f"strict=False: {len(missing)} missing keys keep their initial values: "
            f"{', '.join(missing)}", verbose, logging.WARNING)
    if unexpected:
        say(f"strict=False: {len(unexpected)} unexpected keys ignored: {', '.join(unexpected)}",
            verbose, logging.WARNING)
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    return missing, unexpected


def _is_bare(ckpt: Checkpoint) -> bool:
    """Whether the weights came without a config of their own (a bare state dict)."""
    return ckpt.config is None and ckpt.vitkit_config is None


def _to_vitkit(ckpt: Checkpoint, fmt: str, notes: list[str], keep_pre_logits: bool,
               num_classes: int | None, num_heads: int | None, named: ViTConfig | None = None):
    """The vitkit state dict and config keywords of a checkpoint in format ``fmt``; ``named``
    (the config of the name the user gave) says what a bare file does not."""
    module = formats.get(fmt)
    # the config that describes the weights: their own (in the metadata of files vitkit wrote)
    # before a config.json beside them
    config = ckpt.config if ckpt.vitkit_config is None else ckpt.vitkit_config
    # a reader that can take the name's config is given it for a bare file (timm's layout)
    told = {"named": named.to_dict()} if named is not None and _is_bare(ckpt) and \
        "named" in inspect.signature(module.to_vitkit).parameters else {}
    try:
        state, kwargs, extra = module.to_vitkit(dict(ckpt.state), config, notes, **told)
    except KeyError as err:  # a config that lacks what its layout always has
        raise CheckpointError(f"{ckpt.path} is a {module.LABEL} checkpoint whose config lacks "
                              f"{err}; restore its config.json as its library wrote it") from err
    known = {f.name for f in fields(CNNConfig if is_cnn(kwargs) else ViTConfig)} | {"extra"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise CheckpointError(f"{ckpt.path} describes options this vitkit does not know: "
                              f"{', '.join(unknown)} (written by a newer vitkit, or edited); "
                              "update vitkit, or remove them from the metadata")
    if named is not None and is_cnn(kwargs):
        raise CheckpointError(f"{ckpt.path} is a CNN ({kwargs.get('arch')}), not the ViT "
                              f"{named.extra['name']} named: drop the model name")
    if not is_cnn(kwargs):  # a ResNet has no heads to say or infer
        if num_heads is not None:
            kwargs["num_heads"] = num_heads
        elif named is not None and kwargs.get("num_heads") is None:
            kwargs["num_heads"] = named.num_heads  # the weights do not say; the name does
        elif kwargs.get("num_heads") is None:
            # timm and torchvision weights do not store the number of heads
            arch = (config or {}).get("architecture")
            if arch and not exact_variant(kwargs["embed_dim"], kwargs["depth"],
                                          kwargs["mlp_dim"]):
                # a named model of no standard size: its own heads, not a convention's
                raise CheckpointError(
                    f"{ckpt.path}: its config names {arch}, which is not in vitkit's model "
                    "table and has no standard size, and the number of attention heads is in "
                    "neither its weights nor its config (timm's giant models, for one, do not "
                    "follow the 64-wide convention). Pass it: vitkit.load_model(path, "
                    "num_heads=N), or model_args.num_heads in config.json")
            kwargs["num_heads"] = infer_num_heads(
                kwargs["embed_dim"], kwargs["depth"], kwargs["mlp_dim"], notes)
    if not keep_pre_logits and kwargs.get("representation_size"):
        if kwargs["num_classes"] and num_classes in (None, kwargs["num_classes"]):
            raise CheckpointError("the head sits on the pre-logits layer: dropping that layer "
                                  "needs a new head, so pass num_classes=N as well")
        state = {k: v for k, v in state.items()
                 if not k.startswith(("pre_logits.", "head."))}
        kwargs.update(representation_size=0, num_classes=0)
        notes.append("pre-logits layer dropped as asked")
    preprocessor = (config or {}).get("preprocessor") or {}
    for ours, theirs in (("mean", "image_mean"), ("std", "image_std")):
        if theirs in preprocessor:
            extra[ours] = list(preprocessor[theirs])
    if getattr(module, "RECORDS_SOURCE", True):
        extra = {**extra, "source_format": fmt}
    kwargs["extra"] = extra
    return state, kwargs


def load_model(
    source: str | os.PathLike,
    num_classes: int | None = None,
    img_size: Pair | None = None,
    strict: bool = True,
    *,
    model: str | None = None,
    keep_pre_logits: bool = True,
    num_heads: int | None = None,
    act: str | None = None,
    verbose: bool = True,
    **options,
) -> VisionTransformer | CNN:
    """Build the model a checkpoint file or folder describes (a ViT, or the ResNet of a CNN
    checkpoint) and load its weights.

    The format (any in :data:`FORMATS`) is detected from the keys and files, and the
    architecture inferred from them and their config. ``model="NAME"`` (any ``vitkit list``
    name) names the architecture instead: what a bare state dict does not say (the rotary
    embeddings, the heads, the activation, the eps) is taken from the name, and every field the
    weights fix (width, depth, patch, tokens, table, MLP, biases, LayerScale) and every key and
    shape is checked against it (:mod:`vitkit.checkpoints.named`); a name that does not fit is
    a :class:`CheckpointError` naming each mismatch and the names that fit. ``num_classes``
    different from the checkpoint's puts a fresh head on; ``img_size`` different from its
    resolution interpolates the position table; each is said in one line of the ``vitkit`` log
    (INFO; the command line shows it on stderr, with ``verbose=True``). Anything
    else that does not fit is a :class:`CheckpointError` listing every offending key.
    ``keep_pre_logits=False`` drops a pre-logits / pooler layer (JAX, torchvision, HF
    ``ViTModel``);
    ``num_heads`` overrides the head count where the weights cannot tell (timm, torchvision);
    ``act`` the MLP activation ("quick_gelu" for OpenAI's CLIP weights in a layout that does not
    say it). Every other :class:`~vitkit.models.vit.ViTConfig` field is an option too, as in
    ``create_model`` (``drop_path_rate=0.1``, ``dynamic_img_size=True``, ``depth=2``): it is set
    on the model, or refused by name when it contradicts the weights' shapes.
    The returned model's ``load_record`` (a dict) keeps what was adapted: the format, missing and
    unexpected keys, notes, the replaced head and the interpolated grids.
    """
    if num_classes is not None and num_classes < 0:
        raise CheckpointError(f"num_classes must be 0 (no head) or more, got {num_classes}")
    check_options(options)
    options.update({k: v for k, v in (("num_heads", num_heads), ("act", act)) if v is not None})
    if model is not None:
        named_config(model, options)  # an unknown name or a bad option before any reading
    return from_checkpoint(read_checkpoint(source), num_classes=num_classes, img_size=img_size,
                           strict=strict, model=model, keep_pre_logits=keep_pre_logits,
                           verbose=verbose, options=options, source=source)


def from_checkpoint(ckpt: Checkpoint, *, num_classes: int | None = None,
                    img_size: Pair | None = None, strict: bool = True, model: str | None = None,
                    keep_pre_logits: bool = True, verbose: bool = True,
                    options: dict | None = None, source=None) -> VisionTransformer | CNN:
    """:func:`load_model` on a checkpoint already read (:func:`read_checkpoint`); ``options``
    the config overrides, ``num_heads`` and ``act`` among them. Built under
    ``torch.device("meta")`` it checks a checkpoint's keys and shapes without any memory."""
    options = dict(options or {})
    num_heads = options.get("num_heads")
    name, wanted = model, None
    if name is not None:
        wanted = named_config(name, options)
        wanted.extra["name"] = name
    source = ckpt.path if source is None else source
    fmt = detect_format(ckpt)
    notes: list[str] = []
    state, kwargs = _to_vitkit(ckpt, fmt, notes, keep_pre_logits, num_classes, num_heads,
                               wanted)
    if wanted is not None:
        extra = kwargs.pop("extra")
        kwargs = fit(name, wanted, kwargs, state, bare=_is_bare(ckpt), asked=set(options),
                     resize=img_size is not None, strict=strict)
        # a bare file cannot say its preprocessing: the name's pre-trained weights' mean/std
        mean, std = PRETRAINED_NORM.get(name, ((0.5,) * 3, (0.5,) * 3))
        kwargs["extra"] = {"name": name, "mean": list(mean), "std": list(std), **extra} \
            if _is_bare(ckpt) else extra
    elif options:
        if is_cnn(kwargs):
            raise CheckpointError(f"{ckpt.path} is a CNN ({kwargs.get('arch')}): it takes none "
                                  f"of the ViT options {', '.join(options)}")
        kwargs = override(kwargs, options)
    cnn = is_cnn(kwargs)  # a ResNet baseline or teacher
    if cnn:
        model = CNN(CNNConfig(**kwargs))
    else:
        with VisionTransformer.weights_to_be_loaded():  # the state overwrites the weights
            model = VisionTransformer(ViTConfig(**kwargs))
        if not model.state_dict().keys() <= state.keys():  # strict=False: some keep the init
            model.init_weights()
    missing, unexpected = load_state(model, state, strict, verbose)
    suspect = None
    if not cnn and getattr(formats.get(fmt), "DEPTH_FROM_WEIGHTS", False) and not ckpt.config \
            and name is None:  # a name's depth was checked against the blocks
        suspect = shallower_than_known(model.cfg.embed_dim, model.cfg.depth, model.cfg.mlp_dim)
        if suspect:
            say(suspect, verbose, logging.WARNING)
    for note in notes:
        say(note, verbose)
    # what was adapted on the way in, for `vitkit doctor` and for anyone who asks
    model.load_record = {"source": str(source), "format": fmt, "model": name,
                         "missing": missing,
                         "unexpected": unexpected, "notes": list(notes),
                         "head_replaced": None, "interpolated": None,
                         "depth_suspect": suspect}
    if num_classes is not None and num_classes != model.num_classes:
        model.load_record["head_replaced"] = [model.num_classes, num_classes]
        say(f"head replaced: the checkpoint has {model.num_classes} classes, the new head has "
            f"{num_classes} (randomly initialised)", verbose, logging.WARNING)
        model.reset_classifier(num_classes)
        model.cfg.extra.pop("class_names", None)
    if img_size is not None and not cnn and as_pair(img_size) != model.cfg.img_size:
        old, old_img = model.grid_size, model.cfg.img_size
        model.set_img_size(img_size)
        new = model.grid_size
        size = f"({model.cfg.img_size[0]}x{model.cfg.img_size[1]})"
        if model.pos_embed is None:  # rotary embeddings only: computed for any grid
            say(f"no position table to interpolate: the rotary embeddings ({model.cfg.rope}) are "
                f"computed for the {new[0]}x{new[1]} grid {size}; only the size is recorded",
                verbose)
        else:
            model.load_record["interpolated"] = [list(old), list(new)]
            say(f"position table interpolated from a {old[0]}x{old[1]} grid "
                f"({old_img[0]}x{old_img[1]}) to {new[0]}x{new[1]} {size}, "
                f"{model.cfg.pos_interp}" + (" (the rotary embeddings need no interpolation)"
                                             if model.cfg.rope else ""), verbose)
    return model.eval()


# ----------------------------------------------------------------------------------- writing
def save_model(model, path: str | os.PathLike) -> Path:
    """Write vitkit's own format: one ``.safetensors`` whose metadata rebuilds the model.

    The metadata holds the whole :class:`~vitkit.models.vit.ViTConfig` (dims, patch, grid,
    pooling, eps, prefix tokens) and its ``extra`` (name, mean/std, class names), as JSON under
    ``vitkit_config``.
    """
    return export(model, path, to="vitkit")


def export(model, dst: str | os.PathLike, to: str = "vitkit") -> Path:
    """Write ``model`` in another codebase's layout (any name in :data:`EXPORTS`; what each
    writes, a file or a folder, is the ``write`` of its module in :data:`FORMATS`).

    A model the layout cannot hold is refused before anything is written: the error lists
    every reason and the formats that can hold it.
    """
    if to not in EXPORTS:
        raise CheckpointError(f"unknown export format {to!r}; choose one of {', '.join(EXPORTS)}")
    fmt = formats.get(to)
    problems = fmt.refusals(model.cfg)
    if problems:
        raise CheckpointError(f"cannot export to {to}: the model " + "; ".join(problems)
                              + ". Formats that can hold it: "
                              + ", ".join(formats.writable(model.cfg)) + ".")
    return fmt.write(model, Path(dst))


def convert(src: str | os.PathLike, dst: str | os.PathLike, to: str | None = None,
            img_size: Pair | None = None, num_classes: int | None = None,
            verbose: bool = True, model: str | None = None) -> Path:
    """Load ``src`` (any format; ``model``: the registered architecture of a bare state dict,
    as :func:`load_model` takes it), optionally resize / re-head it, and write ``dst``.

    ``to=None`` keeps the source's format where vitkit can write it (DeiT is written in timm's
    layout, which is DeiT's own); otherwise (a torchvision ResNet) vitkit's format.
    """
    model = load_model(src, num_classes=num_classes, img_size=img_size, verbose=verbose,
                       model=model)
    if img_size is not None and is_cnn(model):
        raise CheckpointError(f"{src} is a CNN ({model.cfg.arch}): it has no position table to "
                              "resize and runs at any input size as it is; nothing was written")
    if to is None:
        source = model.cfg.extra.get("source_format", "vitkit")
        source = "timm" if source == "deit" else source
        to = source if source in EXPORTS else "vitkit"
    out = export(model, dst, to)
    say(f"wrote {out} ({to})", verbose)
    return out
