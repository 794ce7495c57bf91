"""The first attention layer with identical input tokens: rotary, additive at attention, or bias.

Its input is replaced (a forward pre-hook) by one token repeated, twice with two contents; what then
differs between tokens at ``scaled_dot_product_attention`` is position (``vispe.audit.rotary``). Read
at the native grid and, where the model runs there, at the non-square one (RoPE's coordinates: the
same step per patch at both = integer; a step times the grid size constant = normalised).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vispe.audit import rotary
from vispe.audit._run import Target
from vispe.audit.report import Defect, Entry, Report

Grid = tuple[int, int]


def _same(which: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def f(x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 3:
            return x
        flat = x.flatten(1, -2)  # (B, L, C): tokens, or a (B, h, w, C) window's cells
        v = flat.mean(dim=1, keepdim=True) if which == 0 else flat[:, :1] * 0.5 + 0.1  # (B, 1, C)
        return v.expand_as(flat).reshape(x.shape).contiguous()
    return f


def _read(t: Target, g: Grid, module: str, image_grid: Grid | None = None) -> list[Any] | None:
    """(q, k, mask) of the first attention call for each content, grid part, batch 0 (``g``: the
    attention's grid; ``image_grid``: the image's, when the attention sees one window of it)."""
    out = []
    for which in (0, 1):
        rec = t.record(t.images(image_grid or g, seed=5), replace={module: _same(which)}, stop_after=1)
        if rec.error is not None or not rec.attn:
            return None
        a = rec.attn[0]
        P = a.q.shape[2] - g[0] * g[1]
        if P < 0 or a.q.shape[2] != a.k.shape[2]:
            return None
        m = None
        if a.mask is not None and a.mask.is_floating_point():
            m = a.mask.expand(a.q.shape[0], a.q.shape[1], a.q.shape[2], a.k.shape[2])[0, :, P:, P:].double()
        out.append((a.q[0, :, P:].double(), a.k[0, :, P:].double(), m, P))
    return out


def first_attention(t: Target, rep: Report, g0: Grid, g1: Grid | None, module: str,
                    image_grid: Grid | None = None) -> None:
    reads = {g: _read(t, g, module, image_grid) for g in (g0, g1) if g is not None}
    r0 = reads.get(g0)
    if r0 is None:
        return
    (q1, k1, m1, P), (q2, _, _, _) = r0
    kind = rotary.classify(q1, q2)
    heads, _, d = q1.shape
    if m1 is not None and float((m1 - m1[..., :1, :1]).abs().max()) > 1e-6:
        e = Entry(module, "bias", [f"a logits bias ({heads} heads) handed to scaled_dot_product_attention"])
        for g, r in reads.items():
            if r is not None and r[0][2] is not None:
                s = rotary.relative_spread_bias(r[0][2], g)
                e.details.append(f"shift test at {g[0]}x{g[1]}: bias spread at one offset {s:.2g} "
                                 f"({'relative' if s < 1e-4 else 'not relative'})")
        rep.entries.append(e)
    if kind == "none":
        return
    if kind == "additive":
        rep.entries.append(Entry(module, "additive-at-attention",
                                 ["q and k move by a content-independent vector per token (DETR: q = W (x + pos))"]))
        return
    if kind == "other":
        rep.entries.append(Entry(module, "rotary", ["position changes q in a way that is not a rotation"]))
        rep.defects.append(Defect("rotary", f"{module}: position transforms q but keeps neither the pairs' norms "
                                  "(layout 'half' or 'interleaved') nor the head's: the cos/sin table's pairing is "
                                  "not the rotation's", "pair norms change with position for both pairings",
                                  f"rotate q and k with one pairing: vispe.build('rope_axial', head_dim={d}, "
                                  f"num_heads={heads}, layout='half' or 'interleaved') (timm #2692)"))
        return
    e = Entry(module, "rotary", [])
    rep.entries.append(e)
    for g, r in reads.items():
        if r is None:
            continue
        s = rotary.relative_spread(r[0][0], r[0][1], g)
        ok = s < 1e-4
        e.details.append(f"shift test at {g[0]}x{g[1]}: q.k spread at one offset {s:.2g} "
                         f"({'relative' if ok else 'not relative'})")
        if not ok and kind.startswith("rotary-"):
            rep.defects.append(Defect("relative", f"{module}: the rotation is not a function of the offset at "
                                      f"{g[0]}x{g[1]} patches (angles not those of the token's (y, x))",
                                      f"q.k spread {s:.2g} over token pairs at one offset",
                                      "compute the angles at (y, x) of the row-major grid: vispe.build('rope_axial', "
                                      f"head_dim={d}, num_heads={heads})"))
    if kind == "orthogonal":
        e.details.append("orthogonal blocks larger than 2x2 planes (the head's norm is kept; LieRE / STRING / ComRoPE)")
        return
    layout = kind.split("-")[1]
    e.details.append(f"pair layout: {layout}")
    _name(e, reads, layout, g0, g1, d)


def _name(e: Entry, reads: dict[Grid, Any], layout: str, g0: Grid, g1: Grid | None, d: int) -> None:
    rel, ok = rotary.angles(reads[g0][0][0], layout)
    res = rotary.linear_residual(rel, ok, g0)
    if res > 1e-3:
        h, w = g0
        col = rel.reshape(rel.shape[0], w, h, -1).transpose(1, 2).reshape(rel.shape)  # tokens read x-major
        if rotary.linear_residual(col, ok, g0) < 1e-3:
            e.details.append("flatten order: column-major (x-major): the angles are those of (n % h, n // h)")
        else:
            e.details.append(f"angles not linear in (y, x) at {g0[0]}x{g0[1]} (residual {res:.2g} rad)")
        return
    e.details.append("flatten order: row-major (the angles are linear in (y, x) of token n = y * w + x)")
    sy, sx = rotary.steps(rel, g0)
    order = rotary.axial_split(sy, sx, ok)
    if order is None:
        e.details.append("mixed frequencies: pairs turn with both y and x (RoPE-Mixed; vispe rope_mixed)")
        return
    fy = sy[0, : d // 4] if order == "yx" else sy[0, d // 4:]
    normalised = None
    if g1 is not None and reads.get(g1) is not None:
        rel1, ok1 = rotary.angles(reads[g1][0][0], layout)
        _, sx1 = rotary.steps(rel1, g1)
        fx = sx[0, d // 4:] if order == "yx" else sx[0, : d // 4]  # x: the axis whose size differs
        fx1 = sx1[0, d // 4:] if order == "yx" else sx1[0, : d // 4]
        if torch.allclose(fx1, fx, rtol=1e-4, atol=1e-7):
            normalised = False
        elif torch.allclose(fx1 * g1[1], fx * g0[1], rtol=1e-4, atol=1e-7):
            normalised = True
        coords = {False: "integer patch index (the same step per patch at every size)",
                  True: "normalised to the grid (the step per patch scales with 1 / size)",
                  None: "rescaled in another way at another size"}[normalised]
        e.details.append(f"coordinates: {coords}")
    e.details.append(f"axis order: {'y' if order == 'yx' else 'x'} on the first half of the pairs; "
                     f"per-patch steps along y: {', '.join(f'{v:.4g}' for v in fy.abs().tolist()[:6])}")
    for kw in rotary.candidates(fy.abs(), g0, d, layout, order, bool(normalised)):
        err = rotary.equals_vispe(rel, ok, g0, d, kw)
        if err < 1e-3:
            e.details.append(f"equals {rotary.describe(kw)} (largest angle error {err:.1g} rad)")
            return
    e.details.append("no rope_axial setting tried gives these angles")
