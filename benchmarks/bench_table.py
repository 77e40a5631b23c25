"""`vitkit bench` over models x image sizes x (inference, training step), as one Markdown table.

``--batch`` is the batch at the model's own size (224 for the ViT-B/L names); other sizes keep
about as many tokens per step (384 -> about a third), so memory stays level. A configuration
that runs out of memory gets a row saying so and the rest still run. ``--compile`` compiles
the model for each configuration (on a GPU this is where the bf16 throughput comes from; the
compile time is outside the timed steps).

Usage: python benchmarks/bench_table.py [--models NAME...] [--sizes 224 384] [--batch 256]
       [--device cpu|cuda] [--dtype float32|bfloat16] [--compile] [--steps 10] [--out PATH]
benchmarks/gpu_check.sh runs it for ViT-B/16 and ViT-L/16 on a GPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from vitkit.models.bench import bench, machine
from vitkit.models.cost import flop_model
from vitkit.models.registry import build_config


def batch_for(name: str, size: int, batch: int) -> int:
    """About the same number of tokens per step as ``batch`` images at the model's own size."""
    tokens = flop_model(build_config(name, img_size=size)).tokens
    base = flop_model(build_config(name)).tokens
    return max(1, round(batch * base / tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["vit_base_patch16_224", "vit_large_patch16_224"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 384])
    parser.add_argument("--batch", type=int, default=256,
                        help="batch at the model's own image size")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "bench_table.md")
    args = parser.parse_args()

    lines = ["# vitkit bench", "",
             f"Machine: {machine()}. {args.dtype}"
             f"{' autocast' if args.dtype == 'bfloat16' else ''} on {args.device}"
             f"{', torch.compile' if args.compile else ''}; median of {args.steps} steps after "
             "warm-up. A training step is forward, backward and AdamW.", "",
             "| model | size | work | batch | ms/step | images/s | GFLOP/s | share of matmul "
             "peak | peak memory MiB |", "|---|---|---|---|---|---|---|---|---|"]
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write(line: str) -> None:  # after every row, so a run cut short keeps what it did
        lines.append(line)
        print(line, flush=True)
        args.out.write_text("\n".join(lines) + "\n")

    for name in args.models:
        for size in args.sizes:
            batch = batch_for(name, size, args.batch)
            for train in (False, True):
                work = "training step" if train else "inference"
                try:
                    r = bench(name, batch=batch, img_size=size, train=train,
                              compile=args.compile, dtype=args.dtype, device=args.device,
                              steps=args.steps)
                except torch.OutOfMemoryError:
                    write(f"| {name} | {size} | {work} | {batch} | out of memory | | | | |")
                    torch.cuda.empty_cache()
                    continue
                finally:
                    torch._dynamo.reset()  # each configuration compiles afresh
                write(
                    f"| {name} | {size} | {work} | {batch} | {r.step_ms:.1f} "
                    f"(±{100 * r.spread:.0f}%) | {r.images_per_s:,.0f} | "
                    f"{r.achieved_gflops:,.0f} | {100 * r.share_of_peak:.0f}% | "
                    f"{r.peak_memory_mb:,.0f} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
