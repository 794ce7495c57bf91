"""STRING: separable translation-invariant rotations (Schenck et al., ICML 2025, "Learning the RoPEs").

STRING rotates q and k by ``exp(y L_y + x L_x)`` with commuting skew-symmetric generators; every
such rotation is RoPE conjugated by one orthogonal matrix, ``P^T RoPE(y, x) P``, so logits depend
only on offsets, exactly. Two parametrisations of P (``variant``):

* ``"cayley"`` (default): ``P = (I - S)(I + S)^-1`` with S skew-symmetric (from the strict upper
  triangle of a learned (head_dim, head_dim) matrix per head), one dense block of ``head_dim``
  channels; the RoPE part is RoPE-Mixed's: learned (fy, fx) per head and channel pair, rope-vit's
  initialisation with ``theta`` 100 (``vispe.image.rope_mixed.mixed_init``); S starts at 0 (P = I:
  STRING starts as RoPE-Mixed; ``cayley_std`` > 0 draws S ~ N(0, cayley_std^2) instead);
* ``"circulant"``: ``L_k = C_k - C_k^T`` with C_k circulant (first rows ``c`` learned per head, axis
  and block), block-circulant with blocks of ``block_size`` channels (16: the size the paper's sweep
  over {4, ..., 64} most often chose); circulant matrices commute and share the real Fourier basis
  F, so ``exp(sum_k p_k L_k) = F^T RoPE(theta(p)) F`` with angles ``theta_j(p) = sum_k p_k w_kj``
  linear in c (w read off ``F L_k F^T``): the paper's FFT form, in real arithmetic. Only
  ``c_m - c_(b-m)`` (0 < m < b/2) survives in ``C - C^T``, so ``c`` stores c_1 .. c_(b/2-1) (the
  rest 0), N(0, 2 circulant_std^2): the distribution of that difference for c ~ N(0, circulant_std^2),
  circulant_std 0.01 (an initialisation near the identity, as third-party implementations use; the
  paper's was not read);

What is returned: ``R(p) = RoPE(p) P`` (block rotations, ``vispe.encoding``); the paper's left
factor ``P^T`` cancels in every logit, ``(R(p) q)^T (R(p') k) = q^T P^T RoPE(p' - p) P k``, and is
not computed. Prefix tokens get R(0) = P (``zero_rotation``): the paper's identity, P^T R(0), in
that frame, so that a prefix token's logits are the paper's and folding P stays exact.
Coordinates as RoPE's (``vispe.image._rotary``, "index" by default); padding mask,
train-time augmentation, ``at`` and resolution ``scaling`` ("pi", and "yarn" per frequency
component as RoPE-Mixed) apply to the RoPE part unchanged.

Channel layout: "cayley" pairs its RoPE channels per ``layout`` (default "interleaved", rope-vit's
pairing) and P is stored in rotate-half order (``layout="interleaved"`` permutes it), so a
checkpoint moves between layouts as RoPE's does; "circulant" takes ``layout="interleaved"``
(consecutive blocks, each in its own Fourier basis).

Cost (issue 52): in training the rotations are never materialised: ``factors`` gives P and the
angles (``vispe.kernels.rope_blocks.Conjugated``) and the kernel computes ``RoPE(p) (P q)``: one
(head_dim x head_dim) product per token shared by every token (for "circulant", F per block of b),
then RoPE's rotation with learned angles (``vispe.kernels.rope.rotate``: its backward needs only
the cos/sin tables and the output). Values and gradients equal the block rotations'
(``rope_blocks.rotate_qk(..., method="blocks")``, tests/test_rope_blocks_factored.py). Also while
torch.compile / torch.export record (plain products).

Folding P at inference: P depends on no position, so ``q' = RoPE(p) (P q)`` and P can be
multiplied into the q and k rows of the attention's projection once: ``fold_string_(model)`` does
it for every STRING layer (exact, float32; refused where a q/k norm or a decoupled position
projection sits between the projection and the rotation). A folded STRING returns plain angles and
runs on the RoPE kernels at RoPE's cost; its state_dict then holds the folded weights (and no S).
vispe does not fold on its own: training needs P apart, and folding changes the checkpoint.
The paper's numbers were not read here (PUBLISHED.md section 10).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe import _checks, lie
from vispe.axis.rope import apply_rope, half_to_interleaved
from vispe.axis.rope_scaling import yarn_frequencies
from vispe.image._blocks import BlockRotaryBase
from vispe.image._factors import Conjugated
from vispe.image.rope_mixed import mixed_init
from vispe.registry import register

VARIANTS = ("cayley", "circulant")


def real_fourier_basis(b: int, *, device=None) -> torch.Tensor:
    """Orthogonal real DFT basis of R^b (b even), rows [1, (-1)^m, cos_1, sin_1, cos_2, sin_2, ...]
    (normalised): every circulant matrix is block-diagonal in it, in 2 x 2 blocks.  # (b, b)"""
    m = torch.arange(b, dtype=torch.float64, device=device)
    rows = [torch.full((b,), 1.0, dtype=torch.float64, device=device) / math.sqrt(b), torch.cos(math.pi * m) / math.sqrt(b)]
    for j in range(1, b // 2):
        rows += [torch.cos(2 * math.pi * j * m / b) * math.sqrt(2 / b), torch.sin(2 * math.pi * j * m / b) * math.sqrt(2 / b)]
    return torch.stack(rows).float()


def circulant(c: torch.Tensor) -> torch.Tensor:
    """Circulant matrices with first rows ``c`` (..., b): ``C[i, j] = c[(j - i) mod b]``.  # (..., b, b)"""
    b = c.shape[-1]
    idx = (torch.arange(b, device=c.device)[None, :] - torch.arange(b, device=c.device)[:, None]) % b  # (b, b)
    return c[..., idx]


@register("string")
class STRING(BlockRotaryBase):
    """STRING (module docstring).

    Args: ``head_dim``, ``num_heads``, ``variant`` ("cayley" | "circulant"), ``block_size`` (circulant
    only; None: min(16, head_dim)), ``theta`` (100) and ``rotate`` (True) of the RoPE-Mixed part
    (cayley), ``cayley_std`` (0), ``circulant_std`` (0.01), ``layout``, and
    ``vispe.image._rotary.RotaryBase``'s ``dim``, ``grid``, ``num_prefix_tokens``, ``coords``,
    ``scale``, ``shift``, ``jitter``, ``ref_grid``, ``normalize_coords``, ``stretch``, ``rescale``,
    ``generator``, ``scaling`` ("none" | "pi" | "yarn"), ``scaling_axes``, ``yarn_alpha``, ``yarn_beta``.
    """

    own_pairs = True
    SCALINGS = ("none", "pi", "yarn")
    scaling_refusal = ("'ntk' rescales the base of a geometric schedule; STRING's frequencies are learned 2D "
                       "vectors (as RoPE-Mixed's); use 'yarn' or 'pi'")

    def __init__(self, head_dim: int, num_heads: int, *, variant: str = "cayley", block_size: int | None = None,
                 theta: float = 100.0, rotate: bool = True, cayley_std: float = 0.0, circulant_std: float = 0.01,
                 dim: int | None = None, grid=None, num_prefix_tokens: int = 0, layout: str = "interleaved",
                 coords: str = "index", scale: float = 1.0, shift: float = 0.0, jitter: float = 0.0, ref_grid=None,
                 normalize_coords: str = "separate", stretch: float = 1.0, rescale: float = 1.0,
                 generator: torch.Generator | None = None, scaling: str = "none", scaling_axes: str | None = None,
                 yarn_alpha: float | None = None, yarn_beta: float | None = None) -> None:
        super().__init__(head_dim, num_heads, dim=dim, grid=grid, num_prefix_tokens=num_prefix_tokens,
                         layout=layout, coords=coords, scale=scale, shift=shift, jitter=jitter, ref_grid=ref_grid,
                         normalize_coords=normalize_coords, stretch=stretch, rescale=rescale, generator=generator,
                         scaling=scaling, scaling_axes=scaling_axes, yarn_alpha=yarn_alpha, yarn_beta=yarn_beta)
        self.variant = _checks.choice("variant", variant, VARIANTS)
        self.folded = False
        if variant == "cayley":
            if block_size is not None and block_size != head_dim:
                raise ValueError(f"block_size={block_size!r} with variant='cayley': P is one dense block of head_dim="
                                 f"{head_dim} channels; expected None")
            self._init_blocks(head_dim)
            self.theta = _checks.positive_float("theta", theta)
            if not isinstance(rotate, bool):
                raise ValueError(f"rotate={rotate!r}: expected True or False")
            self.rotate = rotate
            self.cayley_std = float(cayley_std)
            if not self.cayley_std >= 0:
                raise ValueError(f"cayley_std={cayley_std!r}: expected a number >= 0")
            self.freqs = nn.Parameter(mixed_init(head_dim, num_heads, theta, rotate))  # (heads, d/2, 2) (fy, fx)
            self.S = nn.Parameter(torch.randn(num_heads, head_dim, head_dim) * self.cayley_std)  # raw, half order
        else:
            if layout != "interleaved":
                raise ValueError(f"layout={layout!r} with variant='circulant': each block pairs channels in its own "
                                 "Fourier basis, consecutive blocks; expected layout='interleaved'")
            b = min(16, head_dim) if block_size is None else block_size
            self._init_blocks(b)
            if self.block_size % 2 or self.block_size < 4:
                raise ValueError(f"block_size={b!r}: expected an even size of at least 4 (Fourier pairs; a 2-channel "
                                 "circulant skew-symmetric matrix is 0)")
            self.circulant_std = _checks.positive_float("circulant_std", circulant_std)
            # only c_m - c_(b-m), 0 < m < b/2, survives in C - C^T: stored as c_1 .. c_(b/2-1) with the rest 0,
            # entries N(0, 2 std^2), the distribution of that difference for c ~ N(0, std^2)
            self.c = nn.Parameter(torch.randn(num_heads, 2, head_dim // self.block_size, self.block_size // 2 - 1)
                                  * (self.circulant_std * 2 ** 0.5))  # (heads, 2, nb, b/2 - 1), y then x

    def factorable(self) -> bool:  # RoPE(p) P: plain products, also while torch.compile / export record
        return not self.folded

    @property
    def block_size(self) -> int:  # a folded STRING is RoPE: angles
        return 2 if self.folded else self._block

    # --- the orthogonal part ---------------------------------------------------------------------
    def basis(self, device=None) -> torch.Tensor:
        """P in the layout's channel order: (heads, head_dim, head_dim) for "cayley", the real
        Fourier basis (b, b) of every block for "circulant".  # float32"""
        if self.variant == "circulant":
            return real_fourier_basis(self._block, device=device)
        P = lie.cayley(lie.skew_from_upper(self.S.float().to(device)))  # (H, d, d) rotate-half order
        if self.layout == "interleaved":
            perm = half_to_interleaved(torch.arange(self.head_dim, device=P.device))
            P = P[:, perm][:, :, perm]
        return P

    def first_rows(self) -> torch.Tensor:
        """The circulant matrices' first rows [0, c_1, ..., c_(b/2-1), 0, ..., 0], float32.  # (heads, 2, nb, b)"""
        c = self.c.float()
        return torch.cat([c.new_zeros(*c.shape[:-1], 1), c, c.new_zeros(*c.shape[:-1], self._block // 2)], -1)

    def frequencies(self) -> torch.Tensor:
        """The RoPE part's (fy, fx) per head and pair, float32 (pairs in the layout's order for
        "cayley"; per block, Fourier pairs in order, for "circulant").  # (heads, pairs, 2)"""
        if self.variant == "cayley":
            return self.freqs.float()
        F = real_fourier_basis(self._block, device=self.c.device)  # (b, b)
        L = circulant(self.first_rows())  # (H, 2, nb, b, b)
        w = F @ (L - L.transpose(-1, -2)) @ F.t()  # (H, 2, nb, b, b) 2 x 2 blocks on the diagonal
        w = torch.diagonal(w, offset=-1, dim1=-2, dim2=-1)[..., 0::2]  # (H, 2, nb, b/2) lower entries
        return w.flatten(2).transpose(1, 2)  # (H, nb * b/2, 2)

    def angles(self, coords: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
        """RoPE angles of the frequencies, then ``RoPE(p) P`` per token.  # (B|1, heads, N, nb, b, b);
        angles (B|1, heads, N, head_dim/2) once folded"""
        f = self.frequencies().to(coords.device)  # (H, pairs, 2)
        if s is not None:  # YaRN per component (vispe.image.rope_mixed)
            ref = torch.tensor(self.ref_grid, dtype=torch.float32, device=f.device) * self.scale  # (2,)
            f = yarn_frequencies(f, s[:, :, None], ref, alpha=self.yarn_alpha, beta=self.yarn_beta)  # (B|1, H, pairs, 2)
        ang = torch.matmul(coords[:, None], f.transpose(-1, -2))  # (B|1, H, N, pairs)
        if self.folded:
            return ang
        if self._factored:  # R(p) = RoPE(p) P without a matrix per token (vispe.kernels.rope_blocks)
            return Conjugated(self.zero_rotation(coords.device), ang,
                              self.layout if self.variant == "cayley" else "interleaved")
        if self.variant == "cayley":
            P = self.basis(coords.device)  # (H, d, d)
            rows = P.transpose(-1, -2)[None, :, None]  # (1, H, 1, d, d): columns of P as rows
            R = apply_rope(rows, ang[..., None, :], self.layout).transpose(-1, -2)  # (B|1, H, N, d, d)
            return R[..., None, :, :]  # (B|1, H, N, 1, d, d)
        F = self.basis(coords.device)  # (b, b)
        nb, b = self.head_dim // self._block, self._block
        ang = ang.unflatten(-1, (nb, b // 2))  # (B|1, H, N, nb, b/2)
        return apply_rope(F.t(), ang[..., None, :], "interleaved").transpose(-1, -2)  # (B|1, H, N, nb, b, b)

    def zero_rotation(self, device=None) -> torch.Tensor | None:
        """R(0) = P: what prefix tokens get (the paper's identity, ``P^T R(0)``).  # (heads|1, nb, b, b)"""
        if self.folded:
            return None
        P = self.basis(device)
        if self.variant == "circulant":
            return P.expand(1, self.head_dim // self._block, *P.shape)  # (1, nb, b, b)
        return P[:, None]  # (H, 1, d, d)

    # --- folding P into the projection (inference) -----------------------------------------------
    @torch.no_grad()
    def fold_into_(self, qkv: nn.Linear) -> None:
        """Multiply P into the q and k rows of ``qkv`` (rows [q | k | v], heads of head_dim) and drop it
        from the encoding, which then returns angles (module docstring)."""
        if self.folded:
            raise ValueError("this STRING is folded already")
        H, d = self.num_heads, self.head_dim
        if not isinstance(qkv, nn.Linear) or qkv.out_features != 3 * H * d:
            raise ValueError(f"qkv={qkv!r}: expected the attention's nn.Linear with {3 * H * d} output rows (q, k, v)")
        P = self.basis(qkv.weight.device)  # (H, d, d) or (b, b)
        if self.variant == "circulant":
            P = torch.block_diag(*[P] * (d // self._block)).expand(H, d, d)  # consecutive blocks
        for part in (0, 1):  # q, k
            rows = slice(part * H * d, (part + 1) * H * d)
            w = qkv.weight[rows].view(H, d, -1)  # (H, d, C)
            qkv.weight[rows] = (P.to(w.dtype) @ w).reshape(H * d, -1)
            if qkv.bias is not None:
                bias = qkv.bias[rows].view(H, d, 1)
                qkv.bias[rows] = (P.to(bias.dtype) @ bias).reshape(-1)
        if self.variant == "cayley":
            del self.S  # P is in the weights now
        self.folded = True
        self._cache.clear()

    def extra_repr(self) -> str:
        extra = (f", theta={self.theta:g}, rotate={self.rotate}, cayley_std={self.cayley_std:g}"
                 if self.variant == "cayley" else f", circulant_std={self.circulant_std:g}")
        return f"{super().extra_repr()}, variant={self.variant!r}{extra}, folded={self.folded}"


@torch.no_grad()
def fold_string_(model: nn.Module) -> int:
    """Fold P of every STRING attention layer of ``model`` into its q/k projection (``STRING.fold_into_``,
    exact); returns how many layers were folded. For inference: the state_dict changes (no S)."""
    n = 0
    for name, m in model.named_modules():
        pe = getattr(m, "pe", None)
        if not isinstance(pe, STRING) or pe.folded or not isinstance(getattr(m, "qkv", None), nn.Linear):
            continue
        for attr in ("q_norm", "k_norm"):
            if not isinstance(getattr(m, attr, nn.Identity()), nn.Identity):
                raise ValueError(f"{name}.{attr} is a {type(getattr(m, attr)).__name__}: it sits between the projection "
                                 "and the rotation, so P cannot be folded into the projection")
        for attr in ("q_pos", "k_pos"):
            if getattr(m, attr, None) is not None:
                raise ValueError(f"{name}.{attr} is set: a decoupled position projection adds to q/k before the "
                                 "rotation, so P cannot be folded into qkv alone")
        pe.fold_into_(m.qkv)
        n += 1
    return n
