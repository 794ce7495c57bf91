"""What an encoding says about the tokens of a grid, as plain matrices (the figures' data).

* ``position_codes(pe, shape)``: one vector per grid token, ``(h*w, D)``. Additive: the code added
  to the token. Rotary: ``[cos(angles), sin(angles)]`` over every head and channel pair, so that the
  dot product of two codes is ``sum cos(theta_i - theta_j)``: the score a unit query and key get
  from their positions alone (it depends only on their offset).
* ``bias_matrix(pe, shape)``: a bias encoding's logit bias among the grid tokens, ``(heads, N, N)``.
* ``similarity_matrix(pe, shape)``: cosine similarity of the codes, ``(N, N)``; for a bias encoding,
  the bias averaged over heads.
* ``offset_map(matrix, shape)``: the mean of ``matrix[i, j]`` over token pairs with the same offset
  ``(dy, dx) = (y_i - y_j, x_i - x_j)`` (query minus key, as Swin's index), ``(2h-1, 2w-1)``, and the
  spread (max - min) of those entries: 0 everywhere for a translation-invariant encoding.

Tokens are row-major over (y, x); every function takes ``shape = (h, w)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vispe.coords import grid_coords


def _family(pe) -> str:
    fam = getattr(pe, "family", None)
    if fam is None:
        raise ValueError(f"pe={type(pe).__name__}: expected a vispe encoding (with a `family`)")
    return fam


@torch.no_grad()
def position_codes(pe, shape: tuple[int, int]) -> torch.Tensor:
    """One float32 vector per grid token.  # (h*w, D)"""
    fam = _family(pe)
    if fam == "additive":
        code = pe(tuple(shape), None, device=torch.device("cpu"))  # (1, N, C)
        return code[0].detach().float()
    if fam == "rotary":
        ang = pe(tuple(shape), None, device=torch.device("cpu")).detach().float()  # (1, heads|1, N, d/2)
        ang = ang[0].permute(1, 0, 2).reshape(ang.shape[-2], -1)  # (N, heads*d/2)
        return torch.cat([ang.cos(), ang.sin()], dim=-1)  # (N, heads*d)
    raise ValueError(f"pe family {fam!r}: position codes exist for additive and rotary encodings; "
                     "use bias_matrix for a bias encoding (a conditional or absent one has none)")


@torch.no_grad()
def bias_matrix(pe, shape: tuple[int, int], q: torch.Tensor | None = None) -> torch.Tensor:
    """Logit bias among the grid tokens (prefix rows/columns dropped).  # (heads, N, N) float32"""
    if _family(pe) != "bias":
        raise ValueError(f"pe family {_family(pe)!r}: expected a bias encoding")
    if getattr(pe, "contextual", False) and q is None:
        raise ValueError("a contextual bias depends on the queries: pass q (1, heads, P+N, head_dim)")
    bias = pe(tuple(shape), None, device=torch.device("cpu"), **({"q": q} if q is not None else {}))
    P = getattr(pe, "num_prefix_tokens", 0)
    return bias[0, :, P:, P:].detach().float()


def similarity_matrix(pe, shape: tuple[int, int]) -> torch.Tensor:
    """Cosine similarity of the position codes (bias encodings: bias averaged over heads).  # (N, N)"""
    if _family(pe) == "bias":
        return bias_matrix(pe, shape).mean(0)
    codes = F.normalize(position_codes(pe, shape), dim=-1)  # (N, D)
    return codes @ codes.t()


def offset_map(matrix: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and spread (max - min) of ``matrix`` (N, N) per offset (query - key).  # 2 x (2h-1, 2w-1)"""
    h, w = shape
    N = h * w
    if matrix.shape != (N, N):
        raise ValueError(f"matrix has shape {tuple(matrix.shape)}: expected ({N}, {N}) for shape {tuple(shape)}")
    c = grid_coords(h, w, dtype=torch.long)  # (N, 2) as (y, x)
    d = c[:, None, :] - c[None, :, :]  # (N, N, 2)
    idx = ((d[..., 0] + h - 1) * (2 * w - 1) + d[..., 1] + w - 1).reshape(-1)  # (N*N,)
    vals = matrix.reshape(-1).double()
    L = (2 * h - 1) * (2 * w - 1)
    count = torch.zeros(L, dtype=torch.float64).index_add_(0, idx, torch.ones_like(vals))
    mean = torch.zeros(L, dtype=torch.float64).index_add_(0, idx, vals) / count
    hi = torch.full((L,), -torch.inf, dtype=torch.float64).scatter_reduce(0, idx, vals, "amax")
    lo = torch.full((L,), torch.inf, dtype=torch.float64).scatter_reduce(0, idx, vals, "amin")
    return mean.reshape(2 * h - 1, 2 * w - 1).float(), (hi - lo).reshape(2 * h - 1, 2 * w - 1).float()


def encoding_name(pe) -> str:
    """The registry name of an encoding (its class name if unregistered)."""
    return getattr(pe, "registry_name", type(pe).__name__)


def reference_positions(shape: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """Corner, edge and centre cells of a grid, by name: ``{"corner": (0, 0), ...}`` as (y, x)."""
    h, w = shape
    return {"corner": (0, 0), "edge": (h // 2, 0), "centre": (h // 2, w // 2)}
