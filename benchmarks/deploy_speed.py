"""ONNX deployment on the CPU (issue 27): images per second of vitkit's in-place inference path,
timm, onnxruntime fp32 and onnxruntime int8 (static, as `vitkit quantize` writes it), for
ViT-S/16 and ViT-B/16 at 224, batch 1 and 32; and the int8 model's top-1 next to the fp32 one
on the demo data (cluttered digits) and the second boxed dataset (fashion-boxes), each model
quantized by `vitkit quantize`'s search.

Usage: python benchmarks/deploy_speed.py [--models NAME ...] [--batches 1 32] [--repeats 5]
       [--accuracy-only | --speed-only] [--out benchmarks/results/deploy_speed.md]

Speed: the four contenders run the same architecture (timm's own class, vitkit's ONNX file
exported from the vitkit model, its int8 version calibrated on 32 crops of scikit-learn's
sample photos) on the same inputs, interleaved round by round in one process (see
benchmarks/README.md); a timed call is 32 images (32 calls at batch 1, one at batch 32), the
median over the rounds is reported. onnxruntime is given torch's thread count. No weights are
downloaded: the speed models keep vitkit's initialisation, loaded into timm's class too (speed
does not depend on the values).

Accuracy: the demo's ViT (`vit_micro_patch4_32` on cluttered digits, the demo's recipe) and
explain_boxes.py's vanilla ViT on fashion-boxes, trained once with `vitkit train` and cached in
runs/bench, exported and quantized with `vitkit.deploy.quantize.quantize` (budget 1 point).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import timm
import torch
from torch.utils.data import DataLoader, TensorDataset

import vitkit
from vitkit.data.images import preprocess, preprocessing, to_rgb
from vitkit.deploy import export_onnx
from vitkit.deploy.quantize import Calibration, plain_graph, quantize, quantize_graph
from vitkit.models.bench import interleaved, machine
from vitkit.train.config import resolve
from vitkit.train.trainer import train

OUT = Path(__file__).parent / "results" / "deploy_speed.md"
CACHE = Path("runs/bench")
IMAGES = 32  # per timed call
# data spec -> (image side, training options): the demo's ViT and explain_boxes.py's
ACCURACY = {
    "cluttered-digits": (32, dict(model="vit_micro_patch4_32", data_size=3000, steps=375,
                                  batch_size=64)),
    "fashion-boxes": (64, dict(model="vit_micro_patch4_32", patch_size=8, data_size=6000,
                               epochs=12, batch_size=64, lr=8e-3, label_smoothing=0.1,
                               mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))),
}


def photos(model, n: int = 32) -> torch.Tensor:
    """``n`` crops of scikit-learn's two sample photos, preprocessed as the model's metadata
    says: (n, 3, 224, 224)."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    arrays = load_sample_images().images
    size, mean, std = preprocessing(model)
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        img = Image.fromarray(arrays[i % len(arrays)])
        w, h = img.size
        s = min(w, h) * rng.uniform(0.3, 1.0)
        x0, y0 = rng.uniform(0, w - s), rng.uniform(0, h - s)
        out.append(preprocess(to_rgb(img.crop((x0, y0, x0 + s, y0 + s))), size, mean, std)[0])
    return torch.stack(out)


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def contenders(name: str, tmp: Path, say) -> tuple[dict, torch.Tensor]:
    """{contender: forward(x) -> logits as numpy} for model ``name``, and 32 photos."""
    torch.manual_seed(0)
    model = vitkit.create_model(name).eval()
    theirs = timm.create_model(name, pretrained=False)
    theirs.load_state_dict(model.state_dict())  # the same weights in timm's own class
    theirs.eval()
    x = photos(model)
    say(f"{name}: exporting to onnx and quantizing (static, 32 photos)")
    fp32 = plain_graph(export_onnx(model, tmp / f"{name}.onnx"), tmp / f"{name}.plain.onnx")
    calibration = Calibration(DataLoader(TensorDataset(x, torch.zeros(len(x))), batch_size=8),
                              "pixel_values")
    int8 = tmp / f"{name}.int8.onnx"
    quantize_graph(fp32, int8, "static", calibration, [])
    sessions = {"onnxruntime fp32": session(fp32), "onnxruntime int8": session(int8)}

    def run_torch(m):
        def forward(batch):
            with torch.inference_mode():
                return m(batch).numpy()
        return forward

    def run_ort(s):
        return lambda batch: s.run(None, {"pixel_values": batch.numpy()})[0]

    fns = {"vitkit": run_torch(model), "timm": run_torch(theirs),
           **{k: run_ort(s) for k, s in sessions.items()}}
    ref = fns["vitkit"](x[:2])
    for k, fn in fns.items():  # the same function, within float32 and int8 error
        err = np.abs(fn(x[:2]) - ref).max() / np.abs(ref).max()
        say(f"  {k}: logits within {err:.1e} (relative) of vitkit's")
    return fns, x


