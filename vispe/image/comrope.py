"""ComRoPE: RoPE with trainable commuting angle matrices (Yu et al., CVPR 2025; Longin-Yu/ComRoPE).

A token at (y, x) rotates q and k by ``R(y, x) = exp(y A_y + x A_x)`` where the block-diagonal
skew-symmetric angle matrices A_y, A_x commute, so ``R(p)^T R(p') = R(p' - p)``: logits depend
only on offsets, exactly, for any block size. Two ways to make them commute (the reference's
``model.py``, ``ComRoPEAPAttention`` and ``ComRoPELDAttention``), ``variant``:

* ``"ld"`` (default; "linearly dependent"): one matrix per head and block, ``B = P - P^T``, scaled
  per axis and block: ``A_k = m_k B``; ``P ~ N(0, init_std^2)`` (heads, head_dim/b, b, b),
  ``m ~ N(0, 1)`` (2, head_dim/b) shared by the heads (the reference's ``multiplier``);
* ``"ap"`` ("axis-partitioned"): block j belongs to axis ``j mod 2`` (y for even blocks, x for odd),
  ``A = P - P^T`` on its blocks and 0 on the other axis's; ``P ~ N(0, init_std^2)``.

B is stored as its strict upper triangle, ``upper`` (``B = triu(upper, 1) - triu(upper, 1)^T``,
entries N(0, 2 init_std^2): the distribution of the reference's P - P^T; the symmetric part of P
never mattered); a reference ``freqs`` P converts as ``upper = P - P^T``.

Conventions of the reference, the defaults here: ``init_std`` 1 (its config default);
``block_size`` 8; coordinates ``coords="unit"``: the patch centre in unit coordinates of the (valid)
image, ``(i + 0.5) / n`` per axis (the reference's ``axis_scale=True``), so any grid maps to
(0, 1): position interpolation by construction ("index", "normalized", "centered" as
``vispe.image._rotary``); channel layout: block j on channels [j b, (j+1) b). Not reproduced: the
reference rotates its class token at the image centre (``cls_position=0.5``); vispe's rotary rule
leaves prefix tokens unrotated (``vispe.encoding``), which is what its other rotary encodings do.
The block size of the paper's tables was not read here (the reference's config default is 2, where
ComRoPE is RoPE with learned frequencies); 8 is a choice, documented as such.

Cost (issue 52): ``A_k = m_k B`` (for "ap", m one-hot per block), so ``R(y, x) = exp(t B)`` with
``t = y m_y + x m_x`` a scalar per token and block. In eager mode the rotation is computed in B's
real Schur basis, ``Q RoPE(t w) Q^T`` (``vispe.kernels.rope_commuting``: ``torch.linalg.eigh`` of
``i B``, b x b per head and block, in float64), with its own backward: the gradient of B is the
adjoint Frechet derivative of exp in closed form (sinc of half sums and differences of the angles,
so equal or zero frequencies divide by nothing), on a grid summed per row and per column first
(``exp(tB) = exp(t_y B) exp(t_x B)``); nothing per token is kept but q and k in the Schur basis.
Values and gradients equal the block rotations' (tests/test_rope_blocks_factored.py).
The block rotations (``method="blocks"``, and the path while torch.compile / torch.export record:
the ONNX exporter has no eigh): exponentials once per row and once per column of a grid (h + w
instead of h w) multiplied per token ("ld"; "ap" takes each block from its axis), from the rows and
columns directly on a grid without padding mask or per-token jitter, otherwise once per distinct y
and x in eager mode (``vispe.lie.per_value``) and per token while tracing. In eval mode without
gradients the rotations of a grid are cached (``vispe.image._blocks``). b = 2 returns angles.

Grid change: recomputed at any (h, w); with unit coordinates a larger grid is a finer sampling of
the same (0, 1) range. No resolution ``scaling`` (nothing to scale in unit coordinates).
Parameters: ``upper`` (heads, head_dim/b, b, b) and, for "ld", ``multiplier`` (2, head_dim/b).
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks, _tracing, lie
from vispe.image._blocks import BlockRotaryBase
from vispe.image._factors import Commuting
from vispe.lie import skew_schur
from vispe.registry import register

VARIANTS = ("ld", "ap")
COORDS = ("unit", "index", "normalized", "centered")


@register("comrope")
class ComRoPE(BlockRotaryBase):
    """ComRoPE (module docstring).

    Args: ``head_dim``, ``num_heads``, ``variant`` ("ld" | "ap"), ``block_size`` (8, at most
    head_dim; "ap" needs head_dim / block_size even), ``init_std`` (1.0), ``coords`` ("unit" |
    "index" | "normalized" | "centered"), ``layout`` ("interleaved" | "half"), and
    ``vispe.image._rotary.RotaryBase``'s ``dim``, ``grid``, ``num_prefix_tokens``, ``scale``,
    ``shift``, ``jitter``, ``stretch``, ``rescale``, ``generator``, ``ref_grid``.
    """

    SCALINGS = ("none",)
    scaling_refusal = "ComRoPE's unit coordinates map every grid to (0, 1) already (interpolation built in)"
    has_convention = True

    def __init__(self, head_dim: int, num_heads: int, *, variant: str = "ld", block_size: int = 8,
                 init_std: float = 1.0, coords: str = "unit", dim: int | None = None, grid=None,
                 num_prefix_tokens: int = 0, layout: str = "interleaved", scale: float = 1.0, shift: float = 0.0,
                 jitter: float = 0.0, stretch: float = 1.0, rescale: float = 1.0,
                 generator: torch.Generator | None = None, ref_grid=None, scaling: str = "none") -> None:
        _checks.choice("coords", coords, COORDS)
        super().__init__(head_dim, num_heads, dim=dim, grid=grid, num_prefix_tokens=num_prefix_tokens,
                         layout=layout, coords="centered" if coords == "unit" else coords, scale=scale,
                         shift=shift, jitter=jitter, stretch=stretch, rescale=rescale, generator=generator,
                         ref_grid=ref_grid, scaling=scaling)
        self.comrope_coords = coords
        self.variant = _checks.choice("variant", variant, VARIANTS)
        self._init_blocks(min(block_size, head_dim) if isinstance(block_size, int) else block_size)
        b, nb = self.block_size, head_dim // self.block_size
        if variant == "ap" and nb % 2:
            raise ValueError(f"variant='ap' with head_dim={head_dim}, block_size={b}: expected an even number of "
                             f"blocks (head_dim / block_size = {nb}), half for y and half for x")
        self.init_std = _checks.positive_float("init_std", init_std)
        # B = P - P^T of the reference (P ~ N(0, std^2)) has independent N(0, 2 std^2) entries above the
        # diagonal: stored as that strict upper triangle (adding a symmetric part to P changes nothing)
        self.upper = nn.Parameter(torch.randn(num_heads, nb, b, b) * (init_std * 2 ** 0.5))  # (heads, nb, b, b)
        self.multiplier = nn.Parameter(torch.randn(2, nb)) if variant == "ld" else None  # (2, nb) y, x

    def convention(self, coords, n):
        """"unit": (c + 1) / 2 of the "centered" coordinates, i.e. (i + 0.5) / n."""
        return (coords + 1) / 2 if self.comrope_coords == "unit" else coords

    def axis_generators(self) -> torch.Tensor:
        """A_y and A_x, float32 (0 on the other axis's blocks for "ap").  # (heads, 2, nb, b, b)"""
        B = lie.skew_from_upper(self.upper.float())  # (H, nb, b, b)
        if self.variant == "ld":
            return self.multiplier.float()[None, :, :, None, None] * B[:, None]  # (H, 2, nb, b, b)
        axis = torch.arange(B.shape[1], device=B.device) % 2  # (nb,) block j -> axis j mod 2
        onehot = (axis[None, :] == torch.arange(2, device=B.device)[:, None]).to(B.dtype)  # (2, nb)
        return onehot[None, :, :, None, None] * B[:, None]

    def angles(self, coords: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
        """Block rotations exp(y A_y) exp(x A_x), per distinct y and x.  # (B|1, heads, N, nb, b, b)"""
        if self._factored:  # exp(t B), t = y m_y + x m_x per block, in B's Schur basis
            return self._commuting(coords)
        A = self.axis_generators().to(coords.device)  # (H, 2, nb, b, b)
        Bc, N, _ = coords.shape
        if self.block_size == 2:  # commuting planes: a rotation by -(y u_y + x u_x)
            return -torch.einsum("bnk,hkj->bhnj", coords, A[..., 0, 1])  # (B|1, H, N, nb)
        flat = coords.reshape(Bc * N, 2)  # (M, 2)
        R = self._combine(self._along(flat[:, 0], A, 0), self._along(flat[:, 1], A, 1))  # (M, H, nb, b, b)
        return R.view(Bc, N, *R.shape[1:]).transpose(1, 2)  # (B|1, H, N, nb, b, b)

    def factorable(self) -> bool:  # eigh is not recorded by the ONNX exporter: blocks while tracing
        return self.block_size > 2 and not _tracing.is_tracing()

    def axis_weights(self) -> torch.Tensor:
        """A_k = weight[k, j] B per block j: ``multiplier`` ("ld") or the axis of each block ("ap").  # (2, nb)"""
        if self.variant == "ld":
            return self.multiplier.float()
        axis = torch.arange(self.head_dim // self.block_size, device=self.upper.device) % 2  # (nb,)
        return (axis[None, :] == torch.arange(2, device=axis.device)[:, None]).float()

    def _commuting(self, coords: torch.Tensor) -> Commuting | None:
        """The factored form ``exp(t B)`` of ``coords`` (B|1, N, 2), or of a separable grid's (B|1, h, w, 2)
        (y by row, x by column: ``grid`` (ty, tx)); None: a degenerate B, use the blocks."""
        B = lie.skew_from_upper(self.upper.float()).to(coords.device)  # (H, nb, b, b)
        Q, w, ok = skew_schur(B)
        if not bool(ok.all()):
            return None
        M = self.axis_weights().to(coords.device)  # (2, nb)
        if coords.dim() == 4:  # t = y m_y + x m_x = ty[row] + tx[col]
            ty = coords[:, :, 0, :1] * M[0]  # (B|1, h, nb)
            tx = coords[:, 0, :, 1:] * M[1]  # (B|1, w, nb)
            return Commuting(None, B, (Q, w), (ty[:, None], tx[:, None]))
        return Commuting(torch.matmul(coords, M)[:, None], B, (Q, w))  # t (B|1, 1, N, nb)

    def grid_angles(self, shape, mask, device) -> torch.Tensor:
        """The grid's rotations from its rows and columns when its coordinates are separable (no
        padding mask: a padded column counts y from 0; no per-token jitter).  # (B|1, heads, N, nb, b, b)"""
        coords, _ = self.token_coords(shape, mask, device)  # (B|1, N, 2); scaling is "none" here
        if self._factored and mask is None and not (self.jitter and self._augmenting()):
            return self._commuting(coords.unflatten(1, shape) * self.scale)
        if self._factored or mask is not None or self.block_size == 2 or (self.jitter and self._augmenting()):
            return self.angles(coords * self.scale)
        h, w = shape
        c = coords.unflatten(1, (h, w)) * self.scale  # (B|1, h, w, 2): y by row, x by column
        Bc = c.shape[0]
        A = self.axis_generators().to(c.device)  # (H, 2, nb, b, b)
        ry = self._along(c[:, :, 0, 0].reshape(-1), A, 0)  # (B|1 * h, H, nb, b, b)
        rx = self._along(c[:, 0, :, 1].reshape(-1), A, 1)  # (B|1 * w, H, nb, b, b)
        R = self._combine(ry.view(Bc, h, 1, *ry.shape[1:]), rx.view(Bc, 1, w, *rx.shape[1:]))  # (B|1, h, w, H, nb, b, b)
        return R.flatten(1, 2).transpose(1, 2)  # (B|1, H, N, nb, b, b)

    @staticmethod
    def _along(p: torch.Tensor, A: torch.Tensor, k: int) -> torch.Tensor:
        """exp(p A_k) for each coordinate of ``p`` (M,), once per distinct value.  # (M, H, nb, b, b)"""
        return lie.per_value(p[:, None], lambda v: lie.expm(v[:, :, None, None, None] * A[None, :, k]))

    def _combine(self, ry: torch.Tensor, rx: torch.Tensor) -> torch.Tensor:
        """R = exp(y A_y) exp(x A_x), broadcast: "ap" takes each block from its axis.  # broadcast shape"""
        if self.variant == "ap":  # block j depends on axis j mod 2 only: no product
            even = (torch.arange(ry.shape[-3], device=ry.device) % 2 == 0)[:, None, None]  # (nb, 1, 1)
            return torch.where(even, ry, rx)
        return torch.matmul(ry, rx)  # commuting factors

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, variant={self.variant!r}, comrope_coords={self.comrope_coords!r}, "
                f"init_std={self.init_std:g}")
