"""``vitkit train``: from scratch, fine-tuning or distilling, on one process or under torchrun.

A run folder holds ``config.yaml`` (the effective configuration), ``metrics.csv``, TensorBoard
event files, ``curves.png``, ``best.safetensors`` and ``last.safetensors`` (vitkit checkpoints
with metadata; LoRA merged), ``state.pt`` (everything ``--resume`` needs), ``params.json`` (what
trains: :mod:`vitkit.train.adapt`) and ``train.log``. All writes are atomic. Every random draw
is a function of (seed, epoch, step or sample), so a run killed at any point and resumed ends
with exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torchvision.transforms import v2
from tqdm import tqdm

from vitkit.checkpoints.io import load_model, save_model
from vitkit.data.datasets import load_split
from vitkit.data.transforms import Transformed, eval_transform, sample_seed, train_transform
from vitkit.diagnose import diagnose_run, start_of_run, to_json
from vitkit.errors import ConfigError, LockHeld, VitkitError
from vitkit.models.cnn import create_cnn, is_cnn
from vitkit.models.mae import MaskedAutoencoder
from vitkit.models.registry import build_config, create_model
from vitkit.recipe import RunPlan, cosine_lr, plan_run
from vitkit.train import adapt, distributed, runfolder
from vitkit.train import config as config_io
from vitkit.train import resume as resume_io
from vitkit.train.config import TrainConfig
from vitkit.train.distill import distillation_loss
from vitkit.train.runlog import RunLog
from vitkit.train.stopping import EarlyStop, holdout_split
from vitkit.util.files import atomic_write, remove_stale_temporaries

logger = logging.getLogger("vitkit")
# The progress bar reads the loss to the host every LOG_EVERY optimizer steps (and at an
# epoch's last): a read per step would make the host wait on the device every step.
LOG_EVERY = 20


class NonFiniteLoss(VitkitError, RuntimeError):
    """The loss became NaN or infinite; the message names the step and the usual causes (it
    goes to train.log for people; ``result.json`` records ``stopped: "non-finite"`` with the
    step, the epoch and the value, which is what ``vitkit doctor`` reads)."""

    def __init__(self, message: str, step: int, epoch: int, value: float):
        super().__init__(message)
        self.step, self.epoch, self.value = step, epoch, value


@dataclass
class RunResult:
    run_dir: Path
    best_top1: float
    history: list[dict]
    train_images: int
    # with --patience or --holdout: how the run ended and the best checkpoint's numbers
    # (stopped, epochs, best_epoch, test_* on the validation split, train_* on the training
    # images); the same as result.json
    outcome: dict | None = None


# ------------------------------------------------------------------------------- building
def build_model(cfg: TrainConfig, num_classes: int, class_names: list[str]) -> nn.Module:
    """A fresh model, or ``cfg.init`` loaded (head and position table adapted)."""
    if cfg.init:
        # --model beside --init names the architecture of a bare state dict (load_model checks
        # it against the weights); a CNN name is checked just below
        named = None if cfg.model == config_io.FROM_INIT or is_cnn(cfg.model) else cfg.model
        model = load_model(cfg.init, num_classes=num_classes, img_size=cfg.img_size,
                           model=named)
        _check_init_matches(cfg, model)
        _warn_if_the_head_means_other_classes(cfg, model, class_names)
        if cfg.distill and not getattr(model.cfg, "distilled", False):
            raise ConfigError("distillation needs a distilled student (a distillation token); "
                             "--init a distilled checkpoint or train one from scratch")
        blocks = list(getattr(model, "blocks", []))
        for i, block in enumerate(blocks):  # stochastic depth rising linearly, as from scratch
            block.drop_path1.p = block.drop_path2.p = cfg.drop_path * i / max(len(blocks) - 1, 1)
    elif is_cnn(cfg.model):
        model = create_cnn(cfg.model, num_classes, cfg.img_size)
    else:
        patch = {"patch_size": cfg.patch_size} if cfg.patch_size > 0 else {}
        model = create_model(cfg.model, num_classes=num_classes, img_size=cfg.img_size,
                             drop_path_rate=cfg.drop_path, distilled=bool(cfg.distill), **patch)
    model.cfg.extra.update(class_names=list(class_names), mean=list(cfg.mean),
                           std=list(cfg.std))
    model = adapt.prepare(model, cfg)  # --freeze, --lora-rank
    if cfg.objective == "mae":  # trained inside its autoencoder; saved alone (_saved)
        return MaskedAutoencoder(model, cfg.mask_ratio)
    return model


def _saved(model: nn.Module) -> nn.Module:
    """What a checkpoint holds: the model, or the encoder of a masked autoencoder (its decoder
    is for pre-training only); LoRA adapters merged into a copy (:func:`adapt.plain`)."""
    return adapt.plain(model.encoder if isinstance(model, MaskedAutoencoder) else model)


def _warn_if_the_head_means_other_classes(cfg: TrainConfig, model: nn.Module,
                                          class_names: list[str]) -> None:
    """An --init head of the data's class count is kept; say so when it was trained on other
    classes (fine-tuning a 0-4 classifier on classes 5-9 starts from its 0-4 rows)."""
    kept = model.cfg.extra.get("class_names")
    if model.load_record.get("head_replaced") is None and kept \
            and list(kept) != list(class_names):
        shown = ", ".join(map(str, kept[:5])) + (", ..." if len(kept) > 5 else "")
        data = ", ".join(map(str, class_names[:5])) + (", ..." if len(class_names) > 5 else "")
        logger.warning(f"--init {cfg.init}'s head was trained on other classes ({shown}) than "
                       f"the data's ({data}); it is kept, row for row, since their counts are "
                       f"equal. For a fresh head, drop it first: vitkit convert {cfg.init} "
                       f"headless.safetensors --num-classes 0, then --init headless.safetensors")


def _check_init_matches(cfg: TrainConfig, model: nn.Module) -> None:
    """--model named beside --init must be the checkpoint's architecture, not silently
    ignored."""
    if cfg.model == config_io.FROM_INIT:
        return
    if is_cnn(cfg.model) or is_cnn(model):
        same = is_cnn(model) and is_cnn(cfg.model) and model.cfg.arch == cfg.model
        what = model.cfg.arch if is_cnn(model) else "a ViT"
    else:
        try:
            named = build_config(cfg.model)
        except ValueError:
            return  # an unknown name is refused where models are built
        keys = ("embed_dim", "depth", "num_heads", "patch_size", "mlp_dim")
        same = all(getattr(named, k) == getattr(model.cfg, k) for k in keys)
        what = (f"a ViT of width {model.cfg.embed_dim}, depth {model.cfg.depth}, patch "
                f"{model.cfg.patch_size}")
    if not same:
        raise ConfigError(f"--init {cfg.init} is {what}, not {cfg.model}: the checkpoint sets "
                          "the architecture; drop --model (or name the checkpoint's own)")


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float) -> list[dict]:
    """AdamW groups: no decay on biases, norms, tokens and position tables; optional
    layer-wise lr decay for ViTs (the head at full lr, each block below it x ``layer_decay``)."""
    depth = len(getattr(model, "blocks", []))
    groups: dict[tuple, dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.dim() < 2 or name in ("cls_token", "dist_token", "reg_token", "pos_embed")
        if depth and layer_decay < 1.0:
            if name.startswith(("patch_embed", "cls_token", "dist_token", "reg_token",
                                "pos_embed")):
                layer = 0
            elif name.startswith("blocks."):
                layer = int(name.split(".")[1]) + 1
            else:
                layer = depth + 1
            scale = layer_decay ** (depth + 1 - layer)
        else:
            scale = 1.0
        key = (no_decay, scale)
        group = groups.setdefault(key, {"params": [], "weight_decay": 0.0 if no_decay
                                        else weight_decay, "lr_scale": scale})
        group["params"].append(p)
    return list(groups.values())


def nested_subset(split, fraction: float, seed: int):
    """The first ``fraction`` of a permutation fixed by ``seed``: a smaller fraction is always
    inside a larger one (the data-size study relies on it)."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"data_fraction must be in (0, 1], got {fraction}")
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed + 12345))
    keep = sorted(order[: max(1, round(fraction * len(split)))].tolist())
    return type(split)([split.images[i] for i in keep], [split.labels[i] for i in keep],
                       split.classes, split.skipped)


