"""One process or many: torchrun sets RANK / WORLD_SIZE / LOCAL_RANK, and the same code runs
DistributedDataParallel over them (NCCL on GPUs, gloo on CPUs)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vitkit.errors import ConfigError


@dataclass
class Context:
    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup(device: str = "auto") -> Context:
    """Join the process group torchrun describes (if any) and pick this process's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda asked for, but torch sees no CUDA device")
    dev = torch.device(f"cuda:{local}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Context(rank, world, dev)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over processes (a no-op in one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
