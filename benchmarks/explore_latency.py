"""What a person waits for in the explorer, measured by driving the page itself: Debian's
Chromium through Playwright on a real server (uvicorn on loopback), for vit_base_patch16_224 and
the demo ViT. Times are from the user's action to the page having drawn the answer:

- first view: a 640 x 480 photo chosen in the file picker -> the attention views drawn (the
  picture, every head of every layer, the attention-only maps, the per-head numbers); and ->
  the full view (the gradient methods too, which load after);
- a head click while a slow job (the faithfulness curves) holds the model -> the main figure
  redrawn; and a [CLS] map of another layer asked of the server meanwhile;
- a class change -> every gradient map redrawn for the new class;
- faithfulness (a job) -> its verdict shown;
- causal: the logit lens and the linear head-importance estimate -> drawn; the exact ablation
  (a job) -> drawn.

Each first view uses a fresh image; medians over --repeats (the two long jobs, faithfulness and
the exact ablation, are run to the end on the first image only). Usage:
    python benchmarks/explore_latency.py [--repeats 3] [--demo runs/demo/vit/best.safetensors]
Writes benchmarks/results/explore_latency.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image
from playwright.sync_api import sync_playwright

import vitkit
from vitkit.models.bench import machine
from vitkit.web.session import Explorer

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from live import TOKEN, serve  # noqa: E402  (the tests' server helper)

OUT = Path(__file__).parent / "results" / "explore_latency.md"
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--disable-gpu", "--disable-quic", "--disable-sync", "--disable-background-networking"]
GOALS = {"first view (attention views drawn)": "< 2000",
         "head click while a job runs (figure redrawn)": "< 100",
         "[CLS] map from the server while a job runs": "< 100",
         "causal: logit lens + linear estimate": "< 2000"}


def photo(folder: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    path = folder / f"photo{seed}.jpg"
    Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(path)
    return path


def wait(page, expression: str, timeout: float = 600.0) -> float:
    """Milliseconds until ``expression`` is true in the page (polled every 5 ms)."""
    start, end = time.perf_counter(), time.perf_counter() + timeout
    while time.perf_counter() < end:
        if page.evaluate(expression):
            return (time.perf_counter() - start) * 1000
        time.sleep(0.005)
    raise TimeoutError(expression)


def since(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def digest(page, canvas: str) -> str:
    return page.evaluate(f"document.getElementById('{canvas}').toDataURL()")


def one_image(page, path: Path, seed: int, times: dict, slow: bool) -> None:
    """Time one image's steps; ``slow``: let the faithfulness and exact-ablation jobs finish
    (else the faithfulness job is cancelled once the click was timed)."""
    def add(name: str, ms: float) -> None:
        times.setdefault(name, []).append(ms)
        print(f"    {name}: {ms:.0f} ms", file=sys.stderr, flush=True)

    start = time.perf_counter()
    page.set_input_files("#file", str(path))
    wait(page, f"S.view && S.view.label === '{path.name}' && "
               "document.body.dataset.view === 'attention'")
    add("first view (attention views drawn)", since(start))
    wait(page, "document.body.dataset.view === 'full'")
    add("full view (gradient methods too)", since(start))

    page.select_option("#faith-method", "rollout")  # a slow job holds the model ...
    faith_started = page.evaluate("performance.now()")
    page.click("#faith-run")
    wait(page, "JOBS.faith !== undefined && !document.getElementById('faith-job').hidden")
    depth = page.evaluate("S.model.depth")
    before = digest(page, "main")
    # ... while the user clicks a head: from the click to the next frame, timed in the page
    add("head click while a job runs (figure redrawn)", page.evaluate(
        """async (sel) => { const t = performance.now();
           document.querySelector(sel).click();
           await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
           return performance.now() - t; }""",
        f"#mosaic canvas[data-layer='{seed % depth}'][data-head='1']"))
    assert digest(page, "main") != before
    add("[CLS] map from the server while a job runs", page.evaluate(
        """async (layer) => { const t = performance.now();
           await api('/api/method', { image: S.view.image, method: 'cls', layer, head: 2 });
           return performance.now() - t; }""", (seed + 1) % depth))
    running = page.evaluate("JOBS.faith !== undefined")
    times.setdefault("(the job was still running during the click)", []).append(
        100.0 if running else 0.0)
    if slow:
        wait(page, "document.getElementById('faith-text').textContent.includes('AUC')")
        add("faithfulness: the curves drawn (a first answer)", page.evaluate(
            "performance.now()") - faith_started)
        wait(page, "document.getElementById('faith-text').textContent.includes('random maps "
                   "on deletion')")
        add("faithfulness: the verdict (20 random maps, sanity checks)", page.evaluate(
            "performance.now()") - faith_started)
    else:
        page.click("#faith-cancel")
        wait(page, "document.getElementById('faith-job').hidden")

    target = 1 + seed % (page.evaluate("S.model.classes.length") - 1)  # gradient maps only
    start = time.perf_counter()
    page.select_option("#target", str(target))
    name = page.evaluate(f"className({target})")
    grads = page.evaluate("withGradients()")
    wait(page, " && ".join(f"document.querySelector('#method-{g} figcaption').textContent"
                           f".includes('({name})')" for g in grads) or "true")
    add("class change (every gradient map redrawn)", since(start))

    start = time.perf_counter()
    page.click("#causal-run")
    wait(page, "!document.getElementById('causal-exact').disabled && "
               "document.querySelectorAll('#importance-table td').length > 0")
    add("causal: logit lens + linear estimate", since(start))
    if slow:
        start = time.perf_counter()
        page.click("#causal-exact")
        wait(page, "document.getElementById('exact-text').textContent.includes('Rank "
                   "correlation')")
        add("causal: exact ablation (job)", since(start))


def measure(browser, model, repeats: int) -> dict[str, float]:
    explorer = Explorer(model)
    times: dict[str, list[float]] = {}
    with serve(explorer) as url, tempfile.TemporaryDirectory() as tmp:
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.goto(f"{url}/?token={TOKEN}")
        wait(page, "document.body.dataset.ready === '1'")
        warm: dict = {}
        print("  warm-up image", file=sys.stderr, flush=True)
        one_image(page, photo(Path(tmp), 999), 999, warm, slow=False)  # warm-up, not counted
        for i in range(repeats):
            one_image(page, photo(Path(tmp), i), i, times, slow=i == 0)
            print(f"  {model.cfg.extra.get('name', 'model')}: image {i + 1} of {repeats}",
                  file=sys.stderr, flush=True)
        page.close()
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--demo", type=Path, default=Path("runs/demo/vit/best.safetensors"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    models = {"vit_base_patch16_224 (random weights, 1000 classes)":
              vitkit.create_model("vit_base_patch16_224").eval()}
    if args.demo.exists():
        models[f"demo ViT ({args.demo})"] = vitkit.load_model(args.demo, verbose=False)
    else:
        models["vit_micro_patch4_32, the demo's architecture (random weights)"] = \
            vitkit.create_model("vit_micro_patch4_32", num_classes=10).eval()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        results = {name: measure(browser, model, args.repeats) for name, model in models.items()}
        version = browser.version
        browser.close()
    names = list(next(iter(results.values())))
    lines = ["# Explorer latency, as the page shows it", "",
             f"Machine: {machine()}; Chromium {version} driven by Playwright, server on "
             f"loopback (browser and server share the machine). Median of {args.repeats} "
             "images (the two long jobs: the first image only); milliseconds from the user's "
             "action to the answer drawn on the page. "
             "Made by `python benchmarks/explore_latency.py`.", "",
             "| step | goal | " + " | ".join(results) + " |",
             "|---|---|" + "---:|" * len(results)]
    for n in names:
        if n.startswith("("):
            lines.append(f"| {n} | | " + " | ".join(
                "yes" if r[n] else "no" for r in results.values()) + " |")
            continue
        lines.append(f"| {n} | {GOALS.get(n, '')} | " + " | ".join(
            f"{r[n]:.0f}" for r in results.values()) + " |")
    lines += ["", "Layer and head clicks are drawn from the model view the first view already "
              "sent; the [CLS], rollout and MAP maps read the stored attention without the "
              "model lock, so neither waits behind a job. The gradient methods load after the "
              "attention views are drawn.", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
