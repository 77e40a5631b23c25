"""What an audit flags, and how a flag is tested.

A place: where one class's maps (a SpRAy cluster of them, :mod:`vitkit.audit.spray`, or the whole
class) put relevance that the other classes' maps do not. :func:`candidate_region` derives the
region from the data, with no size or shape: the patches whose mean share of relevance exceeds
the other classes' by ``Z`` standard errors, kept when that excess holds at least ``EXCESS`` of
the maps' relevance. Any size, any place, several disjoint parts.

Every candidate is a hypothesis until masking tests it (:func:`examine_region`), each test against
a control so that a large region (a frame) is judged as fairly as a small one:

- needed: filled from its neighbours (ROAD's imputation) on the class's images, the region costs
  the class ``CONFIDENCE_DROP`` more confidence (or ``FLIPPED`` more of its predictions, and
  two standard errors more: :func:`beyond`) than filling the same pixels costs the other
  classes' images in theirs;
- enough: pasted from the class's images onto other classes' images, it turns ``MOVED`` more
  of them (and two standard errors more) to the class than the same pixels pasted from other
  classes' images do;
- the same pixels: the class's images lie at most ``SAME_PIXELS`` as far from their common
  pattern in the region as the other classes' images lie from it (:func:`pixel_variation`, 0
  for a mark stamped alike on each, about 1 for whatever happens to be there).

A finding has the same pixels on the class's images and is needed, enough or both (a stamped
mark that turns other images to the class is a shortcut even where the class's own images are
recognised without it); masking refutes a hypothesis that is neither needed nor enough; the rest
(an object part that is needed and enough but differs from image to image) stay unsettled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vitkit.explain.localisation import box_masks
from vitkit.explain.perturb import noisy_linear_fill

Z = 4.0  # a patch is in the region when the excess is this many standard errors...
EXCESS = 0.1  # ... and the region holds at least this much more of the relevance than elsewhere
CONFIDENCE_DROP = 0.1  # needed: the class loses this much more confidence than the control...
FLIPPED = 0.05  # ... or this much more of its images change their prediction
MOVED = 0.1  # enough: this much more of the other images turn to the class than the control
MIN_CLUSTER = 12  # a cluster smaller than this is too few images to flag (SpRAy's minimum)
SAME_PIXELS = 0.25  # a fixed thing: its images lie a quarter as far from it as the others do
VERDICTS = ("finding", "unsettled", "refuted")


def region(mean_shares: torch.Tensor, mass: float = 0.5) -> torch.Tensor:
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
    """One pattern of the audit: ``kind`` ("region", "outside-box", or a statistic of
    :mod:`vitkit.audit.statistics`: "colour", "texture"), the class it concerns,
    the cluster (None: the whole class), the region (bool (gh, gw), for a place), the evidence
    and what to do, and after testing ``verdict`` (one of ``VERDICTS``) with the measured
    ``effect``. ``members``: the images the pattern was found on; ``found``: what a statistic
    tested (its neutral value or its band of frequencies)."""

    kind: str
    cls: int
    evidence: str
    fix: str
    cluster: int | None = None
    region: torch.Tensor | None = None
    verdict: str | None = None
    effect: dict = field(default_factory=dict)
    members: list[int] = field(default_factory=list)
    found: torch.Tensor | None = None

    @property
    def confirmed(self) -> bool:
        return self.verdict == "finding"

    @property
    def title(self) -> str:
        """What the flag says, one line: the model relies on what, for which class."""
        what = {"region": "a fixed region", "outside-box": "the context outside the object",
                "colour": "the colour, brightness and contrast",
                "texture": "a texture"}[self.kind]
        where = f" (cluster {self.cluster})" if self.cluster is not None else ""
        lead = {"finding": "the model relies on ", "unsettled": "unsettled: the model may "
                "rely on "}.get(self.verdict or "", "refuted: the model relies on ")
        return f"{lead}{what} for class {self.cls}{where}"

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("region", "members", "found")}
        out["confirmed"] = self.confirmed
        out["title"] = self.title
        if self.region is not None:
            out["region"] = self.region.int().tolist()
        return out


def judge(needed: bool, enough: bool, same: bool | None = None) -> str:
    """The verdict of the tests. A place (``same`` measured) is a finding when its pixels are
    the same on the class's images and the model needs it or is moved by it: a stamped thing
    that, pasted, turns other images to the class is a shortcut even where the class's own
    images are also recognised without it. A property of the whole image (no pixel test to
    tell it from the object) must be both needed and enough."""
    if (needed or enough) and (same if same is not None else needed and enough):
        return "finding"
    return "unsettled" if needed or enough else "refuted"


def candidate_region(members: torch.Tensor, others: torch.Tensor) -> torch.Tensor | None:
    """bool (gh, gw): where the maps ``members`` (n, gh, gw, shares) put more relevance than the
    maps ``others`` (m, gh, gw) by ``Z`` standard errors, or None when that region holds less
    than ``EXCESS`` more of the members' relevance than of the others'."""
    if len(members) < 2 or len(others) < 2:
        return None
    diff = members.mean(0) - others.mean(0)
    se = (members.var(0) / len(members) + others.var(0) / len(others)).sqrt()
    r = diff > Z * se.clamp_min(1e-12)
    if not r.any() or diff[r].sum().item() < EXCESS:
        return None
    return r


def region_flag(cls: int, cluster: int | None, members: list[int], member_shares: torch.Tensor,
                other_shares: torch.Tensor) -> Flag | None:
    """A hypothesis about class ``cls`` (one cluster, or all of it when ``cluster`` is None),
    from the maps' shares of its ``members`` and of the other classes' images; None when the
    maps put no more relevance anywhere than the other classes'."""
    r = candidate_region(member_shares, other_shares)
    if r is None:
        return None
    mine = (member_shares.mean(0) * r).sum().item()
    theirs = (other_shares.mean(0) * r).sum().item()
    who = f"cluster {cluster} of class {cls}" if cluster is not None else f"class {cls}"
    return Flag(
        "region", cls, cluster=cluster, region=r, members=members,
        evidence=(f"{who} ({len(members)} images) puts {mine:.0%} of its relevance on "
                  f"{int(r.sum())} patch(es) ({r.float().mean().item():.0%} of the image), where "
                  f"the other classes put {theirs:.0%}"),
        fix=("look at these images for a mark, tag, watermark, frame or border in that region; "
             "remove it from the training data or put it on every class alike, then retrain"))


