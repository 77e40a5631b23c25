"""Where do the maps point, on modern layouts and a harder dataset, against the peers?

Two boxed datasets whose object box is known: vitkit's cluttered digits (32 x 32, an 8 x 8 digit
among digit fragments) and fashion-boxes (64 x 64, a 28 x 28 Fashion-MNIST item on a texture
among two smaller items of other classes). On each, three small ViTs trained by `vitkit train`:
a vanilla [CLS] one, one with 4 register tokens (DINOv2's layout) and one with an attention
pooling head (SigLIP's MAP), all with 8 x 8 patch grids. Every vitkit method that applies to the
model and the peers run on the same model and images (captum's Integrated Gradients and
Input x Gradient, pytorch-grad-cam's CAMs, LXT's AttnLRP where LXT can load the model, Chefer's
official code where a clone of it is given) are scored by the same trust checks
(``vitkit.explain.trust``): deletion and insertion under the constant and the blur baselines,
the percentile against random maps, pointing game and mass in box, and the randomisation check.

Usage: python benchmarks/explain_boxes.py [--train-only] [--eval 100] [--chefer-repo DIR]
Trains the models it does not find under runs/bench/ (one command trains all four, each to
early stopping on a held-out tenth, then annealed; up to an hour each on one CPU core; a
training cut short continues where it stopped),
then writes explain_boxes.md, .csv and .png to --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import peer_maps
import torch

import vitkit
from vitkit.data import cluttered_digits
from vitkit.data.boxed import boxed_fashion
from vitkit.explain import trust
from vitkit.explain.lrp import RULES
from vitkit.models.bench import machine
from vitkit.train import resolve, train
from vitkit.train.resume import leftover
from vitkit.util.files import atomic_write
from vitkit.viz import plot

RESULTS = Path(__file__).parent / "results"
CACHE = Path("runs/bench")
LAYOUTS = {"vanilla": "vit_micro_patch4_32", "reg4": "vit_micro_patch4_32_reg4",
           "map": "vit_micro_patch4_32_map"}
# data spec, image side, patch side: both give an 8 x 8 grid of patches
SETS = {"cluttered-digits": (32, 4), "fashion-boxes": (64, 8)}
# the three layouts on fashion-boxes; on the digits the vanilla model of explain_faithfulness.py
MODELS = [("cluttered-digits", "vanilla"), *(("fashion-boxes", layout) for layout in LAYOUTS)]
# trained to the best the recipe reaches: early stopping on a held-out tenth of the training
# split (patience 4, at most 60 epochs), then 4 epochs annealed to the floor
RECIPE = dict(data_size=6000, epochs=60, patience=4, anneal_epochs=4, holdout=0.1,
              batch_size=64, lr=8e-3, label_smoothing=0.1, mean=(0.0, 0.0, 0.0),
              std=(1.0, 1.0, 1.0))
# at lr 8e-3 the register and MAP models never left chance on fashion-boxes (the loss stayed at
# ln 10 for 8 epochs, until early stopping): the register model gets half the rate, gradients
# clipped at 1 and 2 warm-up epochs; the MAP model, which learned during that warm-up and fell
# back to chance once the rate reached 4e-3, a quarter
STABLE = dict(clip_grad=1.0, warmup_epochs=2)
LAYOUT_RECIPE = {("fashion-boxes", "reg4"): dict(STABLE, lr=4e-3),
                 ("fashion-boxes", "map"): dict(STABLE, lr=2e-3)}


def checkpoint(data: str, layout: str) -> Path:
    if (data, layout) == ("cluttered-digits", "vanilla"):  # explain_faithfulness.py's model
        return CACHE / "faithfulness_vit.safetensors"
    return CACHE / f"boxes_{data}_{layout}.safetensors"


def trained_model(data: str, layout: str, epochs: int) -> tuple[vitkit.VisionTransformer, str]:
    """The cached model, or one trained now with `vitkit train` (RECIPE, with the layout's
    LAYOUT_RECIPE), and a sentence on how it was trained."""
    path = checkpoint(data, layout)
    note = path.with_suffix(".train.txt")  # how it was trained, written beside it
    if path.exists():
        how = note.read_text() if note.exists() else "trained with `vitkit train`"
        return vitkit.load_model(path), f"`{LAYOUTS[layout]}` {how}, cached in {path}"
    side, patch = SETS[data]
    start = time.perf_counter()
    recipe = dict(RECIPE, **LAYOUT_RECIPE.get((data, layout), {}))
    cfg = resolve(dict(recipe, model=LAYOUTS[layout], data=data, img_size=side,
                       patch_size=patch, epochs=epochs, out=str(CACHE / "runs"),
                       name=f"{data}-{layout}"))
    # cut short with this recipe: continue it exactly where it stopped; any other leftover goes
    resume = leftover(CACHE / "runs" / f"{data}-{layout}", cfg)
    run = train(None, resume=resume) if resume else train(cfg, overwrite=True)
    model = vitkit.load_model(run.run_dir / "best.safetensors")
    vitkit.save_model(model, path)
    out = run.outcome
    how = (f"trained with `vitkit train` on {RECIPE['data_size']} images at lr "
           f"{recipe['lr']:g}{', gradients clipped at 1' if recipe.get('clip_grad') else ''}: "
           f"{out['epochs']} epochs (stopped: {out['stopped']}, at most {epochs}, "
           f"patience {RECIPE['patience']}, then {RECIPE['anneal_epochs']} annealed) "
           f"in {time.perf_counter() - start:.0f} s")
    atomic_write(note, lambda tmp: tmp.write_text(how))
    return model, f"`{LAYOUTS[layout]}` {how}"


def validation(data: str, n: int):
    """``n`` held-out images (n, 3, S, S), labels (n,) and boxes (n, 4), drawn as `vitkit train`'s
    validation split draws them (seed 2; source items disjoint from training)."""
    if data == "cluttered-digits":
        return cluttered_digits(n, "val", canvas=32, align=4, seed=2)
    return boxed_fashion(n, "val", canvas=64, object_size=28, distractor_size=14, seed=2)


BASELINES = ("constant", "blur")
GRADIENT_METHODS = ("grad-rollout", "chefer", "gradcam", *RULES)


def evaluate(model, val, args) -> tuple[list[dict], list[str]]:
    """Every vitkit method that applies and every peer that can run, scored alike."""
    images, boxes = val.images, val.boxes
    rows, left_out = trust.method_table(
        model, images, boxes=boxes, baselines=BASELINES, n_random=args.random,
        steps=args.steps, sanity_images=args.sanity_images,
        progress=lambda m: print(f"  scored {m}", flush=True))
    rows = [{"method": r["method"], "by": "vitkit", **r} for r in rows]
    with torch.no_grad():
        target = model(images).argmax(-1)
    for peer in args.peers:
        reason = peer_maps.applies(peer, model)
        if reason:
            left_out.append(f"{peer} ({reason})")
            continue
        maps, seconds = peer_maps.peer_maps(peer, model, images, target)
        rows.append({"method": peer, "by": peer_maps.library(peer),
                     "seconds_per_image": seconds,
                     **trust.score_maps(model, images, maps, target, boxes=boxes,
                                        baselines=BASELINES, n_random=args.random,
                                        steps=args.steps)})
        print(f"  scored {peer}", flush=True)
    random = torch.rand((len(images), *model.grid_size), generator=torch.Generator().manual_seed(0))
    rows.append({"method": "random", "by": "floor",
                 **trust.score_maps(model, images, random, target, boxes=boxes,
                                    baselines=BASELINES, n_random=args.random,
                                    steps=args.steps)})
    if args.random < 19:  # p = 1/(n + 1) at best: a win at p <= 0.05 needs 19 random maps
        for r in rows:
            r.pop("win_rate", None)
    return rows, left_out


def _best(rows: list[dict], by, key: str, lower: bool) -> tuple[str, float]:
    chosen = [r for r in rows if by(r["by"]) and key in r]
    r = (min if lower else max)(chosen, key=lambda r: r[key])
    return r["method"], r[key]


def summary(results: dict) -> list[dict]:
    """Per model: vitkit's best method and the best peer on each headline score."""
    out = []
    for (data, layout), (acc, rows, _) in results.items():
        row = {"data": data, "layout": layout, "top-1": acc}
        for key, lower in (("deletion_constant", True), ("deletion_blur", True),
                           ("pointing", False), ("mass_in_box", False)):
            ours = _best(rows, lambda b: b == "vitkit", key, lower)
            peers = [r for r in rows if r["by"] not in ("vitkit", "floor")]
            theirs = _best(peers, lambda b: True, key, lower) if peers else ("-", float("nan"))
            ahead = ours[1] < theirs[1] if lower else ours[1] > theirs[1]
            tied = round(ours[1], 3) == round(theirs[1], 3)  # equal as printed
            row[key.replace("_", " ")] = (f"{ours[1]:.3f} {ours[0]} vs {theirs[1]:.3f} "
                                          f"{theirs[0]}" + (" (tie)" if tied else
                                                            "" if ahead else " (behind)"))
        grads = [r for r in rows if r["method"] in GRADIENT_METHODS]
        row["gradient methods passing randomisation"] = (
            f"{sum(r['randomisation'] == 'pass' for r in grads)} of {len(grads)}")
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-only", action="store_true")
    parser.add_argument("--epochs", type=int, default=RECIPE["epochs"])
    parser.add_argument("--eval", type=int, default=60, help="validation images per model")
    parser.add_argument("--steps", type=int, default=8, help="deletion/insertion steps")
    parser.add_argument("--random", type=int, default=10, help="random maps per image")
    parser.add_argument("--sanity-images", type=int, default=16,
                        help="images for the randomisation and class checks")
    parser.add_argument("--peers", default=",".join(peer_maps.PEERS),
                        help="comma-separated peers to run (default: all)")
    parser.add_argument("--chefer-repo", type=Path, default=None,
                        help="a clone of hila-chefer/Transformer-Explainability")
    parser.add_argument("--models", default=None,
                        help="comma-separated checkpoints to score instead of the trained six "
                             "(the benchmark's own test uses a tiny one)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.peers = [p for p in args.peers.split(",") if p]
    peer_maps.CHEFER_REPO = args.chefer_repo
    results, hows = {}, {}
    if args.models:
        models = [("cluttered-digits", Path(p).stem) for p in args.models.split(",")]
    else:
        models = MODELS
    for data, layout in models:
        if args.models:
            model, how = vitkit.load_model(Path(args.models.split(",")[len(hows)])), "given"
        else:
            model, how = trained_model(data, layout, args.epochs)
        model.eval()
        val = validation(data, 500)
        with torch.no_grad():
            acc = (model(val.images).argmax(-1) == val.labels).float().mean().item()
        print(f"{data} {layout}: {how}; validation top-1 {acc:.3f}", flush=True)
        hows[(data, layout)] = how
        if args.train_only:
            continue
        val = validation(data, args.eval)
        rows, left_out = evaluate(model, val, args)
        results[(data, layout)] = (acc, rows, left_out)
    if args.train_only:
        return
    write(results, hows, args)


def write(results: dict, hows: dict, args) -> None:
    lines = [
        "# Where the maps point: two boxed datasets, three layouts, vitkit against the peers",
        "",
        f"Machine: {machine()}.",
        f"Each model scored on {args.eval} held-out images (source items disjoint from "
        f"training). Deletion and insertion: {args.steps} steps, most relevant patch first, the "
        "probability of the predicted class, area under the curve (lower deletion and higher "
        "insertion are more faithful), removed patches filled with a constant (0) or a "
        f"blurred copy. Percentile vs random: the share of {args.random} random maps per image "
        "the method beats on deletion (constant)"
        + ("" if args.random < 19 else "; win rate: the share of images where it beats them at "
           "p <= 0.05") + ". Pointing: the map's top "
        "patch inside the object's box; mass in box: the share of the map's positive mass in "
        "it. Randomisation (vitkit's methods, on the first "
        f"{args.sanity_images} images): the rank correlation with the trained model's map "
        f"after every block is re-initialised, pass below {trust.RANDOMISED_MAX_CORRELATION}. "
        "Peers: captum 0.9 (Integrated Gradients with a zero baseline and 32 steps, "
        "Input x Gradient; pixel attributions summed per patch), pytorch-grad-cam 1.5 (five "
        "CAMs on the last block's first LayerNorm), LXT 2.1's AttnLRP (on the model exported "
        "to Hugging Face's ViT), Chefer et al.'s official transformer_attribution "
        "(hila-chefer/Transformer-Explainability, its own ViT with the same weights, one image "
        "at a time). LXT's seconds are its forward and backward in its own process.",
        "",
        "## Summary: vitkit's best against the best peer",
        "",
        trust.table_markdown(summary(results)),
        "",
    ]
    for (data, layout), (acc, rows, left_out) in results.items():
        lines += [f"## {data}, {layout} ({hows[(data, layout)]}; validation top-1 {acc:.3f})",
                  "", trust.table_markdown(rows), ""]
        if left_out:
            lines += ["Left out: " + "; ".join(left_out) + ".", ""]
    lines += ["![deletion and pointing](explain_boxes.png)", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "explain_boxes.md").write_text("\n".join(lines))
    csv_rows = [{"data": d, "layout": la, **r} for (d, la), (_, rows, _) in results.items()
                for r in rows]
    (args.out / "explain_boxes.csv").write_text(trust.table_csv(csv_rows))
    bars = {}
    for (data, layout), (_, rows, _) in results.items():
        for r in rows:
            bars.setdefault(r["method"], {})[f"{data} {layout}"] = r["deletion_constant"]
    plot.save(plot.figure_grouped_bars(bars, ylabel="deletion AUC (constant), lower is better",
                                       title="every method on every model"),
              args.out / "explain_boxes.png")
    print(f"wrote {args.out / 'explain_boxes.md'}")


if __name__ == "__main__":
    main()
