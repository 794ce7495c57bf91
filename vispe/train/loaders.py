"""DataLoaders whose order and augmentation depend only on (seed, epoch, index).

That is what makes a run reproducible and a resume exact, with or without worker processes:

* the order of an epoch is a permutation seeded by ``seed + epoch`` (DistributedSampler, which also
  splits it across processes; with one process it is the whole permutation);
* a resumed epoch skips the batches already done (``SkipSampler``), so the rest is unchanged;
* each training sample is drawn with the random generators (torch, numpy, random) seeded from
  ``(seed, epoch, index)`` (``SeededSamples``), so random augmentation does not depend on which
  worker loads it or on what ran before. In the main process the generators are restored after
  each sample, so the model's own randomness (dropout, drop-path) is not disturbed.

Evaluation data is split across processes without padding (``shard_indices``), so that sums
reduced over processes count every test sample exactly once.
"""
from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, Subset, get_worker_info

from vispe.train.distributed import DistInfo, shard_indices


class SeededSamples(Dataset):
    """``dataset[i]`` computed with the random generators seeded from (seed, epoch, i)."""

    def __init__(self, dataset: Dataset, seed: int):
        self.dataset, self.seed, self.epoch = dataset, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        s = ((self.seed * 1_000_003 + self.epoch) * 10_000_019 + int(index)) % (2**63 - 1)
        if get_worker_info() is not None:  # a worker process: its generators serve only the data
            _seed_all(s)
            return self.dataset[index]
        states = torch.get_rng_state(), np.random.get_state(), random.getstate()
        try:
            _seed_all(s)
            return self.dataset[index]
        finally:
            torch.set_rng_state(states[0])
            np.random.set_state(states[1])
            random.setstate(states[2])


def _seed_all(s: int) -> None:
    # the CPU generator only: data transforms draw from it, and torch.manual_seed would also reseed (and, in
    # the main process, leave reseeded) every accelerator's generator, and record a Python stack for CUDA's
    # lazy seeding on each call (about 0.2 ms per sample, a sixth of the shapes set's loading time)
    torch.default_generator.manual_seed(s)
    np.random.seed(s % 2**32)
    random.seed(s)


class SkipSampler(Sampler):
    """The indices of ``sampler`` after the first ``skip`` ones (a resumed epoch)."""

    def __init__(self, sampler: Sampler, skip: int = 0):
        self.sampler, self.skip = sampler, int(skip)

    def __iter__(self):
        it = iter(self.sampler)
        for _ in range(self.skip):
            next(it, None)
        yield from it

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)


def subset(dataset: Dataset, n: int | None) -> Dataset:
    """The first ``n`` samples (all of them when ``n`` is None or larger than the data set)."""
    if n is None or n >= len(dataset):
        return dataset
    return Subset(dataset, range(n))


def train_loader(dataset: SeededSamples, *, batch_size: int, epoch: int, skip_batches: int, seed: int,
                 dist_info: DistInfo, num_workers: int = 0, collate_fn=None, pin_memory: bool = False) -> DataLoader:
    """The loader of one training epoch, starting after ``skip_batches`` batches."""
    dataset.set_epoch(epoch)
    sampler = DistributedSampler(dataset, num_replicas=dist_info.world_size, rank=dist_info.rank,
                                 shuffle=True, seed=seed, drop_last=False)
    sampler.set_epoch(epoch)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)  # worker base seeds; the global RNG is untouched
    return DataLoader(dataset, batch_size=batch_size, sampler=SkipSampler(sampler, skip_batches * batch_size),
                      num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, generator=gen,
                      drop_last=False)


def num_train_batches(n: int, batch_size: int, dist_info: DistInfo) -> int:
    per_rank = -(-n // dist_info.world_size)  # DistributedSampler pads to equal shards
    return -(-per_rank // batch_size)


def eval_loader(dataset: Dataset, *, batch_size: int, dist_info: DistInfo, num_workers: int = 0,
                collate_fn=None, pin_memory: bool = False) -> DataLoader:
    """This process's share of ``dataset``, in order, every sample in exactly one process."""
    shard = Subset(dataset, shard_indices(len(dataset), dist_info)) if dist_info.enabled else dataset
    return DataLoader(shard, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      collate_fn=collate_fn, pin_memory=pin_memory,
                      generator=torch.Generator().manual_seed(0))
