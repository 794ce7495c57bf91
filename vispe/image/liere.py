"""LieRE: Lie group relative position encodings (Ostmeier et al., ICML 2025; StanfordMIMI/LieRE).

A token at (y, x) rotates the channels of q and k by

    R(y, x) = exp(y A_y + x A_x),    A_k = U_k - U_k^T,  U_k = triu(raw_k, 1)

with one learned skew-symmetric generator per axis, block-diagonal with blocks of ``block_size``
b channels (the reference's ``generator_dim``), per head (``per_head=True``, the reference's
``rotary_embedding_per_head``) and per layer (one encoding per attention layer, as
``rotary_embedding_per_layer``). Conventions of the reference (``models/rope_vit.py``,
``LierePositionEncoder`` with ``phase_type="naver"``), the defaults here:

* block size: ``head_dim`` (one dense generator per head; the reference's ``generator_dim`` 64 for
  its 64-channel heads); b = 2 gives commuting 2 x 2 planes, i.e. RoPE with learned mixed
  frequencies, and is computed as angles (``-(y u_y + x u_x)`` per plane, u the upper entry);
* generator init: ``raw ~ U[0, 2 pi)`` (``init_scale``, RoPE-Mixed's angle range), its strict upper
  triangle used (the reference's ``- 0.5`` cancels in ``U - U^T``);
* coordinates (``coords="liere"``): ``linspace(0, n / n0, n)`` per axis, n the grid's (with a
  mask: each image's valid) length and n0 the length of ``grid``, the grid the model is built for
  (its training grid): [0, 1] at the training size, growing past 1 on larger grids (extrapolation,
  as the reference). ``coords="normalized"`` is the reference's ``scale_0_to_1`` ([0, 1] at every
  size: position interpolation both ways); "index" and "centered" as ``vispe.image._rotary``.
  Without a ``grid`` (a detector built without one) n0 = n, i.e. "normalized";
* channel layout: block j on channels [j b, (j+1) b) (``layout="interleaved"``);
* prefix tokens: unrotated (the reference's class token gets the identity too).

Relative property: only for commuting generators. With b = 2 (or generators that happen to
commute) ``R(p)^T R(p') = R(p' - p)`` and logits depend on offsets only; with larger blocks
``exp(A + B) != exp(A) exp(B)`` and they do not (tests/test_image_rotary_blocks.py shows both).

Cost: the reference exponentiates one matrix per token and step. Here the exponential is taken once
per *distinct* coordinate of the batch (``vispe.lie.per_value``: a padded batch of B images
exponentiates each valid-extent grid once, not B times), by scaling and squaring
(``vispe.lie.expm``, which also exports to ONNX: a degree-12 Taylor polynomial in 5 products, the
squarings chosen from ``|y| |A_y|_2 + |x| |A_x|_2``, the largest over the batch), and in eval mode
without gradients the rotations of a grid are cached (``vispe.image._blocks``); b = 2 needs no
exponential. In training (eager) the blocks are rebuilt in backward instead of kept
(``vispe.kernels.rope_blocks.Recomputed``, activation checkpointing of the rotation only, issue 52):
the generators do not commute, so there is no eigenbasis to rotate in, and what autograd would keep
is every product of every token's exponential. ``bench/rope_blocks.py`` measures both.

Grid change: rotations are recomputed at any (h, w). ``grid`` is recorded in the state_dict
(``table_grid``); a checkpoint saved for another grid is loaded by rescaling each axis's generator
by n0_new / n0_saved, which leaves every rotation at every size unchanged (the coordinates scale
by the inverse); ``resize_(shape)`` does the same. Resolution scaling (``scaling``): none; use
``coords="normalized"`` for the reference's interpolation.

Parameter: ``generators`` (heads|1, 2, head_dim/b, b, b), raw (y then x). The reference's
``generator_raw_params`` (2, depth, heads * head_dim/b, b, b) of layer i is
``raw[:, i].view(2, heads, head_dim/b, b, b).transpose(0, 1)``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks, _tracing, lie
from vispe.image._blocks import BlockRotaryBase
from vispe.image._factors import Recomputed
from vispe.registry import register

COORDS = ("liere", "normalized", "index", "centered")


def rotations(coords: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
    """exp(y A_y + x A_x) of ``coords`` (B|1, N, 2) with the generators of ``raw`` (H|1, 2, nb, b, b),
    once per distinct coordinate.  # (B|1, H|1, N, nb, b, b)"""
    A = lie.skew_from_upper(raw.float())  # (H, 2, nb, b, b)
    Bc, N, _ = coords.shape

    bound = None
    if not _tracing.is_tracing():  # |y A_y + x A_x|_2 <= |y| |A_y|_2 + |x| |A_x|_2: no norm per token
        with torch.no_grad():
            sigma = torch.linalg.matrix_norm(A.double(), ord=2)  # (H, 2, nb)
            bound = float((coords.abs().reshape(-1, 2).amax(0).double() * sigma.transpose(1, -1)).sum(-1).max()) \
                if coords.numel() else 0.0

    def exps(v: torch.Tensor) -> torch.Tensor:  # (U, 2) -> (U, H, nb, b, b)
        return lie.expm(torch.einsum("uk,hkjab->uhjab", v, A), normal=True, bound=bound)

    R = lie.per_value(coords.reshape(Bc * N, 2), exps)  # (B*N, H, nb, b, b)
    return R.view(Bc, N, *R.shape[1:]).transpose(1, 2)