def pixel_variation(own: torch.Tensor, others: torch.Tensor, region_mask: torch.Tensor) -> float:
    """In [0, 1]: how far the images ``own`` (n, C, H, W) lie from their common pattern in the
    region (their median there), as a share of how far the images ``others`` lie from it: about
    0 for a mark, tag or watermark stamped alike on each (even one that fills part of the
    region, where the rest of it is alike on all images), about 1 (capped) for different things
    that happen to sit there. The absolute difference, averaged over channels and images (so
    that the class's images without the mark count), summed over the region's pixels."""
    px = pixel_mask(region_mask, tuple(own.shape[-2:]))[0, 0]
    pattern = own[:, :, px].median(0).values  # (C, P)

    def distance(x: torch.Tensor) -> float:
        return (x[:, :, px] - pattern).abs().mean((0, 1)).sum().item()

    tiny = 1e-6 * int(px.sum())
    return float(min(1.0, (distance(own) + tiny) / (distance(others) + tiny)))


def pixel_mask(region_mask: torch.Tensor, img_size: tuple[int, int]) -> torch.Tensor:
    """bool (gh, gw) -> bool (1, 1, H, W): the region's patches in pixels."""
    h, w = img_size
    gh, gw = region_mask.shape
    return region_mask.repeat_interleave(h // gh, 0).repeat_interleave(w // gw, 1)[None, None]


def probabilities(model, x: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
    """(n, C, H, W) -> (n, classes) softmax, in batches."""
    if not len(x):
        return torch.empty(0)
    return torch.cat([model(x[i:i + batch_size]).softmax(-1).float()
                      for i in range(0, len(x), batch_size)])


def needed_effect(model, cls: int, own: torch.Tensor, own_changed: torch.Tensor,
                  others: torch.Tensor, others_changed: torch.Tensor) -> dict:
    """What a change costs the class on its images ``own`` (-> ``own_changed``) against what the
    same change costs the other images (-> ``others_changed``) in their own predictions."""
    p, q = probabilities(model, own), probabilities(model, own_changed)
    po, qo = probabilities(model, others), probabilities(model, others_changed)
    pred = po.argmax(-1)
    out = {"images": len(own), "control_images": len(others),
           "confidence_before": p[:, cls].mean().item(),
           "confidence_after": q[:, cls].mean().item(),
           "flipped": ((p.argmax(-1) == cls) & (q.argmax(-1) != cls)).float().mean().item()
           if len(q) else 0.0,  # predicted as the class before the change, not after
           "control_confidence_before": po.gather(1, pred[:, None]).mean().item(),
           "control_confidence_after": qo.gather(1, pred[:, None]).mean().item(),
           "control_flipped": (qo.argmax(-1) != pred).float().mean().item()}
    drop = out["confidence_before"] - out["confidence_after"]
    control = out["control_confidence_before"] - out["control_confidence_after"]
    out["needed"] = bool(drop - control >= CONFIDENCE_DROP
                         or beyond(out["flipped"], len(own), out["control_flipped"],
                                   len(others), FLIPPED))
    return out


def beyond(share: float, n: int, control: float, m: int, margin: float) -> bool:
    """Whether a share of ``n`` images exceeds a control's share of ``m`` by ``margin`` and by
    two standard errors of the difference (so that 2 images of 26 are not a finding)."""
    se = (share * (1 - share) / max(n, 1) + control * (1 - control) / max(m, 1)) ** 0.5
    return share - control >= max(margin, 2 * se)


def enough_effect(model, cls: int, given: torch.Tensor, control: torch.Tensor,
                  before: torch.Tensor) -> dict:
    """The share of other images turned to the class by the class's pattern (``given``) against
    the same change made from other classes' images (``control``); ``before``: unchanged."""
    def to_class(x):
        return (probabilities(model, x).argmax(-1) == cls).float().mean().item()

    out = {"images": len(given), "to_class_before": to_class(before),
           "to_class_after": to_class(given), "to_class_control": to_class(control)}
    out["enough"] = beyond(out["to_class_after"], len(given), out["to_class_control"],
                           len(control), MOVED)
    return out


def donors(images: torch.Tensor, count: int) -> torch.Tensor:
    """(n, C, H, W) -> (count, C, H, W): the images repeated in turn."""
    return images[torch.arange(count) % len(images)]


@torch.no_grad()
def examine_region(model, cls: int, own: torch.Tensor, own_donors: torch.Tensor,
                others: torch.Tensor, region_mask: torch.Tensor) -> tuple[str, dict]:
    """Test a region of class ``cls``: ``own`` (n, C, H, W) the images the pattern was found on,
    ``own_donors`` those of them with the most relevance there (pasted from), ``others`` images
    of other classes (the control and the images pasted onto). Returns the verdict and the
    measured effect."""
    px = pixel_mask(region_mask, tuple(own.shape[-2:]))
    half = len(others) // 2
    control_donors, targets = others[:half], others[half:]
    removed = needed_effect(
        model, cls, own, noisy_linear_fill(own, px.expand(len(own), 1, -1, -1)),
        targets, noisy_linear_fill(targets, px.expand(len(targets), 1, -1, -1)))
    added = enough_effect(model, cls,
                          torch.where(px, donors(own_donors, len(targets)), targets),
                          torch.where(px, donors(control_donors, len(targets)), targets),
                          targets)
    variation = pixel_variation(own, others, region_mask)
    same = variation <= SAME_PIXELS
    effect = {"removed": removed, "added": added, "pixel_variation": variation, "same": same}
    return judge(removed["needed"], added["enough"], same), effect


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
            p = probabilities(model, imgs, batch_size)
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
                 or drop(own, "accuracy") - drop(rest, "accuracy") >= FLIPPED)
    return bool(confirmed), effect
