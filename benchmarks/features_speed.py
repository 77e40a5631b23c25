"""Features (pooled embeddings) per second of ``vitkit features`` on the CPU against timm
(``forward_features`` + ``forward_head(pre_logits=True)`` in a torch DataLoader loop under
``torch.inference_mode``) and Hugging Face (``pipeline("image-feature-extraction", pool=True)``),
on the same weights and the same image files, for DINOv2-S/14 and DINOv3-S/16 at 224.

The weights are timm's random initialisation (seeded; nothing is downloaded), handed to vitkit
(its own checkpoint file, or timm's bare state dict with ``model=NAME`` where ``load_model``
takes it) and to Hugging Face (``vitkit.export(..., to="hf")``: a ``Dinov2Model`` /
``DINOv3ViTModel`` folder). The images are a folder of JPEGs written once: random crops of
scikit-learn's two sample photos, short side 256, so every peer decodes, resizes (bicubic, short
side to 224), centre-crops and normalises them itself (ImageNet mean/std everywhere). Before any
timing, the three models are checked equal on the same input tensor (pooled embedding and, for
HF, the final tokens), and each peer's own end-to-end output is compared with vitkit's.

vitkit is timed on the path a user runs: ``vitkit.backbone.shards.run`` (what ``vitkit features
CKPT --data FOLDER --out DIR`` calls: model load, weights hash, decode, preprocessing, forward,
shards and manifest), into a fresh folder each round; the model load is also timed on its own in
the same round, and features/s excludes it for every contender (each peer's load is timed too).
Contenders run in turn within each round (A B C A B C ...). The CLI itself is timed once per
model as a subprocess (Python and torch imports included). A stage profile of vitkit's path
(load, hash, listing, decode, preprocessing, forward, shard writing) closes each model.

Usage: python benchmarks/features_speed.py [--images 192] [--rounds 3] [--batch-size 32]
       [--workers 0] [--models dinov2 dinov3] [--quick] [--out PATH]
``--quick`` (a smoke run, about a minute on a quiet machine): 8 images, 1 round, batch 8,
no CLI subprocess, written to /tmp/features_speed_quick.md unless ``--out`` is given.
Writes benchmarks/results/features_speed.md.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import timm
import timm.data
import torch
import transformers
from PIL import Image

import vitkit
from vitkit.audit.analysis import _read
from vitkit.audit.store import audit_data
from vitkit.backbone import shards
from vitkit.backbone.features import embed, transform
from vitkit.checkpoints import load_model, timm_eva
from vitkit.data.images import IMAGENET_MEAN, IMAGENET_STD, preprocessing
from vitkit.models.bench import machine, median

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "features_speed.md"
DOCS = ROOT / ".helpers" / "docs_bench_features.md"
SIDE = 224
MODELS = {  # key: (timm name, HF model class, HF image processor class, label)
    "dinov2": ("vit_small_patch14_dinov2", "Dinov2Model", "BitImageProcessor", "DINOv2-S/14"),
    "dinov3": ("vit_small_patch16_dinov3", "DINOv3ViTModel", "DINOv3ViTImageProcessor",
               "DINOv3-S/16"),
}


# --------------------------------------------------------------------------------- the images
def write_images(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` JPEGs: random crops (side 160-420 px, aspect 3:4 to 4:3, random mirror) of
    scikit-learn's two sample photos, scaled to a short side of 256 and a long side whose
    centre crop at 224 starts on a whole pixel (vitkit rounds a half-pixel offset down, as HF's
    PIL processor does; torchvision's ``CenterCrop``, which timm uses, rounds it half to even:
    on other sizes their crops sit one pixel apart in about a quarter of the images)."""
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(a) for a in load_sample_images().images]
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        photo = photos[i % len(photos)]
        w, h = photo.size
        side = int(rng.integers(160, min(w, h) + 1))
        aspect = float(rng.uniform(0.75, 4 / 3))
        cw, ch = min(w, int(side * aspect)), side
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        img = photo.crop((x0, y0, x0 + cw, y0 + ch))
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        long = round(max(img.size) * 256 / min(img.size))
        while (int(SIDE * long / 256) - SIDE) % 2:  # a whole-pixel centre-crop offset
            long += 1
        size = (long, 256) if img.width >= img.height else (256, long)
        img = img.resize(size, Image.Resampling.LANCZOS)
        path = folder / f"img{i:05d}.jpg"
        img.save(path, quality=90)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------- the weights
