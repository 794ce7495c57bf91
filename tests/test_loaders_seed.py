"""vispe.train.loaders.SeededSamples: sample i of epoch e is drawn from generators seeded by (seed, e, i),
the same numbers as with ``torch.manual_seed`` (issue 39 seeds the CPU generator alone, which is what
``torch.manual_seed`` does on the CPU, without its per-call cost), and the caller's generators are left
as they were."""
from __future__ import annotations

import random

import numpy as np
import torch

from vispe.train.loaders import SeededSamples


class Draws(torch.utils.data.Dataset):
    def __len__(self):
        return 5

    def __getitem__(self, i):
        return torch.rand(3), float(np.random.rand()), random.random(), torch.randint(0, 1000, (2,))


def test_samples_are_those_of_torch_manual_seed_and_leave_the_caller_s_generators_alone():
    ds = SeededSamples(Draws(), seed=7)
    ds.set_epoch(2)
    torch.manual_seed(123)
    before = torch.rand(4)
    torch.manual_seed(123)
    got = [ds[i] for i in (4, 0, 3)]
    assert torch.equal(torch.rand(4), before)  # the caller's stream continues as if nothing was drawn
    for i, (t, n, r, k) in zip((4, 0, 3), got):
        s = ((7 * 1_000_003 + 2) * 10_000_019 + i) % (2**63 - 1)
        torch.manual_seed(s)
        np.random.seed(s % 2**32)
        random.seed(s)
        want = Draws()[i]
        assert torch.equal(t, want[0]) and n == want[1] and r == want[2] and torch.equal(k, want[3]), i
    assert not torch.equal(got[0][0], got[1][0])  # another index, other numbers
    ds.set_epoch(3)
    assert not torch.equal(ds[4][0], got[0][0])  # another epoch, other numbers
