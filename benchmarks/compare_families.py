"""vitkit against timm on the families built on the plain ViT (DINOv2-S/14, CLIP-B/16, and
SigLIP-B/16) and on timm's Eva (DINOv3-S/16, EVA-02-T/14), same weights and inputs, one process,
interleaved rounds. Ratios are timm's time over vitkit's per round (above 1: vitkit is faster);
median and spread (half the IQR). The last column is vitkit's forward with every layer's
attention maps over its plain forward (the cost of looking inside).

DINOv2 runs at 224 (16x16 patches + [CLS]) rather than its native 518, to keep the run short on a
CPU; the arithmetic per token is the same. Usage:
    python benchmarks/compare_families.py [--batch 8] [--repeats 9] [--out PATH]
Writes benchmarks/results/compare_families.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import timm
import torch

import vitkit
from vitkit.checkpoints import timm_eva
from vitkit.models import inference
from vitkit.models.bench import interleaved, machine, median, spread

OUT = Path(__file__).parent / "results" / "compare_families.md"
MODELS = {"vit_small_patch14_dinov2": dict(img_size=224), "vit_base_patch16_clip_224": {},
          "vit_base_patch16_siglip_224": {}, "vit_small_patch16_dinov3": dict(img_size=224),
          "eva02_tiny_patch14_224": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = []
    for name, size in MODELS.items():
        torch.manual_seed(0)
        theirs = timm.create_model(name, **size).eval()
        ours = vitkit.create_model(name, **size).eval()
        ours.load_state_dict(timm_eva.to_vitkit_keys(theirs.state_dict()))  # timm's weights
        x = torch.randn(args.batch, 3, *ours.cfg.img_size)
        with torch.inference_mode():
            assert (ours(x) - theirs(x)).abs().max() < 1e-3  # the same model, first
            times = interleaved({"vitkit": lambda m=ours, x=x: m(x),
                                 "timm": lambda m=theirs, x=x: m(x),
                                 "maps": lambda m=ours, x=x: m(x, return_attn=True)},
                                repeats=args.repeats, warmup=1, desc=name)
        ratios = [t / v for t, v in zip(times["timm"], times["vitkit"], strict=True)]
        looks = [m / v for m, v in zip(times["maps"], times["vitkit"], strict=True)]
        with torch.inference_mode():
            fused = "in-place CPU path" if inference.applies(ours, x) else "standard blocks"
        rows.append(f"| `{name}` | {size.get('img_size', 224)} | {fused} | "
                    f"{1000 * median(times['vitkit']) / args.batch:.1f} | "
                    f"{1000 * median(times['timm']) / args.batch:.1f} | "
                    f"{median(ratios):.2f} ± {spread(ratios):.2f} | "
                    f"{median(looks):.2f} ± {spread(looks):.2f} |")
        print(rows[-1], flush=True)
    text = "\n".join([
        "# vitkit vs timm on DINOv2, CLIP, SigLIP, DINOv3 and EVA-02 (CPU inference)", "",
        f"Machine: {machine()}. float32, batch {args.batch}, {args.repeats} interleaved rounds; "
        "ratio = timm time / vitkit time per round (median ± half IQR).", "",
        "| model | image | vitkit path | vitkit ms/image | timm ms/image | timm / vitkit "
        "| every-layer maps / plain forward (vitkit) |",
        "|---|---|---|---|---|---|---|", *rows, ""])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