def epoch_batches(n: int, batch: int, seed: int, epoch: int, rank: int,
                  world: int) -> list[list[int]]:
    """This process's batches of an epoch: a permutation from (seed, epoch), cut into global
    batches of ``batch * world``, each dealt to the processes by stride (the last partial
    batch is dropped, so every process takes the same number of steps)."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
    order, per_step = perm.tolist(), batch * world
    return [order[s * per_step:(s + 1) * per_step][rank::world] for s in range(n // per_step)]


def _mixer(cfg: TrainConfig, num_classes: int):
    choices = []
    if cfg.cutmix > 0:
        choices.append((v2.CutMix(alpha=cfg.cutmix, num_classes=num_classes),
                        cfg.mix_switch_prob if cfg.mixup > 0 else 1.0))
    if cfg.mixup > 0:
        choices.append((v2.MixUp(alpha=cfg.mixup, num_classes=num_classes),
                        1 - cfg.mix_switch_prob if cfg.cutmix > 0 else 1.0))
    if not choices:
        return None
    if len(choices) == 1:
        return choices[0][0]
    return v2.RandomChoice([c for c, _ in choices], p=[p for _, p in choices])


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(model: nn.Module, loader, device, num_classes: int) -> dict:
    """Loss, top-1, top-5 and a confusion matrix over ``loader``, summed over processes; for a
    masked autoencoder the reconstruction loss, and no top-1 (NaN)."""
    model.eval()
    if isinstance(model, MaskedAutoencoder):
        return _evaluate_reconstruction(model, loader, device)
    loss = torch.zeros((), device=device, dtype=torch.float64)
    top1 = torch.zeros((), device=device, dtype=torch.float64)
    top5 = torch.zeros((), device=device, dtype=torch.float64)
    confusion = torch.zeros(num_classes, num_classes, device=device, dtype=torch.float64)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x).float()
        loss += F.cross_entropy(logits, y, reduction="sum")
        top = logits.topk(min(5, num_classes), dim=-1).indices
        top1 += (top[:, 0] == y).sum()
        top5 += (top == y[:, None]).any(-1).sum()
        confusion.index_put_((y, top[:, 0]), torch.ones_like(y, dtype=torch.float64),
                             accumulate=True)
    for t in (loss, top1, top5, confusion):
        distributed.all_reduce_sum(t)
    n = confusion.sum().clamp_min(1)
    per_class = confusion.diagonal() / confusion.sum(1).clamp_min(1)
    return {"loss": (loss / n).item(), "top1": (top1 / n).item(), "top5": (top5 / n).item(),
            "per_class": per_class.tolist(), "confusion": confusion.long().cpu()}


@torch.no_grad()
def _evaluate_reconstruction(model: MaskedAutoencoder, loader, device) -> dict:
    """The mean masked-patch error over ``loader`` (the eval masks: a fixed seed)."""
    total = torch.zeros((), device=device, dtype=torch.float64)
    count = torch.zeros((), device=device, dtype=torch.float64)
    for x, _ in loader:
        x = x.to(device)
        total += model(x).double() * len(x)
        count += len(x)
    for t in (total, count):
        distributed.all_reduce_sum(t)
    nan = float("nan")
    return {"loss": (total / count.clamp_min(1)).item(), "top1": nan, "top5": nan,
            "per_class": [], "confusion": torch.zeros(0, 0, dtype=torch.long)}


def _val_loader(split, cfg: TrainConfig, ctx) -> DataLoader:
    ds = Transformed(split, eval_transform(cfg.img_size, cfg.mean, cfg.std), cfg.seed)
    idx = list(range(ctx.rank, len(ds), ctx.world))
    return DataLoader(torch.utils.data.Subset(ds, idx), batch_size=max(cfg.batch_size, 128),
                      num_workers=cfg.workers)


# ---------------------------------------------------------------------------------- train
def _save_state(path: Path, raw, opt, ema, progress: dict, cfg: TrainConfig) -> None:
    state = {"model": raw.state_dict(), "optimizer": opt.state_dict(),
             "ema": ema.state_dict() if ema is not None else None,
             "rng": torch.get_rng_state(), "config": cfg.to_dict(), **progress}
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def train(cfg: TrainConfig | None, resume: str | Path | None = None,
          progress: bool | None = None, overwrite: bool = False) -> RunResult:
    """Train as ``cfg`` says; with ``resume`` (a run folder), continue that run exactly.

    A run folder that already holds a run is refused for a new run (see
    :mod:`vitkit.train.runfolder`); ``overwrite`` moves its files aside instead. The folder is
    locked while the run writes it: a second process on it fails at once.
    """
    if cfg is None and resume is None:
        raise ConfigError("train() needs a config or a run folder to resume")
    if resume is not None:
        cfg = None
        resume_io.check_resumable(Path(resume))
    device = cfg.device if cfg is not None else config_io.load(Path(resume) / "config.yaml").device
    ctx = distributed.setup(device)
    run_dir = _run_dir(cfg, resume)
    held, created = None, False
    try:
        held, created = _claim(run_dir, ctx, resume is not None, overwrite)
        return _train(cfg, resume, ctx, progress)
    except NonFiniteLoss:
        # a diverged run is kept, log and all: it is what `vitkit doctor` diagnoses
        if ctx.main:
            logger.info("kept %s with its log: vitkit doctor %s says what went wrong",
                        run_dir, run_dir)
        raise
    except BaseException:
        if held is not None:
            held.release()
            held = None
        if created and ctx.main:
            _remove_if_empty_run(run_dir)
        raise
    finally:
        if held is not None:
            held.release()
        distributed.cleanup()


def _claim(run_dir: Path, ctx, resume: bool, overwrite: bool):
    """The main process claims the run folder (:func:`runfolder.claim`); every process learns
    whether it could, so none waits on the others."""
    held, created, error = None, False, None
    if ctx.main:
        try:
            held, created = runfolder.claim(run_dir, resume=resume, overwrite=overwrite)
        except (ConfigError, LockHeld) as err:  # a folder it may not use, or one held
            error = err
    refused = distributed.all_reduce_sum(torch.tensor(float(error is not None),
                                                      device=ctx.device)).item()
    if error is not None:
        raise error
    if refused:
        raise ConfigError(f"the main process could not claim the run folder {run_dir}")
    return held, created


def _remove_if_empty_run(run_dir: Path) -> None:
    """A run that stopped before its first checkpoint leaves no folder holding only its log,
    config and plan."""
    if run_dir.is_dir() and {p.name for p in run_dir.iterdir()} <= {"train.log", "config.yaml",
                                                                     "run.json", ".progress",
                                                                     adapt.RECORD}:
        shutil.rmtree(run_dir, ignore_errors=True)
        logger.info("removed %s: the run stopped before its first checkpoint", run_dir)


def _run_dir(cfg: TrainConfig, resume) -> Path:
    if resume:
        return Path(resume)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    model = Path(cfg.init).stem if cfg.model == config_io.FROM_INIT else Path(cfg.model).stem
    name = cfg.name or f"{model}-{cfg.data.split(':')[0]}-{stamp}"
    return Path(cfg.out) / name


@dataclass
class _Run:
    """Everything one training run holds between its steps (built by :func:`_setup`)."""

    cfg: TrainConfig
    ctx: distributed.Context
    run_dir: Path
    log: RunLog
    raw: nn.Module  # the model itself (not wrapped by DDP or compile)
    net: nn.Module  # DDP-wrapped when several processes train
    forward: nn.Module  # net, compiled when asked
    ema: nn.Module | None
    teacher: nn.Module | None
    opt: torch.optim.Optimizer
    train_ds: Transformed
    val_loader: DataLoader  # the selection set: the held-out images with --holdout
    test_split: object  # with --holdout: the validation split, evaluated once at the end
    train_split: object
    mixer: object
    autocast: object
    num_classes: int
    train_images: int
    global_batch: int
    base_lr: float
    steps_per_epoch: int
    epochs: int
    total: int  # optimiser steps in the whole run
    warmup: int
    show: bool  # progress bar
    progress: resume_io.Progress  # the last step done, for the next resume's report
    stop: EarlyStop  # the validation loss's best and the patience counter
    # progress, saved in state.pt
    step: int = 0
    best: float = -1.0
    history: list = field(default_factory=list)
    start_epoch: int = 0
    done_in_epoch: int = 0  # steps already done in start_epoch (a mid-epoch resume)
    epoch_loss_sum: float = 0.0  # their summed losses, so the epoch's mean covers every step


@dataclass
class _EpochStats:
    # sum of the step losses of this process's steps in the epoch: a tensor on the device
    # while the epoch runs (read to the host at log intervals and at its end only)
    loss_sum: torch.Tensor | float
    steps: int  # steps of the whole epoch, those before a resume included
    seen: int  # images, all processes
    start: float  # perf_counter at the epoch's start
    lr: float  # the last step's


@dataclass
class _Data:
    """The run's images: ``train`` (after --holdout and --data-fraction), ``val`` (what picks
    the best epoch: the held-out share with --holdout), ``test`` (with --holdout: the
    validation split, evaluated once at the end) and the class count."""

    train: object
    val: object
    test: object | None
    classes: int


@dataclass
class _Models:
    """The model as trained (``raw``), as stepped (``net``: DDP when several processes) and
    as called (``forward``: compiled when asked), its EMA, the teacher and the optimiser."""

    raw: nn.Module
    net: nn.Module
    forward: nn.Module
    ema: nn.Module | None
    teacher: nn.Module | None
    opt: torch.optim.Optimizer


def _resume_state(cfg: TrainConfig | None, resume, run_dir: Path,
                  ctx) -> tuple[TrainConfig, dict | None]:
    """The config and the saved state of a resumed run (checked against each other), or
    ``cfg`` and None; stale temporary files left by a killed writer are removed."""
    state = None
    if resume:
        cfg = config_io.load(run_dir / "config.yaml")
        state = resume_io.load_state(run_dir / "state.pt")
        resume_io.check_state(state, cfg.to_dict(), run_dir)
    if ctx.main and run_dir.is_dir():
        for stale in remove_stale_temporaries(run_dir, "state.pt"):
            logger.info("removed %s, left by a process killed while writing", stale)
    return cfg, state


def _build_data(cfg: TrainConfig) -> _Data:
    """The splits of ``cfg.data``, the held-out share taken before the subset (its images are
    never trained on)."""
    options = dict(size=cfg.data_size, val_fraction=cfg.val_fraction, seed=cfg.seed,
                   root=cfg.data_root, download=cfg.download)
    train_split = load_split(cfg.data, "train", cfg.img_size, **options)
    val_split = load_split(cfg.data, "val", cfg.img_size, **options)
    classes = len(train_split.classes)
    test_split = None
    if cfg.holdout > 0:
        train_split, held = holdout_split(train_split, cfg.holdout)
        test_split, val_split = val_split, held
    if cfg.data_fraction < 1.0:
        train_split = nested_subset(train_split, cfg.data_fraction, cfg.seed)
    return _Data(train_split, val_split, test_split, classes)


def _say_data(cfg: TrainConfig, data: _Data, log: RunLog) -> None:
    """The run's images and its stopping rule, in the log."""
    train_split, val_split, test_split = data.train, data.val, data.test
    log.line(f"data {cfg.data}: {len(train_split)} train"
             + (f" ({cfg.data_fraction:g} of the split)" if cfg.data_fraction < 1 else "")
             + (f", {len(val_split)} held out to choose the best epoch, {len(test_split)} "
                "val images evaluated once at the end" if test_split is not None else
                f", {len(val_split)} val images") + f", {data.classes} classes")
    if cfg.patience:
        log.line(f"early stopping: the run stops once the validation loss has not improved "
                 f"for {cfg.patience} evaluations (at most {cfg.steps or cfg.epochs} "
                 f"{'steps' if cfg.steps else 'epochs'})")
    if train_split.skipped:
        log.line(f"skipped {len(train_split.skipped)} unreadable images: "
                 + ", ".join(train_split.skipped))


