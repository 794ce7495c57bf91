"""Rotations from skew-symmetric generators: the math of the block-rotation encodings.

``liere``, ``comrope`` and ``string`` rotate q and k by ``R(p) = exp(sum_k p_k A_k)`` with learned
skew-symmetric generators ``A_k`` (block-diagonal, blocks of ``b`` channels). Here:

* ``skew_from_upper(raw)`` (LieRE: ``triu(raw, 1) - triu(raw, 1)^T``) and ``skew(p)`` (ComRoPE:
  ``p - p^T``) build generators from free parameters;
* ``expm(a)``: the exponential of a batch of square matrices by scaling and squaring of a degree-12
  Taylor polynomial (Paterson-Stockmeyer, 5 products), written with matmul / where only, so
  torch.export and the ONNX exporter record it (``torch.linalg.matrix_exp`` has no ONNX form); each
  batch gets one number of squarings from a bound on its norms (``ceil(log2(bound / 1.5))``;
  ``normal=True`` for skew-symmetric generators tightens it through ``|a^2|`` and ``|a^4|``; a
  caller may pass its own bound), each matrix its own while tracing (``MAX_SQUARINGS`` masked rounds),
  float32 accuracy against ``torch.linalg.matrix_exp`` about 1e-6 for ``|a| < 10``, 2e-5 up to
  ~60 (tests/test_image_rotary_blocks.py, tests/test_rope_blocks_factored.py);
* ``cayley(s)``: ``(I - s)(I + s)^-1``, orthogonal for skew-symmetric ``s`` (STRING);
* ``rotation_2x2(angles)``: the block-diagonal rotation of angles, as (..., n, 2, 2) blocks;
* ``per_value(values, fn)``: ``fn`` evaluated once per distinct value of ``values`` and gathered
  back (the "exponentiate per distinct coordinate" saving; plain evaluation while tracing, where
  ``torch.unique``'s data-dependent size cannot be recorded).

Everything is float32 (float64 for float64 inputs); callers turn autocast off.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from vispe import _tracing

#: Taylor degree and the norm each matrix is scaled to before squaring: remainder
#: 1.5^13 / 13! ~ 3e-8, float32 rounding; the degree-12 polynomial is evaluated by Paterson-Stockmeyer
#: in 5 products (x^2, x^3, x^4 and two Horner steps in x^4), where plain Horner takes 12
TAYLOR_DEGREE = 12
SCALED_NORM = 1.5
#: squarings recorded under torch.compile / torch.export (eager uses the batch's own maximum):
#: enough for generators of norm up to 1.5 * 2^16
MAX_SQUARINGS = 16
#: Newton-Schulz steps of ``cayley`` while tracing: converged for condition numbers up to ~5e4 (|S| up to ~200)
NEWTON_SCHULZ = 20


def skew_from_upper(raw: torch.Tensor) -> torch.Tensor:
    """``triu(raw, 1) - triu(raw, 1)^T`` (LieRE's generator from its raw parameter).  # raw.shape"""
    upper = raw.triu(1)
    return upper - upper.transpose(-1, -2)


def skew(p: torch.Tensor) -> torch.Tensor:
    """``p - p^T`` (ComRoPE's angle matrix from its parameter).  # p.shape"""
    return p - p.transpose(-1, -2)


def _inf_norm(a: torch.Tensor) -> torch.Tensor:
    return a.abs().sum(-1).amax(-1)  # (...,) the infinity norm bounds the spectral one


def _squarings(bound: torch.Tensor) -> torch.Tensor:
    """How many times each matrix is halved: ceil(log2(bound / SCALED_NORM)), at least 0.  # bound.shape"""
    s = torch.ceil(torch.log2(bound.clamp(min=1e-30) / SCALED_NORM))
    return s.clamp(min=0, max=MAX_SQUARINGS)


def squarings(a: torch.Tensor, *, normal: bool = False, bound: float | None = None) -> int:
    """The number of squarings eager ``expm`` takes for the batch ``a`` (..., b, b): from ``bound``
    when given (an upper bound on every matrix's spectral norm), else from the largest of the
    matrices' norm bounds (``|a|_inf``; for ``normal`` the smaller of that, ``|a^2|_inf^(1/2)`` and
    ``|a^4|_inf^(1/4)``)."""
    if not a.numel():
        return 0
    with torch.no_grad():
        if bound is not None:
            top = torch.tensor(float(bound))
        else:
            top = _inf_norm(a)
            if normal:
                a2 = torch.matmul(a, a)
                top = torch.minimum(top, torch.minimum(_inf_norm(a2).sqrt(), _inf_norm(torch.matmul(a2, a2)).sqrt().sqrt()))
            top = top.max()
        return int(_squarings(top))


def expm(a: torch.Tensor, *, normal: bool = False, bound: float | None = None) -> torch.Tensor:
    """``exp(a)`` of square matrices ``a`` (..., b, b), by scaling and squaring.  # a.shape

    Eager: every matrix of the batch is scaled by the same power of two, ``squarings(a, normal=,
    bound=)`` (a bound on the norm: ``|a|_inf``; ``normal=True`` for skew-symmetric generators,
    where ``|a|_2 = |a^k|_2^(1/k)``, takes the smaller of that, ``|a^2|_inf^(1/2)`` and
    ``|a^4|_inf^(1/4)``; a caller that knows a bound, LieRE's ``|y| |A_y|_2 + |x| |A_x|_2``, passes
    it and no norm is computed per matrix), then squared that many times: no per-matrix selection
    (``torch.where`` copies as much memory as a product). While torch.compile / torch.export record:
    each matrix its own count (``|a|_inf``) in ``MAX_SQUARINGS`` masked rounds. Differentiable
    (autograd through the products)."""
    if a.shape[-1] != a.shape[-2]:
        raise ValueError(f"a has shape {tuple(a.shape)}: expected square matrices (..., b, b)")
    tracing = _tracing.is_tracing()
    if tracing:
        per = _squarings(_inf_norm(a.detach()))  # (...,)
        x = a * torch.exp2(-per)[..., None, None]
    else:
        rounds = squarings(a, normal=normal, bound=bound)
        x = a * 2.0 ** -rounds
    x2 = torch.matmul(x, x)
    x3 = torch.matmul(x2, x)
    x4 = torch.matmul(x2, x2)
    c = [1.0 / math.factorial(k) for k in range(TAYLOR_DEGREE + 1)]

    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)

    def block(i: int) -> torch.Tensor:  # sum_j c_(4i+j) x^j, j < 4
        if tracing:  # out of place: the ONNX exporter's functional graph has no in-place view update
            return c[4 * i + 3] * x3 + c[4 * i + 2] * x2 + c[4 * i + 1] * x + c[4 * i] * eye
        out = (x3 * c[4 * i + 3]).add_(x2, alpha=c[4 * i + 2]).add_(x, alpha=c[4 * i + 1])  # one new tensor
        out.diagonal(dim1=-2, dim2=-1).add_(c[4 * i])
        return out

    e = block(2) + c[12] * x4
    e = torch.matmul(x4, e) + block(1)  # Horner in x^4
    e = torch.matmul(x4, e) + block(0)
    if tracing:
        for i in range(MAX_SQUARINGS):
            e = torch.where((per > i)[..., None, None], torch.matmul(e, e), e)
        return e
    for _ in range(rounds):
        e = torch.matmul(e, e)
    return e


