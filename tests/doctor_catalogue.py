"""The doctor's catalogue: run folders, checkpoints and maps files, each with one problem planted
and the finding it must raise, and healthy ones that must stay quiet.

Where the machine allows, a case is a real run (``tests/data/doctor/``, made by
``make_runs.py`` there: vitkit trainings on the digits, timm ``train.py`` and Hugging Face
Trainer output); where it does not, a file edited from a real one, and each case says which.
``tests/test_doctor_catalogue.py`` runs every case; ``python tests/doctor_catalogue.py`` prints
the confusion table that docs/doctor.md shows (a test keeps the two equal).

A case is caught when a finding of its check has its level; a healthy case raises a false
alarm with any warning or error other than the true ones it lists (``true_warnings``: a run of
1,438 images from scratch *is* small data).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.checkpoints import timm as timm_format
from vitkit.data.datasets import load_split
from vitkit.data.images import Preprocess, preprocessing
from vitkit.diagnose import diagnose
from vitkit.recipe import plan_run
from vitkit.train import resolve, train

DATA = Path(__file__).parent / "data" / "doctor"
TRAINED = DATA / "trained.safetensors"
DEMO = DATA / "demo-recipe.safetensors"  # vitkit demo's recipe: LayerNorms barely moved


@dataclass(frozen=True)
class Case:
    """``build(folder) -> target`` makes the case under ``folder``; ``expect`` is the planted
    problem's (check, level), None for a healthy case."""

    name: str
    kind: str  # "run", "checkpoint", "maps"
    source: str  # "real run", "edited", "real run, edited", "built"
    build: Callable[[Path], Path]
    expect: tuple[str, str] | None = None
    true_warnings: tuple[str, ...] = ()
    img_size: int | None = None

    @property
    def healthy(self) -> bool:
        return self.expect is None


