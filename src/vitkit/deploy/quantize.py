"""int8 for the CPU that keeps its accuracy: onnxruntime's quantization of a vitkit ONNX file,
measured on the user's data, with the layers that cannot take it kept in float.

Naive int8 of a ViT can take ImageNet top-1 to 0% (TinyNeuralNetwork #204) until the residual
adds and a few sensitive layers stay in float. Here only the matrix products (``MatMul``,
``Gemm``, ``Conv``) are quantized: the residual adds, LayerNorm, the softmax and GELU stay in
float by construction. Then:

1. the scored split's images (at most ``eval_images``, a fixed random choice) are dealt into
   two halves: *selection* images, on which every choice is made, and *held-out* images,
   used for no choice, on which the reported top-1 is measured (an accuracy measured on the
   images that chose the layers would be optimistic);
2. the float and int8 models are scored (top-1) on the selection images; if int8 loses more
   than the budget there, every quantized product's sensitivity is measured (the change of
   the logits when it alone is int8, on calibration images), and the most sensitive are kept
   in float, 1, 2, 4, ... of them, until the loss is within the budget or ``max_float`` of
   them (default half) are in float (past that int8 gains little);
3. a model still over the budget on the selection images is refused (nothing written)
   unless ``force``; the float and int8 top-1 on the held-out images are what the report,
   the command and the file's metadata give as its accuracy.

A checkpoint in any layout vitkit reads is exported to ONNX first.

``mode="static"`` calibrates activation ranges on images from the data (QDQ format, uint8
activations, int8 per-channel weights); ``"dynamic"`` quantizes the weights and computes
activation ranges per batch at run time (no calibration). The outcome is a
:class:`Quantized` report; the file is written atomically.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from vitkit.checkpoints.io import load_model
from vitkit.data.datasets import load_split, loose_images
from vitkit.data.transforms import Transformed, eval_transform
from vitkit.deploy.onnx_export import export_onnx
from vitkit.deploy.runtime import OnnxModel, is_onnx
from vitkit.errors import ConfigError, OverBudget
from vitkit.util.files import atomic_write
from vitkit.util.numbers import check_number

log = logging.getLogger("vitkit")  # progress lines: the CLI shows them

QUANTISED = ("MatMul", "Gemm", "Conv")  # everything else stays in float
MODES = ("static", "dynamic")
MAX_FLOAT = 0.5  # keep at most this share of the products in float: past it int8 gains little


@dataclass
class Quantized:
    """What :func:`quantize` measured and did. ``images``, ``float_top1``, ``int8_top1`` and
    ``naive_top1`` are on the held-out images (used for no choice); ``selection_*`` on the
    images the layers kept in float and the budget check were chosen on."""

    mode: str
    images: int  # held-out images
    float_top1: float
    int8_top1: float
    naive_top1: float  # every product in int8
    budget: float  # the most top-1 (a share, 0.01 = 1 point) int8 may lose
    quantized: int  # products in int8
    kept_float: list[str] = field(default_factory=list)  # products kept in float, by name
    written: bool = False
    path: str = ""
    float_mb: float = 0.0
    int8_mb: float = 0.0
    selection_images: int = 0
    selection_float_top1: float = 0.0
    selection_int8_top1: float = 0.0

    @property
    def loss(self) -> float:
        return self.float_top1 - self.int8_top1

    def to_dict(self) -> dict:
        return {**asdict(self), "loss": self.loss}


def _choice(count: int, limit: int) -> list[int]:
    """At most ``limit`` of ``count`` indices (0: all), a fixed random choice, sorted."""
    if not limit or count <= limit:
        return list(range(count))
    order = torch.randperm(count, generator=torch.Generator().manual_seed(0))
    return sorted(order[:limit].tolist())


def _loader(images, size, mean, std, limit: int) -> DataLoader:
    """A loader over ``images`` (a Split) preprocessed as the model's metadata says, at most
    ``limit`` of them (:func:`_choice`)."""
    images = Transformed(images, eval_transform(size, mean, std))
    return DataLoader(Subset(images, _choice(len(images), limit)), batch_size=64)


def _halves(images, size, mean, std, limit: int) -> tuple[DataLoader, DataLoader]:
    """(selection, held-out) loaders: the images :func:`_choice` picks, dealt alternately into
    two halves so both see every class in proportion."""
    images = Transformed(images, eval_transform(size, mean, std))
    chosen = _choice(len(images), limit)
    return (DataLoader(Subset(images, chosen[0::2]), batch_size=64),
            DataLoader(Subset(images, chosen[1::2]), batch_size=64))


def _calibration_folder(calibration: str | None):
    """The images of a calibration folder (any depth, labels unused), read before any work;
    None for a data spec (or no ``calibration``)."""
    if calibration is not None and Path(calibration).expanduser().is_dir():
        return loose_images(calibration)
    if calibration is not None and ("/" in calibration or os.sep in calibration) \
            and ":" not in calibration:
        raise ConfigError(f"--calibration {calibration}: no such folder. Give a folder of "
                          "images or a data spec (e.g. imagefolder:PATH, digits)")
    return None


def _as_onnx(src: Path, tmp: Path, say, model_name: str | None = None) -> Path:
    """``src`` itself when it is an ONNX file, else the checkpoint (a bare state dict of the
    registered ``model_name``) exported to one in ``tmp``."""
    if is_onnx(src):
        if model_name is not None:
            raise ConfigError(f"--model {model_name} names the architecture of a state dict; "
                              f"{src} is an ONNX graph, which holds its own: drop --model")
        return src
    say(f"exporting {src} to onnx first")
    return export_onnx(load_model(src, model=model_name, verbose=False), tmp / "exported.onnx")


@torch.no_grad()
def top1(model: OnnxModel, loader: DataLoader) -> float:
    right = total = 0
    for x, y in loader:
        right += (model(x).argmax(-1) == y).sum().item()
        total += len(y)
    return right / total


class Calibration:
    """onnxruntime's CalibrationDataReader protocol over a loader of (images, labels) batches:
    {input: images} dicts."""

    def __init__(self, loader: DataLoader, name: str) -> None:
        self.batches = [x.numpy() for x, _ in loader]
        self.name, self.i = name, 0

    def get_next(self):
        if self.i >= len(self.batches):
            return None
        self.i += 1
        return {self.name: self.batches[self.i - 1]}

    def rewind(self) -> None:
        self.i = 0


def plain_graph(src: Path, dst: Path) -> Path:
    """``src`` without the exporter's recorded intermediate shapes (onnx's shape inference,
    which the quantizer runs, recomputes them and refuses where a traced one disagrees)."""
    import onnx

    proto = onnx.load(str(src))
    del proto.graph.value_info[:]
    onnx.save_model(proto, str(dst))
    return dst


def _products(path: Path) -> list:
    import onnx

    return [n for n in onnx.load(str(path), load_external_data=False).graph.node
            if n.op_type in QUANTISED]


def quantize_graph(src: Path, dst: Path, mode: str, calibration: Calibration | None,
                   exclude: list[str], cache: Path | None = None,
                   only: list[str] | None = None) -> None:
    """``src`` (from :func:`plain_graph`) in int8 at ``dst``: the products (all, or ``only``)
    but ``exclude``; static mode calibrates on ``calibration`` (the ranges kept in ``cache``
    for the next call)."""
    import onnxruntime.quantization as q  # the deploy extra

    with _quiet_advice():
        _run_quantizer(q, src, dst, mode, calibration, exclude, cache, only)


class _Advice(logging.Filter):
    """onnxruntime's quantizer advises, on the root logger at every call, its pre-processing
    (shape inference, which :func:`plain_graph` leaves to it): not the user's to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-process" not in record.getMessage()


