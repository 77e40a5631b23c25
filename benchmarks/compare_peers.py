"""vitkit against timm, Hugging Face transformers (sdpa and eager) and torchvision on identical
architectures, weights and inputs, in one process, interleaved A B C ... so the machine's drift
falls on all of them alike. Every number is the median of the per-round ratios to vitkit's
time (above 1: vitkit is faster), with their spread (half the interquartile range).

Covers inference and a training step (forward, backward, AdamW) for ViT-S/16 and ViT-B/16 at
224, and the cost of maps (vitkit with all-layer maps vs without; HF eager with
output_attentions; vitkit with the last layer's maps only), and what vitkit's in-place CPU
inference path buys (vitkit with ``inplace_inference = False`` as one more peer).
Usage: python benchmarks/compare_peers.py [--batch 8] [--repeats 7] [--models NAME...]
       [--device cpu|cuda] [--dtype float32|bfloat16] [--out PATH]
Writes benchmarks/results/compare_peers.md (``--out`` elsewhere; benchmarks/gpu_check.sh uses
it on a GPU with bf16 autocast).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import tempfile
from pathlib import Path

import timm
import torch
import torchvision
import transformers

import vitkit
from vitkit.checkpoints import torchvision as tv_format
from vitkit.models.bench import interleaved, machine, median, spread

OUT = Path(__file__).parent / "results" / "compare_peers.md"


def peers(name: str) -> dict[str, torch.nn.Module]:
    """The same weights in every library's own model class."""
    torch.manual_seed(0)
    ours = vitkit.create_model(name).eval()
    out = {"vitkit": ours}
    out["vitkit-standard"] = copy.deepcopy(ours)
    out["vitkit-standard"].inplace_inference = False
    t = timm.create_model(name, num_classes=1000)
    t.load_state_dict(ours.state_dict())
    out["timm"] = t.eval()
    with tempfile.TemporaryDirectory() as folder:  # transformers' own reader maps the names
        vitkit.export(ours, folder, to="hf")
        for impl in ("sdpa", "eager"):
            out[f"hf-{impl}"] = transformers.ViTForImageClassification.from_pretrained(
                folder, attn_implementation=impl).eval()
    state, args = tv_format.from_vitkit(ours)
    tv = torchvision.models.VisionTransformer(**args)
    tv.load_state_dict(state)
    out["torchvision"] = tv.eval()
    return out


def _logits(model, x):
    out = model(x)
    return getattr(out, "logits", out)


def inference_calls(models: dict, x: torch.Tensor, autocast) -> dict:
    def under(fn):
        def call():
            with autocast():
                return fn()
        return call

    calls = {k: under(lambda m=m: _logits(m, x)) for k, m in models.items()}
    calls["vitkit+maps"] = under(lambda: models["vitkit"](x, return_attn=True))
    calls["vitkit+last map"] = under(
        lambda: models["vitkit"](x, return_attn=True, attn_layers=[-1]))
    calls["hf-eager+attentions"] = under(lambda: models["hf-eager"](x, output_attentions=True))
    return calls


def train_calls(models: dict, x: torch.Tensor, y: torch.Tensor, autocast) -> dict:
    calls = {}
    for name in ("vitkit", "timm", "hf-sdpa", "torchvision"):
        model = models[name].train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def step(m=model, o=opt):
            with autocast():
                loss = torch.nn.functional.cross_entropy(_logits(m, x), y)
            loss.backward()
            o.step()
            o.zero_grad(set_to_none=True)

        calls[name] = step
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--models", nargs="+",
                        default=["vit_small_patch16_224", "vit_base_patch16_224"])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16 runs every peer under the same autocast")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    dev = torch.device(args.device)

    def autocast():
        if args.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(dev.type, dtype=torch.bfloat16)

    what = "float32" if args.dtype == "float32" else "bfloat16 autocast"
    lines = ["# vitkit against its peers", "",
             f"Machine: {machine()}. {what} on {dev.type}, batch {args.batch}, median of "
             f"{args.repeats} "
             "interleaved rounds. Each cell: peer time / vitkit time for the same work in the same "
             "round, median over rounds (± half the interquartile range; above 1.00: vitkit is "
             "faster). Same weights and inputs everywhere (logits checked).", ""]
    for name in args.models:
        models = {k: m.to(dev) for k, m in peers(name).items()}
        x = torch.randn(args.batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (args.batch,), device=dev)
        with torch.no_grad():  # same logits in float32 first
            ref = _logits(models["vitkit"], x[:4])
            for k, m in models.items():
                diff = (_logits(m, x[:4]) - ref).abs().max().item()
                assert diff < 1e-3, f"{k} disagrees with vitkit by {diff}"
        with torch.inference_mode():
            inf = interleaved(inference_calls(models, x, autocast), repeats=args.repeats,
                              desc=f"{name} inference")
        trn = interleaved(train_calls(models, x, y, autocast), repeats=args.repeats,
                          warmup=1, desc=f"{name} train")
        base_i, base_t = median(inf["vitkit"]), median(trn["vitkit"])

        def ratio(times: dict, a: str, b: str = "vitkit", unit: str = "") -> str:
            """Median and spread of the per-round ratios a / b (each round times both)."""
            r = [ta / tb for ta, tb in zip(times[a], times[b], strict=True)]
            return f"{median(r):.2f}{unit}" + (f" (±{100 * spread(r):.0f}%)" if len(r) > 1 else "")

        peers_ = ("timm", "hf-sdpa", "hf-eager", "torchvision")
        lines += [f"## {name}", "",
                  f"vitkit: inference {1000 * base_i / args.batch:.2f} ms/image "
                  f"({args.batch / base_i:,.0f} images/s), training step "
                  f"{1000 * base_t / args.batch:.2f} ms/image ({args.batch / base_t:,.0f} "
                  "images/s).", "",
                  "| work | timm | HF sdpa | HF eager | torchvision |", "|---|---|---|---|---|",
                  "| inference | " + " | ".join(ratio(inf, k) for k in peers_) + " |",
                  "| training step | " + " | ".join(
                      ratio(trn, k) if k in trn else "-" for k in peers_) + " |", "",
                  f"Maps: vitkit with every layer's per-head maps costs "
                  f"{ratio(inf, 'vitkit+maps', unit='x')} its plain forward, with the last "
                  f"layer's {ratio(inf, 'vitkit+last map', unit='x')}; HF eager with "
                  f"output_attentions costs "
                  f"{ratio(inf, 'hf-eager+attentions', unit='x')} vitkit's plain forward "
                  f"({ratio(inf, 'hf-eager+attentions', 'hf-eager', unit='x')} its own).", "",
                  f"vitkit's standard path (`inplace_inference = False`, as under autograd) takes "
                  f"{ratio(inf, 'vitkit-standard', unit='x')} the in-place inference path's "
                  "time.", ""]
        print("\n".join(lines[-12:]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines))  # after each model: a cut-short run keeps it
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
