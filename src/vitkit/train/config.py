"""The training configuration: one dataclass, three recipes, YAML files and command-line flags.

Precedence, lowest first: the dataclass defaults, the ``recipe`` preset, a YAML ``config`` file,
then flags given on the command line. The effective configuration is saved with every run.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from vitkit.errors import ConfigError
from vitkit.models.cnn import is_cnn
from vitkit.recipe import DEFAULT_BATCH_SIZE, DEFAULT_LR
from vitkit.train.adapt import LORA_TARGETS, cnn_refusal, lora_targets
from vitkit.util.files import atomic_write
from vitkit.util.numbers import check_number


@dataclass
class TrainConfig:
    # what to train, on what
    model: str = "vit_micro_patch4_32"  # a vitkit name, or a torchvision CNN (resnet18, ...)
    # a spec of vitkit.data.datasets.DATASETS (CLASSES: 5,6,7 or 0-4; relabelled 0..k-1)
    data: str = "digits"
    img_size: int = 32
    patch_size: int = 0  # > 0: override the ViT's patch size (from scratch only)
    init: str | None = None  # fine-tune from any checkpoint vitkit loads
    # train part of the model (vitkit.train.adapt): "backbone" (only the head learns) or N
    # (the embeddings and the first N blocks stay fixed); or LoRA adapters of rank > 0 on the
    # blocks' linears (qkv, proj, fc1, fc2), merged into the weights in every checkpoint
    freeze: str = ""
    lora_rank: int = 0
    lora_targets: str = "qkv,proj,fc1,fc2"
    lora_alpha: float = 0.0  # LoRA's scale is alpha / rank; 0: alpha = rank (a scale of 1)
    lora_dropout: float = 0.0  # dropout on the adapters' input
    recipe: str = "plain"  # plain | deit | finetune
    # classify: labels and cross-entropy; mae: masked-image pre-training without labels (the
    # ViT's encoder is saved, the decoder dropped: fine-tune it with --init)
    objective: str = "classify"
    mask_ratio: float = 0.75  # mae: the share of patches hidden from the encoder
    data_size: int = 6000  # cluttered-digits training images
    data_fraction: float = 1.0  # train on this share of the training split (nested by seed)
    val_fraction: float = 0.2  # image folders without train/ and val/
    data_root: str = "data"  # where cifar10/cifar100/fashion-mnist/mnist are
    download: bool = False  # let torchvision download CIFAR (needs the network)
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # optimisation
    epochs: int = 10
    steps: int = 0  # > 0: train exactly this many optimizer steps (epochs follow from it)
    batch_size: int = DEFAULT_BATCH_SIZE  # per process
    accum_steps: int = 1
    lr: float = DEFAULT_LR  # at a global batch of 512; scaled by global batch / 512
    min_lr: float = 1e-6
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    warmup_steps: int = 0  # > 0: linear warmup over this many optimizer steps (not epochs)
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
    # early stopping: > 0 stops once the validation loss has not improved for this many
    # evaluations (--epochs / --steps is then the maximum; best.safetensors is the lowest loss)
    patience: int = 0
    # > 0 (with --patience): once patience runs out, train this many more epochs with the
    # learning rate decayed from its current value to --min-lr (cosine), instead of stopping
    # mid-schedule; best.safetensors stays the lowest validation loss of the whole run
    anneal_epochs: int = 0
    # > 0: hold out this share of the training split (the same images for every seed and
    # --data-fraction) to pick the best epoch and stop on; the validation split is then
    # evaluated once, on the best checkpoint (result.json), and never used to choose
    holdout: float = 0.0
    out: str = "runs"
    name: str | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d


FROM_INIT = "(from --init)"  # the model of a run whose --init checkpoint sets the architecture

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


# Lower bounds of numeric options (inclusive); everything else numeric may be any number >= 0.
_AT_LEAST_ONE = ("img_size", "epochs", "batch_size", "accum_steps", "data_size", "eval_every")
_FRACTIONS = ("data_fraction", "val_fraction", "holdout", "mix_switch_prob", "random_erasing",
              "drop_path", "crop_scale", "distill_alpha", "mask_ratio", "lora_dropout")
OBJECTIVES = ("classify", "mae")


def _convert(key: str, value, kind: type, where: str):
    """``value`` as option ``key``'s type; a :class:`ConfigError` naming both otherwise."""
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{where}: {key} = {value!r} is not {expected}; e.g. "
                           f"{key.replace('_', '-')}: {_example(kind)}")

    if value is None:
        if kind is str:  # optional text options (init, teacher, distill, name)
            return None
        raise bad(_expected(kind))
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
        raise bad("true or false")
    if kind is int:
        if isinstance(value, bool):
            raise bad("a whole number")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise bad("a whole number")
    if kind is float:
        if isinstance(value, bool):
            raise bad("a number")
        try:
            return float(value)  # PyYAML reads 5e-4 (no dot) as the string "5e-4"
        except (TypeError, ValueError):
            raise bad("a number") from None
    if kind is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != 3:
            raise bad("a list of three numbers")
        return tuple(_convert(key, v, float, where) for v in value)
    if key == "freeze" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # YAML reads `freeze: 4` as a number
    if not isinstance(value, str):
        raise bad("text")
    return value