@register("liere")
class LieRE(BlockRotaryBase):
    """LieRE (module docstring).

    Args: ``head_dim``, ``num_heads``, ``block_size`` (None: head_dim), ``per_head`` (True),
    ``init_scale`` (2 pi: raw ~ U[0, init_scale)), ``coords`` ("liere" | "normalized" | "index" |
    "centered"), ``grid`` (the training grid n0 of "liere"), ``layout`` ("interleaved" | "half",
    the latter for block_size < head_dim), and ``vispe.image._rotary.RotaryBase``'s ``dim``,
    ``num_prefix_tokens``, ``scale``, ``shift``, ``jitter``, ``stretch``, ``rescale``,
    ``generator``, ``ref_grid``.
    """

    SCALINGS = ("none",)
    scaling_refusal = ("LieRE has no frequencies to scale; coords='normalized' is its reference's interpolation "
                       "(scale_0_to_1)")
    has_convention = True

    def __init__(self, head_dim: int, num_heads: int, *, block_size: int | None = None, per_head: bool = True,
                 init_scale: float = 2 * math.pi, coords: str = "liere", grid=None, dim: int | None = None,
                 num_prefix_tokens: int = 0, layout: str = "interleaved", scale: float = 1.0, shift: float = 0.0,
                 jitter: float = 0.0, stretch: float = 1.0, rescale: float = 1.0,
                 generator: torch.Generator | None = None, ref_grid=None, scaling: str = "none") -> None:
        _checks.choice("coords", coords, COORDS)
        super().__init__(head_dim, num_heads, dim=dim, grid=grid, num_prefix_tokens=num_prefix_tokens,
                         layout=layout, coords="normalized" if coords == "liere" else coords, scale=scale,
                         shift=shift, jitter=jitter, stretch=stretch, rescale=rescale, generator=generator,
                         ref_grid=ref_grid, scaling=scaling)
        self.liere_coords = coords
        self._init_blocks(head_dim if block_size is None else block_size)
        if not isinstance(per_head, bool):
            raise ValueError(f"per_head={per_head!r}: expected True or False")
        self.per_head = per_head
        self.init_scale = _checks.positive_float("init_scale", init_scale)
        b = self.block_size
        raw = torch.rand(num_heads if per_head else 1, 2, head_dim // b, b, b) * self.init_scale
        self.generators = nn.Parameter(raw)  # (heads|1, 2, nb, b, b) raw, y then x

    def convention(self, coords, n):
        """"liere": normalized coordinates times n / n0 per axis (module docstring)."""
        if self.liere_coords != "liere" or self.grid is None:
            return coords
        if n is None:
            raise ValueError("extent=None: LieRE's coordinates (coords='liere') need the valid (h, w) in cells")
        n0 = torch.tensor(self.grid, dtype=torch.float32, device=coords.device)  # (2,)
        return coords * (n / n0)  # (B|1, N, 2)

    def generator_matrices(self) -> torch.Tensor:
        """The skew-symmetric generators A_y, A_x, float32.  # (heads|1, 2, nb, b, b)"""
        return lie.skew_from_upper(self.generators.float())

    def angles(self, coords: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
        """Block rotations exp(y A_y + x A_x) of ``coords`` (B|1, N, 2), once per distinct coordinate.
        # (B|1, heads|1, N, nb, b, b); angles (B|1, heads|1, N, head_dim/2) for block_size 2"""
        if self.block_size == 2:  # exp of [[0, u], [-u, 0]] is a rotation by -u
            A = self.generator_matrices().to(coords.device)  # (H, 2, nb, 2, 2)
            return -torch.einsum("bnk,hkj->bhnj", coords, A[..., 0, 1])  # (B|1, H, N, nb)
        raw = self.generators.to(coords.device)
        if self._factored:  # the same blocks, rebuilt in backward (vispe.kernels.rope_blocks)
            return Recomputed(rotations, (coords, raw))
        return rotations(coords, raw)

    def factorable(self) -> bool:
        """Rebuilt in backward only where there is a backward: not while frozen (eval without
        gradients: the blocks, cached per grid) nor while tracing (the recorded graph keeps what it keeps)."""
        return self.block_size > 2 and not _tracing.is_tracing() and self.frozen_key() is None

    # --- checkpoints: the generators are built for the coordinates of ``grid`` -----------------
    def table_grid(self):
        return self.grid

    @torch.no_grad()
    def _rescaled(self, raw: torch.Tensor, src, dst) -> torch.Tensor:
        """Generators of grid ``src`` for grid ``dst``: axis k times dst_k / src_k."""
        f = torch.tensor([dst[0] / src[0], dst[1] / src[1]], dtype=raw.dtype, device=raw.device)
        return raw * f.view(1, 2, 1, 1, 1)

    @torch.no_grad()
    def resize_(self, shape) -> LieRE:
        """Make ``shape`` the reference grid n0, with the same rotations at every size (module docstring)."""
        shape = _checks.grid_shape("shape", shape)
        if self.grid is not None and self.liere_coords == "liere":
            self.generators.copy_(self._rescaled(self.generators, self.grid, shape))
        self.grid = shape
        return self

    def load_grid_(self, state_dict, prefix, saved) -> None:
        raw = state_dict.get(prefix + "generators")
        if raw is not None and self.liere_coords == "liere":  # other coordinates do not depend on the grid
            state_dict[prefix + "generators"] = self._rescaled(raw, saved, self.grid)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, liere_coords={self.liere_coords!r}, per_head={self.per_head}, "
                f"init_scale={self.init_scale:g}, grid={self.grid}")
