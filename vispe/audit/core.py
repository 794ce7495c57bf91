"""``audit(model)``: the probes in order, their findings named against vispe's conventions.

1. sizes: native, non-square, odd, larger, smaller (``sizes`` replaces them); each runs or is refused;
2. where position enters (``tables``: the first block's input on a constant image; ``rotary``: the
   first attention's q / k and logits mask with identical input tokens; windows from the attention
   calls' shapes), at the native grid and at the non-square one;
3. the rules at another size (a table's resampling, RoPE's coordinates), the shift test;
4. behaviour: windows as rectangles, alone = padded (when the model takes a mask), the position
   modules under ``dtype`` autocast (bf16 by default).
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from vispe.audit import behaviour, tables
from vispe.audit._run import Attn, Call, Target, error_line, preserved
from vispe.audit.report import Defect, Entry, Finding, Report

Grid = tuple[int, int]


def default_grids(g: tuple[int, int]) -> dict[str, tuple[int, int]]:
    """Grids (patches) probed around the native one ``g``."""
    gh, gw = g
    odd = (gh + 1 if gh % 2 == 0 else gh + 2, gw + 1 if gw % 2 == 0 else gw + 2)
    nonsq = (gh, gw + 2 * max(1, gw // 4)) if gh == gw else (gw, gh)  # 8x8 -> 8x12, 14x14 -> 14x20
    return {"native": g, "non-square": nonsq, "odd": odd,
            "larger": (gh + 2 * max(1, gh // 8), gw + 2 * max(1, gw // 8)),  # 8x8 -> 10x10, 16x16 -> 20x20
            "smaller": (max(2, gh - 2 * max(1, gh // 4)), max(2, gw - 2 * max(1, gw // 4)))}


def _kind(g: tuple[int, int], native: tuple[int, int]) -> str:
    if g == native:
        return "native"
    if g[0] != g[1]:
        return "non-square"
    if g[0] % 2:
        return "odd"
    return "larger" if g[0] * g[1] > native[0] * native[1] else "smaller"


def _block_of(name: str) -> str:
    """The nearest ancestor that is an item of a list ("blocks.0.attn" -> "blocks.0")."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i].isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1])


def _size_fix(model: nn.Module, family: str) -> str:
    kind = type(model).__name__
    if kind in ("VisionTransformer", "Eva", "VisionTransformerDistilled"):
        return ("vispe.models.vit.convert_vit(model) (any size), or timm.create_model(name, dynamic_img_size=True)")
    if "rotary" in family:
        return "compute the angles at the input's grid: vispe.build('rope_axial', head_dim=..., num_heads=...)"
    if "additive" in family:
        return "resample the table by target size: vispe.build('learned_abs', dim=..., grid=(h, w))"
    return "compute position at the input's grid (a vispe encoding: vispe.build(name, ...), any (h, w))"


