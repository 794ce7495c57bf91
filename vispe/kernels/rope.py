"""Fast RoPE for attention: cos/sin tables built once, q and k rotated together by one function.

``vispe.axis.rope.apply_rope`` is the readable reference (cos/sin recomputed at every call, a new
tensor per half, a ``cat``); this module is what the attention layer runs by default:

* ``rope_tables(angles, num_prefix_tokens)`` turns angles ``(B|1, H|1, N, d/2)`` into float32
  ``cos``, ``sin`` of shape ``(B|1, H|1, P+N, d/2)`` (prefix tokens unrotated: cos 1, sin 0).
  ``tables_for(pe, ctx, ...)`` builds them once per grid: an encoding whose angles are fixed
  (``pe.fixed_key()`` not None) keeps them in its table cache across forward passes, and one
  forward pass shares them between layers through ``PosContext.memo`` (padding masks included).
* ``rotate(x, cos, sin, layout, angles)`` rotates ``x`` (..., P+N, d), e.g. q and k stacked as
  one ``(2, B, H, L, d)`` view of the qkv projection, with four in-place kernels into one output
  (no temporaries, no cat/stack, no dtype round trip when ``x`` is float32). Its backward is the
  inverse rotation (nothing saved but the tables); when ``angles`` needs a gradient (RoPE-Mixed),
  ``d out1/d angle = -out2`` and ``d out2/d angle = out1`` give it from the saved output.
* ``rotate_at(pe, x, coords, extent)`` rotates tokens that are not grid cells (a detector's queries at
  their anchors, ``pe.at``) by the same kernels, so that both sides of a rotary cross-attention go
  through one path and one ``impl``.
* ``impl="compiled"`` runs the same math through ``torch.compile`` (one fused loop per pass).
* While ``torch.compile`` or ``torch.export`` records the model (``vispe._tracing.is_tracing``),
  ``rotate`` is the plain out-of-place expression differentiated by autograd: the compiler fuses
  it, and the in-place kernels above break Inductor at symbolic sizes.

Block rotations (the rotary contract's second form, ``pe.block_size > 2``: LieRE, ComRoPE,
STRING) enter through the same ``rotate_qk`` and are applied by ``vispe.kernels.rope_blocks``.

Pairing (``layout``) as ``apply_rope``: "half" pairs channel i with i + d/2, "interleaved" pairs
2i with 2i + 1; pair (x1, x2) at angle a becomes (x1 cos a - x2 sin a, x2 cos a + x1 sin a).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vispe import _checks, _tracing
from vispe.axis.rope import LAYOUTS

ROPE_IMPLS = ("auto", "reference", "fused", "compiled")


def rope_tables(angles: torch.Tensor, num_prefix_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``angles`` (B|1, H|1, N, d/2), prefix rows prepended (cos 1, sin 0).

    Float32 (float64 for float64 angles).  # (B|1, H|1, P+N, d/2) each
    """
    wd = torch.float64 if angles.dtype == torch.float64 else torch.float32
    a = F.pad(angles.to(wd), (0, 0, num_prefix_tokens, 0)) if num_prefix_tokens else angles.to(wd)
    return a.cos(), a.sin()


def tables_for(pe, shape: tuple[int, int], mask: torch.Tensor | None, num_prefix_tokens: int,
               device: torch.device, memo: dict | None = None):
    """``(cos, sin, angles)`` of rotary encoding ``pe`` for P prefix + ``shape`` grid tokens.

    ``angles`` (prefix rows at 0) is returned only when it needs a gradient (learned angles), else
    None. Fixed angles (``pe.fixed_key()`` is not None) are computed once: ``memo`` (``PosContext.memo``,
    one per forward pass) shares them between the layers (a packed batch's many grid sizes would evict
    each other from ``pe``'s small cache), and without a mask they also stay in ``pe``'s table cache
    across forward passes.  # (B|1, H|1, P+N, d/2) each
    """
    key = pe.fixed_key() if hasattr(pe, "fixed_key") else None
    P = num_prefix_tokens

    def build():
        return rope_tables(pe(shape, mask, device=device), P)

    if key is not None and not torch.compiler.is_compiling():
        full = ("rope_tables", key, tuple(shape), P, device)
        if memo is not None and full in memo:  # this forward pass's tables: every layer, every grid size
            return (*memo[full], None)
        tables = pe.cached(full, build) if mask is None else build()
        if memo is not None:
            memo[full] = tables
        return (*tables, None)
    angles = pe(shape, mask, device=device)  # (B|1, H|1, N, d/2) float32
    if not (angles.requires_grad and torch.is_grad_enabled()):
        return (*rope_tables(angles, P), None)
    angles = F.pad(angles, (0, 0, P, 0)) if P else angles  # prefix tokens: angle 0
    cos, sin = rope_tables(angles.detach())
    return cos, sin, angles