def _expected(kind: type) -> str:
    return {bool: "true or false", int: "a whole number", float: "a number",
            tuple: "a list of three numbers"}.get(kind, "text")


def _example(kind: type) -> str:
    return {bool: "true", int: "3", float: "5.0e-4", tuple: "[0.5, 0.5, 0.5]"}.get(kind, "name")


def read_config_file(config_file: str | os.PathLike) -> dict:
    """The options in a YAML file, names normalised (``batch-size`` -> ``batch_size``)."""
    path = Path(config_file)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist" if not path.exists() else
                          f"config {path} is a folder; expected a YAML file of option: value")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}".replace("\n", " ")) from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not a text file ({err})") from err
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping of option: value, got "
                          f"{type(loaded).__name__}")
    return {str(k).replace("-", "_"): v for k, v in loaded.items()}


def resolve(overrides: dict, config_file: str | os.PathLike | None = None) -> TrainConfig:
    """Defaults < recipe < YAML file < ``overrides`` (the flags the user gave).

    Every value is checked against its option's type (and converted where YAML read a number as
    text, e.g. ``lr: 5e-4``) before anything is loaded; a wrong name, type or range is a
    :class:`~vitkit.errors.ConfigError` naming the key, the value and what was expected.
    """
    from_file = read_config_file(config_file) if config_file else {}
    names = {f.name for f in fields(TrainConfig)}
    unknown = sorted((set(from_file) | set(overrides)) - names)
    if unknown:
        where = f"in {config_file}" if set(unknown) & set(from_file) else "given"
        raise ConfigError(f"unknown training option(s) {where}: {', '.join(unknown)}; see "
                          "`vitkit train --help` for the names")
    types = field_types()
    from_file = {k: _convert(k, v, types[k], str(config_file)) for k, v in from_file.items()}
    overrides = {k: _convert(k, v, types[k], "option") for k, v in overrides.items()}
    recipe = overrides.get("recipe", from_file.get("recipe", "plain"))
    if recipe not in RECIPES:
        raise ConfigError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    merged = {**RECIPES[recipe], **from_file, **overrides, "recipe": recipe}
    if merged.get("init"):
        if merged.get("patch_size"):
            raise ConfigError("--patch-size sets the patches of a model trained from scratch; "
                              "with --init the checkpoint's own patch size is used (drop "
                              "--patch-size, or train from scratch without --init)")
        if "model" not in merged:  # the checkpoint says what it is; no default name stands in
            merged["model"] = FROM_INIT
    cfg = TrainConfig(**merged)
    _check_ranges(cfg)
    if cfg.objective not in OBJECTIVES:
        raise ConfigError(f"--objective must be classify or mae, got {cfg.objective!r}")
    if cfg.objective == "mae":
        clash = [f"--{name.replace('_', '-')}" for name in ("distill", "mixup", "cutmix")
                 if getattr(cfg, name)]
        if clash:
            raise ConfigError(f"--objective mae pre-trains without labels; {', '.join(clash)} "
                              "mix or distil labels: drop them for the pre-training run")
        if is_cnn(cfg.model):
            raise ConfigError(f"--objective mae pre-trains a ViT; {cfg.model} is a CNN")
        if not 0 < cfg.mask_ratio < 1:
            raise ConfigError(f"--mask-ratio is the share of patches hidden, in (0, 1), got "
                              f"{cfg.mask_ratio}")
    if cfg.anneal_epochs and not cfg.patience:
        raise ConfigError(f"--anneal-epochs {cfg.anneal_epochs} anneals once early stopping "
                          "ends a run, and this run has no --patience: add --patience P (e.g. "
                          "--patience 5 --anneal-epochs 5), or drop --anneal-epochs (a run "
                          "without patience follows its cosine schedule to the end)")
    _check_adapt(cfg)
    if cfg.distill not in (None, "hard", "soft"):
        raise ConfigError(f"distill must be 'hard' or 'soft', got {cfg.distill!r}")
    if cfg.distill and not cfg.teacher:
        raise ConfigError("distillation needs --teacher (a checkpoint of a trained CNN or ViT)")
    return cfg