def _plan(cfg: TrainConfig, data: _Data, ctx, run_dir: Path, log: RunLog,
          fresh: bool) -> RunPlan:
    """The run's numbers (vitkit.recipe), written to run.json; the doctor's word on them
    before the first step of a ``fresh`` run."""
    plan = plan_run(cfg.to_dict(), len(data.train), data.classes, ctx.world)
    if plan.steps_per_epoch == 0:
        raise ConfigError(f"{len(data.train)} training images cannot fill one global batch of "
                          f"{plan.global_batch}; lower --batch-size or --accum-steps")
    if ctx.main:
        text = json.dumps(plan.to_dict(), indent=2) + "\n"
        atomic_write(run_dir / "run.json", lambda tmp: tmp.write_text(text))
    if fresh:
        for finding in start_of_run(cfg.to_dict(), plan):
            if finding.level != "ok":
                log.line(f"doctor: {finding.level}: {finding.summary}. Fix: {finding.fix}")
    return plan


def _build_models(cfg: TrainConfig, data: _Data, plan: RunPlan, state: dict | None, ctx,
                  run_dir: Path) -> _Models:
    """The model (from ``state`` on a resume), its EMA, the teacher and AdamW."""
    raw = build_model(cfg, data.classes, data.train.classes)
    if state is not None:
        resume_io.load_model_state(raw, state, run_dir / "state.pt")
    raw = raw.to(ctx.device)
    if cfg.grad_checkpointing:
        if not hasattr(raw, "set_grad_checkpointing"):
            raise ConfigError(f"--grad-checkpointing applies to ViTs; {cfg.model} is a CNN")
        raw.set_grad_checkpointing(True)
    ema = copy.deepcopy(raw).eval().requires_grad_(False) if cfg.ema_decay > 0 else None
    if ema is not None and state is not None and state["ema"] is not None:
        ema.load_state_dict(state["ema"])
    teacher = None
    if cfg.distill:
        teacher = load_model(cfg.teacher).to(ctx.device).eval().requires_grad_(False)
    net = DistributedDataParallel(raw) if ctx.world > 1 else raw
    opt = torch.optim.AdamW(param_groups(raw, cfg.weight_decay, cfg.layer_decay), lr=plan.lr)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
    return _Models(raw, net, torch.compile(net) if cfg.compile else net, ema, teacher, opt)


