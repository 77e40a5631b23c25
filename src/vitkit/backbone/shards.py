"""A features folder: a data split embedded once, in safetensors shards, resumable, under
torchrun.

``run(checkpoint, data, out)`` reads the split as the audit does (a data spec or a folder of
images, ``--limit``: :func:`vitkit.audit.store.audit_data`), embeds it in shards of
``shard_size`` images (``out/features-NNNNN.safetensors``, each written atomically: the
arrays of :func:`vitkit.backbone.features.embed`, plus ``index`` and ``label``) and writes
``out/manifest.json``: the model (name, source, config, the SHA-256 of its weights), the
preprocessing, what was stored with its shapes and dtype, the image paths, labels and class
names, and the count. A run that was interrupted starts again at the first missing shard; a
folder made with another model, preprocessing, data or other ``what``/``layers`` is refused,
and so is a folder another live process is writing (a lock file holding its PID). Under
torchrun the ranks split the shards as the audit's scan does (rank 0 plans, each rank embeds
its shard of the round, rank 0 writes), and batches never cross a shard's edge, so the
arrays equal a single process's. :func:`read_features` reads a folder back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from vitkit.audit.store import (
    _broadcast,
    _first,
    _gather,
    audit_data,
    resume_progress,
    shard_indices,
)
from vitkit.backbone.features import (
    check_backbone,
    embed_rows,
    layer_key,
    parse_layers,
    parse_what,
    resize,
    transform,
)
from vitkit.checkpoints import load_model
from vitkit.data.images import preprocessing
from vitkit.errors import ConfigError, DataError, LockHeld
from vitkit.train.distributed import setup
from vitkit.train.runfolder import lock
from vitkit.util.files import atomic_write, remove_stale_temporaries
from vitkit.util.numbers import check_counts

log = logging.getLogger("vitkit")

MANIFEST = "manifest.json"
LOCK = ".vitkit-features.lock"
SHARD_SIZE = 1024
FORMAT = "vitkit-features/1"
SAME = ("model", "preprocessing", "what", "layers", "data")  # what a resume must share


def shard_path(out: Path, s: int) -> Path:
    return Path(out) / f"features-{s:05d}.safetensors"


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of a model's state dict: every tensor's name, dtype, shape and bytes, in name
    order (the same weights give the same hash whatever file they came from)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def image_path(split, data: str, split_name: str, i: int) -> str:
    """The image's file, or ``SPEC[split]#index`` for a built-in data set."""
    img = split.images[i] if isinstance(split.images, (list, tuple)) else None
    return str(img) if isinstance(img, (str, Path)) else f"{data}[{split_name}]#{i}"


def describe(model, source: str, size: tuple[int, int], what, layers, *,
             weights: str | None = None) -> dict:
    """The manifest's model, preprocessing, what and layers: what the arrays depend on
    (``weights``: the weights' hash, :func:`weights_sha256` of the model by default)."""
    cfg = model.cfg
    _, mean, std = preprocessing(model)
    return {
        "model": {"name": cfg.extra.get("name"), "source": str(source),
                  "config": json.loads(json.dumps(cfg.to_dict(), default=list)),
                  "weights_sha256": weights or weights_sha256(model)},
        "preprocessing": {"img_size": list(size), "mean": list(mean), "std": list(std),
                          "resize": "bicubic to cover the size, aspect kept, centre crop"},
        "what": list(what), "layers": list(layers),
    }


def _differences(old: dict, new: dict) -> list[str]:
    said = []
    if old.get("model", {}).get("weights_sha256") != new["model"]["weights_sha256"]:
        was = old.get("model", {})
        said.append(f"another model (weights sha256 {str(was.get('weights_sha256'))[:12]} from "
                    f"{was.get('source')} -> {new['model']['weights_sha256'][:12]} from "
                    f"{new['model']['source']})")
    for key in ("preprocessing", "data"):
        for k, v in new[key].items():
            if old.get(key, {}).get(k) != v:
                said.append(f"other {key} ({k} {old.get(key, {}).get(k)!r} -> {v!r})")
    for key in ("what", "layers"):
        if old.get(key) != new[key]:
            said.append(f"other --{key} ({old.get(key)!r} -> {new[key]!r})")
    return said