def _halves(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two members of every channel pair, as views.  # (..., d/2) each"""
    if layout == "half":
        return t.chunk(2, dim=-1)
    return t[..., 0::2], t[..., 1::2]


def _rotate_into(out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 layout: str, sign: float) -> torch.Tensor:
    """out = R(sign * angle) x, written pair by pair into ``out`` (same shape as x, compute dtype)."""
    x1, x2 = _halves(x, layout)
    o1, o2 = _halves(out, layout)
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-sign)  # x1 cos - x2 sin
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin, value=sign)  # x2 cos + x1 sin
    return out


def _rotate_math(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, sign: float) -> torch.Tensor:
    """The same rotation as one out-of-place expression (what ``torch.compile`` fuses)."""
    x1, x2 = _halves(x, layout)
    o1, o2 = x1 * cos - sign * x2 * sin, x2 * cos + sign * x1 * sin
    if layout == "half":
        return torch.cat([o1, o2], dim=-1)
    return torch.stack([o1, o2], dim=-1).flatten(-2)


_compiled_math = None


def _compiled():
    global _compiled_math
    if _compiled_math is None:
        _compiled_math = torch.compile(_rotate_math, dynamic=False, fullgraph=True)
    return _compiled_math


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum ``t`` over the dimensions that broadcasting added or expanded to reach it from ``shape``."""
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


class _Rotate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, angles, layout, compiled):
        wd = cos.dtype
        xw = x.to(wd)
        shape = torch.broadcast_shapes(x.shape[:-1], cos.shape[:-1]) + x.shape[-1:]
        if compiled:
            out = _compiled()(xw, cos, sin, layout, 1.0)
        else:
            out = _rotate_into(torch.empty(shape, dtype=wd, device=x.device), xw, cos, sin, layout, 1.0)
        out = out.to(x.dtype)
        ctx.layout, ctx.compiled, ctx.x_dtype, ctx.x_shape = layout, compiled, x.dtype, x.shape
        ctx.angles_shape = angles.shape if angles is not None else None
        ctx.save_for_backward(cos, sin, out if ctx.needs_input_grad[3] else None)
        return out

    @staticmethod
    def backward(ctx, g):
        cos, sin, out = ctx.saved_tensors
        layout, wd = ctx.layout, cos.dtype
        gw = g.to(wd)
        gx = ga = None
        if ctx.needs_input_grad[0]:  # the inverse rotation R(-angle) g
            if ctx.compiled:
                gx = _compiled()(gw, cos, sin, layout, -1.0)
            else:
                gx = _rotate_into(torch.empty(g.shape, dtype=wd, device=g.device), gw, cos, sin, layout, -1.0)
            gx = _sum_to(gx, ctx.x_shape).to(ctx.x_dtype)
        if ctx.needs_input_grad[3]:  # d/da: g1 * (-out2) + g2 * out1, summed over broadcast dims
            g1, g2 = _halves(gw, layout)
            o1, o2 = _halves(out.to(wd), layout)
            ga = _sum_to(torch.mul(g2, o1).addcmul_(g1, o2, value=-1.0), ctx.angles_shape)  # one temporary
        return gx, None, None, ga, None, None


def rotate_qk(pe, qk: torch.Tensor, shape: tuple[int, int], mask: torch.Tensor | None = None,
              num_prefix_tokens: int = 0, *, memo: dict | None = None, impl: str = "auto") -> torch.Tensor:
    """q and k stacked, ``qk`` (2, B, H, P+N, d) (or any (..., P+N, d)), rotated by encoding ``pe``.

    ``impl``: "auto" / "fused" (``tables_for`` + ``rotate``), "compiled", or "reference"
    (``apply_rope`` of freshly computed angles, the readable definition). An encoding that returns
    block rotations (``pe.block_size > 2``, ``vispe.encoding``) is applied by
    ``vispe.kernels.rope_blocks.rotate_qk`` whatever ``impl`` says (one kernel for that form).
    """
    _checks.choice("impl", impl, ROPE_IMPLS)
    if getattr(pe, "block_size", 2) > 2:  # block rotations, the contract's second form: one kernel for them
        from vispe.kernels import rope_blocks  # (impl chooses among the angle kernels above)

        return rope_blocks.rotate_qk(pe, qk, shape, mask, num_prefix_tokens)
    L = qk.shape[-2]
    if impl == "reference":
        from vispe.axis.rope import apply_rope

        angles = pe(shape, mask, device=qk.device)  # (B|1, H|1, N, d/2)
        angles = F.pad(angles, (0, 0, num_prefix_tokens, 0)) if num_prefix_tokens else angles
        _check_len(angles, L, shape, num_prefix_tokens)
        return apply_rope(qk, angles, pe.layout)
    cos, sin, angles = tables_for(pe, shape, mask, num_prefix_tokens, qk.device, memo)
    _check_len(cos, L, shape, num_prefix_tokens)
    return rotate(qk, cos, sin, pe.layout, angles=angles, impl="compiled" if impl == "compiled" else "fused")


def rotate_at(pe, x: torch.Tensor, coords: torch.Tensor, extent: torch.Tensor | None = None, *,
              impl: str = "auto") -> torch.Tensor:
    """``x`` (B, H, L, d) rotated by encoding ``pe`` at continuous unit (y, x) ``coords`` (B|1, L, 2)
    (``pe.at(coords, extent)``, ``extent`` (B|1, 2) valid cells): the queries of a rotary
    cross-attention, by the kernels and ``impl`` of ``rotate_qk`` (gradients reach learned angles and
    coordinates that need them)."""
    _checks.choice("impl", impl, ROPE_IMPLS)
    if getattr(pe, "block_size", 2) > 2:  # block rotations, the contract's second form (vispe.kernels.rope_blocks)
        from vispe.kernels import rope_blocks

        return rope_blocks.rotate_at(pe, x, coords, extent)
    angles = pe.at(coords, extent)  # (B|1, H|1, L, d/2) float32
    if angles.shape[-2] != x.shape[-2]:
        raise ValueError(f"the encoding gives {angles.shape[-2]} angles at coords {tuple(coords.shape)}: expected "
                         f"{x.shape[-2]}, one per token of x")
    if impl == "reference":
        from vispe.axis.rope import apply_rope

        return apply_rope(x, angles, pe.layout)
    learn = angles.requires_grad and torch.is_grad_enabled()
    cos, sin = rope_tables(angles.detach())
    return rotate(x, cos, sin, pe.layout, angles=angles if learn else None,
                  impl="compiled" if impl == "compiled" else "fused")


def _check_len(t: torch.Tensor, L: int, shape, P: int) -> None:
    if t.shape[-2] != L:
        raise ValueError(f"the encoding gives {t.shape[-2] - P} token angles: expected {L - P} "
                         f"(grid {tuple(shape)} + {P} prefix tokens)")


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half", *,
           angles: torch.Tensor | None = None, impl: str = "fused") -> torch.Tensor:
    """Rotate ``x`` (..., L, d) by the tables ``cos``, ``sin`` (broadcastable to (..., L, d/2)).

    ``cos`` and ``sin`` are treated as constants; pass the ``angles`` they were computed from
    (the same shape, before ``rope_tables``' prefix rows are added: pass padded angles then) when
    the angles need a gradient. Returns ``x``'s dtype; the math runs in ``cos``'s dtype.
    ``impl``: "fused" (in-place kernels) or "compiled" (``torch.compile``, one fused loop).
    """
    _checks.choice("layout", layout, LAYOUTS)
    _checks.choice("impl", impl, ("fused", "compiled"))
    d = x.shape[-1]
    if cos.shape != sin.shape or cos.shape[-1] * 2 != d:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)}: expected one shape ending in "
                         f"x.shape[-1] / 2 = {d // 2}")
    if angles is not None and angles.shape != cos.shape:
        raise ValueError(f"angles has shape {tuple(angles.shape)}: expected the tables' {tuple(cos.shape)}")
    need = angles if angles is not None and angles.requires_grad and torch.is_grad_enabled() else None
    if _tracing.is_tracing():  # torch.compile / torch.export: plain autograd, no custom Function
        return _traced(x, cos, sin, need, layout)
    return _Rotate.apply(x, cos.detach(), sin.detach(), need, layout, impl == "compiled")


def _traced(x, cos, sin, angles, layout):
    """``rotate`` while torch.compile or torch.export records: the out-of-place math, differentiated
    by autograd (through ``angles`` when they learn). ``_rotate_into``'s ``out=`` kernels writing
    into views of one ``empty`` buffer fail in Inductor once sizes are symbolic (at a second image
    size, or with ``dynamic=True``: ``InductorError: mul expected 2 arguments, got 3``, torch 2.14,
    even without the autograd Function); the compiler fuses this expression into one loop anyway."""
    if angles is None:
        return _rotate_math(x.to(cos.dtype), cos.detach(), sin.detach(), layout, 1.0).to(x.dtype)
    cos, sin = rope_tables(angles)
    # learned angles: autograd saves both halves of x for their gradient. As views of the qkv
    # projection their strides are symbolic expressions Inductor lays out otherwise, and AOT autograd
    # then compiles the backward for the first size's strides (torch 2.14: a stride assertion fails
    # at the next size, with dynamic=True); contiguous copies have the layout Inductor gives them.
    x1, x2 = (t.contiguous() for t in _halves(x.to(cos.dtype), layout))
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out = torch.cat([o1, o2], dim=-1) if layout == "half" else torch.stack([o1, o2], dim=-1).flatten(-2)
    return out.to(x.dtype)
