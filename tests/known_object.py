"""A ViT whose answer is known: built by hand so that one patch per image decides its class-0
logit, so every faithful map must rank that patch first (tests/test_explain.py,
tests/test_explain_trust.py)."""

import torch
from conftest import SMALL, small_vit

from vitkit import VisionTransformer

D = SMALL["embed_dim"]
OBJECTS = [(2, 5), (6, 1)]  # (row, col) of the object patch in image 0 and image 1


def object_detector() -> VisionTransformer:
    """A one-block ViT built by hand whose class-0 logit measures one thing: how bright the
    patch that [CLS] attends to is. Every other weight is zero (LayerNorms are the identity).

    Patch embedding: dim 0 = the patch's mean brightness, dim 1 = 1 (so no token is all
    zeros under LayerNorm); [CLS] = dim 2. Head 0 of the block: query "am I [CLS]" (dim 2),
    key and value "how bright am I" (dim 0), written back to dim 3; the other heads and the
    MLP add nothing. The head reads dim 3 into class 0. So [CLS] attends to the brightest
    patch, and only the values of patches brighter than the rest raise the logit: the bright
    patch is the answer, and every faithful map ranks it first."""
    model = small_vit(depth=1)
    state = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    for k in state:
        if "norm" in k and k.endswith("weight"):
            state[k] += 1.0
    state["patch_embed.proj.weight"][0] = 1 / (3 * 4 * 4)
    state["patch_embed.proj.bias"][1] = 1.0
    state["cls_token"][0, 0, 2] = 1.0
    qkv = state["blocks.0.attn.qkv.weight"]  # rows: q, k, v, each (heads x head_dim)
    qkv[0, 2] = qkv[D, 0] = qkv[2 * D, 0] = 1.0  # head 0's first q, k and v channels
    state["blocks.0.attn.proj.weight"][3, 0] = 1.0
    state["head.weight"][0, 3] = 1.0
    model.load_state_dict(state)
    return model.eval()


def object_images() -> torch.Tensor:
    """Dim clutter (0..0.2) with one bright 4x4 patch per image, at ``OBJECTS``."""
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 0.2
    for b, (r, c) in enumerate(OBJECTS):
        x[b, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4] = 1.0
    return x


def assert_object_ranked_first(grid_map: torch.Tensor, method: str) -> None:
    """Each image's object patch scores highest, by a clear margin (an all-zero, constant or
    misplaced map fails)."""
    for b, (r, c) in enumerate(OBJECTS):
        others = grid_map[b].clone()
        others[r, c] = -float("inf")
        assert grid_map[b, r, c] > 2 * others.max().clamp_min(0) and grid_map[b, r, c] > 0, \
            f"{method}: image {b}'s object at {(r, c)} scores {grid_map[b, r, c]:.3g}, another " \
            f"patch {others.max():.3g} (argmax {divmod(int(grid_map[b].argmax()), 8)})"
