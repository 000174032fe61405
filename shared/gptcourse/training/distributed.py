"""Data-parallel training with torch.distributed: one process per CPU group or GPU, each with its share of
every batch, gradients averaged across processes by DistributedDataParallel.

`torchrun --nproc_per_node W -m gptcourse.training ...` starts W processes and tells each its RANK, LOCAL_RANK,
WORLD_SIZE and where rank 0 listens (MASTER_ADDR, MASTER_PORT). `join_process_group` reads them and joins the
group: NCCL when CUDA is present (GPU to GPU), gloo otherwise (CPU, over TCP). The global batch of B rows is
drawn identically on every rank, and rank r trains on rows [r B/W, (r + 1) B/W): the average of the W ranks'
gradients is then the gradient of the whole batch, so W processes compute what one process would.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """Where this process stands: its rank among world_size processes, and its device."""

    rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, evaluates and writes checkpoints."""
        return self.rank == 0


def current_ranks() -> Ranks:
    """This process's place in an initialised process group (rank 0 of 1 without one)."""
    if not (dist.is_available() and dist.is_initialized()):
        return Ranks()
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    return Ranks(dist.get_rank(), dist.get_world_size(), device)


def join_process_group() -> Ranks:
    """Join the process group torchrun describes in the environment (nothing to join without WORLD_SIZE)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Ranks()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return current_ranks()


def leave_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_rows(batch_size: int, ranks: Ranks) -> slice:
    """The rows of a global batch that this rank trains on: an equal, contiguous share."""
    if batch_size % ranks.world_size:
        raise ValueError(f"the global batch_size={batch_size} does not split evenly across "
                         f"{ranks.world_size} processes: use a multiple of {ranks.world_size}")
    share = batch_size // ranks.world_size
    return slice(ranks.rank * share, (ranks.rank + 1) * share)