def bare_refusal(name: str, timm_file: Path) -> str | None:
    """Why ``vitkit features`` cannot use timm's bare state dict with ``--model NAME`` (loaded
    as ``shards.run`` loads it) and give timm's features, or None when it can."""
    if "model" not in inspect.signature(load_model).parameters:
        return "load_model takes no model=NAME"
    try:
        m = load_model(timm_file, model=name, img_size=SIDE, verbose=False)
    except Exception as err:  # noqa: BLE001 - recorded in the results
        return f"load_model(state dict, model={name!r}) refuses it: {str(err)[:160]}"
    _, mean, std = preprocessing(m)
    if tuple(mean) != tuple(IMAGENET_MEAN) or tuple(std) != tuple(IMAGENET_STD):
        return (f"load_model(state dict, model={name!r}) preprocesses with mean {tuple(mean)} "
                f"and std {tuple(std)}, not timm's ImageNet mean/std")
    return None


def make_weights(key: str, work: Path, layout: str) -> dict:
    """timm's seeded random model, and the same weights as a vitkit checkpoint and an HF
    folder; vitkit reads timm's bare state dict with ``model=NAME`` where it can (``layout``
    auto) or is told to (timm), and otherwise its own file."""
    name = MODELS[key][0]
    torch.manual_seed(0)
    t = timm.create_model(name, pretrained=False, img_size=SIDE, num_classes=0).eval()
    with torch.no_grad():  # LayerScale starts at 1e-5: blocks that add nothing would hide bugs
        for k, p in t.named_parameters():
            if "gamma" in k:
                p.uniform_(0.3, 1.0)
    ours = vitkit.create_model(name, img_size=SIDE).eval()
    ours.load_state_dict(timm_eva.to_vitkit_keys(t.state_dict()))
    ours.cfg.extra.update(mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD))  # timm's, HF's
    timm_file = work / f"{key}-timm.pth"
    torch.save(t.state_dict(), timm_file)
    why = None if layout == "timm" else bare_refusal(name, timm_file)
    if layout == "timm" or (layout == "auto" and why is None):
        ckpt, model_name = timm_file, name
    else:
        ckpt, model_name = vitkit.save_model(ours, work / f"{key}.safetensors"), None
    hf = copy.deepcopy(ours)  # HF's pooler_output is [CLS]: the export needs cls pooling
    hf.cfg = dataclasses.replace(hf.cfg, pool="cls")
    hf_dir = vitkit.export(hf, work / f"{key}-hf", to="hf")
    return {"name": name, "timm_file": timm_file, "ckpt": ckpt, "model_name": model_name,
            "hf_dir": hf_dir, "bare_refusal": why}


# ---------------------------------------------------------------------------- the contenders
def vitkit_load(w: dict):
    extra = {"model": w["model_name"]} if w["model_name"] else {}
    return load_model(w["ckpt"], verbose=False, img_size=SIDE, **extra)


def vitkit_run(w: dict, folder: Path, out: Path, batch: int) -> None:
    """``vitkit features CKPT --data FOLDER --out OUT --batch-size B``, in this process."""
    shutil.rmtree(out, ignore_errors=True)
    shards.run(w["ckpt"], str(folder), out, model_name=w["model_name"], img_size=SIDE,
               batch_size=batch, device="cpu", say=lambda _: None)


def vitkit_pooled(out: Path) -> np.ndarray:
    arrays, _ = shards.read_features(out, ["pooled"])
    return arrays["pooled"][np.argsort(arrays["index"])]


def timm_load(w: dict):
    m = timm.create_model(w["name"], pretrained=False, img_size=SIDE, num_classes=0)
    m.load_state_dict(torch.load(w["timm_file"], map_location="cpu", weights_only=True))
    return m.eval()


class Files(torch.utils.data.Dataset):
    def __init__(self, paths, tf) -> None:
        self.paths, self.tf = paths, tf

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as img:
            return self.tf(img.convert("RGB"))