def _plan(out: Path, manifest: dict, shards: int):
    """On rank 0: (the lock, the shards still to embed), or (None, the reason to refuse)."""
    for place in (out, *out.parents):
        if place.exists() and not place.is_dir():
            return None, {"error": f"{place} is a file; --out needs a folder there"}
    out.mkdir(parents=True, exist_ok=True)
    try:
        held = lock(out, name=LOCK, who="vitkit features",
                    instead="give this run another --out")
    except LockHeld as err:
        return None, {"error": str(err), "lock": True}
    path = out / MANIFEST
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            held.release()
            return None, {"error": f"{path} cannot be read ({err}); delete {out} or choose "
                                   "another --out"}
        changed = _differences(old, manifest)
        if changed:
            held.release()
            return None, {"error": f"{out} holds features made with " + "; ".join(changed)
                          + f". Resume it with the same options, choose another --out, or "
                          f"delete {out} to start again"}
    elif any(out.glob("features-*.safetensors")):
        held.release()
        return None, {"error": f"{out} holds feature shards but no {MANIFEST}; delete them "
                               "or choose another --out"}
    for s in range(shards):
        remove_stale_temporaries(out, shard_path(out, s).name)
    write_manifest(out, {**manifest, "complete": False})
    return held, {"todo": [s for s in range(shards) if not shard_path(out, s).exists()]}


def write_manifest(out: Path, manifest: dict) -> None:
    atomic_write(Path(out) / MANIFEST,
                 lambda tmp: tmp.write_text(json.dumps(manifest, indent=1) + "\n"))


def write_shard(out: Path, s: int, arrays: dict[str, np.ndarray], errors: dict[int, str]
                ) -> None:
    """One shard, atomically; every array made contiguous (safetensors' numpy writer would
    write a strided view's buffer as if it were contiguous)."""
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    meta = {"format": FORMAT, "errors": json.dumps({str(i): e for i, e in errors.items()})}
    atomic_write(shard_path(out, s), lambda tmp: save_file(arrays, str(tmp), metadata=meta))


def _empty() -> dict[str, np.ndarray]:
    return {"index": np.zeros(0, np.int64), "label": np.zeros(0, np.int64)}


def run(checkpoint: str | os.PathLike, data: str, out: str | os.PathLike, *,
        split: str = "val", model_name: str | None = None, img_size=None,
        what: Sequence[str] | str = ("pooled",), layers: Sequence[int] | str | None = None,
        batch_size: int = 64, shard_size: int = SHARD_SIZE, limit: int | None = None,
        data_root: str = "data", device: str = "auto",
        say: Callable[[str], None] = log.info) -> dict | None:
    """Embed ``data``'s ``split`` with ``checkpoint`` into ``out`` (see the module). Returns the
    manifest on rank 0 (None on the other ranks). Raises ConfigError, DataError or LockHeld
    on bad input."""
    check_counts((("batch_size", batch_size), ("shard_size", shard_size),
                  ("limit", 1 if limit is None else limit)))
    what = parse_what(what)
    ctx = setup(device)
    # a bare state dict named by --model may hold a table for --img-size's grid, not the
    # name's own: the name is then checked at that size
    extra = {"model": model_name, "img_size": img_size} if model_name else {}
    model = load_model(checkpoint, verbose=ctx.main, **extra)
    check_backbone(model, what, ())
    layers = parse_layers(layers, len(model.blocks))
    check_backbone(model, what, layers)
    weights = weights_sha256(model)  # the checkpoint's weights, before any resize
    size = resize(model, img_size)
    manifest = describe(model, str(checkpoint), size, what, layers, weights=weights)
    manifest["model"]["model_option"] = model_name  # --model, to load the source again
    model.to(ctx.device).eval()
    rows = audit_data(data, split, size[0], data_root)
    if limit is not None and limit < len(rows):
        rows = _first(rows, limit)
    n = len(rows)
    manifest = {"format": FORMAT, **manifest,
                "data": {"spec": data, "split": split, "data_root": data_root, "images": n,
                         "shard_size": shard_size}}
    out = Path(out)
    shards = math.ceil(n / shard_size)
    held, plan = _plan(out, manifest, shards) if ctx.main else (None, None)
    plan = _broadcast(plan, ctx)
    if "error" in plan:
        raise (LockHeld if plan.get("lock") else ConfigError)(plan["error"])
    try:
        _embed(model, rows, out, plan["todo"], n=n, shard_size=shard_size, ctx=ctx,
               what=what, layers=layers, batch_size=batch_size, say=say,
               preprocess=transform(model, size))
        if not ctx.main:
            return None
        return finish(out, manifest, rows, shards)
    finally:
        if held is not None:
            held.release()