def audit(model: nn.Module, sizes: Sequence[tuple[int, int]] | None = None, dtype: torch.dtype | None = None, *,
          call: Call | None = None, patch: tuple[int, int] | None = None, native: tuple[int, int] | None = None,
          name: str | None = None) -> Report:
    """Probe ``model`` (any image model) and report how it encodes position and where that breaks.

    ``sizes``: (H, W) pixel sizes to run at (default: native, non-square, odd, larger, smaller);
    ``dtype``: the autocast dtype of the numerics probe (default bfloat16); ``call(model, images,
    mask)``: how to feed it (default: ``vispe.audit._run.default_call``); ``patch`` and ``native``:
    its patch and native sizes in pixels when they cannot be read from it. Weights and train/eval
    modes are left as they were.
    """
    start = time.perf_counter()
    dtype = torch.bfloat16 if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r}: expected a floating torch.dtype such as torch.bfloat16")
    t = Target(model, call=call, patch=patch, native=native)
    rep = Report(name or type(model).__name__, t.native, t.patch)
    grids = default_grids(t.native_grid)
    if sizes is not None:
        grids = {}
        for s in sizes:
            if not (isinstance(s, (tuple, list)) and len(s) == 2 and all(isinstance(v, int) and v > 0 for v in s)):
                raise ValueError(f"sizes={sizes!r}: expected (H, W) pairs of positive ints")
            g = (s[0] // t.patch[0], s[1] // t.patch[1])
            grids.setdefault(_kind(g, t.native_grid) if g not in grids.values() else f"{g}", g)
        grids = {"native": t.native_grid, **{k: v for k, v in grids.items() if v != t.native_grid}}
    with preserved(model):
        _probe(t, rep, grids, dtype)
    rep.seconds = time.perf_counter() - start
    return rep


def _probe(t: Target, rep: Report, grids: dict[str, tuple[int, int]], dtype: torch.dtype) -> None:
    runs, refused = {}, []
    for kind, g in grids.items():
        rec = t.record(t.images(g))
        H, W = t.pixels(g)
        if rec.error is None:
            runs[kind] = rec
            rep.findings.append(Finding("sizes", f"runs at {kind} {H}x{W} px ({g[0]}x{g[1]} patches)"))
        else:
            refused.append(f"{kind} {H}x{W}: {error_line(rec.error)}")
            rep.findings.append(Finding("sizes", f"refuses {kind} {H}x{W} px", error_line(rec.error)))
    if "native" not in runs:
        rep.defects.append(Defect("sizes", "does not run at its native size", refused[0], "check the call and sizes"))
        return
    g0 = grids["native"]
    g1 = grids.get("non-square") if "non-square" in runs else None
    attn0 = runs["native"].attn
    if not attn0:
        rep.findings.append(Finding("position", "no scaled_dot_product_attention call seen: attention probes skipped"))
    _structure(t, rep, g0, g1, attn0)
    if refused:
        rep.defects.append(Defect("sizes", f"runs at {g0[0] * t.patch[0]}x{g0[1] * t.patch[1]} px but refuses "
                                  f"{len(refused)} of {len(grids) - 1} other sizes", "; ".join(refused),
                                  _size_fix(t.model, rep.family)))
    _windows(t, rep, g1 or g0, runs["non-square" if g1 else "native"].attn)
    if t.takes_mask and attn0:
        canvas = next((grids[k] for k in ("larger", "non-square") if k in runs), None)
        _padding(t, rep, g0, canvas)
    _numerics(t, rep, g0, dtype)


def _structure(t: Target, rep: Report, g0: Grid, g1: Grid | None, attn0: list[Attn]) -> None:
    names = list(dict.fromkeys(a.module for a in attn0 if a.module))
    blocks = list(dict.fromkeys(_block_of(n) for n in names))[:2]
    codes: dict[Grid, list[torch.Tensor | None]] = {}
    for g in (g0, g1):
        if g is None or not blocks:
            continue
        stop = next((i + 1 for i, a in enumerate(attn0) if len(blocks) > 1 and _block_of(a.module) == blocks[1]), None)
        rec = t.record(t.images(g, constant=True), hook_inputs=tuple(blocks), hook_outputs=tuple(blocks[:1]), stop_after=stop)
        codes[g] = [tables.grid_code(rec.inputs[blocks[0]], g) if blocks[0] in rec.inputs else None]
        if len(blocks) > 1 and blocks[1] in rec.inputs and blocks[0] in rec.outputs:  # what runs between the blocks
            a, b = rec.inputs[blocks[1]], rec.outputs[blocks[0]]
            codes[g].append(tables.grid_code(a - b, g) if a.shape == b.shape else None)
        if g == g0:
            scale = rec.inputs.get(blocks[0])
    c0 = codes[g0][0] if g0 in codes else None
    if c0 is not None and tables.varies(c0, scale):
        e = Entry(f"before {blocks[0]}", "additive", [f"channels: {tables.axis_channels(c0)}"])
        c1 = codes[g1][0] if g1 is not None and g1 in codes else None
        if g1 is not None and c1 is not None:
            rule, errs = tables.resample_rule(c0, c1)
            ev = ", ".join(f"{k} {v:.3g}" for k, v in errs.items())
            e.details.append(f"at {g1[0]}x{g1[1]} patches: {tables.RULES[rule]} (relative errors: {ev})")
            if rule in ("swapped", "size_swapped", "unchanged"):
                rep.defects.append(Defect("table", f"the additive code at the non-square grid {g1[0]}x{g1[1]} is "
                                          f"{tables.RULES[rule]}", ev,
                                          "resample by target size (h, w) in that order: vispe.build('learned_abs', "
                                          "dim=..., grid=(h, w)), or vispe.models.vit.convert_vit(model)"))
        rep.entries.append(e)
    elif g0 in codes and len(codes[g0]) > 1 and tables.varies(codes[g0][1], scale):
        rep.entries.append(Entry(f"between {blocks[0]} and {blocks[1]}", "conditional",
                                 ["the tokens of a constant image differ after the first block "
                                  "(a convolution with zero padding: PEG / CPE)"]))
    win = behaviour.first_windowed(attn0, g0)
    if win is not None:
        rep.entries.append(Entry(attn0[win].module, "windowed",
                                 [f"attention call {win}: batch {attn0[win].q.shape[0]} x {attn0[win].q.shape[2]} "
                                  f"tokens for a {g0[0]}x{g0[1]} grid"]))
    from vispe.audit.attention import first_attention

    if attn0 and win != 0:
        first_attention(t, rep, g0, g1, attn0[0].module)
    elif attn0 and int(attn0[0].q.shape[2] ** 0.5) ** 2 == attn0[0].q.shape[2]:  # square windows: probe one
        s = int(attn0[0].q.shape[2] ** 0.5)
        first_attention(t, rep, (s, s), None, attn0[0].module, image_grid=g0)


def _windows(t: Target, rep: Report, g: Grid, attn: list[Attn]) -> None:
    i = behaviour.first_windowed(attn, g)
    if i is None:
        return
    groups = behaviour.window_groups(t, g, i)
    if isinstance(groups, str):
        rep.findings.append(Finding("windows", f"windows at {g[0]}x{g[1]} patches not read: {groups}"))
        return
    bad = [c for c in groups if not behaviour.is_rectangle(c)]
    seen = (min(g[0], behaviour.REGION[0]), min(g[1], behaviour.REGION[1]))
    where = "" if seen == tuple(g) else f" (one-patch changes in the top-left {seen[0]}x{seen[1]} cells)"
    rep.findings.append(Finding("windows", f"{len(groups)} windows at {g[0]}x{g[1]} patches{where}, "
                                f"{len(groups) - len(bad)} of them rectangles of the grid"))
    if bad:
        show = sorted(bad[0])[:8]
        rep.defects.append(Defect("windows", f"{len(bad)} of {len(groups)} attention windows at {g[0]}x{g[1]} patches "
                                  "are not rectangles of the grid", f"window 0 holds cells (y, x) {show}",
                                  "partition (B, h, w, C) as view(B, nh, h // nh, nw, w // nw, C).permute(0, 1, 3, 2, 4, 5):"
                                  " h before w (rf-detr #148)"))


def _padding(t: Target, rep: Report, g: Grid, canvas: Grid | None) -> None:
    if canvas is None:
        return
    d = behaviour.padded_difference(t, g, canvas)
    if isinstance(d, str):
        rep.findings.append(Finding("padding", f"alone vs padded not measured: {d}"))
        return
    text = f"{g[0]}x{g[1]} patches alone vs padded to {canvas[0]}x{canvas[1]}: largest relative difference {d:.2g}"
    rep.findings.append(Finding("padding", text))
    if d > 1e-4:
        rep.defects.append(Defect("padding", "an image padded in a batch (mask given) does not equal it alone", text,
                                  "count positions over each image's valid area and hide padded keys: a mask-aware "
                                  "vispe encoding (vispe.build('sine', dim=...), or mask_aware=True) in vispe's Attention"))


def _numerics(t: Target, rep: Report, g: Grid, dtype: torch.dtype) -> None:
    res = behaviour.dtype_errors(t, g, dtype)
    if isinstance(res, str):
        rep.findings.append(Finding("dtype", f"position numerics under {str(dtype).replace('torch.', '')} not "
                                    f"measured: {res}"))
        return
    for name, (err, rnd) in res.items():
        low = err > 2 * rnd + 1e-3
        rep.findings.append(Finding("dtype", f"{name} under {str(dtype).replace('torch.', '')} autocast: "
                                    f"{'computed in low precision' if low else 'float32 math, cast at the end'}",
                                    f"largest error {err:.3g}, rounding alone {rnd:.3g}"))
        if low:
            rep.defects.append(Defect("dtype", f"{name} ({type(t.modules[name]).__name__}) computes position in "
                                      f"{str(dtype).replace('torch.', '')} under autocast",
                                      f"largest error {err:.3g} against float32; rounding float32's result costs {rnd:.3g}",
                                      "compute the code in float32 and cast at the end (vispe's encodings do: "
                                      "vispe.build('sine', dim=...))"))
