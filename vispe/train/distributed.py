"""Data-parallel training over processes launched by torchrun (one process per GPU or CPU slot).

    torchrun --nproc_per_node 4 train.py --config configs/cifar10_vit.yaml

``setup`` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and starts
the process group: NCCL when the device is CUDA, gloo on CPU. Without those variables everything
here is a no-op for one process. Only rank 0 writes files (``is_main``); metrics are sums and
counts reduced with ``all_reduce(SUM)`` so that every rank sees the totals over all the data.
Multi-machine runs need the run folder on a file system all machines share (to resume).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device_type: str) -> DistInfo:
    """Start the process group when launched by torchrun with more than one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    return info


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_reduce_sums(sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sum each value over all processes (one collective for the whole dict)."""
    if not (dist.is_available() and dist.is_initialized()) or not sums:
        return sums
    keys = sorted(sums)
    flat = torch.stack([sums[k].double().reshape(()) for k in keys])  # (K,)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return dict(zip(keys, flat.unbind(0)))


def broadcast_error(message: str | None) -> str | None:
    """Rank 0's error message (or None) on every rank, so that all stop together."""
    if not (dist.is_available() and dist.is_initialized()):
        return message
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shard_indices(n: int, info: DistInfo) -> range:
    """Every ``world_size``-th index from ``rank``: an exact partition of 0..n-1 (no padding)."""
    return range(info.rank, n, info.world_size)
