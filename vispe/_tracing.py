"""Shape arithmetic that stays symbolic under torch.export / torch.compile (private).

A grid (h, w) is a pair of Python ints in eager mode and a pair of ``torch.SymInt`` while
``torch.export`` (and so ``torch.onnx.export(..., dynamo=True)``) or ``torch.compile`` records the
model with dynamic sizes. A Python ``if`` on a SymInt (``h == grid_h``, ``h < grid_h``) makes the
recorder guard on it: the exported graph is then valid for one branch only, or export fails. The
helpers here give the same result as the eager branches without specialising:

* ``known(cond)`` / ``known_false(cond)``: True only when ``cond`` holds / fails for every size (a
  plain bool is itself);
* ``check(cond, msg)``: a ValueError now when ``cond`` is a False bool, a runtime assertion when
  it is symbolic (``torch._check``);
* ``resize(x, size, ...)``: ``F.interpolate`` by target size with vispe's "antialias only when
  shrinking" rule; the same size returns ``x`` itself in eager mode, and when tracing both
  branches are recorded and selected by a tensor predicate (so the graph is right at any size).

``torch.jit.trace`` records sizes as constants: ``refuse_jit_trace`` raises a clear error instead
of returning a trace that is silently wrong at every other size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental import symbolic_shapes
from torch.fx.experimental.symbolic_shapes import statically_known_true

#: torch < 2.6 has no statically_known_false (there, negating a plain bool with sym_not breaks a compiled graph)
_known_false = getattr(symbolic_shapes, "statically_known_false", None) or \
    (lambda cond: statically_known_true(torch.sym_not(cond)))


def is_exporting() -> bool:
    """True while torch.export (incl. the dynamo ONNX exporter) records."""
    return getattr(torch.compiler, "is_exporting", lambda: False)()  # torch >= 2.7


def is_tracing() -> bool:
    """True while torch.compile, torch.export (incl. the dynamo ONNX exporter) or jit.trace records."""
    return torch.compiler.is_compiling() or is_exporting() or torch.jit.is_tracing()


def known(cond) -> bool:
    """``cond`` (bool or SymBool) holds for every value of its sizes; never adds a guard.

    One call for both kinds: under torch.compile an ``isinstance(cond, bool)`` test of a SymBool
    is answered as dynamo sees it, and the ``bool(cond)`` branch then guarded on the size (a
    recompile at every new size); ``statically_known_true`` returns a plain bool as it is.
    """
    return statically_known_true(cond)


def known_false(cond) -> bool:
    """``cond`` (bool or SymBool) fails for every value of its sizes; never adds a guard (nor, under
    torch.compile, a graph break: ``torch.sym_not`` of a plain bool would make one)."""
    return _known_false(cond)


def check(cond, msg: str) -> None:
    """ValueError(msg) when ``cond`` is False; when symbolic and undecided, a runtime assertion."""
    if known_false(cond):
        raise ValueError(msg)
    if not known(cond):
        torch._check(cond, lambda: msg)


def refuse_jit_trace(what: str = "this encoding") -> None:
    """Raise under ``torch.jit.trace``, which would bake the grid size into the trace as constants."""
    if torch.jit.is_tracing():
        raise NotImplementedError(
            f"torch.jit.trace of {what}: the trace would record the grid size (h, w) as constants and be "
            "silently wrong at any other image size, so vispe refuses it. Use torch.export or "
            "vispe.export.export_onnx (dynamic batch, height and width) instead; TorchScript is not supported.")


def refuse_script(what: str) -> None:
    """``__prepare_scriptable__`` of vispe modules: TorchScript is not supported, say so clearly."""
    raise NotImplementedError(
        f"torch.jit.script of {what}: TorchScript is not supported (vispe computes positions from the "
        "grid size in Python). Use torch.export or vispe.export.export_onnx (dynamic batch, height and width).")


def _scalar(n) -> torch.Tensor:
    return torch.scalar_tensor(n, dtype=torch.long)


def resize(x: torch.Tensor, size: tuple, *, mode: str, antialias="shrink",
           align_corners: bool | None = None) -> torch.Tensor:
    """``F.interpolate(x (N, C, H, W), size)`` by target size.  # (N, C, *size)

    ``antialias``: True / False as torch, or "shrink" = antialias iff an axis gets shorter
    (vispe's rule for learned tables). The same size returns ``x`` itself (eager) or its exact
    resampling at the same size (tracing: the identity for every interpolation mode here).
    """
    old = tuple(x.shape[-2:])
    size = tuple(size)
    if known(old[0] == size[0]) and known(old[1] == size[1]):
        return x
    if mode != "nearest" and x.requires_grad and torch.is_grad_enabled() and _compiling_symbolic(old, size):
        return _eager_resize(x, size, mode=mode, antialias=antialias, align_corners=align_corners)
    kw = {} if mode == "nearest" else {"align_corners": align_corners}
    if antialias != "shrink":
        return F.interpolate(x, size=size, mode=mode, antialias=bool(antialias) and mode != "nearest", **kw)
    shrink = (size[0] < old[0]) | (size[1] < old[1])  # bool or SymBool
    if known(shrink) or known_false(shrink):
        return F.interpolate(x, size=size, mode=mode, antialias=known(shrink) and mode != "nearest", **kw)
    # undecided while tracing: record both and pick at run time with a tensor predicate
    plain = F.interpolate(x, size=size, mode=mode, antialias=False, **kw)
    aa = F.interpolate(x, size=size, mode=mode, antialias=mode != "nearest", **kw)
    pred = (_scalar(size[0]) < _scalar(old[0])) | (_scalar(size[1]) < _scalar(old[1]))
    return torch.where(pred.to(x.device), aa, plain)


def _compiling_symbolic(*shapes) -> bool:
    """torch.compile (not torch.export) records with a symbolic size among ``shapes``."""
    if not torch.compiler.is_compiling() or is_exporting():
        return False
    static = getattr(symbolic_shapes, "has_static_value", None)  # dynamo answers it; isinstance it does not
    return any(not static(n) if static else isinstance(n, torch.SymInt) for shape in shapes for n in shape)


@torch.compiler.disable
def _eager_resize(x: torch.Tensor, size: tuple, **kw) -> torch.Tensor:
    """``resize`` run outside a compiled graph (sizes are ints here). Under torch.compile with symbolic
    sizes the backward of bicubic interpolation (antialiased or not) has no working meta function
    (torch 2.14: ``isIntList() INTERNAL ASSERT FAILED`` in ``_upsample_bicubic2d_aa_backward``), so
    a learned table that is resized while it trains (learned_abs, relbias) is resized eagerly: a
    graph break, and no recompile at a new size."""
    return resize(x, tuple(int(n) for n in size), **kw)