@contextlib.contextmanager
def _quiet_advice():
    advice = _Advice()
    logging.getLogger().addFilter(advice)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(advice)


def _run_quantizer(q, src, dst, mode, calibration, exclude, cache, only) -> None:
    if mode == "dynamic":
        q.quantize_dynamic(src, dst, op_types_to_quantize=list(QUANTISED), per_channel=True,
                         weight_type=q.QuantType.QInt8, nodes_to_exclude=exclude,
                         nodes_to_quantize=only)
        return
    calibration.rewind()
    q.quantize_static(src, dst, calibration, quant_format=q.QuantFormat.QDQ,
                    op_types_to_quantize=list(QUANTISED), per_channel=True, reduce_range=True,
                    activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                    nodes_to_exclude=exclude, nodes_to_quantize=only,
                    calibrate_method=q.CalibrationMethod.MinMax, calibration_cache_path=cache,
                    # a product's output goes to a float op (add, softmax, LayerNorm) or is the
                    # logits: rounding it to 8 bits loses accuracy for nothing (and ties logits)
                    extra_options={"OpTypesToExcludeOutputQuantization": list(QUANTISED)})


def sensitivity(src: Path, products: list, quantize, batch: np.ndarray,
                tmp: Path) -> dict[str, float]:
    """Each product's sensitivity: the relative L2 change of the logits on ``batch`` when
    that product alone is int8 (``quantize(dst, only=[name])``; the calibrated ranges are
    cached, so each costs one graph rewrite and one forward)."""
    import onnxruntime as ort

    def logits(path: Path) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: batch})[0].astype(np.float64)

    ref = logits(src)
    out = {}
    for node in products:
        quantize(tmp, only=[node.name])
        out[node.name] = float(np.linalg.norm(logits(tmp) - ref) / max(np.linalg.norm(ref),
                                                                        1e-12))
    return out


