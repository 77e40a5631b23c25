"""The training configuration: one dataclass, three recipes, YAML files and command-line flags.

Precedence, lowest first: the dataclass defaults, the ``recipe`` preset, a YAML ``config`` file,
then flags given on the command line. The effective configuration is saved with every run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path

import yaml


@dataclass
class TrainConfig:
    # what to train, on what
    model: str = "vit_micro_patch4_32"  # a vitkit name, or a torchvision CNN (resnet18, ...)
    data: str = "digits"  # digits | cluttered-digits | imagefolder:PATH | cifar10 | cifar100
    img_size: int = 32
    patch_size: int = 0  # > 0: override the ViT's patch size (from scratch only)
    init: str | None = None  # fine-tune from any checkpoint vitkit loads
    recipe: str = "plain"  # plain | deit | finetune
    data_size: int = 6000  # cluttered-digits training images
    data_fraction: float = 1.0  # train on this share of the training split (nested by seed)
    val_fraction: float = 0.2  # image folders without train/ and val/
    data_root: str = "data"  # where cifar10/cifar100 live
    download: bool = False  # let torchvision download CIFAR (needs the network)
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # optimisation
    epochs: int = 10
    steps: int = 0  # > 0: train exactly this many optimizer steps (epochs follow from it)
    batch_size: int = 64  # per process
    accum_steps: int = 1
    lr: float = 5e-4  # at a global batch of 512; scaled by global batch / 512
    min_lr: float = 1e-6
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    clip_grad: float = 0.0  # max gradient norm; 0 = off
    layer_decay: float = 1.0  # < 1: layer-wise lr decay for fine-tuning ViTs
    ema_decay: float = 0.0  # > 0: keep and evaluate an EMA of the weights
    # regularisation and augmentation
    label_smoothing: float = 0.0
    drop_path: float = 0.0
    crop_scale: float = 1.0  # RandomResizedCrop minimum scale; 1.0 = plain resize
    hflip: bool = False
    randaugment: int = 0  # RandAugment magnitude; 0 = off
    mixup: float = 0.0  # MixUp alpha; 0 = off
    cutmix: float = 0.0  # CutMix alpha; 0 = off
    mix_switch_prob: float = 0.5  # with both on: chance of CutMix
    random_erasing: float = 0.0
    # distillation (DeiT)
    distill: str | None = None  # hard | soft
    teacher: str | None = None  # a checkpoint, or a torchvision CNN name with weights in init
    distill_alpha: float = 0.5
    distill_tau: float = 1.0
    # machinery
    seed: int = 0
    workers: int = 0
    device: str = "auto"  # auto | cpu | cuda
    compile: bool = False
    grad_checkpointing: bool = False  # ViTs: recompute blocks in backward, less memory
    checkpoint_every: int = 0  # also save resumable state every N steps; 0 = each epoch
    eval_every: int = 1  # evaluate (and save) every N epochs, and after the last
    out: str = "runs"
    name: str | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d


RECIPES: dict[str, dict] = {
    "plain": {},
    # DeiT (Touvron et al. 2021), from scratch
    "deit": dict(lr=5e-4, weight_decay=0.05, warmup_epochs=5, label_smoothing=0.1,
                 drop_path=0.1, crop_scale=0.08, hflip=True, randaugment=9, mixup=0.8,
                 cutmix=1.0, mix_switch_prob=0.5, random_erasing=0.25, clip_grad=0.0),
    # fine-tuning a pre-trained checkpoint: smaller lr, lighter augmentation
    "finetune": dict(lr=1e-4, weight_decay=0.05, warmup_epochs=1, label_smoothing=0.1,
                     drop_path=0.1, crop_scale=0.5, hflip=True, clip_grad=1.0),
}


def field_types() -> dict[str, type]:
    """Field name -> the scalar type a command-line value converts to."""
    out = {}
    for f in fields(TrainConfig):
        t = str(f.type)
        out[f.name] = (bool if "bool" in t else int if t.startswith("int") else
                       float if t.startswith("float") else tuple if "tuple" in t else str)
    return out


def resolve(overrides: dict, config_file: str | None = None) -> TrainConfig:
    """Defaults < recipe < YAML file < ``overrides`` (the flags the user gave)."""
    from_file: dict = {}
    if config_file:
        loaded = yaml.safe_load(Path(config_file).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{config_file} must hold a mapping of option: value")
        from_file = {k.replace("-", "_"): v for k, v in loaded.items()}
    names = {f.name for f in fields(TrainConfig)}
    unknown = sorted((set(from_file) | set(overrides)) - names)
    if unknown:
        raise ValueError(f"unknown training option(s): {', '.join(unknown)}; see "
                         "`vitkit train --help`")
    recipe = overrides.get("recipe", from_file.get("recipe", "plain"))
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    merged = {**RECIPES[recipe], **from_file, **overrides, "recipe": recipe}
    for key in ("mean", "std"):
        if key in merged:
            merged[key] = tuple(float(v) for v in merged[key])
    cfg = TrainConfig(**merged)
    if cfg.distill not in (None, "hard", "soft"):
        raise ValueError(f"distill must be 'hard' or 'soft', got {cfg.distill!r}")
    if cfg.distill and not cfg.teacher:
        raise ValueError("distillation needs --teacher (a checkpoint of a trained CNN or ViT)")
    return cfg


def save(cfg: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def load(path: str | Path) -> TrainConfig:
    return resolve({}, str(path))
