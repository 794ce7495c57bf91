"""The suite's random state (tests/conftest.py): every test, and every module's own fixtures, start
from ``torch.manual_seed(VISPE_TEST_SEED)`` (and the same seed for ``random`` and NumPy), so an
unseeded draw gives the same numbers on every run and on every xdist worker."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from conftest import TEST_SEED


def _first_draws():
    g = torch.Generator().manual_seed(TEST_SEED)
    return torch.rand(3, generator=g), random.Random(TEST_SEED).random(), np.random.RandomState(TEST_SEED).rand()


@pytest.fixture(scope="module")
def drawn_once():
    return torch.rand(3)


def test_a_module_fixture_draws_from_the_seeded_state(drawn_once):
    assert torch.equal(drawn_once, _first_draws()[0])


@pytest.mark.parametrize("case", ["first", "after one that drew"])
def test_every_test_starts_from_the_seeded_state(case):
    want_torch, want_random, want_numpy = _first_draws()
    assert torch.equal(torch.rand(3), want_torch)
    assert random.random() == want_random and np.random.rand() == want_numpy
    torch.rand(5), random.random(), np.random.rand()  # draws the next case must not see
