"""How fast the explorer answers: time to the first view of an image and per-interaction
latency, through a real server (uvicorn on loopback, an HTTP client in the same process), for
vit_base_patch16_224 and the demo ViT.

"First view" is what the page asks when an image arrives: the upload (decode, preprocess, one
forward with every layer's maps, the layers x heads model view), the per-head numbers, and the
attention-only methods ([CLS] attention, rollout). Layer and head changes are answered in the
page from the model view already sent (no request); the timed interactions are the ones that
ask the server: a patch click (its row and rollout row at a new layer/head), a head fusion, a
[CLS] map at another layer/head, rollout with new settings. Gradient methods, the faithfulness
curves and the causal tables are timed too (first call; repeats come from the cache). Each
first view uses a fresh image; medians over --repeats. Usage:
    python benchmarks/explore_latency.py [--repeats 5] [--demo runs/demo/vit/best.safetensors]
Writes benchmarks/results/explore_latency.md.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

import vitkit
from vitkit.models.bench import machine
from vitkit.web.session import Explorer

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from live import TOKEN, serve  # noqa: E402  (the tests' server helper)

OUT = Path(__file__).parent / "results" / "explore_latency.md"


def photo(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def timed(fn, *args, **kwargs) -> float:
    """Milliseconds one request took (it must succeed)."""
    start = time.perf_counter()
    r = fn(*args, **kwargs)
    elapsed = time.perf_counter() - start
    if r.status_code != 200:
        raise RuntimeError(r.text)
    return elapsed * 1000


def measure(model, repeats: int) -> dict[str, float]:
    explorer = Explorer(model)
    times: dict[str, list[float]] = {}
    depth, heads = model.cfg.depth, model.cfg.num_heads
    p = model.num_prefix_tokens
    with serve(explorer) as url, httpx.Client(base_url=url, headers={"X-Vitkit-Token": TOKEN},
                                              timeout=600) as http:
        http.post("/api/image", content=photo(999))  # warm-up
        for i in range(repeats):
            data = photo(i)
            start = time.perf_counter()
            image = http.post("/api/image", content=data).json()["image"]
            http.get("/api/stats", params=dict(image=image))
            for method in ("cls", "rollout"):
                if method in explorer.info()["applicable"]:
                    http.get("/api/method", params=dict(image=image, method=method))
            times.setdefault("first view (upload, model view, stats, attention maps)",
                             []).append((time.perf_counter() - start) * 1000)
            layer, head = i % depth, (i + 1) % heads
            steps = {
                "patch click (row + rollout row)": ("/api/token", dict(
                    image=image, query=p + 5 + i, layer=layer, head=head)),
                "another layer/head: patch row": ("/api/token", dict(
                    image=image, query=p + 5 + i, layer=(layer + 1) % depth, head=0)),
                "head fusion (max) for the mosaic": ("/api/heads", dict(
                    image=image, fusion="max")),
                "[CLS] map at another layer/head": ("/api/method", dict(
                    image=image, method="cls", layer=layer, head=head)),
                "rollout, new residual and discard": ("/api/method", dict(
                    image=image, method="rollout", residual=0.3, discard=0.5)),
                "Chefer (gradients), first call": ("/api/method", dict(
                    image=image, method="chefer")),
                "Chefer again (cached)": ("/api/method", dict(image=image, method="chefer")),
                "faithfulness curves (rollout, 16 steps)": ("/api/faithfulness", dict(
                    image=image, method="rollout")),
                "causal: logit lens + head importance": ("/api/causal", dict(image=image)),
            }
            for name, (path, params) in steps.items():
                times.setdefault(name, []).append(timed(http.get, path, params=params))
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--demo", type=Path, default=Path("runs/demo/vit/best.safetensors"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    models = {"vit_base_patch16_224 (random weights, 1000 classes)":
              vitkit.create_model("vit_base_patch16_224").eval()}
    if args.demo.exists():
        models[f"demo ViT ({args.demo})"] = vitkit.load_model(args.demo, verbose=False)
    else:
        models["vit_micro_patch4_32 (random weights; no demo run found)"] = \
            vitkit.create_model("vit_micro_patch4_32", num_classes=10).eval()
    results = {name: measure(model, args.repeats) for name, model in models.items()}
    names = list(next(iter(results.values())))
    lines = ["# Explorer latency", "", f"Machine: {machine()}. Median of {args.repeats} images; "
             "milliseconds, measured by an HTTP client on loopback (server and client share the "
             "machine). Goals: a layer/head/patch change under 100 ms, the first full view of "
             "a ViT-B/16 image under 2 s on 2 cores.", "",
             "| step | " + " | ".join(results) + " |",
             "|---|" + "---:|" * len(results)]
    lines += [f"| {n} | " + " | ".join(f"{r[n]:.0f}" for r in results.values()) + " |"
              for n in names]
    lines += ["", "Layer and head changes in the mosaic and the main figure are drawn from the "
              "model view the first view already sent: no request, a redraw only.", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
