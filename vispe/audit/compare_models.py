"""``vispe.audit.compare(a, b)``: where two models' position handling differs.

Each model runs once on the same image; the position code it hands to its first attention (a
keyword argument named like ``pos`` / ``position_embeddings`` of any module: DETR-style encoders,
RT-DETR's AIFI) is read, or else the additive code at its first block's input (a constant image,
``vispe.audit.tables``). The two codes are compared on the same grid: their largest difference, and
which convention explains it: y and x in the other channel half, tokens in column-major order
(x-major flattening), or both (transformers' RT-DETR against OmDet-Turbo's sin-cos: equal on square
grids, up to 2.0 apart on 15x20).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from vispe.audit import tables
from vispe.audit._run import Call, Target, preserved


@dataclass
class Comparison:
    a: str
    b: str
    grid: tuple[int, int] | None  # (h, w) of the codes compared
    where: tuple[str, str] = ("", "")  # where each code was read
    max_abs: float = float("nan")  # largest |a - b| over the grid
    relation: str = ""  # the convention that makes b equal a, or "none found"
    differences: list[str] = field(default_factory=list)

    def text(self) -> str:
        head = f"{self.a} vs {self.b}"
        if self.grid is None:
            return "\n".join([head, *self.differences])
        h, w = self.grid
        return "\n".join([f"{head} at {h}x{w}: position codes up to {self.max_abs:.3g} apart",
                          f"  read at: {self.where[0]} / {self.where[1]}", f"  b equals a with: {self.relation}",
                          *(f"  {d}" for d in self.differences)])

    def __str__(self) -> str:
        return self.text()


def _grid(n: int, size: tuple[int, int]) -> tuple[int, int]:
    """The (h, w) with h * w = n closest to the image's aspect."""
    best = min(((h, n // h) for h in range(1, n + 1) if n % h == 0),
               key=lambda g: abs(g[0] / g[1] - size[0] / size[1]))
    return best


def position_code(t: Target, size: tuple[int, int]) -> tuple[str, torch.Tensor | None]:
    """(where, tokens (1, N, C)) of the first position code the model hands to a module, else the
    grid tokens of the first block's input on a constant image, minus their mean."""
    H, W = size
    img = torch.zeros(1, t.channels, H, W, device=t.device, dtype=t.dtype)  # (1, 3, H, W)
    with preserved(t.model):
        rec = t.record(img, pos_inputs=True)
        if rec.pos_inputs:
            name, key, code = rec.pos_inputs[0]
            return f"{name}({key}=...)", code.reshape(1, -1, code.shape[-1])
        if rec.attn and rec.attn[0].module:
            from vispe.audit.core import _block_of

            block = _block_of(rec.attn[0].module)
            rec = t.record(img, hook_inputs=(block,), stop_after=1)
            g = (H // t.patch[0], W // t.patch[1])
            gc = tables.grid_code(rec.inputs[block], g) if block in rec.inputs else None
            if gc is not None:  # grid tokens minus their mean (the patch embedding's bias is content)
                return f"input of {block} (minus its mean)", gc.reshape(1, g[0] * g[1], -1)
    return "", None


def _relation(a: torch.Tensor, b: torch.Tensor, grid: tuple[int, int]) -> str:
    h, w = grid
    C = a.shape[-1]
    scale = float(a.abs().max()) or 1.0

    def halves(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[..., C // 2:], x[..., : C // 2]], dim=-1)

    def col_major(x: torch.Tensor) -> torch.Tensor:  # tokens flattened x-major, read back as the row-major grid
        return x.reshape(w, h, C).transpose(0, 1).reshape(h * w, C)

    tries = {"nothing (equal)": b, "y and x in the other channel half": halves(b),
             "tokens in column-major (x-major) order": col_major(b),
             "the other channel half and column-major tokens": halves(col_major(b))}
    for name, x in tries.items():
        if float((x - a).abs().max()) <= 1e-4 * scale:
            return name
    return "none found"


def compare(a: nn.Module, b: nn.Module, *, size: tuple[int, int] | None = None, call: Call | None = None,
            call_b: Call | None = None) -> Comparison:
    """Compare the position codes of ``a`` and ``b`` on one image of ``size`` (H, W) pixels (default:
    ``a``'s native size). ``call`` / ``call_b``: how to feed each (``vispe.audit._run.default_call``)."""
    ta, tb = Target(a, call=call), Target(b, call=call_b or call)
    size = size or ta.native
    if not (isinstance(size, tuple) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size)):
        raise ValueError(f"size={size!r}: expected (H, W) positive ints")
    (wa, ca), (wb, cb) = position_code(ta, size), position_code(tb, size)
    out = Comparison(type(a).__name__, type(b).__name__, None, (wa, wb))
    if ca is None or cb is None:
        out.differences.append(f"no position code read from {out.a if ca is None else out.b}")
        return out
    if ca.shape[-2:] != cb.shape[-2:]:
        out.differences.append(f"codes of shapes {tuple(ca.shape)} and {tuple(cb.shape)}: not comparable")
        return out
    grid = _grid(ca.shape[-2], size)
    A, B = ca[0].double(), cb[0].double()  # (N, C)
    out.grid, out.max_abs = grid, float((A - B).abs().max())
    out.relation = _relation(A, B, grid)
    if out.relation not in ("nothing (equal)", "none found"):
        out.differences.append(f"layout: {out.relation}")
    for name, code in ((out.a, A), (out.b, B)):
        g = tables.grid_code(code[None], grid)
        if g is not None:
            out.differences.append(f"{name} channels: {tables.axis_channels(g)}")
    return out
