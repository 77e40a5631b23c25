"""Shortcuts that are not a place: a property of the whole image that one class carries (a
colour cast, a brightness or contrast shift, a texture), tested by intervention.

Each statistic in ``STATISTICS`` finds its hypothesis in the data (``find``: None when the class
shows nothing to test), neutralises it on an image and imposes it from a donor. For a class,
:func:`examine_statistic` measures, as the masking tests of :mod:`vitkit.audit.flags` do and
against the same kind of control:

- needed: neutralising it on the class's images costs the class ``CONFIDENCE_DROP`` more
  confidence (or ``FLIPPED`` more predictions) than neutralising it on the other classes'
  images costs them;
- enough: imposing it from the class's images on other classes' images turns ``MOVED`` more of
  them to the class than imposing it from another class's images does.

The statistics:

- colour: each channel's mean and standard deviation (a colour cast, a brightness or contrast
  shift; 2 numbers a channel, no layout): neutralised to the other classes' median, imposed
  from a donor;
- texture: the frequencies where the class's images have more power than the others' (their
  share of each image's power spectrum, compared as the maps' shares are compared for a place:
  :func:`vitkit.audit.flags.candidate_region`); neutralised by removing those frequencies,
  imposed by adding a donor's. A texture is stationary (a grating, a grain, a weave): its band
  covers the image (:func:`band_spread` at least ``SPREAD``), where an object's frequencies sit
  on the object; a band that is needed and enough but covers less stays unsettled.

Images are the model's input tensors (N, C, H, W), normalised; every statistic is computed
there, so it does not depend on the normalisation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vitkit.audit.flags import (
    Flag,
    candidate_region,
    donors,
    enough_effect,
    judge,
    needed_effect,
    probabilities,
)


def _levels(x: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, C, 1, 2): each channel's mean and standard deviation."""
    return torch.cat([x.mean((2, 3), keepdim=True),
                      x.std((2, 3), keepdim=True).clamp_min(1e-6)], 3)


def _set_levels(x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """``x`` with each channel shifted and scaled to ``levels`` (N or 1, C, 1, 2)."""
    now = _levels(x)
    return (x - now[..., :1]) / now[..., 1:] * levels[..., 1:] + levels[..., :1]


def power_shares(x: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, H, W // 2 + 1): each image's power spectrum (summed over channels,
    the mean removed) as shares of its total."""
    p = torch.fft.rfft2(x - x.mean((2, 3), keepdim=True)).abs().pow(2).sum(1)
    return p / p.flatten(1).sum(1).clamp_min(1e-12)[:, None, None]


def _band(x: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """The part of ``x`` at the frequencies ``bins`` (bool (H, W // 2 + 1))."""
    return torch.fft.irfft2(torch.fft.rfft2(x) * bins, s=x.shape[-2:])


@dataclass(frozen=True)
class Statistic:
    """``find(own, others)``: what to test (a value or a band), or None; ``neutralise(x,
    found)`` and ``impose(x, donors, found)`` -> images; words for the report."""

    find: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]
    neutralise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    impose: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    what: str
    fix: str


STATISTICS: dict[str, Statistic] = {
    "colour": Statistic(
        lambda own, others: _levels(others).median(0, keepdim=True).values,
        _set_levels,
        lambda x, d, found: _set_levels(x, _levels(d)),
        "the colour, brightness and contrast (each channel's mean and spread)",
        "the class's images have a colour, brightness or contrast of their own (a cast, a "
        "lighting, a camera, an exposure): make them alike across classes (or augment colour "
        "and brightness), then retrain"),
    "texture": Statistic(
        lambda own, others: candidate_region(power_shares(own), power_shares(others)),
        lambda x, bins: x - _band(x, bins),
        lambda x, d, bins: x - _band(x, bins) + _band(d, bins),
        "a texture (frequencies where its images have more power than the other classes')",
        "the class's images have a texture, grain, weave or noise of their own (a scanner, a "
        "compression, a background): make it alike across classes (or augment noise and "
        "blur), then retrain"),
}


@torch.no_grad()
def examine_statistic(model, name: str, cls: int, own: torch.Tensor, others: torch.Tensor
                      ) -> tuple[str, dict, torch.Tensor] | None:
    """Test whether class ``cls`` rests on the statistic ``name``: ``own`` (n, C, H, W) images
    predicted as the class, ``others`` (m, C, H, W) images predicted as another (half the
    control donors, half the images imposed on). Returns the verdict, the effect and what was
    tested (a value or a band of frequencies), or None when the data shows nothing to test."""
    stat = STATISTICS[name]
    found = stat.find(own, others)
    if found is None:
        return None
    half = len(others) // 2
    control_donors, targets = others[:half], others[half:]
    removed = needed_effect(model, cls, own, stat.neutralise(own, found),
                            targets, stat.neutralise(targets, found))
    added = enough_effect(
        model, cls, stat.impose(targets, donors(own, len(targets)), found),
        stat.impose(targets, donors(control_donors, len(targets)), found), targets)
    effect = {"removed": removed, "added": added}
    verdict = judge(removed["needed"], added["enough"])
    if found.dtype == torch.bool:  # a band: a texture covers the image, an object's edges don't
        effect["frequencies"] = int(found.sum())
        effect["band_spread"] = band_spread(own, found)
        if verdict == "finding" and effect["band_spread"] < SPREAD:
            verdict = "unsettled"
    return verdict, effect, found


SPREAD = 0.75  # a texture's band fills at least three quarters of the image's patches


def band_spread(x: torch.Tensor, bins: torch.Tensor, grid: int = 8) -> float:
    """How evenly the band's energy covers each image, in (0, 1]: the perplexity of its share
    per cell of a ``grid`` x ``grid`` division over the number of cells, the median over the
    images (1: a stationary texture, evenly everywhere; a quarter: an object's edges, in the
    quarter of the image where the object is)."""
    energy = _band(x, bins).pow(2).sum(1, keepdim=True)  # (N, 1, H, W)
    cells = torch.nn.functional.adaptive_avg_pool2d(energy, grid).flatten(1)
    p = cells / cells.sum(1, keepdim=True).clamp_min(1e-12)
    perplexity = torch.exp(-(p * p.clamp_min(1e-12).log()).sum(1))
    return (perplexity / p.shape[1]).median().item()


@torch.no_grad()
def neutralised_drop(model, name: str, classes: torch.Tensor, images: torch.Tensor,
                     found: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
    """(n,) the confidence in its class (``classes``, (n,) one per image, e.g. its prediction)
    each of ``images`` (n, 3, H, W) loses when the statistic is neutralised: how much its
    prediction rests on it."""
    changed = STATISTICS[name].neutralise(images, found)
    column = classes.long()[:, None]
    before = probabilities(model, images, batch_size).gather(1, column)[:, 0]
    after = probabilities(model, changed, batch_size).gather(1, column)[:, 0]
    return (before - after).clamp_min(0)


def statistic_flag(name: str, cls: int, members: list[int]) -> Flag:
    stat = STATISTICS[name]
    return Flag(name, cls, members=members,
                evidence=f"class {cls}'s predictions may rest on {stat.what}", fix=stat.fix)
