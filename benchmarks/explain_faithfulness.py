"""How faithful is each attribution method? A small ViT on cluttered digits, where the object's
position is known, scored by deletion / insertion AUC, pointing game and mass in box, with a
random map as the floor.

Usage: python benchmarks/explain_faithfulness.py [--checkpoint PATH] [--epochs 12] [--eval 300]
Trains vit_micro_patch4_32 on 6,000 cluttered digits unless --checkpoint names a saved model
(the trained model is cached under runs/bench/). Writes
benchmarks/results/explain_faithfulness.md and explain_faithfulness.png.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import vitkit
from vitkit import explain
from vitkit.data import cluttered_digits
from vitkit.explain import metrics
from vitkit.models.bench import machine
from vitkit.train import resolve, train
from vitkit.viz import plot

RESULTS = Path(__file__).parent / "results"
CACHE = Path("runs/bench/faithfulness_vit.safetensors")
DATA = dict(canvas=32, digit_size=8, clutter=4, fragment=4, align=4)  # digits on whole patches


def trained_model(args) -> tuple[vitkit.VisionTransformer, str]:
    path = Path(args.checkpoint) if args.checkpoint else CACHE
    if path.exists():
        return vitkit.load_model(path), f"loaded from {path}"
    start = time.perf_counter()
    # `vitkit train`'s cluttered-digits are this benchmark's DATA: digits on whole patches
    run = train(resolve(dict(model="vit_micro_patch4_32", data="cluttered-digits", img_size=32,
                             data_size=args.train_size, epochs=args.epochs, batch_size=64,
                             lr=8e-3, label_smoothing=0.1, mean=(0.0, 0.0, 0.0),
                             std=(1.0, 1.0, 1.0), out=str(path.parent),
                             name="faithfulness-run")))
    model = vitkit.load_model(run.run_dir / "best.safetensors")
    vitkit.save_model(model, path)
    return model, (f"vit_micro_patch4_32 trained with `vitkit train` (lr 8e-3 x 64/512, batch "
                   f"64, label smoothing 0.1) for {args.epochs} epochs on {args.train_size} "
                   f"images in {time.perf_counter() - start:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--eval", type=int, default=300, help="validation images scored")
    parser.add_argument("--steps", type=int, default=16, help="deletion/insertion steps")
    args = parser.parse_args()

    model, how = trained_model(args)
    val = cluttered_digits(args.eval, "val", seed=2, **DATA)
    with torch.no_grad():
        accuracy = (model(val.images).argmax(-1) == val.labels).float().mean().item()
    size = tuple(val.images.shape[-2:])
    rows, curves = [], {}
    for method in [*explain.METHODS, "random"]:
        if method == "random":
            maps = metrics.random_maps(torch.zeros(args.eval, *model.grid_size), seed=0)
            with torch.no_grad():
                target = model(val.images).argmax(-1)
        else:
            e = explain.explain_map(model, val.images, method, head="mean")
            maps, target = e.map, e.target
        c = metrics.deletion_insertion(model, val.images, maps, target, steps=args.steps)
        pointing = metrics.pointing_game(maps, val.boxes, size).float().mean().item()
        mass = metrics.mass_in_box(maps, val.boxes, size).mean().item()
        label = "cls (mean of heads, last layer)" if method == "cls" else method
        rows.append((label, c.deletion_auc.mean().item(), c.insertion_auc.mean().item(),
                     pointing, mass))
        curves[label] = (c.deletion.mean(0).numpy(), c.insertion.mean(0).numpy())
        print(f"{label:<34} deletion {rows[-1][1]:.3f}  insertion {rows[-1][2]:.3f}  "
              f"pointing {pointing:.3f}  mass {mass:.3f}", flush=True)

    box_share = (8 * 8) / (size[0] * size[1])
    lines = [
        "# Faithfulness and localisation of attribution methods",
        "",
        f"Machine: {machine()}.",
        f"Model: {how}; validation accuracy {accuracy:.3f} on {args.eval} held-out cluttered "
        "digits (source digits disjoint from training).",
        f"Data: 32x32 canvases, one real 8x8 digit (box = {100 * box_share:.1f}% of the image) "
        "placed on whole 4x4 patches, and 4 digit fragments (4x4) anywhere else as clutter; "
        "maps on the 8x8 patch grid.",
        f"Deletion: patches set to 0 (black) in order of the map, {args.steps} steps; insertion: "
        "patches pasted onto a blurred image. Probability of the predicted class; area under "
        "the curve. Lower deletion AUC and higher insertion AUC are more faithful.",
        "",
        "| method | deletion AUC (lower is better) | insertion AUC (higher is better) | "
        "pointing game | mass in box |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.3f} |" for r in rows]
    lines += ["", f"A map spread evenly would put {100 * box_share:.1f}% of its mass in the box.",
              "", "![curves](explain_faithfulness.png)", ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "explain_faithfulness.md").write_text("\n".join(lines))
    fractions = torch.linspace(0, 1, args.steps + 1).numpy()
    plot.save(plot.figure_curves(fractions, curves, title="cluttered digits, mean over images"),
              RESULTS / "explain_faithfulness.png")
    print(f"wrote {RESULTS / 'explain_faithfulness.md'}")


if __name__ == "__main__":
    main()
