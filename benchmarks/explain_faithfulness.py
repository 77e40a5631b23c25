"""How far can each attribution method be trusted? A small ViT on cluttered digits, where the
object's position is known, scored by the trust checks of `vitkit trust`
(``vitkit.explain.trust.method_table``): deletion and insertion under three baselines, the share
of random maps each method beats, pointing game and mass in box, the randomisation and
class-sensitivity verdicts, and seconds per map; a random map as the floor.

Usage: python benchmarks/explain_faithfulness.py [--checkpoint PATH] [--epochs 12] [--eval 300]
Trains vit_micro_patch4_32 on 6,000 cluttered digits unless --checkpoint names a saved model
(the trained model is cached under runs/bench/). Writes explain_faithfulness.md and .png to
--out (default benchmarks/results). Only the methods that apply to the model run; the others
are named as left out.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import vitkit
from vitkit.data import cluttered_digits
from vitkit.explain import localisation, perturb, trust
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


def random_row(model, images, boxes, args) -> dict:
    """The floor: one random map per image scored like a method."""
    with torch.no_grad():
        target = model(images).argmax(-1)
    maps = perturb.random_maps(torch.zeros(len(images), *model.grid_size), seed=0)
    size = tuple(images.shape[-2:])
    row = {"method": "random"}
    for baseline in perturb.BASELINES:
        for mode in ("deletion", "insertion"):
            row[f"{mode}_{baseline}"] = perturb.auc(perturb.perturbation_curves(
                model, images, maps, target, mode=mode, baseline=baseline,
                steps=args.steps)).mean().item()
    floor = trust.random_floor(model, images, maps, target, n=args.random, steps=args.steps,
                               baseline=perturb.BASELINES[0], seed=1)
    row.update(percentile_vs_random=floor.percentile.mean().item(),
               win_rate=(floor.p_value <= 0.05).float().mean().item(),
               pointing=localisation.pointing_game(maps, boxes, size).float().mean().item(),
               mass_in_box=localisation.mass_in_box(maps, boxes, size).mean().item())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--train-size", type=int, default=6000)
    parser.add_argument("--eval", type=int, default=300, help="validation images scored")
    parser.add_argument("--steps", type=int, default=16, help="deletion/insertion steps")
    parser.add_argument("--random", type=int, default=trust.RANDOM_MAPS,
                        help="random maps per image for the floor")
    parser.add_argument("--sanity-images", type=int, default=16,
                        help="images for the randomisation and class checks")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    model, how = trained_model(args)
    val = cluttered_digits(args.eval, "val", seed=2, **DATA)
    with torch.no_grad():
        accuracy = (model(val.images).argmax(-1) == val.labels).float().mean().item()
    rows, left_out = trust.method_table(
        model, val.images, boxes=val.boxes, n_random=args.random, steps=args.steps,
        sanity_images=args.sanity_images, progress=lambda m: print(f"scored {m}", flush=True))
    rows.append(random_row(model, val.images, val.boxes, args))
    size = tuple(val.images.shape[-2:])
    box_share = (8 * 8) / (size[0] * size[1])
    lines = [
        "# How far each attribution method can be trusted",
        "",
        f"Machine: {machine()}.",
        f"Model: {how}; validation accuracy {accuracy:.3f} on {args.eval} held-out cluttered "
        "digits (source digits disjoint from training).",
        f"Data: 32x32 canvases, one real 8x8 digit (box = {100 * box_share:.1f}% of the image) "
        "placed on whole 4x4 patches, and 4 digit fragments (4x4) anywhere else as clutter; "
        "maps on the 8x8 patch grid.",
        f"Deletion and insertion, most relevant first, {args.steps} steps, the probability of "
        "the predicted class, area under the curve (lower deletion and higher insertion are "
        "more faithful), with the removed patches filled by a constant (0), a blurred copy, "
        "or ROAD's noisy linear imputation from their neighbours. Percentile vs random: the "
        f"share of {args.random} random maps per image the method beats on deletion (constant); "
        "win rate: the share of images where it beats them at p <= 0.05. Randomisation: the "
        "rank correlation with the trained model's map after every block is re-initialised "
        f"(pass below {trust.RANDOMISED_MAX_CORRELATION}); class sensitivity: the rank "
        "correlation with the map of the least likely class (pass below "
        f"{trust.CLASS_MAX_CORRELATION}); both on {args.sanity_images} images.",
        "",
        trust.table_markdown(rows),
        "",
        f"A map spread evenly would put {100 * box_share:.1f}% of its mass in the box.",
    ]
    if left_out:
        lines += ["", "Left out: " + "; ".join(left_out) + "."]
    lines += ["", "![curves](explain_faithfulness.png)", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "explain_faithfulness.md").write_text("\n".join(lines))
    curves = {}
    for method in [r["method"] for r in rows if r["method"] != "random"]:
        e = vitkit.explain.explain_map(model, val.images, method)
        curves[method] = tuple(perturb.perturbation_curves(
            model, val.images, e.map, e.target, mode=mode, baseline=perturb.BASELINES[0],
            steps=args.steps).mean(0).numpy()
            for mode in ("deletion", "insertion"))
    fractions = torch.linspace(0, 1, args.steps + 1).numpy()
    plot.save(plot.figure_curves(fractions, curves, title="cluttered digits, mean over images"),
              args.out / "explain_faithfulness.png")
    print(f"wrote {args.out / 'explain_faithfulness.md'}")


if __name__ == "__main__":
    main()
