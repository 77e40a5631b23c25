"""Timing helpers shared by ``benchmarks/``: interleaved runs and a description of the machine.

Peers are timed A B C A B C ... in one process, so slow drifts of a shared machine (another
job, thermal limits) fall on all of them alike; results are reported as ratios of medians.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch
from tqdm import tqdm


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
    for _ in tqdm(range(repeats), desc=desc, leave=False):
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
