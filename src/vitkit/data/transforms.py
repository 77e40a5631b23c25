"""Training and evaluation transforms (torchvision transforms v2), seeded per sample.

Every random choice for sample ``i`` in epoch ``e`` comes from a generator seeded with
(seed, e, i), whatever process or worker draws it: a run resumed mid-epoch, or split over
several processes, sees exactly the augmentations of an uninterrupted single-process run.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2

from vitkit.data.images import Preprocess


def train_transform(img_size: int, mean, std, *, crop_scale: float = 0.08, hflip: bool = True,
                    randaugment: int = 0, random_erasing: float = 0.0) -> v2.Compose:
    """RandomResizedCrop (scale ``crop_scale``..1), flip, RandAugment (magnitude
    ``randaugment``, 0 = off), to float, normalise, random erasing (probability)."""
    steps: list = [v2.RandomResizedCrop(img_size, scale=(crop_scale, 1.0), antialias=True)]
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    if randaugment:
        steps.append(v2.RandAugment(num_ops=2, magnitude=randaugment))
    steps += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)]
    if random_erasing:
        steps.append(v2.RandomErasing(p=random_erasing, value=0))
    return v2.Compose(steps)


def eval_transform(img_size: int, mean, std) -> Preprocess:
    """The preprocessing of every command (:func:`vitkit.data.images.preprocess`): bicubic
    resize covering ``img_size``, centre crop, to float, normalise."""
    return Preprocess(img_size, mean, std)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed that differs for every (seed, epoch, index)."""
    return (seed * 1_000_003 + epoch * 998_244_353 + index * 2_654_435_761) % (2**63 - 1)


class Transformed(Dataset):
    """``base[i]`` with ``transform`` applied under a generator seeded by (seed, epoch, i)."""

    def __init__(self, base, transform, seed: int = 0) -> None:
        self.base, self.transform, self.seed, self.epoch = base, transform, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        img, label = self.base[i]
        with torch.random.fork_rng(devices=[]):
            # the CPU generator only (the transforms draw from it): torch.manual_seed would
            # also queue a lazy seed of every accelerator, capturing a stack trace each call
            # (1.7 ms a sample on a CUDA build without a GPU, half of a small run's time)
            torch.default_generator.manual_seed(sample_seed(self.seed, self.epoch, i))
            return self.transform(img), label