def speed(models: list[str], batches: list[int], repeats: int, say) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="vitkit-deploy-") as tmp:
        for name in models:
            fns, x = contenders(name, Path(tmp), say)
            for batch in batches:
                chunks = [x[i:i + batch] for i in range(0, IMAGES, batch)]
                calls = {k: (lambda fn=fn, cs=chunks: [fn(c) for c in cs]) for k, fn in fns.items()}
                times = interleaved(calls, repeats=repeats, desc=f"{name} batch {batch}")
                med = {k: statistics.median(v) for k, v in times.items()}
                spread = {k: (max(v) - min(v)) / 2 / med[k] for k, v in times.items()}
                for k in fns:
                    rows.append(dict(model=name, batch=batch, contender=k,
                                     images_s=IMAGES / med[k], spread=spread[k],
                                     vs_vitkit=med["vitkit"] / med[k]))
                say(f"{name} batch {batch}: " + ", ".join(
                    f"{k} {IMAGES / med[k]:.1f} img/s" for k in fns))
    return rows


def trained(data: str, say) -> Path:
    """The cached model of ``data`` (ACCURACY), or one trained now with `vitkit train`."""
    path = CACHE / f"deploy_{data}.safetensors"
    if not path.exists():
        side, options = ACCURACY[data]
        say(f"training the {data} ViT with vitkit train")
        run = train(resolve(dict(options, data=data, img_size=side, out=str(CACHE / "runs"),
                                 name=f"deploy-{data}")))
        path.parent.mkdir(parents=True, exist_ok=True)
        vitkit.save_model(vitkit.load_model(run.run_dir / "best.safetensors"), path)
    return path


def accuracy(say) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="vitkit-deploy-") as tmp:
        for data in ACCURACY:
            src = export_onnx(vitkit.load_model(trained(data, say), verbose=False),
                              Path(tmp) / f"{data}.onnx")
            for mode in ("static", "dynamic"):
                start = time.perf_counter()
                r = quantize(src, Path(tmp) / f"{data}.{mode}.onnx", data, mode=mode,
                             eval_images=0, say=say)
                rows.append(dict(data=data, seconds=time.perf_counter() - start,
                                 **r.to_dict()))
    return rows


def write(out: Path, speed_rows: list[dict], accuracy_rows: list[dict], args) -> None:
    lines = ["# ONNX deployment on the CPU", "",
             f"Machine: {machine()}; onnxruntime {ort.__version__}, timm {timm.__version__}.",
             f"Command: `python benchmarks/deploy_speed.py {' '.join(sys.argv[1:])}`.", ""]
    if speed_rows:
        lines += ["## Images per second", "",
                  f"Float32 224 x 224 inputs, {IMAGES} images per timed call, median of "
                  f"{args.repeats} interleaved rounds (± half the range, relative); "
                  "x vitkit: the contender's speed over vitkit's in-place path (above 1: faster "
                  "than vitkit). int8: static QDQ, every matrix product in int8, the adds, "
                  "LayerNorm, softmax and GELU in float.", "",
                  "| model | batch | contender | images/s | x vitkit |", "|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['batch']} | {r['contender']} | {r['images_s']:.1f} "
                  f"(±{r['spread']:.0%}) | {r['vs_vitkit']:.2f} |" for r in speed_rows]
        lines.append("")
    if accuracy_rows:
        lines += ["## int8 top-1 against fp32", "",
                  "Each model's whole validation split, quantized by `vitkit quantize`'s "
                  "search (budget 1 point): naive = every product in int8; int8 = what the "
                  "command writes.", "",
                  "| data | mode | images | fp32 top-1 | naive int8 | int8 top-1 | points lost "
                  "| kept in float | MB fp32 -> int8 | seconds |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['data']} | {r['mode']} | {r['images']} | {r['float_top1']:.4f} | "
                  f"{r['naive_top1']:.4f} | {r['int8_top1']:.4f} | {r['loss'] * 100:+.2f} | "
                  f"{len(r['kept_float'])} of {len(r['kept_float']) + r['quantized']} | "
                  f"{r['float_mb']:.2f} -> {r['int8_mb']:.2f} | {r['seconds']:.0f} |"
                  for r in accuracy_rows]
        lines.append("")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+",
                   default=["vit_small_patch16_224", "vit_base_patch16_224"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--speed-only", action="store_true")
    p.add_argument("--accuracy-only", action="store_true")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    say = lambda text: print(text, flush=True)  # noqa: E731
    speed_rows = [] if args.accuracy_only else speed(args.models, args.batches, args.repeats,
                                                     say)
    accuracy_rows = [] if args.speed_only else accuracy(say)
    write(args.out, speed_rows, accuracy_rows, args)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
