"""Block rotations of q and k: the second form of the rotary contract (``vispe.encoding``).

A rotary encoding whose ``block_size`` b is larger than 2 (LieRE, ComRoPE, STRING) returns, instead
of angles, one orthogonal b x b matrix per token, head and block of channels:
``R`` (B|1, H|1, N, head_dim/b, b, b) float32. ``vispe.kernels.rope.rotate_qk``, the one entry
point the attention layer calls, hands such an encoding to ``rotate_qk`` here:

* ``rotations_for(pe, shape, mask, P, device)``: the encoding's rotations with P prefix rows
  prepended: the rotation at coordinate 0, ``pe.zero_rotation()``, which is the identity (prefix
  tokens unrotated, the family's rule) for every encoding whose R(0) = I, and STRING's P (its R(p)
  drops the paper's left factor P^T, so its "unrotated" is P: the paper's identity in that frame). While the encoding's generators cannot
  change between calls (``pe.frozen_key()`` not None: eval mode under ``torch.no_grad`` or with
  frozen parameters) the rotations of a grid without mask are kept in its table cache; the key
  includes every parameter's version counter, so an in-place update (an optimiser step,
  ``load_state_dict``) is never served a stale rotation;
* ``apply_blocks(x, R, layout)``: ``x`` (..., L, d) with channel block j of each token multiplied by
  ``R[..., j, :, :]``: ``out_c = sum_c' R[j, i, i'] x_c'`` for the channels c = slot (j, i) and
  c' = slot (j, i') of ``vispe.lie.block_channels`` ("interleaved": consecutive channels, the
  references' layout; "half": strided ones). Float32 math (float64 kept), cast back to x's
  dtype; plain autograd (the gradient reaches the generators through ``R``).

That is the definition, kept as ``method="blocks"``. By default (``method="auto"``) an encoding
that can give its rotations in a factored form (``pe.factors(shape, mask, device)``, issue 52) is
applied without a matrix per token, through ``apply_factors``, with equal values and gradients:

* ``Conjugated(P, angles, layout)``: ``R(p) = RoPE(angles(p)) P`` (STRING): one product by P
  (shared by every token) and RoPE's rotation with learned angles (``vispe.kernels.rope.rotate``);
* ``Commuting(t, B, basis)``: ``R(p) = exp(t(p) B)`` per block (ComRoPE), in B's real Schur basis
  (``vispe.kernels.rope_commuting``, its own gradient);
* ``Recomputed(build, inputs)``: the blocks ``build(*inputs)`` (LieRE), applied under activation
  checkpointing: backward rebuilds them instead of keeping every exponential's intermediates.

``pe.factors`` returns None where it cannot or need not (ComRoPE and LieRE while torch.compile /
torch.export record, a degenerate ComRoPE generator, LieRE while frozen: eval without gradients,
where its cached blocks are cheaper than any exponential): the blocks are used then. The cost of the blocks is one
b x b product per token, head and block (``head_dim * b`` multiply-adds per token and head,
against ``2 head_dim`` for angles) plus building them; ``bench/rope_blocks.py`` measures both.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from vispe import _checks, _tracing, lie
from vispe.coords import float32_math
from vispe.image._factors import Commuting, Conjugated, Recomputed
from vispe.kernels.rope_commuting import commuting_rotate

__all__ = ["METHODS", "Commuting", "Conjugated", "Recomputed", "apply_blocks", "apply_factors", "factors_for",
           "rotate_at", "rotate_qk", "rotations_for", "shared_product", "with_prefix", "block_rotation_matrix"]

METHODS = ("auto", "blocks")


def _work_dtype(*ts: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def apply_blocks(x: torch.Tensor, R: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """``x`` (..., L, d) rotated by the block rotations ``R`` (broadcastable to (..., L, d/b, b, b)).  # x.shape

    One batched product ``R @ X`` whose columns X are every vector that shares a rotation (the
    dimensions R broadcasts over, e.g. q and k and the images of a batch without a mask), so R is
    never copied per image (``torch.matmul`` would expand it to x's batch first)."""
    d, b = x.shape[-1], R.shape[-1]
    if R.shape[-2] != b or R.shape[-3] * b != d:
        raise ValueError(f"R has shape {tuple(R.shape)}: expected (..., {d} / b, b, b) for x {tuple(x.shape)}")
    wd = _work_dtype(x, R)
    xw = x.to(wd)
    if layout == "interleaved":
        xg = xw.unflatten(-1, (d // b, b))  # (..., L, nb, b)
    else:
        xg = xw.unflatten(-1, (b, d // b)).transpose(-1, -2)  # (..., L, nb, b): block j = channels j + i d/b
    out = _shared_matmul(R.to(wd), xg)  # (..., L, nb, b)
    out = out.flatten(-2) if layout == "interleaved" else out.transpose(-1, -2).flatten(-2)
    # contiguous: the product leaves the shared dims (q/k, images) innermost, and attention on such
    # strides takes scaled_dot_product_attention's math path, which keeps the (L, L) weights for backward
    return out.to(x.dtype).contiguous()


def _shared_matmul(R: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``R @ v`` per leading index, R (*lr, b, b) and v (*lv, b) broadcast against each other: the
    dimensions where R has size 1 become columns of one matrix product.  # broadcast(lr, lv) + (b,)"""
    b = R.shape[-1]
    lead = torch.broadcast_shapes(R.shape[:-2], v.shape[:-1])
    n = len(lead)
    R = R.reshape((1,) * (n - R.dim() + 2) + tuple(R.shape))
    v = v.reshape((1,) * (n - v.dim() + 1) + tuple(v.shape))
    cols = [i for i in range(n) if R.shape[i] == 1 and lead[i] != 1]
    rows = [i for i in range(n) if i not in cols]
    v = v.expand(*[lead[i] if i in rows else v.shape[i] for i in range(n)], b)
    vp = v.permute(*rows, n, *cols).reshape(*[lead[i] for i in rows], b, -1)  # (*rows, b, C)
    Rp = R.expand(*[lead[i] if i in rows else 1 for i in range(n)], b, b)
    Rp = Rp.permute(*rows, *cols, n, n + 1).reshape(*[lead[i] for i in rows], b, b)  # (*rows, b, b)
    out = torch.matmul(Rp, vp)  # (*rows, b, C)
    out = out.reshape(*[lead[i] for i in rows], b, *[lead[i] for i in cols])
    order = rows + [n] + cols  # where each dimension of ``out`` sits in (lead..., b)
    return out.permute(*[order.index(i) for i in range(n + 1)])


def with_prefix(R: torch.Tensor, num_prefix_tokens: int, zero: torch.Tensor | None = None) -> torch.Tensor:
    """``R`` (B|1, H|1, N, nb, b, b) with P prefix rotations prepended along N: ``zero``, the encoding's
    rotation at coordinate 0 (H|1, nb|1, b, b), or the identity.  # (B|1, H|1, P+N, nb, b, b)"""
    if not num_prefix_tokens:
        return R
    b = R.shape[-1]
    if zero is None:
        zero = torch.eye(b, dtype=R.dtype, device=R.device)[None, None]  # (1, 1, b, b)
    pre = zero.to(R.dtype)[None, :, None]  # (1, H|1, 1, nb|1, b, b)
    H = max(R.shape[1], pre.shape[1])
    pre = pre.expand(R.shape[0], H, num_prefix_tokens, R.shape[3], b, b)
    return torch.cat([pre, R.expand(R.shape[0], H, *R.shape[2:])], dim=2)


def _build(pe, shape, mask, num_prefix_tokens, device):
    R = pe(shape, mask, device=device)  # (B|1, H|1, N, nb, b, b)
    zero = pe.zero_rotation(device) if hasattr(pe, "zero_rotation") else None
    return with_prefix(R, num_prefix_tokens, zero)


def rotations_for(pe, shape, mask, num_prefix_tokens: int, device) -> torch.Tensor:
    """The block rotations of encoding ``pe`` on grid ``shape`` with P prefix rows (module docstring).  # (B|1, H|1, P+N, nb, b, b)"""
    key = pe.frozen_key() if hasattr(pe, "frozen_key") else None
    if key is not None and mask is None:
        full = ("rope_blocks", key, tuple(shape), num_prefix_tokens, device)
        return pe.cached(full, lambda: _build(pe, shape, None, num_prefix_tokens, device))
    return _build(pe, shape, mask, num_prefix_tokens, device)


def apply_factors(x: torch.Tensor, f, num_prefix_tokens: int, layout: str) -> torch.Tensor:
    """``x`` (..., P+N, d) rotated by factored rotations ``f`` of N tokens (module docstring), P prefix
    tokens at coordinate 0 (STRING's P, the identity for the others).  # x.shape"""
    P = num_prefix_tokens
    if isinstance(f, Conjugated):
        from vispe.kernels import rope  # (rope imports this module lazily too)

        y = shared_product(x.to(_work_dtype(x, f.P)), f.P)  # (..., L, d) P x
        angles = F.pad(f.angles, (0, 0, P, 0)) if P else f.angles  # (B|1, H|1, P+N, d/2)
        cos, sin = rope.rope_tables(angles.detach())
        learn = angles.requires_grad and torch.is_grad_enabled()
        return rope.rotate(y, cos, sin, f.layout, angles=angles if learn else None).to(x.dtype)
    if isinstance(f, Commuting):
        if f.grid is not None:
            return commuting_rotate(x, None, f.B, layout, f.basis, grid=f.grid, num_prefix_tokens=P)
        t = F.pad(f.t, (0, 0, P, 0)) if P else f.t  # (B|1, H|1, P+N, nb) prefix: t = 0
        return commuting_rotate(x, t, f.B, layout, f.basis, num_prefix_tokens=P)
    if isinstance(f, Recomputed):
        def rotated(v: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
            with float32_math(v.device):
                R = with_prefix(f.build(*inputs), P)  # (B|1, H|1, P+N, nb, b, b)
            _check_tokens(R, v, P)
            return apply_blocks(v, R, layout)

        if not torch.is_grad_enabled():
            return rotated(x, *f.inputs)
        return checkpoint(rotated, x, *f.inputs, use_reentrant=False)
    raise ValueError(f"f={type(f).__name__}: expected Conjugated, Commuting or Recomputed")


class _SharedProduct(torch.autograd.Function):
    """``P x`` with P (H|1, nb, b, b) shared by every token; keeps ``x`` (a view of the qkv projection,
    which the attention keeps anyway) for P's gradient, not a permuted copy."""

    @staticmethod
    def _forward(ctx, x, P):
        ctx.save_for_backward(x, P)
        return apply_blocks(x, P[:, None], "interleaved")

    @staticmethod
    def _backward(ctx, g):
        x, P = ctx.saved_tensors
        gx = apply_blocks(g, P.transpose(-1, -2)[:, None], "interleaved") if ctx.needs_input_grad[0] else None
        gP = None
        if ctx.needs_input_grad[1]:
            nb, b = P.shape[-3], P.shape[-1]
            gP = torch.einsum("...hljp,...hljq->hjpq", g.to(P.dtype).unflatten(-1, (nb, b)),
                              x.to(P.dtype).unflatten(-1, (nb, b)))  # (H, nb, b, b)
            gP = gP.sum(0, keepdim=True) if P.shape[0] == 1 else gP
        return gx, gP

    @staticmethod
    def forward(ctx, x, P):  # float32 math whatever autocast says (forward and backward alike)
        with float32_math(x.device):
            return _SharedProduct._forward(ctx, x, P)

    @staticmethod
    def backward(ctx, g):
        with float32_math(g.device):
            return _SharedProduct._backward(ctx, g)


def shared_product(x: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """``x`` (..., H, L, d) times the block matrices P (H|1, nb, b, b) on consecutive channel blocks,
    the same for every token (STRING's P).  # x.shape"""
    if _tracing.is_tracing():  # plain autograd while torch.compile / torch.export record
        return apply_blocks(x, P[:, None], "interleaved")
    return _SharedProduct.apply(x, P)


def factors_for(pe, shape, mask, num_prefix_tokens: int, device):
    """``pe.factors(shape, mask, device)``, kept in the table cache while frozen (as ``rotations_for``);
    None where the encoding has no factored form (then the blocks)."""
    if not hasattr(pe, "factors"):
        return None
    key = pe.frozen_key() if hasattr(pe, "frozen_key") else None
    if key is not None and mask is None:
        return pe.cached(("rope_factors", key, tuple(shape), device), lambda: pe.factors(shape, None, device))
    return pe.factors(shape, mask, device)


def _check_tokens(R: torch.Tensor, x: torch.Tensor, P: int) -> None:
    if R.shape[-4] != x.shape[-2]:
        raise ValueError(f"the encoding gives {R.shape[-4] - P} token rotations: expected {x.shape[-2] - P} "
                         f"({P} prefix tokens)")


def rotate_qk(pe, qk: torch.Tensor, shape, mask=None, num_prefix_tokens: int = 0, *,
              method: str = "auto") -> torch.Tensor:
    """q and k stacked, ``qk`` (2, B, H, P+N, d) (or any (..., P+N, d)), rotated by block encoding ``pe``;
    ``method``: "auto" (factored where the encoding has the form) or "blocks" (module docstring)."""
    _checks.choice("method", method, METHODS)
    f = factors_for(pe, shape, mask, num_prefix_tokens, qk.device) if method == "auto" else None
    if f is not None:
        n = (f.angles.shape[-2] if isinstance(f, Conjugated) else f.tokens() if isinstance(f, Commuting) else None)
        if n is not None and n + num_prefix_tokens != qk.shape[-2]:
            raise ValueError(f"the encoding gives {n} token rotations: expected "
                             f"{qk.shape[-2] - num_prefix_tokens} (grid {tuple(shape)} + {num_prefix_tokens} "
                             "prefix tokens)")
        return apply_factors(qk, f, num_prefix_tokens, pe.layout)
    R = rotations_for(pe, shape, mask, num_prefix_tokens, qk.device)  # (B|1, H|1, P+N, nb, b, b)
    if R.shape[2] != qk.shape[-2]:
        raise ValueError(f"the encoding gives {R.shape[2] - num_prefix_tokens} token rotations: expected "
                         f"{qk.shape[-2] - num_prefix_tokens} (grid {tuple(shape)} + {num_prefix_tokens} prefix tokens)")
    return apply_blocks(qk, R, pe.layout)


def rotate_at(pe, x: torch.Tensor, coords: torch.Tensor, extent: torch.Tensor | None, *,
              method: str = "auto") -> torch.Tensor:
    """``x`` (B, H, L, d) rotated at continuous unit (y, x) ``coords`` (B|1, L, 2) (``pe.at``): the
    queries of a cross-attention whose keys are rotated on their grid by ``rotate_qk`` (the same
    ``method``, the same factored form).  # x.shape"""
    _checks.choice("method", method, METHODS)
    f = pe.factors_at(coords, extent) if method == "auto" and hasattr(pe, "factors_at") else None
    if f is not None:
        return apply_factors(x, f, 0, pe.layout)
    return apply_blocks(x, pe.at(coords, extent), pe.layout)


def block_rotation_matrix(R: torch.Tensor, layout: str) -> torch.Tensor:
    """The full (d, d) matrix of block rotations ``R`` (..., nb, b, b), channels per ``layout``
    (for tests and conversions).  # (..., d, d)"""
    nb, b = R.shape[-3], R.shape[-1]
    d = nb * b
    chan = lie.block_channels(d, b, layout).to(R.device)  # (nb, b)
    full = R.new_zeros(*R.shape[:-3], d, d)
    rows = chan[:, :, None].expand(nb, b, b).reshape(-1)
    cols = chan[:, None, :].expand(nb, b, b).reshape(-1)
    full[..., rows, cols] = R.reshape(*R.shape[:-3], -1)
    return full
