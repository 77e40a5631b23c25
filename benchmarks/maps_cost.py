"""What per-head attention maps cost: vitkit with and without maps, timm beside it.

Same weights, same inputs, float32 inference, interleaved in one process. Writes
benchmarks/results/maps_cost.md. Usage: python benchmarks/maps_cost.py [--batch 8] [--repeats 9]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import timm
import torch

import vitkit
from vitkit.bench import interleaved, machine, median, spread

OUT = Path(__file__).parent / "results" / "maps_cost.md"


def _calls(ours, peer, x) -> dict:
    return {
        "plain": lambda: ours(x),
        "maps": lambda: ours(x, return_attn=True),
        "last": lambda: ours(x, return_attn=True, attn_layers=[-1]),
        "timm": lambda: peer(x),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--models", nargs="+",
                        default=["vit_small_patch16_224", "vit_base_patch16_224"])
    args = parser.parse_args()

    lines = [
        "# Cost of per-head attention maps",
        "",
        f"Machine: {machine()}. float32 inference, batch {args.batch}, median of "
        f"{args.repeats} interleaved rounds; ratios are time / vitkit plain (lower is faster).",
        "",
        "| model | vitkit plain ms/img | all-layer maps | last-layer map | timm plain |",
        "|---|---|---|---|---|",
    ]
    for name in args.models:
        torch.manual_seed(0)
        ours = vitkit.create_model(name).eval()
        peer = timm.create_model(name, num_classes=1000).eval()
        peer.load_state_dict(ours.state_dict())
        x = torch.randn(args.batch, 3, 224, 224)
        with torch.inference_mode():
            times = interleaved(_calls(ours, peer, x), repeats=args.repeats, desc=name)
        base = median(times["plain"])
        cells = [f"{1000 * base / args.batch:.1f} (±{100 * spread(times['plain']):.0f}%)"]
        cells += [f"{median(times[k]) / base:.3f}x" for k in ("maps", "last", "timm")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