def _setup(cfg: TrainConfig | None, resume, ctx, progress) -> _Run:
    """Resume state, data, plan, models: everything before step 1, from the builders above."""
    run_dir = _run_dir(cfg, resume)
    cfg, state = _resume_state(cfg, resume, run_dir, ctx)
    log = RunLog(run_dir, enabled=ctx.main, resume=state is not None)
    torch.manual_seed(cfg.seed)
    data = _build_data(cfg)
    if ctx.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        config_io.save(cfg, run_dir / "config.yaml")
    _say_data(cfg, data, log)
    plan = _plan(cfg, data, ctx, run_dir, log, fresh=state is None)
    models = _build_models(cfg, data, plan, state, ctx, run_dir)
    if ctx.main:
        adapt.record(models.raw, cfg, run_dir / adapt.RECORD)
    log.line(f"model {cfg.model}{' from ' + cfg.init if cfg.init else ''}: "
             f"{adapt.describe(models.raw, cfg)}; {ctx.world} "
             f"process(es) on {ctx.device}; global batch {plan.global_batch}, lr "
             f"{plan.lr:.3g}, {plan.steps_per_epoch} steps/epoch")
    run = _Run(
        cfg=cfg, ctx=ctx, run_dir=run_dir, log=log, raw=models.raw, net=models.net,
        forward=models.forward, ema=models.ema, teacher=models.teacher, opt=models.opt,
        train_ds=Transformed(data.train, train_transform(
            cfg.img_size, cfg.mean, cfg.std, crop_scale=cfg.crop_scale, hflip=cfg.hflip,
            randaugment=cfg.randaugment, random_erasing=cfg.random_erasing), cfg.seed),
        val_loader=_val_loader(data.val, cfg, ctx), test_split=data.test,
        train_split=data.train, mixer=_mixer(cfg, data.classes),
        autocast=torch.autocast("cuda", dtype=torch.bfloat16) if ctx.device.type == "cuda"
        else torch.autocast("cpu", enabled=False),
        num_classes=data.classes, train_images=len(data.train),
        global_batch=plan.global_batch, base_lr=plan.lr,
        steps_per_epoch=plan.steps_per_epoch, epochs=plan.epochs, total=plan.total_steps,
        warmup=plan.warmup_steps,
        show=(sys.stderr.isatty() if progress is None else progress) and ctx.main,
        progress=resume_io.Progress(run_dir, ctx.main),
        stop=EarlyStop(cfg.patience, anneal_epochs=cfg.anneal_epochs),
    )
    if state is not None:
        _restore(run, state)
    return run