def _embed(model, rows, out: Path, todo: list[int], *, n: int, shard_size: int, ctx, what,
           layers, batch_size: int, say, preprocess) -> None:
    done, progress = resume_progress(n, todo, shard_size, ctx=ctx, say=say, out=out,
                                     label="features", verb="embedded")
    for r in range(math.ceil(len(todo) / ctx.world)):
        k = r * ctx.world + ctx.rank
        payload = None
        if k < len(todo):
            s = todo[k]
            indices = shard_indices(s, n, shard_size)
            arrays, errors = embed_rows(model, rows, indices, what=what, layers=layers,
                                        preprocess=preprocess, batch_size=batch_size,
                                        device=ctx.device)
            payload = (s, arrays or _empty(), errors, len(indices))
        for item in _gather(payload, ctx):
            if item is not None:
                write_shard(out, *item[:3])
                done += item[3]
        if ctx.main:
            progress(done)


def finish(out: Path, manifest: dict, rows, shards: int) -> dict:
    """Rank 0, every shard written: the whole manifest (paths, labels, shapes, count)."""
    index, skipped, shapes = [], [], {}
    for s in range(shards):
        with safe_open(str(shard_path(out, s)), framework="numpy") as f:
            meta = f.metadata() or {}
            index += f.get_tensor("index").tolist()
            skipped += [{"index": int(i), "error": e}
                        for i, e in json.loads(meta.get("errors", "{}")).items()]
            for key in f.keys():
                if key not in ("index", "label"):
                    shapes[key] = list(f.get_slice(key).get_shape())[1:]
    if not index:
        raise DataError(f"none of the {manifest['data']['images']} images of "
                        f"{manifest['data']['spec']} could be read; the first error: "
                        f"{skipped[0]['error'] if skipped else '?'}")
    for row in skipped:
        row["path"] = image_path(rows, manifest["data"]["spec"], manifest["data"]["split"],
                                 row["index"])
    keys = ["pooled", "cls", "prefix", "patch"] + [layer_key(i) for i in manifest["layers"]]
    manifest = {**manifest, "complete": True, "count": len(index), "shards": shards,
                "stored": {k: {"shape": [len(index), *shapes[k]], "dtype": "float32"}
                           for k in keys if k in shapes},
                "classes": list(rows.classes),
                "paths": [image_path(rows, manifest["data"]["spec"], manifest["data"]["split"],
                                     i) for i in index],
                "labels": [int(rows.labels[i]) for i in index],
                "skipped": skipped}
    write_manifest(out, manifest)
    return manifest


def read_manifest(folder: str | os.PathLike) -> dict:
    """A features folder's manifest; a DataError when it is missing, unreadable, unfinished or
    a shard is missing (saying how to finish it)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise DataError(f"{folder} holds no {MANIFEST}: expected a folder written by "
                        "`vitkit features`")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path} cannot be read ({err}); run `vitkit features` into another "
                        "--out") from err
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path} is not a vitkit features manifest (format "
                        f"{manifest.get('format')!r}, expected {FORMAT!r})")
    again = (f"run `vitkit features {manifest['model']['source']} --data "
             f"{manifest['data']['spec']} --split {manifest['data']['split']} --out {folder}` "
             "with the same options again to finish it")
    if not manifest.get("complete"):
        raise DataError(f"{folder} is unfinished (an interrupted `vitkit features`); {again}")
    missing = [shard_path(folder, s).name for s in range(manifest["shards"])
               if not shard_path(folder, s).is_file()]
    if missing:
        raise DataError(f"{folder} misses {len(missing)} of its {manifest['shards']} shards "
                        f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                        f"{again}")
    return manifest


def read_features(folder: str | os.PathLike, keys: Sequence[str] | None = None
                  ) -> tuple[dict[str, np.ndarray], dict]:
    """A features folder -> ({"pooled": (n, D), ..., "index": (n,), "label": (n,)}, the
    manifest): the arrays of every shard in order (only ``keys`` and the bookkeeping, when
    given)."""
    manifest = read_manifest(folder)
    wanted = set(manifest["stored"]) if keys is None else set(keys)
    unknown = sorted(wanted - set(manifest["stored"]))
    if unknown:
        raise DataError(f"{folder} holds {', '.join(manifest['stored'])}, not "
                        f"{', '.join(unknown)}; embed it again with --what / --layers")
    parts: dict[str, list[np.ndarray]] = {}
    for s in range(manifest["shards"]):
        arrays = load_file(str(shard_path(folder, s)))
        if not len(arrays["index"]):
            continue
        for k in (*sorted(wanted), "index", "label"):
            parts.setdefault(k, []).append(arrays[k])
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    if len(arrays["index"]) != manifest["count"]:
        raise DataError(f"{folder}'s shards hold {len(arrays['index'])} rows but its manifest "
                        f"says {manifest['count']}; delete it and run `vitkit features` again")
    return arrays, manifest
