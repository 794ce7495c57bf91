"""The small MLP every DETR-style detector uses (box head, reference-point heads, query scales), and the
transformer layers' FFN with its activation by name (``ACTIVATIONS``, defined here only)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import nn

from vispe import _checks

#: the transformers' FFN activation by name: DETR's and Deformable DETR's relu, DAB-DETR's prelu, gelu
ACTIVATIONS = {"relu": nn.ReLU, "prelu": nn.PReLU, "gelu": nn.GELU}


def ffn(d_model: int, dim_feedforward: int, dropout: float, activation: str = "relu") -> Mlp:
    """Every transformer layer's FFN, dense or deformable (timm's ``Mlp``: ``fc1``, act, drop, ``fc2``, drop)."""
    _checks.choice("activation", activation, tuple(ACTIVATIONS))
    return Mlp(d_model, dim_feedforward, act_layer=ACTIVATIONS[activation], drop=dropout)


class MLP(nn.Module):
    """``num_layers`` Linear layers with ReLU between them (DETR's ``MLP``; parameters ``layers.N``)."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """log(x / (1 - x)) with x clamped to [0, 1] and both terms to at least ``eps`` (the papers')."""
    x = x.clamp(0, 1)
    return torch.log(x.clamp(min=eps) / (1 - x).clamp(min=eps))
