"""Fine-tuning part of a model: freezing (``--freeze``) and LoRA adapters (``--lora-rank``).

- ``--freeze backbone``: only the classifier head learns (a linear probe trained as a run).
- ``--freeze N``: the patch embedding, the position table (and rotary frequencies), the prefix
  tokens, the pre-norm and the first N blocks stay fixed; the blocks above them, the final norm
  and the head learn.
- ``--lora-rank R``: Hugging Face PEFT's LoRA (Hu et al. 2021) on the blocks' linear layers
  named by ``--lora-targets`` (``qkv``, ``proj``, ``fc1``, ``fc2``): every base weight is
  frozen, the low-rank pairs and the head learn. A checkpoint never holds the adapters:
  :func:`plain` merges them (W + alpha/r B A) into a copy, so best/last.safetensors are plain
  vitkit models that every command reads; ``state.pt`` keeps them unmerged, so ``--resume``
  continues the run exactly.

ViTs only: a CNN's BatchNorm statistics would still move under a frozen backbone. Frozen
parameters get ``requires_grad=False``, which keeps them out of the optimizer and of its
weight-decay groups (``trainer.param_groups``): their values in a checkpoint are the init's, bit
for bit (under LoRA the adapted weights differ from the init's by the merged delta alone), and
frozen blocks run without stochastic depth. The API: :func:`prepare` (before the optimizer is
built), :func:`plain` (what a checkpoint holds), :func:`counts` and :func:`record` (the
trainable share, in the run folder).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

from torch import nn

from vitkit.errors import ConfigError
from vitkit.models.cnn import is_cnn
from vitkit.util.files import atomic_write

# --lora-targets name -> the modules of a block it adapts (a regular expression on the module
# path; SwiGLU's two first layers, fc1_g and fc1_x, count as fc1)
LORA_TARGETS = {"qkv": r"attn\.qkv", "proj": r"attn\.proj", "fc1": r"mlp\.fc1(_g|_x)?",
                "fc2": r"mlp\.fc2"}
# what stays fixed under --freeze N besides the first N blocks: the embedding stage
EMBEDDING = ("patch_embed", "pos_embed", "cls_token", "dist_token", "reg_token", "rope",
             "norm_pre")
HEADS = ("head", "head_dist")  # a ViT's classifiers
RECORD = "params.json"  # the run folder's record of the trainable parameters


def adapted(cfg) -> bool:
    """Whether ``cfg`` (a TrainConfig) trains only part of its model."""
    return bool(cfg.freeze) or cfg.lora_rank > 0


def frozen_blocks(freeze: str) -> int | None:
    """``--freeze N`` as N; None for "" and "backbone"."""
    return int(freeze) if freeze not in ("", "backbone") else None


def lora_targets(text: str) -> list[str]:
    """``--lora-targets`` as names of :data:`LORA_TARGETS` (comma-separated, in order)."""
    return [t.strip() for t in text.split(",") if t.strip()]


def prepare(model: nn.Module, cfg) -> nn.Module:
    """``model`` frozen or given LoRA adapters as ``cfg`` says (in place; returned). A model
    the options do not fit (a CNN, ``--freeze N`` with N above its depth) is a
    :class:`ConfigError` saying what fits. Frozen blocks run without stochastic depth: they
    compute the same features at every step."""
    if not adapted(cfg):
        return model
    what = f"--lora-rank {cfg.lora_rank}" if cfg.lora_rank else f"--freeze {cfg.freeze}"
    if is_cnn(model):
        raise ConfigError(cnn_refusal(what, model.cfg.arch))
    if cfg.lora_rank:
        return _add_lora(model, cfg)
    depth = len(model.blocks)
    n = frozen_blocks(cfg.freeze)
    if n is not None and n > depth:
        raise ConfigError(f"--freeze {n} asks for more blocks than the model has ({depth}): "
                          f"give 0..{depth} (the first N blocks stay fixed), or --freeze "
                          "backbone for a linear probe")
    for name, p in model.named_parameters():
        p.requires_grad_(not _is_frozen(name, n))
    for block in model.blocks[: depth if n is None else n]:
        block.drop_path1.p = block.drop_path2.p = 0.0
    return model


def cnn_refusal(what: str, arch: str) -> str:
    """Why ``what`` (--freeze, --lora-rank) does not apply to the CNN ``arch``."""
    return (f"{what} trains part of a ViT; {arch} is a CNN, whose BatchNorm statistics would "
            "still move under a frozen backbone: train it whole (drop the option), or adapt a "
            "ViT")


def _is_frozen(name: str, n: int | None) -> bool:
    """Whether parameter ``name`` stays fixed under ``--freeze backbone`` (``n`` None: all but
    the classifier) or ``--freeze n``."""
    top = name.split(".")[0]
    if n is None:
        return top not in HEADS
    return top in EMBEDDING or (top == "blocks" and int(name.split(".")[1]) < n)


def _add_lora(model: nn.Module, cfg) -> nn.Module:
    """PEFT's LoRA layers around the targeted linears of every block; only they and the head
    train."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as err:
        raise ConfigError(f"--lora-rank needs Hugging Face PEFT, which is not installed "
                          f"({err}): pip install '.[train]' from vitkit's folder, or pip "
                          "install peft") from err

    names = lora_targets(cfg.lora_targets)
    pattern = r"blocks\.\d+\.(" + "|".join(LORA_TARGETS[t] for t in names) + ")"
    config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha or cfg.lora_rank,
                        lora_dropout=cfg.lora_dropout, target_modules=pattern, bias="none")
    model = inject_adapter_in_model(config, model)  # freezes every weight but the adapters'
    for head in HEADS:
        module = getattr(model, head, None)
        if module is not None:
            module.requires_grad_(True)
    # the in-place CPU inference path reads each layer's weight, which is not an adapted
    # layer's map: the standard path calls the layers
    model.inplace_inference = False
    return model


