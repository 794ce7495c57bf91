"""Box-to-pixel relative position bias, BoxRPB (Lin et al., ICCV 2023, "DETR Does Not Need
Multi-Scale or Locality Design", Plain-DETR ``GlobalCrossAttention``).

For a query's anchor box with corners (x1, y1), (x2, y2) and a key at feature cell (i, j) with
pixel centre ((j + 0.5) s, (i + 0.5) s) (``stride`` s), per axis the offsets from the cell centre to
the box's two corners go through a small MLP (2 -> ``hidden`` -> heads, ReLU, no output bias)::

    d_x(j) = (x1 - (j + 0.5) s, x2 - (j + 0.5) s)          d_y(i) likewise with y1, y2
    transform "linear": d;   "abs_log8": sign(d) log2(|d| + 1) / log2(8)
    B[h, q, (i, j)] = MLP_x(d_x(j))[h] + MLP_y(d_y(i))[h]     added to the cross-attention logits

Decomposed as the paper: the MLPs run on (Q, w, 2) and (Q, h, 2) offsets; only their broadcast sum is
(B, heads, Q, h*w), the bias itself. Boxes are unit coordinates of each image's valid area (as the
detector's anchors, (cx, cy, w, h)); corners are brought to pixels with the image's valid size in
cells times the stride (Plain-DETR's reference points times ``valid_ratios`` times ``w * stride``), so
an image alone and padded in a batch get the same bias on its valid cells.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks
from vispe.coords import valid_extent

TRANSFORMS = ("linear", "abs_log8")


class BoxRPB(nn.Module):
    """``forward(boxes, shape, mask) -> (B, heads, Q, h*w)``; boxes (B|1, Q, 4) unit (cx, cy, w, h)."""

    def __init__(self, num_heads: int, *, hidden: int = 512, transform: str = "linear", stride: float = 16.0) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.transform = _checks.choice("transform", transform, TRANSFORMS)
        self.stride = _checks.positive_float("stride", stride)
        _checks.positive_int("hidden", hidden)
        self.mlp_x = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, num_heads, bias=False))
        self.mlp_y = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, num_heads, bias=False))

    def _offsets(self, lo: torch.Tensor, hi: torch.Tensor, n: int) -> torch.Tensor:
        """(lo, hi) corner pixels (B, Q) minus every cell centre of an n-cell axis.  # (B, Q, n, 2)"""
        centres = (torch.arange(n, device=lo.device, dtype=torch.float32) + 0.5) * self.stride  # (n,)
        d = torch.stack([lo, hi], -1)[:, :, None] - centres[:, None]  # (B, Q, n, 2)
        if self.transform == "abs_log8":
            d = torch.sign(d) * torch.log2(d.abs() + 1.0) / math.log2(8)
        return d

    def forward(self, boxes: torch.Tensor, shape: tuple[int, int], mask: torch.Tensor | None = None) -> torch.Tensor:
        if boxes.dim() != 3 or boxes.shape[-1] != 4:
            raise ValueError(f"boxes has shape {tuple(boxes.shape)}: expected (B|1, Q, 4) anchor boxes (cx, cy, w, h); "
                             "BoxRPB needs box anchors (decoder='dab' with query_dim=4)")
        h, w = shape
        n = valid_extent(mask, shape, device=boxes.device) * self.stride  # (B|1, 2) valid (h, w) in pixels
        b = boxes.float()
        x1, x2 = (b[..., 0] - b[..., 2] / 2) * n[:, 1:], (b[..., 0] + b[..., 2] / 2) * n[:, 1:]  # (B, Q) each
        y1, y2 = (b[..., 1] - b[..., 3] / 2) * n[:, :1], (b[..., 1] + b[..., 3] / 2) * n[:, :1]
        bx = self.mlp_x(self._offsets(x1, x2, w))  # (B, Q, w, heads)
        by = self.mlp_y(self._offsets(y1, y2, h))  # (B, Q, h, heads)
        bias = by[:, :, :, None] + bx[:, :, None]  # (B, Q, h, w, heads)
        return bias.flatten(2, 3).permute(0, 3, 1, 2)  # (B, heads, Q, h*w)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, transform={self.transform!r}, stride={self.stride:g}"