# ------------------------------------------------------------------------------- run folders
def _real(name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        return Path(shutil.copytree(DATA / name, folder / name))
    return build


def _vitkit_run(config: dict, rows: list[tuple], planned: bool = True, images: int = 200_000,
                classes: int = 10, columns=("train_loss", "val_loss", "val_top1"),
                ) -> Callable[[Path], Path]:
    """A vitkit run folder with ``rows`` of (train_loss, val_loss, val_top1) per epoch, 100
    optimizer steps an epoch; ``planned``: with the run.json the trainer writes (its plan of
    ``images`` and ``classes`` in one process)."""
    def build(folder: Path) -> Path:
        folder = folder / "run"
        folder.mkdir()
        full = {"model": "vit_small_patch16_224", "recipe": "plain", "lr": 5e-4,
                "batch_size": 512, "accum_steps": 1, "warmup_epochs": 1, "weight_decay": 0.05,
                "epochs": len(rows), "steps": 0, "init": None, **config}
        (folder / "config.yaml").write_text(yaml.safe_dump(full))
        lines = ["epoch,step," + ",".join(columns)]
        lines += [f"{i + 1},{100 * (i + 1)}," + ",".join(str(v) for v in row)
                  for i, row in enumerate(rows)]
        (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
        if planned:
            plan = plan_run(full, images, classes).to_dict()
            (folder / "run.json").write_text(json.dumps(plan))
        return folder
    return build


def _without(name: str, *files: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        dst = Path(shutil.copytree(DATA / name, folder / name))
        for f in files:
            (dst / f).unlink()
        return dst
    return build


def _timm_run(args: dict, rows: list[tuple]) -> Callable[[Path], Path]:
    """A timm train.py folder as it writes one: args.yaml (every option, sorted, lr unresolved
    when not given) and summary.csv (epoch from 0, top-1 in percent)."""
    def build(folder: Path) -> Path:
        folder = folder / "20261203-101500-vit_small_patch16_224-224"
        folder.mkdir()
        full = {"model": "vit_small_patch16_224", "opt": "adamw", "lr": None, "lr_base": 5e-4,
                "lr_base_size": 512, "lr_base_scale": "", "batch_size": 128,
                "grad_accum_steps": 1, "weight_decay": 0.05, "warmup_epochs": 5,
                "epochs": len(rows), "clip_grad": None, "mixup": 0.0, "cutmix": 0.0, "aa": None,
                "pretrained": False, "initial_checkpoint": "", "num_classes": 10, **args}
        (folder / "args.yaml").write_text(yaml.safe_dump(full, default_flow_style=False))
        lines = ["epoch,train_loss,eval_loss,eval_top1,eval_top5,lr"]
        lines += [f"{i},{t},{v},{a},{min(100.0, a * 2)},0.0005" for i, (t, v, a) in
                  enumerate(rows)]
        (folder / "summary.csv").write_text("\r\n".join(lines) + "\r\n")
        return folder
    return build


def _hf_run(history: list[dict], labels: int = 10) -> Callable[[Path], Path]:
    """A Hugging Face Trainer output folder as it writes one: checkpoint-N/trainer_state.json
    (sorted keys, NaN as the bare token) and config.json."""
    def build(folder: Path) -> Path:
        folder = folder / "hf-out"
        step = history[-1]["step"]
        ckpt = folder / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        state = {"best_global_step": None, "best_metric": None, "best_model_checkpoint": None,
                 "epoch": history[-1]["epoch"], "eval_steps": 500, "global_step": step,
                 "is_hyper_param_search": False, "is_local_process_zero": True,
                 "is_world_process_zero": True, "log_history": history, "logging_steps": 500,
                 "max_steps": step, "num_input_tokens_seen": 0,
                 "num_train_epochs": int(history[-1]["epoch"]), "save_steps": 500,
                 "stateful_callbacks": {}, "total_flos": 0, "train_batch_size": 32,
                 "trial_name": None, "trial_params": None}
        (ckpt / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        config = {"model_type": "vit", "num_hidden_layers": 2, "hidden_size": 32,
                  "id2label": {str(i): str(i) for i in range(labels)}}
        (ckpt / "config.json").write_text(json.dumps(config, indent=2))
        return folder
    return build


def _hf_history(losses: list[tuple[float, float, float]], lr: float = 5e-5,
                grad=None) -> list[dict]:
    out = []
    for i, (t, v, a) in enumerate(losses):
        step = 10 * (i + 1)
        g = grad[i] if grad else 1.0
        out.append({"epoch": float(i + 1), "grad_norm": g, "learning_rate": lr, "loss": t,
                    "step": step})
        out.append({"epoch": float(i + 1), "eval_accuracy": a, "eval_loss": v, "step": step})
    return out


CHANCE = math.log(10)
# augmented runs: the training loss held near or above chance while validation learns
AUGMENTED_NEAR_CHANCE = [(2.31, 0.7, 0.8)] * 4
AUGMENTED_ABOVE_CHANCE = [(2.9, 0.9, 0.7), (2.8, 0.7, 0.78), (2.75, 0.6, 0.81)]
CONVERGING = [(2.2, 2.0, 0.3), (1.6, 1.5, 0.5), (1.1, 1.1, 0.65), (0.8, 0.85, 0.72),
              (0.6, 0.7, 0.77), (0.5, 0.62, 0.8)]

RUN_CASES = [
    Case("a short run, loss near chance", "run", "real run", _real("short"),
         true_warnings=("run.small_data",)),
    Case("a healthy run (300 steps, top-1 0.85)", "run", "real run", _real("healthy"),
         true_warnings=("run.small_data",)),
    Case("lr 250x too high: stuck at chance for 230 steps", "run", "real run",
         _real("lr-too-high"), ("run.learning", "error"), ("run.small_data",)),
    Case("lr 300: the loss jumps to tens of thousands", "run", "real run",
         _real("diverging"), ("run.learning", "error"), ("run.small_data",)),
    Case("lr 1e9: the loss became NaN at step 2, the folder kept", "run", "real run",
         _real("nan"), ("run.stability", "error"), ("run.small_data",)),
    Case("72 images for 150 epochs: memorised", "run", "real run", _real("overfitting"),
         ("run.overfitting", "warning"), ("run.small_data",)),
    Case("the healthy run without its train.log and run.json", "run", "real run, edited",
         _without("healthy", "train.log", "run.json")),
    Case("a loss 8x above chance", "run", "edited",
         _vitkit_run({}, [(2.4, 2.3, 0.1), (9.0, 12.0, 0.1), (18.4, 19.0, 0.1)]),
         ("run.learning", "error")),
    Case("a loss rising past chance", "run", "edited",
         _vitkit_run({}, [(2.1, 2.1, 0.2), (2.3, 2.35, 0.15), (2.6, 2.7, 0.1)]),
         ("run.learning", "error")),
    Case("flat at chance for 400 steps", "run", "edited",
         _vitkit_run({}, [(CHANCE + d, CHANCE, 0.1) for d in (0.01, -0.02, 0.005, 0.0)]),
         ("run.learning", "error")),
    Case("a NaN train loss in metrics.csv", "run", "edited",
         _vitkit_run({}, [(2.2, 2.1, 0.2), (1.9, 1.8, 0.3), ("nan", "nan", 0.1)]),
         ("run.stability", "error")),
    Case("an infinite validation loss", "run", "edited",
         _vitkit_run({}, [(2.2, 2.1, 0.2), (1.9, "inf", 0.1), (1.8, 1.7, 0.4)]),
         ("run.stability", "error")),
    Case("a jump at the second epoch", "run", "edited",
         _vitkit_run({}, [(1.2, 1.1, 0.6), (2.0, 1.9, 0.3), (1.0, 1.0, 0.65),
                          (0.9, 0.9, 0.7)]),
         ("run.stability", "warning")),
    Case("a loss spike late in the run", "run", "edited",
         _vitkit_run({}, CONVERGING[:4] + [(2.6, 2.5, 0.3), (0.7, 0.8, 0.75)]),
         ("run.stability", "warning")),
    Case("a fine-tune with --recipe finetune (smoothing, drop path, crop 0.5, flips): the train "
         "loss above chance, validation good", "run", "real run", _real("finetune"), None,
         ("run.learning", "run.recipe")),
    Case("the same fine-tune at lr 0.5: diverging", "run", "real run",
         _real("finetune-diverging"), ("run.learning", "error"), ("run.recipe",)),
    Case("label smoothing 0.4: the train loss flat near chance, validation good", "run",
         "edited", _vitkit_run({"label_smoothing": 0.4}, AUGMENTED_NEAR_CHANCE), None),
    Case("stochastic depth 0.5: the train loss above chance, validation good", "run", "edited",
         _vitkit_run({"drop_path": 0.5}, AUGMENTED_ABOVE_CHANCE), None, ("run.learning",)),
    Case("MixUp 0.8 and CutMix 1.0: the train loss above chance, validation good", "run",
         "edited", _vitkit_run({"mixup": 0.8, "cutmix": 1.0}, AUGMENTED_ABOVE_CHANCE), None,
         ("run.learning",)),
    Case("crop scale 0.08: the train loss above chance, validation good", "run", "edited",
         _vitkit_run({"crop_scale": 0.08}, AUGMENTED_ABOVE_CHANCE), None, ("run.learning",)),
    Case("timm: smoothing 0.1 and its default crop: the train loss above chance, validation "
         "good", "run", "edited (timm's layout)",
         _timm_run({"smoothing": 0.1}, [(t, v, 100 * a) for t, v, a in AUGMENTED_ABOVE_CHANCE]),
         None, ("run.learning",)),
    Case("a fine-tune under augmentation whose validation loss climbs past chance", "run",
         "edited", _vitkit_run({"recipe": "finetune", "init": "pretrained.pth", "lr": 1e-4,
                                "label_smoothing": 0.1, "drop_path": 0.1, "crop_scale": 0.5},
                               [(2.6, 1.0, 0.7), (2.9, 2.0, 0.3), (3.4, 2.9, 0.1)]),
         ("run.learning", "error")),
    Case("a short from-scratch run whose loss falls slowly", "run", "edited",
         _vitkit_run({}, [(2.324, 2.30, 0.08), (2.280, 2.27, 0.12), (2.242, 2.23, 0.17)]),
         None),
    Case("train loss 0.03 against a flat validation loss of 1.2", "run", "edited",
         _vitkit_run({}, [(1.5, 1.3, 0.55), (0.6, 1.2, 0.6), (0.2, 1.21, 0.61),
                          (0.03, 1.2, 0.61)]),
         ("run.overfitting", "warning")),
    Case("validation loss rising from its best", "run", "edited",
         _vitkit_run({}, [(2.0, 2.0, 0.3), (1.0, 1.2, 0.6), (0.4, 1.1, 0.62),
                          (0.1, 1.6, 0.6)]),
         ("run.overfitting", "warning")),
    Case("a converging run", "run", "edited", _vitkit_run({}, CONVERGING), None),
    Case("a converging run with Mixup (train loss above validation)", "run", "edited",
         _vitkit_run({"mixup": 0.8, "epochs": 300},
                     [(t + 0.6, v, a) for t, v, a in CONVERGING]), None),
    Case("SGD from scratch with a warmup", "run", "edited",
         _vitkit_run({"opt": "sgd", "lr": 0.05, "warmup_epochs": 5}, CONVERGING),
         ("run.recipe", "warning")),
    Case("SGD at lr 0.1 without warmup or clipping", "run", "edited",
         _vitkit_run({"opt": "sgd", "lr": 0.1, "warmup_epochs": 0}, CONVERGING),
         ("run.recipe", "warning")),
    Case("SGD fine-tuning at lr 0.01 (the ViT paper's recipe)", "run", "edited",
         _vitkit_run({"opt": "sgd", "lr": 0.01, "init": "pretrained.pth"}, CONVERGING), None),
    Case("AdamW at 2e-2 per 512 with 8 accumulation steps, no run.json", "run", "edited",
         _vitkit_run({"lr": 2e-2, "batch_size": 64, "accum_steps": 8}, CONVERGING,
                     planned=False),
         ("run.recipe", "warning")),
    Case("weight decay 1e-4", "run", "edited",
         _vitkit_run({"weight_decay": 1e-4}, CONVERGING), ("run.recipe", "warning")),
    Case("no warmup from scratch", "run", "edited",
         _vitkit_run({"warmup_epochs": 0}, CONVERGING), ("run.recipe", "warning")),
    Case("fine-tuning with AdamW at lr 5e-3", "run", "edited",
         _vitkit_run({"lr": 5e-3, "init": "pretrained.pth"}, CONVERGING),
         ("run.recipe", "warning")),
    Case("from scratch on 1,438 images", "run", "edited",
         _vitkit_run({}, CONVERGING, images=1438), ("run.small_data", "warning")),
    # timm train.py and Hugging Face Trainer folders: real ones (README.md there says how they
    # were made), and edited ones laid out exactly as those programs write them
    Case("timm train.py: AdamW with warmup, 96 steps near chance (timm's weight decay 2e-5)",
         "run", "real run (timm)", _real("timm-healthy"), None, ("run.recipe",)),
    Case("timm train.py: SGD at lr 0.1 from scratch, no warmup", "run", "real run (timm)",
         _real("timm-sgd"), ("run.recipe", "warning")),
    Case("Hugging Face Trainer: learning slowly", "run", "real run (Trainer)",
         _real("hf-healthy")),
    Case("Hugging Face Trainer: lr 50", "run", "real run (Trainer)", _real("hf-diverging"),
         ("run.learning", "error")),
    Case("timm: a healthy run", "run", "edited (timm's layout)",
         _timm_run({}, [(t, v, 100 * a) for t, v, a in CONVERGING]), None),
    Case("timm: SGD at lr 0.1, no warmup (timm's defaults)", "run", "edited (timm's layout)",
         _timm_run({"opt": "sgd", "lr": 0.1, "warmup_epochs": 0, "weight_decay": 2e-5},
                   [(t, v, 100 * a) for t, v, a in CONVERGING]), ("run.recipe", "warning")),
    Case("timm: the loss became NaN", "run", "edited (timm's layout)",
         _timm_run({}, [(2.2, 2.1, 20.0), (1.9, 1.8, 30.0), ("nan", "nan", 10.0)]),
         ("run.stability", "error")),
    Case("timm: memorising", "run", "edited (timm's layout)",
         _timm_run({}, [(1.5, 1.3, 55.0), (0.6, 1.2, 60.0), (0.2, 1.21, 61.0),
                        (0.03, 1.2, 61.0)]), ("run.overfitting", "warning")),
    # Hugging Face Trainer folders, laid out exactly as it writes them
    Case("Hugging Face Trainer: a healthy fine-tuning", "run", "edited (the Trainer's layout)",
         _hf_run(_hf_history(CONVERGING)), None),
    Case("Hugging Face Trainer: a NaN gradient norm (the loss it logs is filtered)", "run",
         "edited (the Trainer's layout)",
         _hf_run(_hf_history(CONVERGING[:3], grad=[1.0, 3.0, math.nan]), labels=10),
         ("run.stability", "error")),
    Case("Hugging Face Trainer: lr 0.5", "run", "edited (the Trainer's layout)",
         _hf_run(_hf_history([(CHANCE + 0.4, CHANCE + 0.5, 0.1)] * 4, lr=0.5)),
         ("run.learning", "error")),
]


# ------------------------------------------------------------------------------- checkpoints
def _edited(change: Callable, name: str, source: Path = TRAINED) -> Callable[[Path], Path]:
    """A real run's checkpoint (the catalogue's trained model unless ``source``) with
    ``change(model)`` applied."""
    def build(folder: Path) -> Path:
        model = vitkit.load_model(source, verbose=False)
        with torch.no_grad():
            change(model)
        return vitkit.save_model(model, folder / f"{name}.safetensors")
    return build


def _timm_file(edit: Callable[[dict], dict], name: str) -> Callable[[Path], Path]:
    """The trained model as a bare timm state dict (``.pth`` or ``.safetensors``, no config),
    edited by ``edit``."""
    def build(folder: Path) -> Path:
        state, _ = timm_format.from_vitkit(vitkit.load_model(TRAINED, verbose=False))
        state = edit({k: v.contiguous() for k, v in state.items()})
        path = folder / name
        if path.suffix == ".pth":
            torch.save(state, path)
        else:
            save_file(state, path)
        return path
    return build


def _drop_block(i: int) -> Callable[[dict], dict]:
    return lambda state: {k: v for k, v in state.items() if not k.startswith(f"blocks.{i}.")}


def _reset_blocks(model):
    for block in model.blocks[1:3]:
        for norm in (block.norm1, block.norm2):
            norm.weight.fill_(1.0)
            norm.bias.zero_()


def _reset_final_norm(model):
    model.norm.weight.fill_(1.0)
    model.norm.bias.zero_()


def _reinit_table(model):
    torch.nn.init.trunc_normal_(model.pos_embed, std=0.02)


def _fresh(folder: Path) -> Path:
    return vitkit.save_model(vitkit.create_model("vit_nano_patch4_32", num_classes=10),
                             folder / "fresh.safetensors")


def _briefly_trained(folder: Path) -> Path:
    """A real 20-step run: its table and blocks have barely moved."""
    result = train(resolve(dict(data="digits", img_size=32, model="vit_nano_patch4_32",
                                steps=20, batch_size=32, out=str(folder), name="brief")),
                   progress=False)
    return result.run_dir / "last.safetensors"


def _briefly_trained_redrawn(folder: Path) -> Path:
    model = vitkit.load_model(_briefly_trained(folder), verbose=False)
    with torch.no_grad():
        _reinit_table(model)
    return vitkit.save_model(model, folder / "brief-redrawn.safetensors")


def _state_file(edit: Callable[[dict], dict], name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        state = edit(load_file(TRAINED))
        save_file(state, folder / name)
        return folder / name
    return build


def _timm_folder_missing_last_block(folder: Path) -> Path:
    """A timm hub-style folder (config.json with its architecture and depth) whose weights
    lost their last block."""
    model = vitkit.load_model(TRAINED, verbose=False)
    out = vitkit.export(model, folder / "timm-folder", to="timm")
    weights = out / "model.safetensors"
    state = load_file(weights)
    save_file({k: v for k, v in state.items() if not k.startswith("blocks.3.")}, weights)
    return out


CHECKPOINT_CASES = [
    Case("the trained model", "checkpoint", "real run", lambda f: TRAINED, None),
    Case("a briefly trained model (20 steps)", "checkpoint", "real run", _briefly_trained,
         None),
    Case("a model never trained", "checkpoint", "built", _fresh, ("weights.trained", "error")),
    Case("the demo recipe's ViT (top-1 0.8, its LayerNorms moved 0.01)", "checkpoint",
         "real run", lambda f: DEMO, None),
    Case("the demo recipe's ViT with its table re-drawn", "checkpoint", "real run, edited",
         _edited(_reinit_table, "demo-reinit-table", DEMO),
         ("weights.position_table", "warning")),
    Case("a briefly trained model (20 steps) with its table re-drawn: cannot tell",
         "checkpoint", "real run, edited", _briefly_trained_redrawn,
         ("weights.position_table", "unknown")),
    Case("the position table re-initialised (ignore_mismatched_sizes)", "checkpoint",
         "real run, edited", _edited(_reinit_table, "reinit-table"),
         ("weights.position_table", "warning")),
    Case("blocks 1 and 2 at initialisation", "checkpoint", "real run, edited",
         _edited(_reset_blocks, "blocks-at-init"), ("weights.partially_loaded", "error")),
    Case("the final norm at initialisation", "checkpoint", "real run, edited",
         _edited(_reset_final_norm, "final-norm-at-init"),
         ("weights.partially_loaded", "error")),
    Case("a key missing", "checkpoint", "real run, edited",
         _state_file(lambda s: {k: v for k, v in s.items() if k != "blocks.1.mlp.fc1.weight"},
                     "missing-key.safetensors"), ("weights.load", "error")),
    Case("a key the model has no place for", "checkpoint", "real run, edited",
         _state_file(lambda s: {**s, "head_dist.weight": s["head.weight"].clone()},
                     "extra-key.safetensors"), ("weights.load", "warning")),
    Case("a bare timm .pth missing its last block", "checkpoint", "real run, edited",
         _timm_file(_drop_block(3), "timm-no-last-block.pth"),
         ("weights.partially_loaded", "warning")),
    Case("a bare timm .safetensors missing a middle block", "checkpoint", "real run, edited",
         _timm_file(_drop_block(1), "timm-gap.safetensors"),
         ("weights.partially_loaded", "error")),
    Case("a timm folder whose config says 4 blocks and whose weights hold 3", "checkpoint",
         "real run, edited", _timm_folder_missing_last_block,
         ("weights.partially_loaded", "error")),
    Case("a bare timm .pth of the trained model", "checkpoint", "real run, converted",
         _timm_file(lambda s: s, "timm-whole.pth"), None),
    Case("a 32 px model asked for 64 px", "checkpoint", "real run", lambda f: TRAINED,
         ("weights.input_size", "warning"), img_size=64),
]


# -------------------------------------------------------------------------------------- maps
def _trained_maps() -> np.ndarray:
    """(layers, heads, T, T) of the trained model on a validation digit."""
    model = vitkit.load_model(TRAINED, verbose=False)
    size, mean, std = preprocessing(model)
    split = load_split("digits", "val", size[0])
    x = Preprocess(size, mean, std)(split[0][0])[None]
    with torch.no_grad():
        _, maps = model(x, return_attn=True)
    return torch.stack(list(maps))[:, 0].numpy()


def _maps(make: Callable[[np.ndarray], np.ndarray], name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        np.save(folder / f"{name}.npy", make(_trained_maps()).astype(np.float32))
        return folder / f"{name}.npy"
    return build


def _sink(a: np.ndarray) -> np.ndarray:
    e = np.zeros(a.shape[-1], dtype=a.dtype)
    e[5] = 1.0
    return 0.3 * a + 0.7 * e  # every row gives 70% to token 5


def _object(a: np.ndarray) -> np.ndarray:
    """One image where the [CLS] row and the object's own patches look at the object (tokens
    20-23) and the background rows keep their attention: healthy, not a sink."""
    out = a.copy()
    e = np.zeros(a.shape[-1], dtype=a.dtype)
    e[20:24] = 0.25
    rows = [0, *range(12, 30)]
    out[..., rows, :] = 0.2 * a[..., rows, :] + 0.8 * e
    return out


MAPS_CASES = [
    Case("maps of the trained model", "maps", "real run", _maps(lambda a: a, "maps"), None),
    Case("heads averaged (layers, T, T)", "maps", "real run, edited",
         _maps(lambda a: a.mean(1), "averaged"), ("maps.heads", "warning")),
    Case("one map (T, T)", "maps", "real run, edited", _maps(lambda a: a[-1].mean(0), "one"),
         ("maps.heads", "warning")),
    Case("identical heads", "maps", "real run, edited",
         _maps(lambda a: np.repeat(a.mean(1, keepdims=True), a.shape[1], 1), "identical"),
         ("maps.heads", "warning")),
    Case("the last layer only (heads, T, T)", "maps", "real run, edited",
         _maps(lambda a: a[-1:], "last-layer"), ("maps.layers", "warning")),
    Case("uniform rows", "maps", "real run, edited",
         _maps(lambda a: np.full_like(a, 1 / a.shape[-1]), "uniform"),
         ("maps.uniform", "warning")),
    Case("a sink taking 70% of every row", "maps", "real run, edited", _maps(_sink, "sink"),
         ("maps.sinks", "warning")),
    Case("one image whose object draws the attention of many rows", "maps", "real run, edited",
         _maps(_object, "object"), None),
]

CASES = RUN_CASES + CHECKPOINT_CASES + MAPS_CASES


# ------------------------------------------------------------------------------- evaluation
@dataclass
class Result:
    case: Case
    findings: list  # of vitkit.diagnose.Finding

    @property
    def caught(self) -> bool:
        check, level = self.case.expect
        return any(f.check == check and f.level == level for f in self.findings)

    @property
    def alarms(self) -> list:
        """Warnings and errors a healthy case should not have raised."""
        return [f for f in self.findings if f.level == "error" or (
            f.level == "warning" and f.check not in self.case.true_warnings)]


def run_case(case: Case, folder: Path) -> Result:
    folder.mkdir(parents=True, exist_ok=True)
    target = case.build(folder)
    return Result(case, diagnose(target, img_size=case.img_size))


def confusion(results: list[Result]) -> str:
    """The Markdown table: per finding, planted cases caught and healthy cases flagged."""
    checks: dict[str, list[int]] = {}
    for r in results:
        if not r.case.healthy:
            row = checks.setdefault(r.case.expect[0], [0, 0, 0])
            row[0] += 1
            row[1] += r.caught
    healthy = [r for r in results if r.case.healthy]
    for r in healthy:
        for f in {f.check for f in r.alarms}:
            checks.setdefault(f, [0, 0, 0])[2] += 1
    lines = [f"| finding | planted cases | caught | healthy cases flagged (of {len(healthy)}) |",
             "|---|---|---|---|"]
    for check in sorted(checks):
        planted, caught, flagged = checks[check]
        lines.append(f"| `{check}` | {planted} | {caught} | {flagged} |")
    planted = [r for r in results if not r.case.healthy]
    lines.append(f"| **all** | {len(planted)} | {sum(r.caught for r in planted)} | "
                 f"{sum(bool(r.alarms) for r in healthy)} |")
    return "\n".join(lines)


def case_list() -> str:
    """The catalogue as a Markdown list: each case, its source and what it must raise."""
    lines = ["| case | kind | made from | must raise |", "|---|---|---|---|"]
    for c in CASES:
        must = f"`{c.expect[0]}` {c.expect[1]}" if c.expect else "nothing (healthy)"
        lines.append(f"| {c.name} | {c.kind} | {c.source} | {must} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results = [run_case(c, Path(tmp) / str(i)) for i, c in enumerate(CASES)]
    for r in results:
        verdict = ("healthy, quiet" if not r.alarms else
                   f"FALSE ALARM {[f.check for f in r.alarms]}") if r.case.healthy else (
            "caught" if r.caught else "MISSED")
        print(f"{verdict:>20}  {r.case.name}")
    print()
    print(confusion(results))
