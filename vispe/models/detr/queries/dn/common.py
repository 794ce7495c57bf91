"""DINO's inverse sigmoid: ``log(x / (1 - x))`` with both terms clamped to at least 1e-3
(IDEA-Research/DINO ``util.misc.inverse_sigmoid``; Deformable DETR's takes 1e-5): a denoising box whose
corner was clamped to the image's border, or a negative whose width went to 0, gets the logit
log(1e-3) = -6.9, not -11.5, and the reference's outputs depend on it."""
from __future__ import annotations

import torch

from vispe.models.detr.mlp import inverse_sigmoid

EPS = 1e-3


def inv_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``inverse_sigmoid(x, 1e-3)`` (module docstring).  # x.shape"""
    return inverse_sigmoid(x, EPS)
