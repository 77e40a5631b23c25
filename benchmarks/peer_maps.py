"""The peers' attribution methods run on a vitkit ViT, each giving maps on its patch grid
(B, gh, gw) for given target classes, so the explanation benchmarks score them exactly as they
score vitkit's own methods.

- captum 0.9: Integrated Gradients (zero baseline, 32 steps) and Input x Gradient, on the pixels,
  summed over the channels and over each patch (signed: evidence for the class ranks first).
- pytorch-grad-cam 1.5: Grad-CAM, Grad-CAM++, XGrad-CAM, LayerCAM and EigenCAM on the last
  block's first LayerNorm (the layer its ViT tutorial uses), the prefix tokens dropped.
- LXT 2.1's AttnLRP: the model exported to Hugging Face's ViT layout and explained by
  tests/lxt_reference.py in its own process (LXT patches the classes it explains); models that
  layout cannot hold (registers, a MAP head) are left out with the exporter's reason.
- Chefer et al.'s official code (hila-chefer/Transformer-Explainability, not on any package
  index): its ``transformer_attribution`` on its own ViT with the model's weights loaded, where
  a clone is given. It needs einops, runs one image at a time, and its ``.cuda()`` calls are made
  no-ops on a CPU machine.

``peer_maps(name, model, images, target)`` -> (maps, seconds per image);
``applies(name, model)`` -> None or the reason it cannot run.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vitkit.checkpoints import export, formats

LXT_SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "lxt_reference.py"
CAMS = ("GradCAM", "GradCAMPlusPlus", "XGradCAM", "LayerCAM", "EigenCAM")
PEERS = ("captum-ig", "captum-ixg", *(f"grad-cam:{c}" for c in CAMS), "lxt-attnlrp",
         "chefer-official")
CHEFER_REPO: Path | None = None  # set by the benchmark's --chefer-repo


def library(name: str) -> str:
    """The peer's library, for the tables."""
    for prefix, lib in (("captum", "captum"), ("grad-cam", "pytorch-grad-cam"),
                        ("lxt", "LXT"), ("chefer", "Chefer et al.")):
        if name.startswith(prefix):
            return lib
    raise ValueError(f"unknown peer {name!r}; choose one of {', '.join(PEERS)}")


def to_grid(pixels: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, H, W) pixel attributions -> (B, gh, gw), summed over each patch."""
    ph, pw = pixels.shape[-2] // grid[0], pixels.shape[-1] // grid[1]
    return F.avg_pool2d(pixels[:, None].float(), (ph, pw))[:, 0] * (ph * pw)


def applies(name: str, model) -> str | None:
    cfg = model.cfg
    if name == "lxt-attnlrp":
        problems = formats.get("hf").refusals(cfg)  # what export(to="hf") would refuse
        if problems:
            return ("LXT explains Hugging Face's ViT, which cannot hold this model: it "
                    + "; ".join(problems))
    if name == "chefer-official":
        if CHEFER_REPO is None:
            return "no clone of hila-chefer/Transformer-Explainability given (--chefer-repo)"
        if not cfg.class_token or cfg.pool != "cls" or cfg.num_reg_tokens:
            return "the official code's ViT reads a [CLS] token and has no registers"
    return None


def _captum(kind: str, model, images, target):
    from captum.attr import InputXGradient, IntegratedGradients

    x = images.clone().requires_grad_(True)
    if kind == "ig":
        a = IntegratedGradients(model).attribute(x, baselines=torch.zeros_like(x), target=target,
                                                 n_steps=32, internal_batch_size=256)
    else:
        a = InputXGradient(model).attribute(x, target=target)
    return to_grid(a.detach().sum(1), model.grid_size)


def _grad_cam(kind: str, model, images, target):
    import pytorch_grad_cam as pgc
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    gh, gw = model.grid_size
    skip = model.num_prefix_tokens

    def tokens_to_map(tokens):  # (B, T, D) -> (B, D, gh, gw)
        t = tokens[:, skip:]
        return t.reshape(t.shape[0], gh, gw, t.shape[-1]).permute(0, 3, 1, 2)

    with getattr(pgc, kind)(model=model, target_layers=[model.blocks[-1].norm1],
                            reshape_transform=tokens_to_map) as cam:
        out = cam(input_tensor=images, targets=[ClassifierOutputTarget(int(t)) for t in target])
    return to_grid(torch.from_numpy(out), (gh, gw))


def _lxt(model, images, target):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        export(model, tmp / "hf", to="hf")
        torch.save(images, tmp / "x.pt")
        done = subprocess.run([sys.executable, str(LXT_SCRIPT), "attn-hf", str(tmp / "hf"),
                               str(tmp / "x.pt"), str(tmp / "out.pt")],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"LXT failed: {done.stderr[-2000:]}")
        out = torch.load(tmp / "out.pt", weights_only=True)
    if not torch.equal(out["logits"].argmax(-1), target):
        raise RuntimeError("LXT's model predicts other classes than the target: not the same "
                           "model")
    return to_grid(out["relevance"], model.grid_size), out["seconds"]


@contextlib.contextmanager
def _cuda_is_cpu():
    """The official code calls .cuda() on its one-hot vectors; on a CPU machine, a no-op."""
    saved = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = saved


def _chefer_official(model, images, target):
    repo = str(CHEFER_REPO)
    if repo not in sys.path:
        sys.path.insert(0, repo)
    from baselines.ViT.ViT_explanation_generator import LRP
    from baselines.ViT.ViT_LRP import VisionTransformer

    cfg = model.cfg
    theirs = VisionTransformer(img_size=cfg.img_size[0], patch_size=cfg.patch_size,
                               num_classes=cfg.num_classes, embed_dim=cfg.embed_dim,
                               depth=cfg.depth, num_heads=cfg.num_heads,
                               mlp_ratio=cfg.mlp_dim / cfg.embed_dim, qkv_bias=cfg.qkv_bias)
    for m in theirs.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = cfg.norm_eps
    with tempfile.TemporaryDirectory() as tmp:
        path = export(model, Path(tmp) / "timm.safetensors", to="timm")
        from safetensors.torch import load_file
        theirs.load_state_dict(load_file(path))
    theirs.eval()
    gap = (theirs(images[:8]) - model(images[:8])).detach().abs().max().item()  # hooks: grads on
    if gap > 1e-3:
        raise RuntimeError(f"the official ViT's logits differ from vitkit's by {gap:.2g}")
    generator = LRP(theirs)
    maps = []
    with _cuda_is_cpu():
        for x, t in zip(images, target, strict=True):
            r = generator.generate_LRP(x[None], index=int(t), method="transformer_attribution")
            maps.append(r.detach().reshape(model.grid_size))
    return torch.stack(maps)


def peer_maps(name: str, model, images: torch.Tensor,
              target: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The peer ``name``'s maps (B, gh, gw) of ``images`` for ``target`` and the seconds per
    image it took (for LXT, the forward and backward in its own process, without its start)."""
    start = time.perf_counter()
    if name == "lxt-attnlrp":
        maps, seconds = _lxt(model, images, target)
        return maps, seconds / len(images)
    if name.startswith("captum-"):
        maps = _captum(name.split("-")[1], model, images, target)
    elif name.startswith("grad-cam:"):
        maps = _grad_cam(name.split(":")[1], model, images, target)
    elif name == "chefer-official":
        maps = _chefer_official(model, images, target)
    else:
        raise ValueError(f"unknown peer {name!r}; choose one of {', '.join(PEERS)}")
    return maps, (time.perf_counter() - start) / len(images)
