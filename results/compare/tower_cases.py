"""The contract of results/compare/parity_towers.py's entries: a ``Case`` (one input, in the original's call),
an ``Entry`` (a tower: its builder, its cases, the output fields compared) and ``redraw`` (every parameter redrawn,
so that a wrong weight mapping shows)."""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

SIZES = ("tiny", "full")


class Case(NamedTuple):
    label: str  # what the input is, for the table
    args: tuple
    kwargs: dict = {}


class Entry(NamedTuple):
    name: str  # short key (--only)
    title: str  # the reference class, for the table
    build: Callable[[str], torch.nn.Module]  # size -> the original, random weights
    cases: Callable[[torch.nn.Module, str, torch.Generator], list]  # (original, size, generator) -> [Case]
    fields: tuple = ("last_hidden_state",)
    convert: Callable | None = None  # original -> converted model; None: convert_vit(original)


def redraw(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter redrawn: norm weights in [0.5, 1.5], matrices N(0, 1/fan_in), the rest N(0, 0.2^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.dim() >= 2 and "embedding" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()