def timm_run(model, paths, batch: int, workers: int) -> np.ndarray:
    tf = timm.data.create_transform(input_size=(3, SIDE, SIDE), interpolation="bicubic",
                                    crop_pct=1.0, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    loader = torch.utils.data.DataLoader(Files(paths, tf), batch_size=batch,
                                         num_workers=workers)
    out = []
    with torch.inference_mode():
        for x in loader:
            out.append(model.forward_head(model.forward_features(x), pre_logits=True).numpy())
    return np.concatenate(out)


def hf_processor(key: str):
    cls = getattr(transformers, MODELS[key][2])  # the family's own (default, torchvision) one
    return cls(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE},
               do_center_crop=True, resample=3, image_mean=list(IMAGENET_MEAN),
               image_std=list(IMAGENET_STD))


def hf_load(w: dict, key: str):
    return transformers.pipeline("image-feature-extraction", model=str(w["hf_dir"]),
                                 image_processor=hf_processor(key), device="cpu")


def hf_run(pipe, paths, batch: int, workers: int) -> np.ndarray:
    got = pipe([str(p) for p in paths], batch_size=batch, num_workers=workers, pool=True,
               return_tensors=True)
    return torch.stack([g.reshape(-1) for g in got]).numpy()


# ------------------------------------------------------------------------------------ checks
def check(key: str, w: dict, paths, batch: int, workers: int) -> dict:
    """The three models equal on one input tensor (asserted), and HF's pipeline end to end on
    the first images against vitkit's [CLS] on vitkit's preprocessing (reported; timm's and
    vitkit's whole outputs are compared after the first round). Returns the differences."""
    ours, t, pipe = vitkit_load(w), timm_load(w), hf_load(w, key)
    pre = transform(ours, (SIDE, SIDE))
    assert tuple(pre.mean) == tuple(IMAGENET_MEAN), (
        f"vitkit's checkpoint preprocesses with mean {pre.mean}, not ImageNet's: the features "
        "would differ from timm's and HF's")
    split = audit_data(str(paths[0].parent), "val", SIDE)
    assert [Path(p) for p in split.images] == list(paths), "vitkit lists the files in another order"
    first = list(range(min(8, len(paths))))
    _, x, _ = _read(split, first, pre)
    with torch.inference_mode():
        tokens = ours.forward_features(x)
        v_pooled, v_cls = ours.forward_head(tokens, pre_logits=True), tokens[:, 0]
        t_tokens = t.forward_features(x)
        t_pooled = t.forward_head(t_tokens, pre_logits=True)
        hf = pipe.model(pixel_values=x)
    d = {"timm_tokens": (t_tokens - tokens).abs().max().item(),
         "timm_pooled": (t_pooled - v_pooled).abs().max().item(),
         "hf_tokens": (hf.last_hidden_state - tokens).abs().max().item(),
         "hf_pooled": (hf.pooler_output - v_cls).abs().max().item()}
    bad = {k: v for k, v in d.items() if not v < 1e-4}
    assert not bad, f"{key}: the models differ on the same input: {bad}"
    own = hf_run(pipe, [paths[i] for i in first], batch, workers)
    d["e2e_hf"] = float(np.abs(own - v_cls.numpy()).max())
    pixels = pipe.image_processor([Image.open(paths[i]).convert("RGB") for i in first],
                                  return_tensors="pt")["pixel_values"]
    d["hf_pixels"] = (pixels - x).abs().max().item()
    d["scale"] = float(v_pooled.abs().max())
    d["between"] = float((v_pooled - v_pooled.mean(0)).abs().max())  # how much images differ
    return d


