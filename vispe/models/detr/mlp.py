"""The small MLP every DETR-style detector uses (box head, reference-point heads, query scales)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: the transformers' FFN activation by name: DETR's and Deformable DETR's relu, DAB-DETR's prelu, gelu
ACTIVATIONS = {"relu": nn.ReLU, "prelu": nn.PReLU, "gelu": nn.GELU}


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