def _tuner_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The PEFT layers in ``model`` (none unless PEFT was imported: a run without LoRA never
    loads it)."""
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    if tuners is None:
        return []
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, tuners.BaseTunerLayer)]


def plain(model: nn.Module) -> nn.Module:
    """What a checkpoint of ``model`` holds: ``model`` itself, or, with LoRA adapters, a copy
    with each merged into its base layer by PEFT (W + alpha/r B A) and the adapter removed:
    the same outputs, a plain vitkit model with vitkit's keys."""
    if not _tuner_layers(model):
        return model
    merged = copy.deepcopy(model)
    for name, layer in _tuner_layers(merged):
        parent, _, child = name.rpartition(".")
        layer.merge()
        setattr(merged.get_submodule(parent), child, layer.get_base_layer())
    vars(merged).pop("peft_config", None)  # what PEFT left on the model: no adapter is left
    merged.inplace_inference = True  # plain layers again: the in-place path computes them
    return merged


def plain_state(model: nn.Module) -> dict:
    """:func:`plain`'s state dict: vitkit's keys, adapters merged."""
    return plain(model).state_dict()


def counts(model: nn.Module) -> dict:
    """{"total": parameters of the model as trained (adapters included), "trainable": those
    the optimizer steps, "fraction": their share}."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"total": total, "trainable": trainable, "fraction": trainable / max(total, 1)}


def describe(model: nn.Module, cfg) -> str:
    """The run log's words on what trains, e.g. ``"5,834,250 parameters, 3,850 trainable
    (0.066%: --freeze backbone)"``."""
    c = counts(model)
    if not adapted(cfg):
        return f"{c['total']:,} parameters, all trainable"
    how = (f"LoRA rank {cfg.lora_rank} on {cfg.lora_targets} + the head" if cfg.lora_rank
           else f"--freeze {cfg.freeze}")
    text = f"{c['total']:,} parameters, {c['trainable']:,} trainable ({c['fraction']:.3%}: {how})"
    if not cfg.init:
        text += ("; no --init: the frozen weights stay at their random initialisation "
                 "(random features); fine-tune a pre-trained checkpoint with --init CKPT")
    return text


def record(model: nn.Module, cfg, path: str | Path) -> dict:
    """Write what trains to ``path`` (the run folder's :data:`RECORD`, atomically): counts
    and the options that set them. The doctor reads it."""
    out = {**counts(model), "freeze": cfg.freeze, "lora_rank": cfg.lora_rank,
           "lora_targets": lora_targets(cfg.lora_targets) if cfg.lora_rank else []}
    text = json.dumps(out, indent=2) + "\n"
    atomic_write(Path(path), lambda tmp: tmp.write_text(text))
    return out
