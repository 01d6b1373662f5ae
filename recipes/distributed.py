"""Ranks, devices and each rank's share of a batch: a single process unless launched by ``torchrun``.

Under ``torchrun`` (``WORLD_SIZE > 1``) each of the W processes takes every W-th example of each global batch, so
the global batch stays ``batch_size``; collectives keep every rank's decisions (the loss, stopping) the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist

from enhance.device import usable_device


class Distributed:
    """Rank/world of this process; a no-op single process unless launched by torchrun."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.active = self.world > 1

    def init(self, device: torch.device) -> None:
        if self.active and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean(self, value: float, device: torch.device) -> float:
        """Mean of ``value`` over all processes (the global batch's loss from the per-rank losses)."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    def broadcast_float(self, value: float, device: torch.device) -> float:
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.broadcast(t, src=0)
        return float(t.item())

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def gather_bytes(self, data: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
        """Every rank's uint8 tensor of the same length (as CPU tensors, in rank order), to all ranks; through a
        tensor collective on ``device``, which NCCL needs (object collectives want a current CUDA device)."""
        if not self.active:
            return [data]
        local = data.to(device)
        out = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(out, local)
        return [t.cpu() for t in out]


def cfg_seed_for(seed: int, rank: int, step: int) -> int:
    return (seed * 1_000_003 + rank * 7919 + step) % (2**63)


def pick_device(name: str, local_rank: int) -> torch.device:
    """The training device (:func:`enhance.device.usable_device`, with ``auto``); ``auto`` and ``cuda`` mean this
    process's own GPU under torchrun (``cuda:LOCAL_RANK``)."""
    device = usable_device(name, auto=True)
    if device.type == "cuda" and device.index is None:
        return usable_device(f"cuda:{local_rank}")
    return device


class EpochBatches:
    """Batches of ``(epoch, index)`` keys for steps ``start .. n_steps-1`` of one epoch (this rank's share)."""

    def __init__(
        self, order: np.ndarray, epoch: int, batch: int, start: int, n_steps: int, rank: int, world: int
    ):
        self.order, self.epoch, self.batch = order, epoch, batch
        self.start, self.n_steps, self.rank, self.world = start, n_steps, rank, world

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for step in range(self.start, self.n_steps):
            keys = self.order[step * self.batch : (step + 1) * self.batch][self.rank :: self.world]
            yield [(self.epoch, int(i)) for i in keys]

    def __len__(self) -> int:
        return max(0, self.n_steps - self.start)