# ----------------------------------------------------------------------------------- timing
def rounds(key: str, w: dict, paths, args, work: Path):
    """Per round, each contender in turn: its load, then its run over every image. Returns
    the times and the first round's vitkit and timm features."""
    folder = paths[0].parent
    t = {c: {"load": [], "run": []} for c in ("vitkit", "timm", "hf")}
    first = {}
    for r in range(args.rounds):
        s = time.perf_counter()
        vitkit_load(w)
        t["vitkit"]["load"].append(time.perf_counter() - s)
        s = time.perf_counter()
        vitkit_run(w, folder, work / "out", args.batch_size)
        t["vitkit"]["run"].append(time.perf_counter() - s - t["vitkit"]["load"][-1])
        if r == 0:
            first["vitkit"] = vitkit_pooled(work / "out")
        s = time.perf_counter()
        m = timm_load(w)
        t["timm"]["load"].append(time.perf_counter() - s)
        s = time.perf_counter()
        got = timm_run(m, paths, args.batch_size, args.workers)
        t["timm"]["run"].append(time.perf_counter() - s)
        first.setdefault("timm", got)
        s = time.perf_counter()
        pipe = hf_load(w, key)
        t["hf"]["load"].append(time.perf_counter() - s)
        s = time.perf_counter()
        hf_run(pipe, paths, args.batch_size, args.workers)
        t["hf"]["run"].append(time.perf_counter() - s)
        del m, pipe
        print(f"{key} round {r + 1}/{args.rounds}: " + ", ".join(
            f"{c} {len(paths) / t[c]['run'][-1]:.1f} features/s" for c in t), flush=True)
    return t, first


def cli_seconds(w: dict, folder: Path, out: Path, batch: int) -> float:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "vitkit", "features", str(w["ckpt"]), "--data", str(folder),
           "--out", str(out), "--batch-size", str(batch), "--device", "cpu",
           "--img-size", str(SIDE)]
    if w["model_name"]:
        cmd += ["--model", w["model_name"]]
    s = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - s


def profile(w: dict, folder: Path, batch: int, work: Path) -> dict[str, float]:
    """vitkit's path in stages, with the functions ``shards.run`` calls (one pass)."""
    p: dict[str, float] = {}

    def timed(name, fn):
        s = time.perf_counter()
        out = fn()
        p[name] = p.get(name, 0.0) + time.perf_counter() - s
        return out

    model = timed("load the checkpoint", lambda: vitkit_load(w))
    timed("hash the weights (manifest)", lambda: shards.weights_sha256(model))
    rows = timed("list the folder", lambda: audit_data(str(folder), "val", SIDE))
    pre = transform(model, (SIDE, SIDE))
    feats = []
    for start in range(0, len(rows), batch):
        idx = range(start, min(start + batch, len(rows)))
        imgs = timed("open the files (PIL, RGB)", lambda idx=idx: [rows[i][0] for i in idx])
        x = timed("decode, resize, crop, normalise",
                  lambda imgs=imgs: torch.stack([pre(i) for i in imgs]))
        feats.append(timed("forward (embed)", lambda x=x: embed(model, x)["pooled"].numpy()))
    out = work / "profile-out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    arrays = {"pooled": np.concatenate(feats), "index": np.arange(len(rows)),
              "label": np.asarray(rows.labels, dtype=np.int64)}
    timed("write the shard", lambda: shards.write_shard(out, 0, arrays, {}))
    return p


