"""What every Hugging Face layout (ViT, DINOv2, CLIP, SigLIP) shares: the activation tables and
the two vitkit options no Hugging Face class has a field for. A leaf module: ``hf`` imports the
family modules, and they import this, never ``hf``."""

from __future__ import annotations

from vitkit.checkpoints.common import CheckpointError

# Hugging Face's hidden_act names -> vitkit's act (gelu_new is the tanh approximation); every
# Hugging Face layout reads and writes through these two tables
ACTS = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_new": "gelu_tanh"}
HF_ACT = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_tanh": "gelu_pytorch_tanh"}


def act_of(config: dict) -> str:
    """vitkit's ``act`` for a Hugging Face config's ``hidden_act``; an error for others."""
    act = ACTS.get(config.get("hidden_act", "gelu"))
    if act is None:
        raise CheckpointError(f"hidden_act {config['hidden_act']!r} is not supported; vitkit "
                              f"reads {', '.join(ACTS)}")
    return act


def interpolation_of(config: dict, dynamic: bool = False, antialias: bool = False) -> dict:
    """``dynamic_img_size`` and ``pos_antialias`` for a config.json: what :func:`interpolation`
    wrote, else what the Hugging Face class does (``dynamic``, ``antialias``)."""
    return {"dynamic_img_size": bool(config.get("dynamic_img_size", dynamic)),
            "pos_antialias": bool(config.get("pos_antialias", antialias))}


def interpolation(cfg, dynamic: bool = False, antialias: bool = False) -> dict:
    """The config.json entries that keep a model's ``dynamic_img_size`` and ``pos_antialias``
    where they differ from what the reader assumes for the class (``dynamic``, ``antialias``):
    transformers keeps them as plain attributes, and :func:`interpolation_of` reads them back."""
    out = {"dynamic_img_size": cfg.dynamic_img_size, "pos_antialias": cfg.pos_antialias}
    return {k: v for k, v in out.items()
            if v != {"dynamic_img_size": dynamic, "pos_antialias": antialias}[k]}
