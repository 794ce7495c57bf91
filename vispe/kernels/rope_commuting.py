"""Rotations by ``exp(t B)`` with one generator per block and a scalar per token: ComRoPE at RoPE's cost.

ComRoPE's generators commute because they are multiples of one skew-symmetric ``B`` per head and
block (``"ld"``: ``A_k = m_k B``; ``"ap"``: ``B`` on the blocks of one axis), so a token's rotation is
``exp(t B)`` with ``t = y m_y + x m_x`` a scalar per token and block. With the real Schur form
``B = Q diag(w_k J) Q^T`` (``skew_schur``: Q orthogonal, J the 2 x 2 rotation generator),
``exp(t B) = Q RoPE(t w) Q^T``: two small (b x b, shared by every token) products and RoPE's
elementwise rotation, no matrix per token.

``commuting_rotate(x, t, B, layout)`` is one autograd function. Nothing per token is kept for
backward but ``x`` in the Schur basis (one tensor of q and k's size) and the scalars t. Its backward:

* ``dx = Q RoPE(-t w) Q^T g``;
* ``dt = sum_k w_k g^_k . J x'^_k`` (``d/dt exp(tB) = B exp(tB)``; hats: in the Schur basis);
* ``dB = Q dB^ Q^T`` with ``dB^ = sum_tokens t L*(t B^)[g^ x^^T]``, the adjoint of the Frechet
  derivative of exp, ``int_0^1 exp(-s t B^) E exp(-(1-s) t B^) ds``. On the 2 x 2 block (k, l) of
  E, its part that commutes with J (``c I + c' J``) and its part that anticommutes (``a K + a' K'``)
  integrate in closed form: ``(c + i c') sinc((a_k - a_l) / 2) e^{-i (a_k + a_l) / 2}`` and
  ``(a + i a') sinc((a_k + a_l) / 2) e^{-i (a_k - a_l) / 2}`` (complex numbers for the 2 x 2 blocks,
  ``a_k = t w_k``). This is the Daleckii-Krein formula in real form: its divided differences are
  evaluated as sinc, so nothing divides by a difference of eigenvalues (equal or zero frequencies
  are ordinary points), where differentiating Q itself would (``torch.linalg.eigh``'s backward).

The Schur form comes from ``torch.linalg.eigh`` of the Hermitian ``i B`` in float64, treated as a
constant (the gradient above does not need its derivative). A generator with a zero frequency pair
(a measure-zero set, e.g. B = 0) has a complex eigenspace at 0 whose vectors need not split into an
orthonormal real pair: ``skew_schur`` then reports it, and the caller uses the block rotations.
Float32 math (float64 kept); the result in x's dtype.
"""
from __future__ import annotations

import math

import torch

from vispe.coords import float32_math
from vispe.lie import SCHUR_TOL, block_channels, skew_schur

__all__ = ["SCHUR_TOL", "commuting_rotate", "dense_basis", "skew_schur"]

#: tokens per chunk of the Frechet sum in backward (bounds its temporaries at chunk * nb * b^2 floats)
CHUNK = 2048


def dense_basis(Q: torch.Tensor, d: int, layout: str) -> torch.Tensor:
    """The block-diagonal basis as one (d, d) matrix per head, ``M[c, j b + i] = Q[j, r, i]`` for the
    channel c of slot (j, r) of ``vispe.lie.block_channels``: ``x @ M`` is every block's Schur
    coordinates in block order (plane k of block j on channels j b + 2k, j b + 2k + 1: RoPE's
    "interleaved" pairs), whatever ``layout`` groups the channels.  # (H, d, d)"""
    nb, b = Q.shape[-3], Q.shape[-1]
    chan = block_channels(d, b, layout).to(Q.device)  # (nb, b)
    rows = chan[:, :, None].expand(nb, b, b).reshape(-1)
    cols = (torch.arange(nb, device=Q.device)[:, None, None] * b + torch.arange(b, device=Q.device)).expand(nb, b, b)
    M = Q.new_zeros(Q.shape[0], d, d)
    M[:, rows, cols.reshape(-1)] = Q.reshape(Q.shape[0], -1)
    return M


