"""Rotations by ``exp(t B)`` with one generator per block and a scalar per token: ComRoPE at RoPE's cost.

ComRoPE's generators commute because they are multiples of one skew-symmetric ``B`` per head and
block (``"ld"``: ``A_k = m_k B``; ``"ap"``: ``B`` on the blocks of one axis), so a token's rotation is
``exp(t B)`` with ``t = y m_y + x m_x`` a scalar per token and block. With the real Schur form
``B = Q diag(w_k J) Q^T`` (``skew_schur``: Q orthogonal, J the 2 x 2 rotation generator),
``exp(t B) = Q RoPE(t w) Q^T``: two small (b x b, shared by every token) products and RoPE's
elementwise rotation, no matrix per token.

``commuting_rotate(x, t, B, layout)`` is one autograd function. Nothing per token is kept for
backward but ``x`` itself (a view of the qkv projection the attention keeps anyway). Its backward:

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

#: how far from orthogonal the Schur basis may be (float64) before the caller falls back
SCHUR_TOL = 1e-9
#: tokens per chunk of the Frechet sum in backward (bounds its temporaries at chunk * nb * b^2 floats)
CHUNK = 2048


def skew_schur(B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Real Schur form of skew-symmetric ``B`` (..., b, b), b even: ``B = Q diag(w_k J) Q^T`` with
    ``J = [[0, -1], [1, 0]]`` and columns of Q in pairs (a_k, c_k). Returns Q (..., b, b) and w
    (..., b/2) in B's dtype (computed in float64), and whether each basis is orthonormal (...,)."""
    b = B.shape[-1]
    mu, U = torch.linalg.eigh(1j * B.detach().double())  # ascending; i B u = mu u: B u = -i mu u
    top = U[..., b // 2:] * math.sqrt(2)  # (..., b, b/2) mu >= 0: B a = mu c, B c = -mu a
    Q = torch.stack([top.real, top.imag], -1).flatten(-2)  # (..., b, b) columns a_1, c_1, a_2, ...
    eye = torch.eye(b, dtype=Q.dtype, device=Q.device)
    ok = (Q.transpose(-1, -2) @ Q - eye).abs().amax((-1, -2)) < SCHUR_TOL  # (...,)
    return Q.to(B.dtype), mu[..., b // 2:].to(B.dtype), ok


def _group(x: torch.Tensor, nb: int, b: int, layout: str) -> torch.Tensor:
    """(..., d) -> (..., nb, b), block j = channels of ``vispe.lie.block_channels``."""
    if layout == "interleaved":
        return x.unflatten(-1, (nb, b))
    return x.unflatten(-1, (b, nb)).transpose(-1, -2)


def _ungroup(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.flatten(-2) if layout == "interleaved" else x.transpose(-1, -2).flatten(-2)


def _rot(v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Planes (2k, 2k+1) of ``v`` (..., b) rotated by angles with ``cos``, ``sin`` (..., b/2).  # v.shape"""
    v1, v2 = v[..., 0::2], v[..., 1::2]
    return torch.stack([v1 * cos - v2 * sin, v2 * cos + v1 * sin], -1).flatten(-2)


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def _in_basis(Q: torch.Tensor, v: torch.Tensor, transpose: bool) -> torch.Tensor:
    """``Q^T v`` (transpose) or ``Q v`` per block: Q (H|1, nb, b, b), v (..., H, L, nb, b).  # v.shape"""
    return torch.einsum("hjba,...hljb->...hlja" if transpose else "hjab,...hljb->...hlja", Q, v)


class _CommutingRotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, t, B, Q, w, layout):
        wd = torch.float64 if x.dtype == torch.float64 else torch.float32
        nb, b = B.shape[-3], B.shape[-1]
        Qw, ww = Q.to(wd), w.to(wd)
        ang = t.to(wd)[..., None] * ww[:, None]  # (B|1, H, L, nb, b/2)
        xh = _in_basis(Qw, _group(x.to(wd), nb, b, layout), True)  # (..., H, L, nb, b)
        out = _ungroup(_in_basis(Qw, _rot(xh, ang.cos(), ang.sin()), False), layout).to(x.dtype)
        ctx.save_for_backward(x, t, Qw, ww)
        ctx.layout, ctx.B_dtype = layout, B.dtype
        return out

    @staticmethod
    def backward(ctx, g):
        x, t, Q, w = ctx.saved_tensors
        layout, wd = ctx.layout, Q.dtype
        nb, b = Q.shape[-3], Q.shape[-1]
        tw = t.to(wd)
        ang = tw[..., None] * w[:, None]  # (B|1, H, L, nb, b/2)
        cos, sin = ang.cos(), ang.sin()
        gh = _in_basis(Q, _group(g.to(wd), nb, b, layout), True)  # (..., H, L, nb, b)
        gx = gt = gB = None
        if ctx.needs_input_grad[0]:
            gx = _sum_to(_ungroup(_in_basis(Q, _rot(gh, cos, -sin), False), layout), x.shape).to(x.dtype)
        xh = _in_basis(Q, _group(x.to(wd), nb, b, layout), True)  # (..., H, L, nb, b) input, Schur basis
        if ctx.needs_input_grad[1]:  # g^ . B^ x'^ = sum_k w_k (g2 x'1 - g1 x'2)
            xr = _rot(xh, cos, sin)
            cross = gh[..., 1::2] * xr[..., 0::2] - gh[..., 0::2] * xr[..., 1::2]  # (..., H, L, nb, b/2)
            gt = _sum_to((cross * w[:, None]).sum(-1), t.shape).to(t.dtype)
        if ctx.needs_input_grad[2]:
            gB = _frechet_adjoint(gh, xh, tw, w, Q).to(ctx.B_dtype)
        return gx, gt, gB, None, None, None


def _frechet_adjoint(gh: torch.Tensor, xh: torch.Tensor, t: torch.Tensor, w: torch.Tensor,
                     Q: torch.Tensor) -> torch.Tensor:
    """``sum_tokens t L*(t B^)[g^ x^^T]`` mapped back by Q (module docstring).  # (H, nb, b, b)"""
    lead = t.dim()  # t (B|1, H, L, nb): the dims of gh/xh before them (q and k) are summed first
    g1, g2 = gh[..., 0::2], gh[..., 1::2]  # (..., B, H, L, nb, b/2) plane k
    x1, x2 = xh[..., 0::2], xh[..., 1::2]

    def outer(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # sum over the stacked dims: (B, H, L, nb, k, l)
        p = u[..., :, None] * v[..., None, :]
        p = p.sum(dim=tuple(range(p.dim() - lead - 2))) if p.dim() > lead + 2 else p
        return _sum_to(p, torch.Size([*t.shape, p.shape[-2], p.shape[-1]]))

    L = t.shape[-2]
    acc = torch.zeros(*w.shape[:-1], w.shape[-1], w.shape[-1], 2, 2, dtype=w.dtype, device=w.device)  # (H, nb, k, l, 2, 2)
    for s in range(0, L, CHUNK):
        sl = slice(s, s + CHUNK)

        def cut(v: torch.Tensor) -> torch.Tensor:
            return v[..., sl, :, :]

        e11, e12 = outer(cut(g1), cut(x1)), outer(cut(g1), cut(x2))  # (B|1, H, l, nb, k, l) E_kl entries
        e21, e22 = outer(cut(g2), cut(x1)), outer(cut(g2), cut(x2))
        tc = t[..., sl, :]  # (B|1, H, l, nb)
        a = tc[..., None] * w[:, None]  # (B|1, H, l, nb, b/2) a_k = t w_k
        ak, al = a[..., :, None], a[..., None, :]
        half_sum, half_diff = (ak + al) / 2, (ak - al) / 2
        c_re, c_im = (e11 + e22) / 2, (e21 - e12) / 2  # commuting part c I + c' J
        n_re, n_im = (e11 - e22) / 2, (e12 + e21) / 2  # anticommuting part a K + a' K'
        sc = torch.sinc(half_diff / math.pi) * tc[..., None, None]  # (B|1, H, l, nb, k, l) times t
        sa = torch.sinc(half_sum / math.pi) * tc[..., None, None]
        cs, ss = torch.cos(half_sum), torch.sin(half_sum)  # e^{-i half_sum}: (cos, -sin)
        cd, sd = torch.cos(half_diff), torch.sin(half_diff)
        rc = sc * (c_re * cs + c_im * ss)  # Re((c_re + i c_im) e^{-i hs})
        ic = sc * (c_im * cs - c_re * ss)
        ra = sa * (n_re * cd + n_im * sd)
        ia = sa * (n_im * cd - n_re * sd)
        parts = torch.stack([rc + ra, -ic + ia, ic + ia, rc - ra], -1)  # R00, R01, R10, R11
        acc = acc + parts.sum(dim=(0, 2)).unflatten(-1, (2, 2))  # over images and tokens
    H, nb, k = acc.shape[0], acc.shape[1], acc.shape[2]
    dBh = acc.permute(0, 1, 2, 4, 3, 5).reshape(H, nb, 2 * k, 2 * k)  # (H, nb, b, b) rows (k, i), cols (l, j)
    return Q @ dBh @ Q.transpose(-1, -2)


def commuting_rotate(x: torch.Tensor, t: torch.Tensor, B: torch.Tensor, layout: str = "interleaved",
                     basis: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``x`` (..., H, L, d) with channel block j of each token rotated by ``exp(t[..., j] B[h, j])``:
    ``t`` (B|1, H|1, L, nb) scalars (4 dims), ``B`` (H, nb, b, b) skew-symmetric; ``basis`` (Q, w) from
    ``skew_schur(B)`` when the caller has checked it (computed here otherwise).  # x.shape"""
    nb, b = B.shape[-3], B.shape[-1]
    if nb * b != x.shape[-1] or t.shape[-1] != nb:
        raise ValueError(f"x {tuple(x.shape)}, t {tuple(t.shape)}, B {tuple(B.shape)}: expected x (..., nb * b), "
                         "t (..., nb), B (H, nb, b, b)")
    Q, w = basis if basis is not None else skew_schur(B)[:2]
    t = t.expand(t.shape[0], B.shape[0], *t.shape[2:])  # (B|1, H, L, nb): the Frechet sum is per head
    return _CommutingRotate.apply(x, t, B, Q, w, layout)
