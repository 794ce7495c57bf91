"""The learned position table of a windowed ViT (LW-DETR's CAE ViT, RF-DETR's DINOv2), resampled to the
input's patch grid.

The table is stored as its checkpoint holds it: (1, 1 + G*G, C), a class-token row and a G x G grid
learned at the pretraining size (G = pretraining image size / patch size). At a grid (h, w) the G x G
part is resampled by target size (never ``scale_factor``), bicubic, ``align_corners=False``, in float32
and cast back, with ``antialias`` as the source does it: RF-DETR (transformers'
``RfDetrDinov2Embeddings.interpolate_pos_encoding``) with antialias, LW-DETR
(``LwDetrViTEmbeddings.get_absolute_positions``) without. At (G, G) the resampling is the identity
(exactly: bicubic weights (0, 1, 0, 0) at the cell centres), so there is no branch on the size (a
branch would put a guard on the grid into an exported graph).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def table_grid(table: torch.Tensor) -> int:
    """G of a (1, 1 + G*G, C) table; a ValueError unless its patch rows form a square."""
    n = table.shape[1] - 1
    G = int(round(n ** 0.5))
    if table.dim() != 3 or G * G != n:
        raise ValueError(f"position table has shape {tuple(table.shape)}: expected (1, 1 + G*G, C), a class row "
                         "and a square grid of the pretraining size")
    return G


def resample_table(table: torch.Tensor, grid: tuple[int, int], *, antialias: bool) -> torch.Tensor:
    """The table's patch part at ``grid`` (h, w).  # (1, h, w, C)"""
    G = table_grid(table)
    C = table.shape[-1]
    patches = table[:, 1:].reshape(1, G, G, C)  # (1, G, G, C)
    x = patches.permute(0, 3, 1, 2).float()  # (1, C, G, G)
    x = F.interpolate(x, size=tuple(grid), mode="bicubic", align_corners=False, antialias=antialias)
    return x.permute(0, 2, 3, 1).to(table.dtype)  # (1, h, w, C)


def table_for_valid(table: torch.Tensor, grid: tuple[int, int], valid: torch.Tensor, *, antialias: bool) -> torch.Tensor:
    """Mask-aware: each image's table resampled to its valid (h_b, w_b) cells (``valid`` (B, 2)), placed at
    the top-left of ``grid`` (h, w), zeros on the padding: an image alone and padded get the same
    position on their valid area.  # (B, h, w, C)"""
    B = valid.shape[0]
    out = table.new_zeros(B, grid[0], grid[1], table.shape[-1])
    for size in {tuple(v) for v in valid.tolist()}:  # one resample per distinct valid size
        rows = [b for b in range(B) if tuple(valid[b].tolist()) == size]
        vh, vw = int(size[0]), int(size[1])
        out[rows, :vh, :vw] = resample_table(table, (vh, vw), antialias=antialias)[0]
    return out