def _rot(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    """Pairs (2i, 2i+1) of ``v`` (..., d) rotated by angles with ``cos``, ``sin`` (..., d/2), times
    ``sign`` (-1: the inverse), into one new tensor.  # broadcast shape"""
    v1, v2 = v[..., 0::2], v[..., 1::2]
    out = torch.empty(torch.broadcast_shapes(v.shape[:-1], cos.shape[:-1]) + v.shape[-1:], dtype=v.dtype,
                      device=v.device)
    o1, o2 = out[..., 0::2], out[..., 1::2]
    torch.mul(v1, cos, out=o1)
    o1.addcmul_(v2, sin, value=-sign)
    torch.mul(v2, cos, out=o2)
    o2.addcmul_(v1, sin, value=sign)
    return out


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def _stacked(v: torch.Tensor, Bt: int) -> torch.Tensor:
    """``v`` (*S, Bx, H, L, d) as (S, Bt, H, L, d): every dim before the batch stacked, and the
    batch folded into them where t is shared by the images (Bt = 1)."""
    return v.reshape(-1, Bt, *v.shape[-3:])


def _points_adjoint(E: torch.Tensor, t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``sum_points t L*(t B^)[E]`` in the Schur basis: E (Bt, H, M, nb, b, b) summed outer products
    at M points of scalars t (Bt, H, M, nb); closed form per 2 x 2 block (module docstring).
    # (H, nb, b, b)"""
    e11, e12 = E[..., 0::2, 0::2], E[..., 0::2, 1::2]  # (Bt, H, M, nb, k, l) E_kl entries
    e21, e22 = E[..., 1::2, 0::2], E[..., 1::2, 1::2]
    a = t[..., None] * w[:, None]  # (Bt, H, M, nb, b/2) a_k = t w_k
    ak, al = a[..., :, None], a[..., None, :]
    half_sum, half_diff = (ak + al) / 2, (ak - al) / 2
    tt = t[..., None, None]
    sc = torch.sinc(half_diff / math.pi) * tt  # (Bt, H, M, nb, k, l) times t
    sa = torch.sinc(half_sum / math.pi) * tt
    c_re, c_im = (e11 + e22) / 2, (e21 - e12) / 2  # commuting part c I + c' J
    n_re, n_im = (e11 - e22) / 2, (e12 + e21) / 2  # anticommuting part a K + a' K'
    cs, ss = torch.cos(half_sum), torch.sin(half_sum)  # e^{-i half_sum}: (cos, -sin)
    cd, sd = torch.cos(half_diff), torch.sin(half_diff)
    rc = sc * (c_re * cs + c_im * ss)  # Re((c_re + i c_im) e^{-i hs})
    ic = sc * (c_im * cs - c_re * ss)
    ra = sa * (n_re * cd + n_im * sd)
    ia = sa * (n_im * cd - n_re * sd)
    parts = torch.stack([rc + ra, -ic + ia, ic + ia, rc - ra], -1).sum(dim=(0, 2))  # (H, nb, k, l, 4) R00 R01 R10 R11
    H, nb, k = parts.shape[0], parts.shape[1], parts.shape[2]
    return parts.unflatten(-1, (2, 2)).permute(0, 1, 2, 4, 3, 5).reshape(H, nb, 2 * k, 2 * k)  # rows (k, i), cols (l, j)


class _CommutingRotate(torch.autograd.Function):
    """x (..., H, P+N, d) rotated by exp(t B) per block. ``ty``, ``tx`` (Bt, H, h|w, nb): the
    separable grid form t = ty[row] + tx[col] of the N = h w grid tokens (prefix: t = 0), or ``t``
    (Bt, H, P+N, nb) per token (``ty`` None). ``M``: ``dense_basis`` of Q."""

    @staticmethod
    def _forward(ctx, x, t, ty, tx, B, Q, w, layout, P):
        wd = torch.float64 if x.dtype == torch.float64 else torch.float32
        Qw, ww = Q.to(wd), w.to(wd)
        Mw = dense_basis(Qw, x.shape[-1], layout)
        if ty is not None:
            grid = (ty.to(wd)[:, :, :, None] + tx.to(wd)[:, :, None, :]).flatten(2, 3)  # (Bt, H, N, nb)
            tw = torch.nn.functional.pad(grid, (0, 0, P, 0))  # (Bt, H, P+N, nb)
        else:
            tw = t.to(wd)
        ang = (tw[..., None] * ww[:, None]).flatten(-2)  # (Bt, H, L, d/2)
        xh = torch.matmul(x.to(wd), Mw)  # (..., H, L, d) Schur coordinates, block order
        out = torch.matmul(_rot(xh, ang.cos(), ang.sin()), Mw.transpose(-1, -2)).to(x.dtype)
        if P:  # prefix tokens: t = 0, exactly unrotated (Q Q^T would round)
            out[..., :P, :] = x[..., :P, :]
        ctx.save_for_backward(xh, tw, ty, tx, Mw, Qw, ww)  # xh, not x: one product less in backward
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.B_dtype, ctx.P, ctx.t_dtype = B.dtype, P, (t if t is not None else ty).dtype
        return out

    @staticmethod
    def _backward(ctx, g):
        xh, t, ty, tx, M, Q, w = ctx.saved_tensors
        wd, P = M.dtype, ctx.P
        nb, half = w.shape[-2], w.shape[-1]
        b = 2 * half
        ang = (t[..., None] * w[:, None]).flatten(-2)  # (Bt, H, L, d/2)
        cos, sin = ang.cos(), ang.sin()
        gh = torch.matmul(g.to(wd), M)  # (..., H, L, d)
        gx = gt = gty = gtx = gB = None
        if ctx.needs_input_grad[0]:
            gx = torch.matmul(_rot(gh, cos, sin, -1.0), M.transpose(-1, -2))
            if P:
                gx[..., :P, :] = g[..., :P, :]
            gx = _sum_to(gx, ctx.x_shape).to(ctx.x_dtype)
        if any(ctx.needs_input_grad[1:4]):  # g^ . B^ x'^ = sum_k w_k (g2 x'1 - g1 x'2)
            xr = _rot(xh, cos, sin)
            cross = (gh[..., 1::2] * xr[..., 0::2]).sub_(gh[..., 0::2] * xr[..., 1::2])  # (..., H, L, d/2)
            dt = _sum_to((cross.unflatten(-1, (nb, half)) * w[:, None]).sum(-1), t.shape)  # (Bt, H, L, nb)
            if ty is None:
                gt = dt.to(ctx.t_dtype)
            else:
                dg = dt[:, :, P:].unflatten(2, (ty.shape[2], tx.shape[2]))  # (Bt, H, h, w, nb)
                gty, gtx = dg.sum(3).to(ctx.t_dtype), dg.sum(2).to(ctx.t_dtype)
        if ctx.needs_input_grad[4]:
            Bt = t.shape[0]
            if ty is None:  # per token: outer products summed over the stacked dims, in chunks
                g5 = _stacked(gh, Bt).unflatten(-1, (nb, b))  # (S, Bt, H, L, nb, b)
                x5 = _stacked(xh, Bt).unflatten(-1, (nb, b))
                dBh = sum(_points_adjoint(torch.einsum("sbhlnp,sbhlnq->bhlnpq", g5[:, :, :, c:c + CHUNK],
                                                       x5[:, :, :, c:c + CHUNK]), t[:, :, c:c + CHUNK], w)
                          for c in range(0, t.shape[2], CHUNK))
            else:  # exp(tB) = exp(ty B) exp(tx B): sum the outer products per row and per column first
                h, wn = ty.shape[2], tx.shape[2]
                g6 = _stacked(gh[..., P:, :], Bt).unflatten(3, (h, wn))  # (S, Bt, H, h, w, d)
                x6 = _stacked(xh[..., P:, :], Bt).unflatten(3, (h, wn))
                ty6, tx6 = ty.to(wd), tx.to(wd)
                ax = (tx6[..., None] * w[:, None]).flatten(-2)[:, :, None]  # (Bt, H, 1, w, d/2)
                ay = (ty6[..., None] * w[:, None]).flatten(-2)[:, :, :, None]  # (Bt, H, h, 1, d/2)
                xc = _rot(x6, ax.cos(), ax.sin()).unflatten(-1, (nb, b))  # exp(tx B) x, Schur coordinates
                ga = _rot(g6, ay.cos(), ay.sin(), -1.0).unflatten(-1, (nb, b))  # exp(ty B)^T g
                Ey = torch.einsum("sbhijnp,sbhijnq->bhinpq", g6.unflatten(-1, (nb, b)), xc)  # (Bt, H, h, nb, b, b)
                Ex = torch.einsum("sbhijnp,sbhijnq->bhjnpq", ga, x6.unflatten(-1, (nb, b)))  # (Bt, H, w, nb, b, b)
                dBh = _points_adjoint(Ey, ty6, w) + _points_adjoint(Ex, tx6, w)
            gB = (Q @ dBh @ Q.transpose(-1, -2)).to(ctx.B_dtype)  # (H, nb, b, b)
        return gx, gt, gty, gtx, gB, None, None, None, None

    @staticmethod
    def forward(ctx, x, t, ty, tx, B, Q, w, layout, P):  # float32 math whatever autocast says (forward and backward alike)
        with float32_math(x.device):
            return _CommutingRotate._forward(ctx, x, t, ty, tx, B, Q, w, layout, P)

    @staticmethod
    def backward(ctx, g):
        with float32_math(g.device):
            return _CommutingRotate._backward(ctx, g)


def commuting_rotate(x: torch.Tensor, t: torch.Tensor | None, B: torch.Tensor, layout: str = "interleaved",
                     basis: tuple[torch.Tensor, torch.Tensor] | None = None, *,
                     grid: tuple[torch.Tensor, torch.Tensor] | None = None, num_prefix_tokens: int = 0) -> torch.Tensor:
    """``x`` (..., H, L, d) with channel block j of each token rotated by ``exp(t[..., j] B[h, j])``:
    ``t`` (B|1, H|1, L, nb) scalars (4 dims), ``B`` (H, nb, b, b) skew-symmetric; ``basis`` (Q, w)
    from ``skew_schur(B)`` when the caller has checked it (computed here otherwise). ``grid`` (ty, tx)
    (B|1, H|1, h|w, nb) instead of ``t``: the scalars of a grid, ``t = ty[row] + tx[col]`` for the
    last h w tokens and 0 for the ``num_prefix_tokens`` before (backward then sums per row and column
    before the Frechet terms: h + w of them instead of h w). The first ``num_prefix_tokens`` (t = 0
    there) are returned as they are.  # x.shape"""
    nb, b = B.shape[-3], B.shape[-1]
    H = B.shape[0]
    Q, w = basis if basis is not None else skew_schur(B)[:2]
    if grid is not None:
        ty, tx = (v.expand(v.shape[0], H, *v.shape[2:]) for v in grid)  # (B|1, H, h|w, nb)
        L = num_prefix_tokens + ty.shape[2] * tx.shape[2]
        if nb * b != x.shape[-1] or ty.shape[-1] != nb or tx.shape[-1] != nb or x.shape[-2] != L:
            raise ValueError(f"x {tuple(x.shape)}, grid {tuple(ty.shape)} {tuple(tx.shape)}, B {tuple(B.shape)}: "
                             f"expected x (..., {L}, nb * b), ty/tx (..., nb), B (H, nb, b, b)")
        return _CommutingRotate.apply(x, None, ty, tx, B, Q, w, layout, num_prefix_tokens)
    if t is None or nb * b != x.shape[-1] or t.shape[-1] != nb:
        raise ValueError(f"x {tuple(x.shape)}, t {None if t is None else tuple(t.shape)}, B {tuple(B.shape)}: "
                         "expected x (..., nb * b), t (..., nb), B (H, nb, b, b)")
    t = t.expand(t.shape[0], H, *t.shape[2:])  # (B|1, H, L, nb): the Frechet sum is per head
    return _CommutingRotate.apply(x, t, None, None, B, Q, w, layout, num_prefix_tokens)