def quantize(src: str | os.PathLike, dst: str | os.PathLike, data: str, *,
             split: str = "val", calibration: str | None = None,
             calibration_images: int = 256, eval_images: int = 2000, budget: float = 0.01,
             mode: str = "static", max_float: float = MAX_FLOAT, force: bool = False,
             root: str = "data", model_name: str | None = None, say=None) -> Quantized:
    """Quantize ``src`` (a vitkit ONNX file, or any checkpoint vitkit reads, exported first) to
    int8 at ``dst`` (see the module docstring). ``data``: a data spec (``imagefolder:PATH``
    for a folder of class folders); its ``split`` gives the accuracy. ``calibration``: a folder
    of images or a data spec whose training split calibrates (default: ``data``'s).
    ``max_float``: the most of the products (a share) the search may keep in float.
    ``model_name``: the registered architecture of a bare state dict."""
    say = say or log.info
    if mode not in MODES:
        raise ConfigError(f"--mode must be static or dynamic, got {mode!r}")
    if not 0 <= budget < 1:
        raise ConfigError(f"--budget is a share of top-1 in [0, 1) (0.01 = 1 point), got "
                          f"{budget}")
    if not 0 <= max_float <= 1:
        raise ConfigError(f"--max-float is a share of the products in [0, 1], got {max_float}")
    check_number("--calibration-images", calibration_images)
    check_number("--eval-images", eval_images, least=0, zero_means="all")
    if calibration is not None and mode == "dynamic":
        raise ConfigError("--calibration applies to --mode static (dynamic int8 computes its "
                          "ranges at run time); drop it, or use --mode static")
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ConfigError(f"the int8 model would replace {src}; give another output path")
    folder = _calibration_folder(calibration) if mode == "static" else None
    with tempfile.TemporaryDirectory(prefix="vitkit-int8-") as tmp:
        fp32 = OnnxModel(_as_onnx(src, Path(tmp), say, model_name))
        size, mean, std = fp32.cfg.img_size, fp32.cfg.extra["mean"], fp32.cfg.extra["std"]
        side = size[0] if size[0] == size[1] else size
        scored = load_split(data, split, side, root=root)
        if len(scored.classes) != fp32.num_classes:
            raise ConfigError(f"{src} has {fp32.num_classes} classes but {data} has "
                              f"{len(scored.classes)}; quantize on the data the model was "
                              "trained for")
        if len(scored) < 2 or eval_images == 1:
            raise ConfigError(f"{data} ({split}) gives {min(len(scored), eval_images or 2)} "
                              "image(s) to score: int8 needs at least 2, one half to choose "
                              "the layers kept in float on and one to report top-1 on; give "
                              "more images (--eval-images 0 takes all)")
        selection, held_out = _halves(scored, size, mean, std, eval_images)
        calibrating = None
        if mode == "static":
            images = folder or load_split(calibration or data, "train", side, root=root)
            calibrating = Calibration(_loader(images, size, mean, std, calibration_images),
                                      fp32.input)
        return _search(fp32, dst, mode, calibrating, selection, held_out, budget, max_float,
                       force, f"{data} ({split})", Path(tmp), say)


