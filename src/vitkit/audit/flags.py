"""What an audit flags, and how a flag is confirmed.

A cluster of one class's maps (:mod:`vitkit.audit.spray`) is suspicious when its relevance sits
on a small region (at most ``SMALL_REGION`` of the patches hold half its mean map) where the
other classes put little (at most ``ELSEWHERE_MAX``). Such a pattern is a hypothesis until
masking confirms it (:func:`confirm_region`): the region is needed (filled from its neighbours
on the class's images, it costs the class confidence or accuracy), enough (pasted onto other
classes' images, it moves their predictions to the class) and the same on the cluster's images
(:func:`pixel_sameness`). An object that happens to sit in one place for a cluster can be
needed and enough, but its pixels differ from image to image; a stamped mark's do not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vitkit.explain.localisation import box_masks
from vitkit.explain.perturb import noisy_linear_fill

SMALL_REGION = 0.1  # a region of at most this share of the patches is small
REGION_MASS = 0.5  # a cluster's region: the fewest top patches holding this share of its map
ELSEWHERE_MAX = 0.25  # the other clusters' share in the region, at most
CONFIDENCE_DROP = 0.1  # confirmed: the class's mean confidence falls at least this much...
ACCURACY_DROP = 0.05  # ... or its accuracy this much ...
MOVED = 0.1  # ... and pasting the region moves this share of other images to the class
MIN_CLUSTER = 12  # a cluster smaller than this is too few images to flag (SpRAy's minimum)
SAME_PIXELS = 0.15  # a fixed thing: the cluster's pixels in the region stay this close to their
# median pattern (median deviation / the pattern's own contrast); a moving object's do not


def region(mean_shares: torch.Tensor, mass: float = REGION_MASS) -> torch.Tensor:
    """bool (gh, gw): the fewest patches of ``mean_shares`` (gh, gw, summing to 1) that hold
    ``mass`` of it."""
    flat = mean_shares.flatten()
    order = flat.argsort(descending=True)
    count = int((flat[order].cumsum(0) < mass).sum().item()) + 1
    out = torch.zeros_like(flat, dtype=torch.bool)
    out[order[:count]] = True
    return out.reshape(mean_shares.shape)


@dataclass
class Flag:
    """One finding of the audit: ``kind`` ("fixed-region", "outside-box", "border"), the class
    it concerns, the cluster (for a fixed region), the region (bool (gh, gw)), the evidence and
    what to do, and after masking ``confirmed`` with the measured ``effect``."""

    kind: str
    cls: int
    evidence: str
    fix: str
    cluster: int | None = None
    region: torch.Tensor | None = None
    confirmed: bool | None = None
    effect: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "region"}
        if self.region is not None:
            out["region"] = self.region.int().tolist()
        return out


def fixed_region_flags(cls: int, cluster_maps: list[torch.Tensor], elsewhere: torch.Tensor,
                       sizes: list[int] | None = None) -> list[Flag]:
    """The clusters of class ``cls`` (their mean shares, each (gh, gw); ``sizes`` their image
    counts, below ``MIN_CLUSTER`` not flagged) whose relevance sits on a small region that the
    other classes (``elsewhere``, their mean shares) leave alone. Clusters that share a region
    (it holds half of each) are one flag, named by the largest."""
    flags: list[Flag] = []
    for k, mean in enumerate(cluster_maps):
        if sizes is not None and sizes[k] < MIN_CLUSTER:
            continue
        r = region(mean)
        size = r.float().mean().item()
        if size > SMALL_REGION:
            continue
        there = (elsewhere * r).sum().item()
        if there > ELSEWHERE_MAX:
            continue
        same = next((f for f in flags if (cluster_maps[f.cluster] * r).sum().item()
                     >= REGION_MASS and (mean * f.region).sum().item() >= REGION_MASS), None)
        if same is not None:
            same.effect.setdefault("clusters", [same.cluster]).append(k)
            continue
        flags.append(Flag(
            "fixed-region", cls,
            evidence=(f"cluster {k} of class {cls} puts {REGION_MASS:.0%} of its relevance on "
                      f"{int(r.sum())} patch(es) ({size:.0%} of the image), where the other "
                      f"classes put {there:.0%}"),
            fix=("look at the cluster's images for a mark, tag, watermark or border in that "
                 "region; remove it from the training data or augment it away, then retrain"),
            cluster=k, region=r))
    return flags


def pixel_sameness(images: torch.Tensor, region_mask: torch.Tensor) -> float:
    """How much the cluster's images (n, C, H, W) differ in the region from their median
    pattern there, relative to that pattern's own contrast (the median over images): about 0
    for a mark, tag or watermark stamped alike on each, larger for different objects that
    happen to sit there."""
    px = pixel_mask(region_mask, tuple(images.shape[-2:]))[0, 0]
    x = images[:, :, px]  # (n, C, P)
    pattern = x.median(0).values  # (C, P)
    contrast = (pattern - pattern.mean()).abs().mean().clamp_min(1e-6)
    deviation = (x - pattern).abs().mean((1, 2))  # (n,)
    return (deviation.median() / contrast).item()


def pixel_mask(region_mask: torch.Tensor, img_size: tuple[int, int]) -> torch.Tensor:
    """bool (gh, gw) -> bool (1, 1, H, W): the region's patches in pixels."""
    h, w = img_size
    gh, gw = region_mask.shape
    return region_mask.repeat_interleave(h // gh, 0).repeat_interleave(w // gw, 1)[None, None]


@torch.no_grad()
def confirm_region(model, cls: int, class_images: torch.Tensor, class_labels: torch.Tensor,
                   donor: torch.Tensor, other_images: torch.Tensor, region_mask: torch.Tensor,
                   batch_size: int = 128) -> tuple[bool, dict]:
    """Mask the region on the class's images (filled from its neighbours, ROAD's imputation)
    and paste it from ``donor`` (C, H, W), a typical image of the cluster, onto other classes'
    images; confirmed when the class loses ``CONFIDENCE_DROP`` confidence or ``ACCURACY_DROP``
    accuracy and ``MOVED`` of the other images turn to the class."""
    px = pixel_mask(region_mask, tuple(class_images.shape[-2:]))

    def probs(x):
        return torch.cat([model(x[i:i + batch_size]).softmax(-1)
                          for i in range(0, len(x), batch_size)]) if len(x) else torch.empty(0)

    effect: dict = {}
    if len(class_images):
        before = probs(class_images)
        after = probs(noisy_linear_fill(class_images, px.expand(len(class_images), 1, -1, -1)))
        effect["removed"] = {
            "images": len(class_images),
            "confidence_before": before[:, cls].mean().item(),
            "confidence_after": after[:, cls].mean().item(),
            "accuracy_before": (before.argmax(-1) == class_labels).float().mean().item(),
            "accuracy_after": (after.argmax(-1) == class_labels).float().mean().item()}
    if len(other_images):
        pasted = torch.where(px, donor[None], other_images)
        effect["added"] = {
            "images": len(other_images),
            "to_class_before": (probs(other_images).argmax(-1) == cls).float().mean().item(),
            "to_class_after": (probs(pasted).argmax(-1) == cls).float().mean().item()}
    r, a = effect.get("removed"), effect.get("added")
    needed = bool(r and (r["confidence_before"] - r["confidence_after"] >= CONFIDENCE_DROP
                         or r["accuracy_before"] - r["accuracy_after"] >= ACCURACY_DROP))
    enough = bool(a and a["to_class_after"] - a["to_class_before"] >= MOVED)
    return needed and enough, effect


OUTSIDE = 0.4  # an image looks outside its box when less than this share of its map is inside
OUTSIDE_SHARE = 0.5  # a class is flagged when this share of its images looks outside


def outside_box_flag(cls: int, in_box: np.ndarray) -> Flag | None:
    """A flag for class ``cls`` when at least ``OUTSIDE_SHARE`` of its images (``in_box``, the
    share of each image's relevance inside its object's box) put most relevance outside."""
    outside = float((in_box < OUTSIDE).mean()) if len(in_box) else 0.0
    if outside < OUTSIDE_SHARE:
        return None
    return Flag(
        "outside-box", cls,
        evidence=(f"{outside:.0%} of the images predicted as class {cls} put more than "
                  f"{1 - OUTSIDE:.0%} of their relevance outside the object's box (median share "
                  f"inside {float(np.median(in_box)):.0%})"),
        fix=(f"the model may use the background or the context of class {cls}: vary the "
             "backgrounds across classes, or crop to the object, then retrain"),
        effect={"outside_share": outside, "median_in_box": float(np.median(in_box))})


def box_pixels(boxes: torch.Tensor, img_size: tuple[int, int]) -> torch.Tensor:
    """(n, 4) pixel boxes (x0, y0, x1, y1) -> bool (n, 1, H, W), True inside each box."""
    return box_masks(boxes, img_size)[:, None]


@torch.no_grad()
def confirm_outside_box(model, cls: int, class_images: torch.Tensor, class_labels: torch.Tensor,
                        class_boxes: torch.Tensor, other_images: torch.Tensor,
                        other_labels: torch.Tensor, other_boxes: torch.Tensor,
                        batch_size: int = 128) -> tuple[bool, dict]:
    """Fill everything outside each image's box (ROAD's imputation) on the class's images and,
    as the control, on the other classes' images (whose maps sit in their boxes); confirmed when
    the class loses ``CONFIDENCE_DROP`` more confidence in its label, or ``ACCURACY_DROP`` more
    accuracy, than the others do: the context carried the class."""

    def measure(x, labels, boxes):
        if not len(x):
            return None
        size = tuple(x.shape[-2:])
        filled = noisy_linear_fill(x, ~box_pixels(boxes, size))
        out = {}
        for name, imgs in (("before", x), ("after", filled)):
            p = torch.cat([model(imgs[i:i + batch_size]).softmax(-1)
                           for i in range(0, len(imgs), batch_size)])
            out[f"confidence_{name}"] = p.gather(1, labels[:, None].long()).mean().item()
            out[f"accuracy_{name}"] = (p.argmax(-1) == labels).float().mean().item()
        out["images"] = len(x)
        return out

    own = measure(class_images, class_labels, class_boxes)
    rest = measure(other_images, other_labels, other_boxes)
    effect = {"context_removed": own, "control": rest}
    if own is None or rest is None:
        return False, effect

    def drop(m, key):
        return m[f"{key}_before"] - m[f"{key}_after"]

    confirmed = (drop(own, "confidence") - drop(rest, "confidence") >= CONFIDENCE_DROP
                 or drop(own, "accuracy") - drop(rest, "accuracy") >= ACCURACY_DROP)
    return bool(confirmed), effect