def _restore(run: _Run, state: dict) -> None:
    """Put a resumed run where its state left it, and say which steps are done again."""
    cfg = run.cfg
    run.step, run.best, run.history = state["step"], state["best"], state["history"]
    run.start_epoch, run.done_in_epoch = state["epoch"], state["step_in_epoch"]
    run.epoch_loss_sum = state.get("epoch_loss_sum", 0.0)
    run.stop = EarlyStop.from_state(state.get("early_stop"), cfg.patience, cfg.anneal_epochs)
    torch.set_rng_state(state["rng"])
    reached = run.progress.last()
    again = (f"; the {reached - run.step} steps run after it (to step {reached}) are done "
             "again" if reached is not None and reached > run.step else
             "; no step is done again")
    run.log.line(f"resumed at epoch {run.start_epoch + 1}, step {run.step} "
                 f"({run.done_in_epoch} steps into the epoch), the last saved state{again}")


def _loss(run: _Run, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The training loss of one micro-batch: cross-entropy, or DeiT's distillation loss."""
    cfg = run.cfg
    if cfg.objective == "mae":  # the masked autoencoder's own loss; no labels
        return run.forward(x)
    if run.teacher is None:
        return F.cross_entropy(run.forward(x).float(), target,
                               label_smoothing=cfg.label_smoothing)
    cls_logits, dist_logits = run.forward(x, distill_heads=True)
    with torch.no_grad():
        teacher_logits = run.teacher(x)
    return distillation_loss(cls_logits.float(), dist_logits.float(), target,
                             teacher_logits.float(), cfg.distill, cfg.distill_alpha,
                             cfg.distill_tau, cfg.label_smoothing)


def _train_epoch(run: _Run, epoch: int, guard=None) -> _EpochStats:
    """The optimiser steps of ``epoch`` (from ``run.done_in_epoch`` on, after a resume)."""
    cfg, ctx = run.cfg, run.ctx
    run.train_ds.set_epoch(epoch)
    batches = epoch_batches(len(run.train_ds), cfg.batch_size, cfg.seed, epoch, ctx.rank,
                            ctx.world)[: run.steps_per_epoch * cfg.accum_steps]
    batches = batches[run.done_in_epoch * cfg.accum_steps:]
    it = iter(DataLoader(run.train_ds, batch_sampler=batches, num_workers=cfg.workers))
    run.net.train()
    annealing = run.stop.annealing
    last = run.steps_per_epoch if annealing else \
        min(run.steps_per_epoch, run.total - epoch * run.steps_per_epoch)  # a step budget
    bar = tqdm(range(run.done_in_epoch, last), disable=not run.show, leave=False,
               desc=f"epoch {epoch + 1}/{_last_epoch(run)}" + (" (annealing)" if annealing
                                                               else ""))
    # a resumed epoch starts from the losses of its steps before the interruption
    stats = _EpochStats(run.epoch_loss_sum, last, 0, time.perf_counter(), 0.0)
    for in_epoch in bar:
        lr = _lr(run)
        for group in run.opt.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        torch.manual_seed(sample_seed(cfg.seed + 1, epoch, run.step))  # dropout, mixing
        run.opt.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=ctx.device)  # stays on the device
        for k in range(cfg.accum_steps):
            x, y = next(it)
            x, y = x.to(ctx.device), y.to(ctx.device)
            target = y
            if run.mixer is not None:
                x, target = run.mixer(x, y)
            sync = k == cfg.accum_steps - 1 or ctx.world == 1
            with (contextlib.nullcontext() if sync else run.net.no_sync()), run.autocast:
                loss = _loss(run, x, target)
                (loss / cfg.accum_steps).backward()
            step_loss += loss.detach().float() / cfg.accum_steps
        # the step's one collective and one read to the host: non-finite loss, Ctrl-C
        stop = _step_flags(run, step_loss, guard, epoch, lr)
        if cfg.clip_grad > 0:
            nn.utils.clip_grad_norm_(run.raw.parameters(), cfg.clip_grad)
        run.opt.step()
        if run.ema is not None:
            _update_ema(run.ema, run.raw, cfg.ema_decay)
        run.step += 1
        stats.seen += run.global_batch
        stats.loss_sum = stats.loss_sum + step_loss
        stats.lr = lr
        if run.show and (run.step % LOG_EVERY == 0 or in_epoch + 1 == last):
            rate = stats.seen / (time.perf_counter() - stats.start)
            bar.set_postfix(loss=f"{step_loss.item():.3f}", lr=f"{lr:.2e}",
                            img_s=f"{rate:.0f}")
        run.progress.step(run.step)
        if ((cfg.checkpoint_every and run.step % cfg.checkpoint_every == 0) or stop) \
                and in_epoch + 1 < last and ctx.main:
            _save_state(run.run_dir / "state.pt", run.raw, run.opt, run.ema, dict(
                step=run.step, epoch=epoch, step_in_epoch=in_epoch + 1, best=run.best,
                history=run.history, epoch_loss_sum=float(stats.loss_sum),
                early_stop=run.stop.state()), cfg)
        if stop and in_epoch + 1 < last:
            _stopped(run)
    run.done_in_epoch, run.epoch_loss_sum = 0, 0.0
    return stats


