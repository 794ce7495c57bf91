"""Deformable DETR's encoder (Zhu et al., ICLR 2021): post-norm layers of multi-scale deformable
self-attention and an FFN over the flattened tokens of all levels.

Layer by layer, as fundamentalvision/Deformable-DETR's ``DeformableTransformerEncoderLayer`` and
transformers' ``DeformableDetrEncoderLayer``::

    x = norm1(x + MSDeformAttn(query = x + pos, reference = r, value = x, key padding))
    x = norm2(x + FFN(x))                                   FFN: fc2(drop(act(fc1(x)))), then drop

``pos`` (B|1, N, d) is the tokens' additive code (``LevelPositions``: a vispe encoding per level plus
the level embedding); ``r`` (B, N, L, 2) their reference points, each token's valid cell centre
looked up on every level (``vispe.coords.level_reference_points``, from the valid ratios);
``levels`` the (h, w) of every level (``vispe.kernels.deformable.Levels``). Padded tokens are masked
as keys (their values are zeroed) and their own outputs are never read. Dropout follows the paper
(after the attention, after the activation and after the FFN); transformers also drops its input
tokens and has no dropout after the activation by default (eval outputs are equal).
Parameter names: ``layers.{i}.self_attn.{sampling_offsets, attention_weights, value_proj,
output_proj}``, ``norm1``, ``mlp.fc1``, ``mlp.fc2``, ``norm2`` (``load_deformable`` maps the papers'
and transformers' onto them).
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.coords import level_reference_points
from vispe.deformable_attention import MSDeformAttn
from vispe.kernels.deformable import Levels
from vispe.models.detr.mlp import ffn


class DeformableEncoderLayer(nn.Module):
    """One post-norm encoder layer (module docstring)."""

    def __init__(self, d_model: int = 256, nheads: int = 8, dim_feedforward: int = 1024, dropout: float = 0.1,
                 num_levels: int = 4, num_points: int = 4, activation: str = "relu") -> None:
        super().__init__()
        self.self_attn = MSDeformAttn(d_model, nheads, num_levels, num_points)
        self.dropout = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.mlp = ffn(d_model, dim_feedforward, dropout, activation)
        self.norm2 = nn.LayerNorm(d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The paper's: Xavier-uniform for every matrix (the FFN's), then ``MSDeformAttn``'s own."""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        self.self_attn.reset_parameters()

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None, reference: torch.Tensor, levels: Levels,
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:  # (B, N, d)
        x = self.norm1(x + self.dropout(self.self_attn(x, reference, x, levels, key_padding_mask, query_pos=pos)))
        return self.norm2(x + self.mlp(x))


class DeformableEncoder(nn.Module):
    """``num_layers`` deformable encoder layers over the tokens of ``num_levels`` levels.

    Args:
        d_model: as DETR's encoder.
        nheads: as DETR's encoder.
        num_layers: layers (the paper's 6).
        dim_feedforward: as DETR's encoder (the paper's FFN is 1024).
        dropout: as DETR's encoder.
        activation: as DETR's encoder.
        num_levels: levels L (the paper's 4).
        num_points: sampling points P per head and level (the paper's 4).
    """

    def __init__(self, d_model: int = 256, nheads: int = 8, num_layers: int = 6, dim_feedforward: int = 1024,
                 dropout: float = 0.1, num_levels: int = 4, num_points: int = 4, activation: str = "relu") -> None:
        super().__init__()
        _checks.positive_int("num_layers", num_layers, allow_zero=True)
        self.layers = nn.ModuleList(DeformableEncoderLayer(d_model, nheads, dim_feedforward, dropout, num_levels,
                                                           num_points, activation) for _ in range(num_layers))
        self.d_model, self.num_levels = d_model, num_levels

    def forward(self, x: torch.Tensor, levels: Levels, pos: torch.Tensor | None = None,
                ratios: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens ``x`` (B, N, d) of ``levels``, their code ``pos`` (B|1, N, d), valid ``ratios``
        (B, L, 2) as (h, w) (``vispe.coords.valid_ratios``; None: an unpadded batch, all 1) and
        ``key_padding_mask`` (B, N), True = padding.  # (B, N, d)"""
        B, N, _ = x.shape
        if N != levels.num_tokens:
            raise ValueError(f"x has {N} tokens: levels {list(levels.shapes)} have {levels.num_tokens}")
        if ratios is None:
            ratios = x.new_ones(B, len(levels), 2, dtype=torch.float32)  # (B, L, 2)
        reference = level_reference_points(levels.shapes, ratios).to(x.dtype)  # (B, N, L, 2) as (y, x)
        for layer in self.layers:
            x = layer(x, pos, reference, levels, key_padding_mask)
        return x
