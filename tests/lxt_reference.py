"""LXT's own AttnLRP and CP-LRP rules (lxt 2.1, "efficient" gradient x input patches) applied to
the peers' models, for tests/test_explain_lrp.py to compare vitkit against. Run as a separate
process: LXT patches the peers' classes in place.

    python tests/lxt_reference.py cp-torchvision STATE.pth X.pt OUT.pt
    python tests/lxt_reference.py attn-hf HF_FOLDER X.pt OUT.pt

Writes {"relevance": (B, H, W) pixel relevance, "logits": (B, C), "seconds": the forward and
backward} for the predicted class.

lxt 2.1's package __init__ imports its LLM patches, which need transformers 4's
``modeling_attn_mask_utils``; the rules and patches vitkit is compared with are loaded without
it, from LXT's own ``lxt/efficient/{rules,patches}.py``.
"""

from __future__ import annotations

import sys
import time
import types
from functools import partial
from pathlib import Path

import lxt
import torch

_pkg = types.ModuleType("lxt.efficient")  # the subpackage without its __init__ (see above)
_pkg.__path__ = [str(Path(lxt.__file__).parent / "efficient")]
sys.modules["lxt.efficient"] = _pkg

from lxt.efficient.patches import (  # noqa: E402
    cp_multi_head_attention_forward,
    dropout_forward,
    layer_norm_forward,
    non_linear_forward,
    patch_method,
    wrap_attention_forward,
)


def cp_torchvision(weights: str) -> torch.nn.Module:
    """torchvision's vit_b_16 with LXT's CP-LRP map for it (lxt/efficient/models/vit_torch.py:
    identity rule on GELU, LayerNorm's std held, no gradient into the softmax)."""
    from torchvision.models import vision_transformer as tv

    for target, patch in {tv.nn.GELU: partial(patch_method, non_linear_forward,
                                              keep_original=True),
                          tv.nn.LayerNorm: partial(patch_method, layer_norm_forward),
                          tv.nn.MultiheadAttention: partial(
                              patch_method, cp_multi_head_attention_forward,
                              keep_original=True)}.items():
        assert patch(target)
    model = tv.vit_b_16()
    model.load_state_dict(torch.load(weights, weights_only=True))
    return model.eval()


def attn_hf(folder: str) -> torch.nn.Module:
    """A Hugging Face ViT with LXT's AttnLRP patches: the uniform rule at the attention's
    query, key (1/4) and value (1/2), identity rule on GELU, LayerNorm's std held."""
    import transformers
    from transformers.activations import GELUActivation
    from transformers.models.vit import modeling_vit as mv

    mv.eager_attention_forward = wrap_attention_forward(mv.eager_attention_forward)
    assert patch_method(non_linear_forward, GELUActivation, keep_original=True)
    assert patch_method(layer_norm_forward, torch.nn.LayerNorm)
    assert patch_method(dropout_forward, torch.nn.Dropout)
    model = transformers.ViTForImageClassification.from_pretrained(
        folder, attn_implementation="eager")
    return model.eval()


def main() -> None:
    kind, source, x_path, out = sys.argv[1:5]
    model = cp_torchvision(source) if kind == "cp-torchvision" else attn_hf(source)
    x = torch.load(x_path, weights_only=True).requires_grad_(True)
    with torch.no_grad():  # a warm-up, so that "seconds" times the explanation alone
        model(x[:1]) if kind == "cp-torchvision" else model(pixel_values=x[:1])
    start = time.perf_counter()
    logits = model(x) if kind == "cp-torchvision" else model(pixel_values=x).logits
    chosen = logits.gather(1, logits.argmax(-1, keepdim=True)).sum()
    chosen.backward()
    relevance = (x * x.grad).sum(1).detach()
    torch.save({"relevance": relevance, "logits": logits.detach(),
                "seconds": time.perf_counter() - start}, out)


if __name__ == "__main__":
    main()
