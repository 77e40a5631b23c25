"""Timing a model (images/s, share of the matmul peak, memory) for ``vitkit bench``, and the
timing helpers ``benchmarks/`` shares: interleaved runs and a description of the machine.

Peers are timed A B C A B C ... in one process, so slow drifts of a shared machine (another
job, thermal limits) fall on all of them alike; results are reported as ratios of medians.
"""

from __future__ import annotations

import contextlib
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm import tqdm

from vitkit.errors import ModelError
from vitkit.models.cost import flop_model
from vitkit.models.registry import create_model
from vitkit.util.numbers import check_counts, check_number


def interleaved(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1,
                desc: str = "timing") -> dict[str, list[float]]:
    """Run each callable ``warmup`` times, then ``repeats`` rounds of one call each, in turn.

    Returns seconds per call for every name. CUDA work is synchronised around each call.
    """
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in tqdm(range(repeats), desc=desc, leave=False, disable=None):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return times


def median(seconds: list[float]) -> float:
    return statistics.median(seconds)


def spread(seconds: list[float]) -> float:
    """Half the range between the 25th and 75th percentiles, relative to the median."""
    q1, _, q3 = statistics.quantiles(seconds, n=4)
    return (q3 - q1) / 2 / statistics.median(seconds)


def machine() -> str:
    """One line naming the processor, threads and library versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{cpu}, {torch.get_num_threads()} torch threads{gpu}; Python "
            f"{platform.python_version()}, torch {torch.__version__}")


# ------------------------------------------------------------------------------ vitkit bench
@dataclass
class BenchResult:
    """One model's timing: per step median and spread, throughput, cost and machine share."""

    name: str
    mode: str  # "inference", "inference+maps" or "train"
    batch: int
    img_size: tuple[int, int]
    device: str
    dtype: str
    step_ms: float
    spread: float  # half the interquartile range / median
    images_per_s: float
    gflops_per_image: float  # of the mode (train counts forward + backward as 3x forward)
    achieved_gflops: float
    peak_gflops: float  # a large matmul of the same dtype, measured in the same run
    peak_memory_mb: float

    @property
    def ms_per_image(self) -> float:
        return self.step_ms / self.batch

    @property
    def share_of_peak(self) -> float:
        return self.achieved_gflops / self.peak_gflops


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int | None = None,
                repeats: int = 5) -> float:
    """GFLOP/s of a large square matmul: the machine's practical ceiling for a ViT.

    On a CPU without bfloat16 units (AVX2 only) a bfloat16 matmul runs at about 1 GFLOP/s, so
    there the matrix is 512 wide, not 2048: seconds instead of minutes, for the same ceiling.
    """
    n = n or (8192 if device.type == "cuda" else 2048 if dtype == torch.float32 else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = interleaved({"mm": lambda: a @ b}, repeats=repeats, warmup=1, desc="matmul peak")
    return 2 * n**3 / median(times["mm"]) / 1e9


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource  # POSIX only

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak, KiB -> MiB


def bench(name: str, batch: int = 8, img_size: int | None = None, train: bool = False,
          attn: bool = False, compile: bool = False, dtype: str = "float32",
          device: str = "cpu", steps: int = 10, warmup: int = 2) -> BenchResult:
    """Time ``steps`` steps of a registered model after ``warmup`` (synchronised on GPU)."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError("--device cuda asked for, but torch sees no CUDA device")
    if dtype not in ("float32", "bfloat16"):
        raise ModelError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    if train and attn:
        raise ModelError("--attn times inference with maps; drop --train or --attn")
    check_counts((("batch", batch), ("steps", steps)), error=ModelError)
    check_number("--warmup", warmup, least=0, error=ModelError)
    if img_size is not None:
        check_number("--img-size", img_size, error=ModelError)
    overrides = {"img_size": img_size} if img_size else {}
    model = create_model(name, **overrides).to(dev)
    size = model.cfg.img_size
    x = torch.randn(batch, 3, *size, device=dev)
    y = torch.randint(0, model.num_classes, (batch,), device=dev)
    half = torch.bfloat16 if dtype == "bfloat16" else None
    autocast = torch.autocast(dev.type, dtype=half) if half else contextlib.nullcontext()
    forward = torch.compile(model) if compile else model
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if train:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            with autocast:
                loss = torch.nn.functional.cross_entropy(forward(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        model.eval()

        def step():
            with torch.inference_mode(), autocast:
                forward(x, return_attn=True) if attn else forward(x)

    times = interleaved({"step": step}, repeats=steps, warmup=warmup, desc=name)["step"]
    peak_memory = _peak_memory_mb(dev)  # before the matmul peak allocates its own operands
    step_s = median(times)
    # what the timed forward computes: without maps, a [CLS] model's last block runs its
    # readout rows only (forward_features(readout_only=True))
    flops = flop_model(model.cfg, readout_only=not attn).flops * (3 if train else 1)
    ips = batch / step_s
    return BenchResult(
        name=name, mode="train" if train else ("inference+maps" if attn else "inference"),
        batch=batch, img_size=tuple(size), device=str(dev), dtype=dtype,
        step_ms=1000 * step_s, spread=spread(times) if len(times) >= 2 else 0.0,
        images_per_s=ips, gflops_per_image=flops / 1e9, achieved_gflops=flops * ips / 1e9,
        peak_gflops=matmul_peak(dev, half or torch.float32),
        peak_memory_mb=peak_memory,
    )


def report(r: BenchResult) -> str:
    """The lines ``vitkit bench`` prints."""
    return "\n".join([
        f"{r.name} {r.mode}: batch {r.batch}, {r.img_size[0]}x{r.img_size[1]}, {r.dtype} on "
        f"{r.device}",
        f"  {r.step_ms:.1f} ms per step (median, ±{100 * r.spread:.0f}%), "
        f"{r.ms_per_image:.2f} ms per image, {r.images_per_s:.1f} images/s",
        f"  {r.gflops_per_image:.2f} GFLOPs per image -> {r.achieved_gflops:.1f} GFLOP/s, "
        f"{100 * r.share_of_peak:.0f}% of this machine's measured matmul peak "
        f"({r.peak_gflops:.1f} GFLOP/s)",
        f"  peak memory {r.peak_memory_mb:.0f} MiB"
        + (" (process peak RSS)" if r.device == "cpu" else " (allocated on the device)"),
        f"  machine: {machine()}",
    ])