def _lr(run: _Run) -> float:
    """The learning rate of the next step: the run's cosine schedule, or the annealing after
    early stopping (:class:`EarlyStop`'s)."""
    if run.stop.annealing:
        return run.stop.lr(run.step, run.steps_per_epoch, run.cfg.min_lr)
    return cosine_lr(run.step, run.total, run.warmup, run.base_lr, run.cfg.min_lr)


def _last_epoch(run: _Run) -> int:
    """The epoch the run ends after: its maximum, or the last annealing epoch."""
    stop = run.stop
    return stop.anneal_from + stop.anneal_epochs if stop.annealing else run.epochs


def _asked_to_stop(run: _Run, guard) -> bool:
    """Whether Ctrl-C was pressed (on any process: they stop at the same step)."""
    asked = guard is not None and guard.asked
    if run.ctx.world > 1:
        flag = torch.tensor(float(asked), device=run.ctx.device)
        asked = distributed.all_reduce_sum(flag).item() > 0
    return asked


def _score(row: dict, cfg: TrainConfig) -> float:
    """What picks best.safetensors without --patience: an evaluation's top-1 (the EMA's where
    better), or minus the reconstruction loss for a masked autoencoder."""
    if cfg.objective == "mae":
        return -row["val_loss"]
    return max(row["val_top1"], row.get("ema_top1", -1.0))