# ---------------------------------------------------------------------------------- report
def table(results: list[dict], n: int) -> list[str]:
    lines = ["| model | contender | load s | features/s (load excluded) | x fastest "
             "| end to end s (load included) |", "|---|---|---|---|---|---|"]
    names = {"vitkit": "vitkit features", "timm": "timm DataLoader loop",
             "hf": "HF pipeline(image-feature-extraction, pool=True)"}
    for res in results:
        fps = {c: n / median(v["run"]) for c, v in res["times"].items()}
        best = max(fps.values())
        for c, v in res["times"].items():
            total = statistics.median(a + b for a, b in zip(v["load"], v["run"], strict=True))
            lines.append(f"| {res['label']} | {names[c]} | {median(v['load']):.2f} | "
                         f"{fps[c]:.1f} | {fps[c] / best:.2f} | {total:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0,
                        help="DataLoader workers for timm and the HF pipeline (default 0: "
                             "decoding in the main process, as vitkit does)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--layout", choices=["auto", "timm", "vitkit"], default="auto",
                        help="vitkit's checkpoint: timm's bare state dict with model=NAME, "
                             "vitkit's own file, or auto (the first where load_model takes "
                             "model=)")
    parser.add_argument("--quick", action="store_true", help="a smoke run (under a minute)")
    parser.add_argument("--no-cli", action="store_true", help="skip the CLI subprocess")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.images, args.rounds, args.batch_size, args.no_cli = 8, 1, 8, True
    out_path = args.out or (Path(tempfile.gettempdir()) / "features_speed_quick.md"
                            if args.quick else OUT)
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths = write_images(work / "images", args.images)
        for key in args.models:
            w = make_weights(key, work, args.layout)
            diffs = check(key, w, paths, args.batch_size, args.workers)
            times, first = rounds(key, w, paths, args, work)
            diffs["e2e_timm"] = float(np.abs(first["timm"] - first["vitkit"]).max())
            print(f"{key} checks: {json.dumps(diffs)}", flush=True)
            cli = None if args.no_cli else cli_seconds(w, paths[0].parent, work / "cli-out",
                                                       args.batch_size)
            prof = profile(w, paths[0].parent, args.batch_size, work)
            results.append({"key": key, "label": MODELS[key][3], "name": w["name"],
                            "ckpt": "timm" if w["model_name"] else "vitkit",
                            "bare_refusal": w["bare_refusal"],
                            "times": times, "diffs": diffs, "cli": cli, "profile": prof})
            print("\n".join(table(results, args.images)), flush=True)
    wall = time.perf_counter() - start
    text = report(results, args, wall)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    print(f"wrote {out_path} ({wall:.0f} s in all)")
    if not args.quick and args.out is None:
        DOCS.parent.mkdir(parents=True, exist_ok=True)
        DOCS.write_text(docs_section(results, args))
        print(f"wrote {DOCS}")


def settings(args) -> str:
    return (f"{args.images} JPEGs (random crops of scikit-learn's two sample photos, short side "
            "256, the long side chosen so that the centre crop starts on a whole pixel: vitkit "
            "rounds a half-pixel offset down, torchvision's `CenterCrop` (timm) half to even, "
            "which on other sizes puts their crops one pixel apart in about a quarter of the "
            f"images), decoded, resized (bicubic, short side {SIDE}), centre-cropped to {SIDE} and "
            f"normalised (ImageNet mean/std) by each contender itself; batch {args.batch_size}; "
            f"{args.workers} DataLoader workers for timm and HF; float32; {args.rounds} round(s), "
            "the contenders in turn within each (medians).")


def checkpoints_line(results: list[dict]) -> str:
    said = []
    for r in results:
        if r["ckpt"] == "timm":
            said.append(f"{r['label']}: timm's bare state dict with `--model {r['name']}`")
        else:
            said.append(f"{r['label']}: vitkit's own checkpoint file of the same weights"
                        + (f" (not timm's bare state dict: {r['bare_refusal']})"
                           if r["bare_refusal"] else ""))
    return "Checkpoint vitkit reads: " + "; ".join(said) + "."