def _search(fp32: OnnxModel, dst: Path, mode: str, calibration, evaluation: DataLoader,
            held_out: DataLoader, budget: float, max_float: float, force: bool,
            scored_on: str, tmp: Path, say) -> Quantized:
    """Steps 2-3 of the module docstring, in ``tmp``: every choice on ``evaluation`` (the
    selection images), the report on ``held_out``; ``dst`` written only within budget."""
    work, cache = tmp / "int8.onnx", tmp / "ranges"
    src = plain_graph(fp32.path, tmp / "float.onnx")
    products = _products(src)
    say(f"choosing on {len(evaluation.dataset)} selection images of {scored_on}; "
        f"{len(held_out.dataset)} held-out images give the reported top-1")
    float_top1 = top1(fp32, evaluation)
    kept: list[str] = []
    quantize_graph(src, work, mode, calibration, kept, cache)
    int8 = OnnxModel(work)  # one session per state of the file
    int8_top1 = top1(int8, evaluation)
    naive_held_out = top1(int8, held_out)
    say(f"selection images: float top-1 {float_top1:.4f}, int8 top-1 {int8_top1:.4f} with "
        f"all {len(products)} products in int8")
    most = int(len(products) * max_float)
    if float_top1 - int8_top1 > budget and most > 0:
        batch = (calibration.batches[0] if calibration is not None
                 else next(iter(evaluation))[0].numpy())
        say(f"measuring the sensitivity of each of the {len(products)} products")
        ranked = sorted(sensitivity(
            src, products, lambda dst, only: quantize_graph(src, dst, mode, calibration, [],
                                                       cache, only),
            batch, tmp / "one.onnx").items(), key=lambda kv: -kv[1])
        k = 1
        while float_top1 - int8_top1 > budget and len(kept) < most:
            kept = [name for name, _ in ranked[:k]]
            quantize_graph(src, work, mode, calibration, kept, cache)
            int8 = OnnxModel(work)
            int8_top1 = top1(int8, evaluation)
            say(f"kept the {len(kept)} most sensitive product(s) in float: int8 top-1 "
                f"{int8_top1:.4f} on the selection images")
            k = min(2 * k, most)
    report = Quantized(mode=mode, images=len(held_out.dataset), float_top1=top1(fp32, held_out),
                       # nothing kept in float: the held-out score is the naive one's
                       int8_top1=top1(int8, held_out) if kept else naive_held_out,
                       naive_top1=naive_held_out,
                       budget=budget, selection_images=len(evaluation.dataset),
                       selection_float_top1=float_top1, selection_int8_top1=int8_top1,
                       quantized=len(products) - len(kept), kept_float=kept,
                       float_mb=src.stat().st_size / 1e6, int8_mb=work.stat().st_size / 1e6)
    if float_top1 - int8_top1 > budget and not force:
        raise OverBudget(
            f"int8 loses {(float_top1 - int8_top1) * 100:.2f} points of top-1 on the "
            f"{len(evaluation.dataset)} selection images of {scored_on}: "
            f"{float_top1:.4f} -> {int8_top1:.4f}, over the budget of {budget * 100:g} "
            f"with {len(kept)} of {len(products)} products kept in float (at most {most}). "
            f"Nothing was written to {dst}. Raise --budget or --max-float, calibrate on more "
            "images (--calibration-images), or pass --force to write it anyway")
    _mark(work, report)
    atomic_write(dst, lambda t: t.write_bytes(work.read_bytes()))
    report.written, report.path = True, str(dst)
    return report


def _mark(path: Path, report: Quantized) -> None:
    """Record the measurement in the int8 file's metadata (``vitkit.int8``)."""
    import onnx

    proto = onnx.load(str(path))
    entry = proto.metadata_props.add()
    entry.key = "vitkit.int8"
    entry.value = json.dumps({k: v for k, v in report.to_dict().items()
                              if k not in ("written", "path")})
    onnx.save_model(proto, str(path))