def _best_epoch(run: _Run) -> int:
    """The epoch best.safetensors holds: with --patience, the lowest validation loss (what
    early stopping watches); else the first evaluation of the highest :func:`_score`."""
    if run.cfg.patience:
        return run.stop.best_epoch
    return max(run.history, key=lambda r: _score(r, run.cfg))["epoch"]


def _step_flags(run: _Run, step_loss: torch.Tensor, guard, epoch: int, lr: float) -> bool:
    """After a step's micro-batches, before the optimizer steps: whether any process's loss is
    not finite (raises :class:`NonFiniteLoss`, every process together) and whether Ctrl-C was
    pressed on any (returned: they stop at the same step). One all-reduce of both flags and
    one read to the host per optimizer step, whatever the accumulation."""
    asked = guard is not None and guard.asked
    flags = torch.stack([(~torch.isfinite(step_loss)).float(),
                         torch.tensor(float(asked), device=step_loss.device)])
    bad, stop = distributed.all_reduce_sum(flags).tolist()
    if bad > 0:
        value = step_loss.item()
        last = run.run_dir / "last.safetensors"
        kept = f"the last good checkpoint is {last}" if last.exists() else \
            "no checkpoint was written before it"
        where = f"became {value}" if not math.isfinite(value) else \
            "became non-finite on another process"
        raise NonFiniteLoss(
            f"the loss {where} at step {run.step + 1} (epoch {epoch + 1}); training "
            f"stopped and {kept}. Usual causes: a learning rate too high (it was {lr:.3g}: "
            "try --lr lower, a longer --warmup-epochs or --clip-grad 1.0), float16 overflow "
            "(vitkit uses bfloat16 on GPU), or broken input images.",
            step=run.step + 1, epoch=epoch + 1, value=value)
    return stop > 0


def _stopped(run: _Run) -> None:
    """Say where an interrupted run stands, then stop it."""
    run.log.line(f"interrupted at step {run.step}: the state is saved; continue with "
                 f"vitkit train --resume {run.run_dir}")
    run.log.close()
    raise KeyboardInterrupt


def _evaluate_and_save(run: _Run, epoch: int, stats: _EpochStats) -> None:
    """Validate after ``epoch``, log it, and write last/best checkpoints and ``state.pt``."""
    ctx = run.ctx
    metrics = evaluate(run.raw, run.val_loader, ctx.device, run.num_classes)
    elapsed = time.perf_counter() - stats.start
    row = {"epoch": epoch + 1, "step": run.step,
           "train_loss": float(stats.loss_sum) / max(1, stats.steps),
           "val_loss": metrics["loss"], "val_top1": metrics["top1"], "val_top5": metrics["top5"],
           "lr": stats.lr, "seconds": elapsed, "images_per_s": stats.seen / elapsed}
    if run.ema is not None:
        row["ema_top1"] = evaluate(run.ema, run.val_loader, ctx.device, run.num_classes)["top1"]
    run.history.append(row)
    score = _score(row, run.cfg)
    was_stopped = run.stop.stopped
    lowest = run.stop.update(row["val_loss"], epoch + 1)
    stops_now = run.stop.stopped and not was_stopped
    anneals = stops_now and run.stop.anneal_epochs > 0 and epoch + 1 < run.epochs
    if anneals:
        run.stop.begin_anneal(epoch + 1, run.step, _lr(run))
    # with early stopping the best checkpoint is the lowest validation loss (what it stops on)
    # (the first evaluation always: a masked autoencoder's score, -loss, may be below -1)
    better = lowest if run.cfg.patience else len(run.history) == 1 or score > run.best
    if run.cfg.patience and lowest and run.cfg.objective != "mae":
        score = row["val_top1"]
    if ctx.main:
        ema_better = run.ema is not None and row.get("ema_top1", -1) > row["val_top1"]
        save_model(_saved(run.raw), run.run_dir / "last.safetensors")
        if better:
            save_model(_saved(run.ema if ema_better and not run.cfg.patience else run.raw),
                       run.run_dir / "best.safetensors")
        best = score if better else run.best
        _save_state(run.run_dir / "state.pt", run.raw, run.opt, run.ema, dict(
            step=run.step, epoch=epoch + 1, step_in_epoch=0, best=best,
            history=run.history, early_stop=run.stop.state()), run.cfg)
        run.log.epoch(row, run.history)
        if stops_now:
            then = (f"; annealing: {run.stop.anneal_epochs} more epochs with the learning rate "
                    f"decayed from {run.stop.anneal_lr:.3g} to {run.cfg.min_lr:g}") if anneals \
                else ""
            run.log.line(f"early stop after epoch {epoch + 1}: the validation loss has not "
                         f"improved for {run.cfg.patience} evaluations; the best is epoch "
                         f"{run.stop.best_epoch} (loss {run.stop.best_loss:.4f}), kept in "
                         f"best.safetensors{then}")
        elif run.stop.annealing and epoch + 1 == _last_epoch(run):
            run.log.line(f"annealed for {run.stop.anneal_epochs} epochs: the best validation "
                         f"loss went from {run.stop.best_before_anneal:.4f} to "
                         f"{run.stop.best_loss:.4f} (epoch {run.stop.best_epoch})")
    run.best = score if better else run.best