def _check_adapt(cfg: TrainConfig) -> None:
    """--freeze and the LoRA options: well-formed, for a model they fit, not both at once
    (their depth limit is checked on the model built, :func:`vitkit.train.adapt.prepare`)."""
    freeze = cfg.freeze.strip()
    if freeze not in ("", "backbone") and not freeze.isdigit():
        raise ConfigError(f"--freeze {cfg.freeze!r} is not a choice: give 'backbone' (only the "
                          "head learns) or a number of blocks N (the embeddings and the first "
                          "N blocks stay fixed), e.g. --freeze 8")
    cfg.freeze = freeze
    if cfg.freeze and cfg.lora_rank:
        raise ConfigError(f"--freeze {cfg.freeze} with --lora-rank {cfg.lora_rank}: LoRA "
                          "already freezes every weight of the model but its adapters and the "
                          "head; give one of them")
    lora_options = [f"--{k.replace('_', '-')}" for k in ("lora_targets", "lora_alpha",
                                                          "lora_dropout")
                    if getattr(cfg, k) != getattr(TrainConfig, k)]
    if lora_options and not cfg.lora_rank:
        raise ConfigError(f"{', '.join(lora_options)} set LoRA adapters, and this run has none: "
                          "add --lora-rank R (e.g. --lora-rank 8), or drop them")
    if cfg.lora_rank:
        names = lora_targets(cfg.lora_targets)
        wrong = [t for t in names if t not in LORA_TARGETS]
        if wrong or not names:
            raise ConfigError(f"--lora-targets {cfg.lora_targets!r}: "
                              + (f"unknown {', '.join(wrong)}; " if wrong else "")
                              + f"choose among {','.join(LORA_TARGETS)} (comma-separated), e.g. "
                              "--lora-targets qkv,fc1")
        if cfg.lora_dropout >= 1:
            raise ConfigError(f"--lora-dropout must be below 1 (the share of the adapters' "
                              f"input dropped), got {cfg.lora_dropout}")
    if not (cfg.freeze or cfg.lora_rank):
        return
    what = f"--lora-rank {cfg.lora_rank}" if cfg.lora_rank else f"--freeze {cfg.freeze}"
    if cfg.objective == "mae":
        raise ConfigError(f"{what} with --objective mae: masked-image pre-training trains the "
                          "whole encoder; drop it for the pre-training run, and freeze or "
                          "adapt when fine-tuning the encoder (--init)")
    if is_cnn(cfg.model):
        raise ConfigError(cnn_refusal(what, cfg.model))


# Upper bounds (inclusive) of numeric options whose range is not [0, inf): with the reason
_AT_MOST = {
    "holdout": (0.5, "a share of the training split kept out of training"),
    "label_smoothing": (0.99, "a share of the target spread over the other classes"),
    "randaugment": (30, "RandAugment's magnitude runs 0..30"),
    "ema_decay": (0.99999, "the EMA keeps this share of itself each step; 1 would never move"),
    "layer_decay": (1.0, "each block below the head gets this factor of the lr"),
    "img_size": (2048, "a bigger input needs tens of GB for one batch on the way in"),
}
_POSITIVE = ("lr", "distill_tau")  # > 0
DEVICES = ("auto", "cpu", "cuda")


def _check_ranges(cfg: TrainConfig) -> None:
    """Every numeric option finite and in its range; the device one vitkit knows. A
    :class:`ConfigError` names the option, the value and the range."""
    for f in fields(TrainConfig):
        value = getattr(cfg, f.name)
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ConfigError(f"{f.name} must be a finite number, got {value}")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if f.name in _FRACTIONS and not 0 <= value <= 1:
            raise ConfigError(f"{f.name} must be between 0 and 1, got {value}")
        check_number(f.name, value, positive=f.name in _POSITIVE,
                     least=1 if f.name in _AT_LEAST_ONE else 0)
        if f.name in _AT_MOST and value > _AT_MOST[f.name][0]:
            top, why = _AT_MOST[f.name]
            raise ConfigError(f"{f.name} must be at most {top} ({why}), got {value}")
    if cfg.data_fraction == 0:
        raise ConfigError("data_fraction must be more than 0 (a share of the training split)")
    if any(s <= 0 for s in cfg.std):
        raise ConfigError(f"std must be positive for every channel, got {list(cfg.std)}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device {cfg.device!r} is not one vitkit knows; choose auto, cpu or "
                          "cuda (pick a GPU with CUDA_VISIBLE_DEVICES)")


def save(cfg: TrainConfig, path: str | Path) -> None:
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    atomic_write(path, lambda tmp: tmp.write_text(text))


def load(path: str | Path) -> TrainConfig:
    return resolve({}, str(path))
