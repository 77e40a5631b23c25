"""Images per second of ``vitkit audit`` on this machine's CPU, the method's cost (the scan:
maps, predictions and region statistics per batch) apart from SpRAy's clustering and from the
masking that confirms flags, against a per-image loop over captum's Integrated Gradients (32
steps, zero baseline) on the same images.

Usage: python benchmarks/audit_speed.py [--out benchmarks/results/audit_speed.md]
The demo's architecture (vit_micro_patch4_32 on 32 x 32 cluttered digits) and ViT-B/16 (224 x
224 cluttered digits) have random weights (seeded; nothing is downloaded): a map costs the same
whatever the weights learned. The planted-shortcut nano ViT of the tests
(tests/data/audit/marked.safetensors) is timed as well, because only a model with flags pays
for their confirmation. Each stage runs once, timed with ``time.perf_counter``, in one process
on a quiet machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import vitkit
from vitkit.audit.analysis import Audit, finish, scan, transform_for
from vitkit.audit.spray import cluster
from vitkit.audit.store import _first
from vitkit.data.datasets import load_split
from vitkit.models.bench import machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CASES = (  # name, model, image side, data, images audited, images for the captum loop, batch
    ("demo ViT (vit_micro_patch4_32, random)", "vit_micro_patch4_32", 32, "cluttered-digits",
     1024, 16, 64),
    ("planted-shortcut nano ViT (tests)", ROOT / "tests/data/audit/marked.safetensors", 32,
     "cluttered-digits+mark:3", 1000, 16, 128),
    ("ViT-B/16 (random)", "vit_base_patch16_224", 224, "cluttered-digits", 64, 2, 16),
)


def model_for(source) -> torch.nn.Module:
    if isinstance(source, Path):
        return vitkit.load_model(source, verbose=False)
    torch.manual_seed(0)
    return vitkit.create_model(source, num_classes=10).eval()


def captum_loop(model, x: torch.Tensor, targets: torch.Tensor) -> float:
    """Seconds for Integrated Gradients one image at a time, as a per-image script does."""
    from captum.attr import IntegratedGradients

    ig = IntegratedGradients(model)
    t0 = time.perf_counter()
    for i in range(len(x)):
        ig.attribute(x[i:i + 1].clone().requires_grad_(True), baselines=torch.zeros_like(x[:1]),
                     target=int(targets[i]), n_steps=32, internal_batch_size=32)
    return time.perf_counter() - t0


def measure(name, source, side, data, n, n_ig, batch) -> dict:
    model = model_for(source)
    split = load_split(data, "train" if "+mark" in data else "val", side, size=max(5 * n, 1000))
    split = _first(split, n)
    t0 = time.perf_counter()
    rows, maps = scan(model, split, list(range(n)), "cp-lrp", batch)
    t_scan = time.perf_counter() - t0
    result = Audit("cp-lrp", rows, maps)
    by_class: dict[int, list[int]] = {}
    for r in rows:
        by_class.setdefault(r["prediction"], []).append(r["index"])
    t0 = time.perf_counter()
    for idx in by_class.values():
        cluster(torch.from_numpy(maps[idx]))
    t_spray = time.perf_counter() - t0
    t0 = time.perf_counter()
    finish(model, split, result)
    t_finish = time.perf_counter() - t0
    transform = transform_for(model)
    x = torch.stack([transform(split[i][0]) for i in range(n_ig)])
    t_ig = captum_loop(model, x, torch.tensor([r["prediction"] for r in rows[:n_ig]]))
    total = t_scan + t_finish
    return {"name": name, "images": n, "scan": n / t_scan, "spray_s": t_spray,
            "confirm_s": max(0.0, t_finish - t_spray), "flags": len(result.flags),
            "audit": n / total, "ig": n_ig / t_ig}


def table(results: list[dict]) -> str:
    lines = ["| model | images | scan (maps, predictions, statistics) images/s | SpRAy s | "
             "flags, masking, suspicion s | flags | whole audit images/s | captum IG loop "
             "images/s | audit / IG |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['name']} | {r['images']} | {r['scan']:.1f} | {r['spray_s']:.2f} | "
                     f"{r['confirm_s']:.2f} | {r['flags']} | {r['audit']:.1f} | {r['ig']:.2f} | "
                     f"{r['audit'] / r['ig']:.0f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "audit_speed.md")
    args = parser.parse_args()
    results = []
    for case in CASES:
        results.append(measure(*case))
        print(table(results), flush=True)
    text = (f"# `vitkit audit` speed on the CPU\n\n{machine()}\n\n"
            "Method cp-lrp (the audit's default). The scan is the method's cost: one forward "
            "and backward per batch for the maps, the predictions from the same pass, the "
            "region statistics and token norms. SpRAy is the spectral clustering of every "
            "predicted class's maps; the next column is the rest of the audit's second half "
            "(the clustering again, the flags, the masking that confirms them, the suspicion "
            "scores), which only a model with flags pays for. The captum column explains one "
            "image at a time with Integrated Gradients (32 steps, zero baseline), as a "
            "per-image script does; audit / IG is the whole audit's images per second over "
            "it.\n\n" + table(results) + "\n\nMade by `python benchmarks/audit_speed.py`.\n")
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