def cayley(s: torch.Tensor) -> torch.Tensor:
    """``(I - s)(I + s)^-1`` of skew-symmetric ``s`` (an orthogonal matrix).  # s.shape

    Eager: one ``torch.linalg.solve``. While torch.compile / torch.export records (the ONNX exporter
    has no solve): ``(I + s)^-1 = (I - s)(I - s^2)^-1`` with ``I - s^2 = I + s^T s`` symmetric
    positive definite (eigenvalues >= 1), inverted by ``NEWTON_SCHULZ`` Newton-Schulz steps."""
    eye = torch.eye(s.shape[-1], dtype=s.dtype, device=s.device).expand_as(s)
    if not _tracing.is_tracing():
        # (I - s) and (I + s)^-1 commute: (I + s)^-1 (I - s), one solve
        return torch.linalg.solve(eye + s, eye - s)
    m = eye - torch.matmul(s, s)  # (..., d, d) SPD
    x = eye / m.abs().sum(-1).amax(-1)[..., None, None]  # I / |m|_inf: |I - m x| < 1
    for _ in range(NEWTON_SCHULZ):
        x = torch.matmul(x, 2 * eye - torch.matmul(m, x))
    return torch.matmul(torch.matmul(eye - s, eye - s), x)


def rotation_2x2(angles: torch.Tensor) -> torch.Tensor:
    """Rotation blocks ``[[cos a, -sin a], [sin a, cos a]]`` of ``angles`` (...,).  # (..., 2, 2)"""
    c, s = angles.cos(), angles.sin()
    return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)


def per_value(values: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``fn(values)`` computed once per distinct value (row) of ``values`` (M, k) and gathered back.

    ``fn`` maps (U, k) rows to (U, ...) results; the result is (M, ...). While torch.compile or
    torch.export records, ``fn(values)`` is called on every row (unique's size is data-dependent)."""
    if _tracing.is_tracing() or values.shape[0] <= 1:
        return fn(values)
    uniq, inverse = torch.unique(values, dim=0, return_inverse=True)  # (U, k), (M,)
    if uniq.shape[0] == values.shape[0]:
        return fn(values)
    return fn(uniq).index_select(0, inverse)


def block_channels(d: int, b: int, layout: str) -> torch.Tensor:
    """Channel of each (block, row) slot: ``out[j, i]`` is the channel that row i of block j acts on.

    "interleaved": consecutive channels, block j = [j b, (j+1) b) (LieRE's and ComRoPE's layout; for
    b = 2 RoFormer's pairs); "half": strided channels, block j = {j, j + d/b, ...} (for b = 2 the
    rotate-half pairs (i, i + d/2)).  # (d/b, b) long"""
    c = torch.arange(d)
    return c.view(d // b, b) if layout == "interleaved" else c.view(b, d // b).t()


#: how far from orthogonal the Schur basis may be (float64) before the caller falls back
SCHUR_TOL = 1e-9


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
