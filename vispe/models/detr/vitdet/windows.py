"""Windows that are rectangles of the (h, w) patch grid, for windowed ViT backbones (LW-DETR, RF-DETR).

A grid of ``h x w`` patches cut into ``n x n`` windows (``n = num_windows``, the windows per side, as
transformers' ``num_windows`` of RF-DETR and ``num_windows_side`` of LW-DETR): window (i, j) holds rows
``i * h/n .. (i+1) * h/n - 1`` and columns ``j * w/n .. (j+1) * w/n - 1``, a rectangle of
``(h/n) x (w/n)`` patches, for any ``h`` and ``w`` divisible by ``n`` (a ValueError names the grid
otherwise). Windows are numbered row-major (i * n + j), tokens inside a window row-major.

This is the layout of transformers' LW-DETR backbone. transformers 5.23's
``RfDetrDinov2Embeddings.window_partition`` views the grid as (n, w/n, n, h/n) instead, which is the
same on a square grid but on a non-square one gives a window patches from rows far apart (8 x 16
patches, 4 x 4 windows: window 0 holds rows 0-1 and columns 0, 1, 8, 9); ``tests/test_rfdetr_windows.py``
shows it window by window against this one (roboflow/rf-detr #148, #398, PR #630 fixed the same upstream).
"""
from __future__ import annotations

import torch

from vispe import _checks


def window_shape(grid: tuple[int, int], num_windows: int) -> tuple[int, int]:
    """(rows, columns) of one window of ``grid`` (h, w) cut into ``num_windows`` x ``num_windows``;
    a ValueError unless both sides are multiples of ``num_windows``."""
    n = _checks.positive_int("num_windows", num_windows)
    h, w = grid
    if h % n or w % n:
        raise ValueError(f"grid (h, w)={tuple(grid)}: expected both sides divisible by num_windows={n} "
                         f"(windows are rectangles of the patch grid; pick an image size whose patch grid is a "
                         f"multiple of {n} per side, or pad to one)")
    return h // n, w // n


def partition(x: torch.Tensor, num_windows: int) -> torch.Tensor:
    """``x`` (B, h, w, C) as window sequences (B * n * n, h/n * w/n, C), window (b, i, j) at b*n*n + i*n + j."""
    B, h, w, C = x.shape
    wh, ww = window_shape((h, w), num_windows)
    n = num_windows
    x = x.reshape(B, n, wh, n, ww, C).permute(0, 1, 3, 2, 4, 5)  # (B, n, n, wh, ww, C)
    return x.reshape(B * n * n, wh * ww, C)


def unpartition(x: torch.Tensor, num_windows: int, grid: tuple[int, int]) -> torch.Tensor:
    """The inverse of ``partition``: (B * n * n, h/n * w/n, C) -> (B, h, w, C)."""
    h, w = grid
    wh, ww = window_shape(grid, num_windows)
    n = num_windows
    C = x.shape[-1]
    x = x.reshape(-1, n, n, wh, ww, C).permute(0, 1, 3, 2, 4, 5)  # (B, n, wh, n, ww, C)
    return x.reshape(-1, h, w, C)


def window_ids(valid: torch.Tensor, grid: tuple[int, int], num_windows: int) -> torch.Tensor:
    """Each cell's window on its image's valid area: ``valid`` (B, 2) valid (h, w) in cells (top-left
    aligned), window (i, j) of image b covering rows i*h_b/n .. and columns j*w_b/n ..; padded cells get
    -1.  # (B, h, w) int64

    The mask-aware layout: an image alone and the same image padded in a batch get the same windows
    when its valid size is divisible by n (checked by the caller)."""
    h, w = grid
    n = num_windows
    dev = valid.device
    vy, vx = valid[:, 0].long(), valid[:, 1].long()  # (B,)
    iy = torch.arange(h, device=dev)[None, :]  # (1, h)
    ix = torch.arange(w, device=dev)[None, :]  # (1, w)
    wy = torch.div(iy * n, vy[:, None].clamp(min=1), rounding_mode="floor")  # (B, h)
    wx = torch.div(ix * n, vx[:, None].clamp(min=1), rounding_mode="floor")  # (B, w)
    ids = wy[:, :, None] * n + wx[:, None, :]  # (B, h, w)
    inside = (iy < vy[:, None])[:, :, None] & (ix < vx[:, None])[:, None, :]  # (B, h, w)
    return ids.masked_fill(~inside, -1)