def report(results: list[dict], args, wall: float) -> str:
    n = args.images
    lines = ["# Features per second: `vitkit features` against timm and Hugging Face (CPU)", "",
             f"Machine: {machine()}, {os.cpu_count()} CPU cores; timm {timm.__version__}, "
             f"transformers {transformers.__version__}, Pillow {Image.__version__}, "
             f"{platform.system()}.", "", settings(args), "", checkpoints_line(results), "",
             "What each contender runs: **vitkit** `vitkit.backbone.shards.run` (what `vitkit "
             "features CKPT --data FOLDER --out DIR` calls: load, weights hash, decode, "
             "preprocessing, forward, safetensors shard and manifest) into a fresh folder; "
             "its load (`load_model`, timed on its own in the same round) is subtracted for "
             "features/s. **timm** `create_model(pretrained=False)` + `load_state_dict`, then "
             "a `DataLoader` over the files with `create_transform(crop_pct=1.0, "
             "interpolation='bicubic')`, `forward_features` + `forward_head(pre_logits=True)` "
             "under `torch.inference_mode`. **HF** `pipeline('image-feature-extraction', "
             "model=FOLDER, image_processor=...)` on the exported `Dinov2Model` / "
             "`DINOv3ViTModel` folder, called with the file paths, `batch_size`, `pool=True`, "
             "`return_tensors=True`; the image processor is the family's own (torchvision "
             "backend, the default) set to short side 224 bicubic + centre crop 224.", "",
             "What is pooled: DINOv2-S: the [CLS] token after the final norm in all three "
             "(timm's `global_pool='token'`, vitkit's pre-logits, HF's `pooler_output`). "
             "DINOv3-S: timm's and vitkit's pre-logits are the mean of the patch tokens "
             "(timm's `global_pool='avg'`), while HF's `pooler_output` is the [CLS] token: "
             "so HF is checked against vitkit's [CLS] token and its final tokens against "
             "vitkit's; the pooling is a negligible part of the time either way.", "",
             "## Speed", "", *table(results, n), "",
             "x fastest: features/s over the fastest contender's for that model (1.00: the "
             "fastest). Load s: vitkit `load_model` of the checkpoint file; timm "
             "`create_model` + `load_state_dict`; HF `pipeline(...)` from the folder.", ""]
    cli = [r for r in results if r["cli"] is not None]
    if cli:
        lines += ["The command line itself, once per model as a subprocess (`python -m vitkit "
                  "features ...`, Python, torch and vitkit imports included): " + "; ".join(
                      f"{r['label']} {r['cli']:.1f} s for {n} images" for r in cli) + ".", ""]
    lines += ["## The same outputs", "",
              "Maximum absolute differences. The weights are timm's initialisation with the "
              "LayerScale factors drawn from U(0.3, 1) (timm starts them at 1e-5, which would "
              "make every block nearly the identity and the checks blind to the blocks). Same "
              "input: 8 images preprocessed by vitkit, fed to each model (asserted below 1e-4 "
              "before any timing). End to end, each contender with its own decoding and "
              "preprocessing: timm's loop over every image against the shards of vitkit's first "
              "timed run; HF's pipeline on the 8 images against vitkit's [CLS] token on "
              "vitkit's preprocessing. HF's image processor resizes float tensors with "
              "torchvision rather than PIL images, so its pixels differ (last column) and its "
              "features by as much as that moves them. For scale: the largest |feature| and "
              "the largest distance of one image's feature from the 8 images' mean.", "",
              "| model | largest feature | images apart | timm, same input | HF pooled, same "
              "input | HF final tokens, same input | timm end to end | HF end to end | HF "
              "pixels vs vitkit's |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        d = r["diffs"]
        lines.append(f"| {r['label']} | {d['scale']:.2f} | {d['between']:.2f} | "
                     f"{d['timm_pooled']:.1e} | "
                     f"{d['hf_pooled']:.1e} | {d['hf_tokens']:.1e} | {d['e2e_timm']:.1e} | "
                     f"{d['e2e_hf']:.1e} | {d['hf_pixels']:.1e} |")
    lines += ["", "## Where vitkit's time goes", "",
              f"One pass of vitkit's path in stages ({n} images, batch {args.batch_size}), "
              "with the functions `shards.run` calls:", "",
              "| stage | " + " | ".join(r["label"] + " s" for r in results) + " |",
              "|---|" + "---|" * len(results)]
    for stage in results[0]["profile"]:
        lines.append(f"| {stage} | " + " | ".join(f"{r['profile'][stage]:.2f}"
                                                   for r in results) + " |")
    lines += ["", f"Made by `python benchmarks/features_speed.py` (this run: {wall / 60:.1f} "
              "minutes in all).", ""]
    return "\n".join(lines)


def docs_section(results: list[dict], args) -> str:
    n = args.images
    return "\n".join([
        "### Features per second", "",
        f"`benchmarks/features_speed.py` times `vitkit features` against timm (a DataLoader "
        f"loop over `forward_features` + `forward_head(pre_logits=True)`) and Hugging Face "
        f"(`pipeline('image-feature-extraction', pool=True)`) on the same random weights and "
        f"the same {n} JPEGs, each contender decoding and preprocessing them itself, batch "
        f"{args.batch_size}, on the CPU ({machine()}); the models are checked equal first. "
        "Model load is timed apart (features/s excludes it); details and the stage profile in "
        "[benchmarks/results/features_speed.md](../benchmarks/results/features_speed.md).", "",
        *table(results, n), ""])


if __name__ == "__main__":
    main()
