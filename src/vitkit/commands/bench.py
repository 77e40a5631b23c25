"""``vitkit bench NAME``: time a model (images/s, ms/image, memory, share of the matmul peak)."""

from __future__ import annotations

import argparse

from vitkit.models.bench import bench, report

NAME = "bench"
HELP = "time a model: images/s, ms/image, memory, share of the matmul peak"
DESCRIPTION = "Warm-up, then timed steps (synchronised on GPU); median and spread."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="a registered model name")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--img-size", type=int, default=None)
    p.add_argument("--train", action="store_true", help="time forward + backward + AdamW")
    p.add_argument("--attn", action="store_true", help="inference with all-layer maps")
    p.add_argument("--compile", action="store_true", help="torch.compile the model first")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")


def run(args: argparse.Namespace) -> None:
    print(report(bench(args.name, batch=args.batch, img_size=args.img_size, train=args.train,
                         attn=args.attn, compile=args.compile, dtype=args.dtype,
                         device=args.device, steps=args.steps, warmup=args.warmup)))
