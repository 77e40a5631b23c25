"""Maps per second for ViT-B/16 on this machine: every vitkit explanation method against the
peers on the same model and images, and each as a multiple of one forward plus backward.

Usage: python benchmarks/explain_speed.py [--model vit_base_patch16_224] [--batch 4]
       [--repeats 3] [--chefer-repo DIR] [--out benchmarks/results/explain_speed.md]
The model has random weights (seeded; nothing is downloaded): the cost of a map does not depend
on what the weights learned. The images are scikit-learn's two sample photos and their mirror
images, cropped to the model's size. vitkit's methods and the peers that run in this process
(captum's Integrated Gradients with 32 steps and Input x Gradient, pytorch-grad-cam's Grad-CAM)
are timed interleaved, round by round (``vitkit.models.bench.interleaved``), the median
reported. LXT patches Hugging Face's classes, so its AttnLRP runs in its own process on the
model exported to that layout and times one call there after a warm-up forward; Chefer's
official code, where a clone is given, explains one image at a time and is timed once.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import peer_maps
import torch
import torch.nn.functional as F

import vitkit
from vitkit.explain import explain_map
from vitkit.explain.registry import applicable
from vitkit.models.bench import interleaved, machine

RESULTS = Path(__file__).parent / "results"
IN_PROCESS_PEERS = ("captum-ig", "captum-ixg", "grad-cam:GradCAM")


def photos(n: int, side: int) -> torch.Tensor:
    """(n, 3, side, side): scikit-learn's sample photos and their mirror images, centre-cropped,
    resized and normalised with ImageNet's mean and std."""
    from sklearn.datasets import load_sample_images

    out = []
    for img in load_sample_images().images:
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).permute(2, 0, 1)
        s = min(x.shape[1:])
        top, left = (x.shape[1] - s) // 2, (x.shape[2] - s) // 2
        x = F.interpolate(x[None, :, top:top + s, left:left + s], size=(side, side),
                          mode="bilinear", antialias=True, align_corners=False)[0]
        out += [x, x.flip(-1)]
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    return ((torch.stack(out * (n // len(out) + 1))[:n]) - mean) / std


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chefer-repo", type=Path, default=None,
                        help="a clone of hila-chefer/Transformer-Explainability")
    parser.add_argument("--out", type=Path, default=RESULTS / "explain_speed.md")
    args = parser.parse_args()
    peer_maps.CHEFER_REPO = args.chefer_repo
    torch.manual_seed(0)
    model = vitkit.create_model(args.model).eval()
    images = photos(args.batch, model.cfg.img_size[0])
    with torch.no_grad():
        target = model(images).argmax(-1)

    def forward_backward():
        x = images.clone().requires_grad_(True)
        model(x).gather(1, target[:, None]).sum().backward()
        model.zero_grad(set_to_none=True)

    fns = {"forward + backward": forward_backward}
    for method in applicable(model.cfg):
        fns[method] = lambda m=method: explain_map(model, images, m)
    for peer in IN_PROCESS_PEERS:
        fns[peer] = lambda p=peer: peer_maps.peer_maps(p, model, images, target)
    times = {k: statistics.median(v) for k, v in
             interleaved(fns, repeats=args.repeats, desc="explaining").items()}
    once = {}
    for peer in ("lxt-attnlrp", "chefer-official"):
        reason = peer_maps.applies(peer, model)
        if reason:
            once[peer] = reason
            continue
        print(f"timing {peer}", flush=True)
        _, per_image = peer_maps.peer_maps(peer, model, images, target)
        times[peer] = per_image * len(images)
    base = times["forward + backward"]
    rows = []
    for name, seconds in times.items():
        by = ("reference" if name == "forward + backward" else
              "vitkit" if name in fns and name not in IN_PROCESS_PEERS else
              peer_maps.library(name))
        rows.append(f"| {name} | {by} | {seconds:.3f} | {len(images) / seconds:.2f} | "
                    f"{seconds / base:.2f} |")
    lines = [
        "# Maps per second",
        "",
        f"Machine: {machine()}.",
        f"Model: {args.model} (random weights, seeded), {args.batch} images per call, "
        f"median of {args.repeats} interleaved rounds after a warm-up.",
        "",
        "| method | by | seconds per batch | maps per second | x forward + backward |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
    if once:
        lines += ["Not timed: " + "; ".join(f"{k} ({v})" for k, v in once.items()) + ".", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