def _train(cfg: TrainConfig | None, resume, ctx, progress) -> RunResult:
    run = _setup(cfg, resume, ctx, progress)
    with resume_io.InterruptGuard() as guard:
        epoch = run.start_epoch
        while epoch < _last_epoch(run):  # annealing moves the end
            if run.stop.finished(epoch):  # early stopping ended it (a resume after the end)
                break
            try:
                stats = _train_epoch(run, epoch, guard)
            except NonFiniteLoss as err:
                run.log.line(str(err))
                run.log.close()
                if ctx.main:  # what the doctor reads; the log line is for people
                    _record_non_finite(run, err)
                raise
            stop = _asked_to_stop(run, guard)
            epoch += 1  # epochs done
            if epoch % max(1, run.cfg.eval_every) and epoch < _last_epoch(run) \
                    and not run.stop.annealing and not stop:
                continue  # not an evaluation epoch (the logged train loss is the eval epoch's)
            _evaluate_and_save(run, epoch - 1, stats)
            if stop and epoch < _last_epoch(run) and not run.stop.finished(epoch):
                _stopped(run)
    outcome = _outcome(run) if run.cfg.patience or run.cfg.holdout else None
    if ctx.main:
        _doctor_at_end(run)
    run.log.close()
    return RunResult(run.run_dir, run.best, run.history, run.train_images, outcome)


def _record_non_finite(run: _Run, err: NonFiniteLoss) -> None:
    """result.json of a run stopped by a non-finite loss: where and what (the value as text,
    since JSON has no NaN)."""
    _write_result(run, dict(stopped="non-finite", step=err.step, epoch=err.epoch,
                            loss=str(err.value), epochs=len(run.history)))


def _write_result(run: _Run, out: dict) -> None:
    """The run's result.json (atomically): how it ended and its numbers."""
    text = json.dumps(out, indent=2) + "\n"
    atomic_write(run.run_dir / "result.json", lambda tmp: tmp.write_text(text))


def _outcome(run: _Run) -> dict:
    """How a run with --patience or --holdout ended, and its best checkpoint's numbers on the
    validation split (with --holdout: seen here for the first time) and on its own training
    images (the train/validation gap), in result.json."""
    ctx, cfg = run.ctx, run.cfg
    distributed.barrier()  # the main process has written best.safetensors
    mae = cfg.objective == "mae"
    chosen = _best_epoch(run)
    out = dict(stopped="patience" if run.stop.stopped else "maximum" if cfg.patience
               else "budget", epochs=run.history[-1]["epoch"] if run.history else 0,
               max_epochs=run.epochs, steps=run.step, best_epoch=chosen,
               best_val_loss=next(r["val_loss"] for r in run.history if r["epoch"] == chosen),
               patience=cfg.patience, holdout=cfg.holdout, anneal_epochs=cfg.anneal_epochs,
               annealed=run.stop.annealing)
    if run.stop.annealing:  # where annealing began, and what it did to the best
        out.update(anneal_from_epoch=run.stop.anneal_from, anneal_from_lr=run.stop.anneal_lr,
                   best_val_loss_before_anneal=run.stop.best_before_anneal)
    if mae:  # an encoder without a trained head: its numbers are the reconstruction's
        out["objective"] = "mae"
        if ctx.main:
            _write_result(run, out)
            run.log.line(f"masked-image pre-training ended after {out['epochs']} epochs; best "
                         f"epoch {chosen}: reconstruction loss {out['best_val_loss']:.4f} on "
                         "the held-out images; best.safetensors is its encoder")
        return out
    best = load_model(run.run_dir / "best.safetensors", verbose=False).to(ctx.device)
    split = run.test_split
    if split is not None:
        test = evaluate(best, _val_loader(split, cfg, ctx), ctx.device, run.num_classes)
        out.update(test_loss=test["loss"], test_top1=test["top1"], test_images=len(split))
    train = evaluate(best, _val_loader(run.train_split, cfg, ctx), ctx.device, run.num_classes)
    out.update(train_loss=train["loss"], train_top1=train["top1"])
    if ctx.main:
        _write_result(run, out)
        run.log.line(f"{'stopped early' if out['stopped'] == 'patience' else 'ran every epoch'}"
                     f" after {out['epochs']} epochs; best epoch {out['best_epoch']}: "
                     f"top-1 {train['top1']:.4f} on its training images"
                     + (f", {out['test_top1']:.4f} on the validation split" if split else ""))
    return out


def _doctor_at_end(run: _Run) -> None:
    """The run checks on the finished run: their lines in train.log, all in doctor.json."""
    findings = diagnose_run(run.run_dir)
    for finding in findings:
        if finding.level != "ok":
            run.log.line(f"doctor: {finding.level}: {finding.summary}. Fix: {finding.fix}")
    text = to_json(findings, str(run.run_dir)) + "\n"
    atomic_write(run.run_dir / "doctor.json", lambda tmp: tmp.write_text(text))


def _update_ema(ema: nn.Module, model: nn.Module, decay: float) -> None:
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters(), strict=True):
            e.lerp_(p.detach(), 1 - decay)
        for e, b in zip(ema.buffers(), model.buffers(), strict=True):
            e.copy_(b)
