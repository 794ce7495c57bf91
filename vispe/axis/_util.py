"""Small helpers shared by the axis primitives (private): working dtype and position checks."""
from __future__ import annotations

import torch


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32: tables and angles never go below float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def positions(name: str, pos, length: int | None = None) -> torch.Tensor:
    """A position tensor of shape (..., N), optionally with N == ``length``; else a ValueError."""
    if not isinstance(pos, torch.Tensor):
        raise ValueError(f"{name} is a {type(pos).__name__}: expected a tensor of positions (..., N)")
    if pos.dim() == 0:
        raise ValueError(f"{name} has shape (): expected a tensor of positions (..., N)")
    if length is not None and pos.shape[-1] != length:
        raise ValueError(f"{name} has shape {tuple(pos.shape)}: expected last dimension {length} "
                         "(one position per token)")
    return pos


def with_head_axis(pairs: torch.Tensor) -> torch.Tensor:
    """(..., Nq, Nk) -> (..., 1, Nq, Nk): pair tables broadcast over heads at dim -3."""
    return pairs.unsqueeze(-3)


def heads_last_to_front(t: torch.Tensor) -> torch.Tensor:
    """(..., Nq, Nk, H) -> (..., H, Nq, Nk)."""
    return t.movedim(-1, -3)


def check_qk(q: torch.Tensor, k: torch.Tensor, q_pos, k_pos, num_heads: int, head_dim: int) -> None:
    """q, k as (..., num_heads, N, head_dim) and their positions of matching lengths, or a ValueError."""
    for name, x in (("q", q), ("k", k)):
        if x.dim() < 3 or x.shape[-3] != num_heads or x.shape[-1] != head_dim:
            raise ValueError(f"{name} has shape {tuple(x.shape)}: expected (..., num_heads={num_heads}, "
                             f"N, head_dim={head_dim})")
    positions("q_pos", q_pos, q.shape[-2])
    positions("k_pos", k_pos, k.shape[-2])
