"""Time against resolution (224, 384) and patch size (32, 16, 8), next to the FLOP model's
prediction, so the N^2 attention term is visible; and what gradient checkpointing does to a
training step's peak memory.

Two tables: time per image with about the same number of tokens in every forward (``--tokens``,
so every setting's matrices have about as many rows and the machine runs them about as
efficiently: the FLOP model counts work, not efficiency), and time per image at one fixed
batch (``--batch``), where the few tokens of patch 32 make matrices too small for the peak.

Usage: python benchmarks/scaling.py [--model vit_base_patch16_224] [--tokens 1600] [--batch 2]
       [--repeats 5] [--memory-batch 16]
Writes benchmarks/results/scaling.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import vitkit
from vitkit.models.bench import interleaved, machine, median, spread
from vitkit.models.cost import flop_model

OUT = Path(__file__).parent / "results" / "scaling.md"
POINTS = [(224, 32), (224, 16), (384, 16), (224, 8)]  # (image, patch)


def saved_activations_mb(model_name: str, checkpointing: bool, batch: int) -> tuple[float, float]:
    """(MiB of activations saved for backward, MiB of parameters) for one training forward.

    Every tensor autograd saves passes through ``saved_tensors_hooks``; storages are counted
    once and parameters apart. Deterministic, unlike a process's resident size.
    """
    torch.manual_seed(0)
    model = vitkit.create_model(model_name).train()
    model.set_grad_checkpointing(checkpointing)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randn(batch, 3, *model.cfg.img_size)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    param_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    return sum(seen.values()) / 2**20, param_mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_base_patch16_224")
    parser.add_argument("--tokens", type=int, default=1600,
                        help="tokens per forward in the first table (batch = tokens / T)")
    parser.add_argument("--batch", type=int, default=2, help="the second table's batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-batch", type=int, default=16,
                        help="batch of the checkpointing measurement (activations dominate)")
    args = parser.parse_args()

    models, costs = {}, {}
    for img, patch in POINTS:
        key = f"{img}px / patch {patch}"
        torch.manual_seed(0)
        models[key] = vitkit.create_model(args.model, img_size=img, patch_size=patch).eval()
        costs[key] = flop_model(models[key].cfg, readout_only=True)  # what model(x) does
    base = "224px / patch 16"
    lines = ["# Scaling with resolution and patch size", "",
             f"Machine: {machine()}. {args.model} architecture, float32 inference, median of "
             f"{args.repeats} rounds. Ratios are of time per image, to {base}; the "
             "FLOP model is the one `vitkit info` prints, for the forward `model(x)` runs "
             "(the last block computes the [CLS] row only).", ""]
    # With equal tokens the settings are interleaved (drift falls on all alike). At a fixed
    # batch their sizes differ 16x, and a big forward just before a small one makes the small
    # one re-fault the memory the big one gave back, so each setting runs on its own there.
    tables = [("About the same number of tokens in every forward",
               {k: max(1, round(args.tokens / c.tokens)) for k, c in costs.items()}, True),
              (f"A fixed batch of {args.batch}", {k: args.batch for k in costs}, False)]
    for title, batches, mixed in tables:
        inputs = {k: torch.randn(batches[k], 3, *m.cfg.img_size) for k, m in models.items()}
        calls = {k: (lambda m=m, x=inputs[k]: m(x)) for k, m in models.items()}
        with torch.inference_mode():
            if mixed:
                times = interleaved(calls, repeats=args.repeats, desc=f"scaling: {title}")
            else:
                times = {k: interleaved({k: c}, repeats=args.repeats, desc=k)[k]
                         for k, c in calls.items()}
        per_image = {k: median(t) / batches[k] for k, t in times.items()}
        lines += [f"## {title}", "",
                  "Settings interleaved round by round." if mixed else
                  "Each setting timed on its own, one after the other.", "",
                  "| setting | batch | tokens T | attention share of FLOPs | time ratio | "
                  "FLOP ratio | measured / predicted |", "|---|---|---|---|---|---|---|"]
        for key, cost in costs.items():
            t_ratio = per_image[key] / per_image[base]
            f_ratio = cost.flops / costs[base].flops
            lines.append(f"| {key} | {batches[key]} | {cost.tokens} | "
                         f"{100 * cost.attention / cost.macs:.1f}% | {t_ratio:.2f} "
                         f"(±{100 * spread(times[key]):.0f}%) | {f_ratio:.2f} | "
                         f"{t_ratio / f_ratio:.2f} |")
        lines.append("")
    plain, params = saved_activations_mb(args.model, False, args.memory_batch)
    ckpt, _ = saved_activations_mb(args.model, True, args.memory_batch)
    fixed = 4 * params  # weights + gradients + AdamW's two moments
    lines += ["## Gradient checkpointing", "",
              f"{args.model}, batch {args.memory_batch}: activations saved for backward (every "
              f"tensor through `saved_tensors_hooks`, storages counted once) {plain:.0f} MiB "
              f"without and {ckpt:.0f} MiB with `set_grad_checkpointing(True)` "
              f"({plain / ckpt:.1f}x less). With weights, gradients and AdamW's moments "
              f"({fixed:.0f} MiB) a training step's peak is about {fixed + plain:.0f} MiB "
              f"against {fixed + ckpt:.0f} MiB: {(fixed + plain) / (fixed + ckpt):.2f}x less. "
              "Gradients are identical (tested).", ""]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
