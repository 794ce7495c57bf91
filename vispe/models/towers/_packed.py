"""The packed path of the converted towers (private): frames of different sizes run without a canvas.

A packed batch (Qwen's ``grid_thw`` sequence, Pixtral's images of several sizes) is regrouped by
frame size: the frames of one (h, w) form one group, in raster order with no padding, the groups one
after the other in a "virtual canvas" (T, C) with no empty cell. The blocks run once over that whole
sequence (1, T, C), as the originals run theirs over ``cu_seqlens``: every per-token layer (qkv, proj,
norms, MLP) over all T tokens at once, and only attention split by group (``PosContext.segments``, one
``vispe.attention.Segment`` per group: q, k, v viewed as (frames, heads, h*w, hd), SDPA batched over
the group's frames, so each frame attends within itself only, the original's block-diagonal
attention). The encodings see each frame's own grid (the segment's ``PosContext(shape=(h, w))``, no
mask; additive input codes and a PEG between blocks per group), so a frame's output does not depend
on the other frames, and it costs what the frame costs, not what the largest frame costs. A tower
gives, for every packed token, its row in the virtual canvas (``cells``), as on the canvas path
(``_common.to_canvas``), so tokens and positions move together by construction.

Which path runs is the tower's ``path``: ``"canvas"``, ``"packed"``, or ``"auto"`` (the default:
the canvas when every frame has one size, as in an equal-size batch or a fixed-size export, the
packed path otherwise); ``last_path`` says which one the last call took.
"""
from __future__ import annotations

import torch

from vispe.attention import PosContext, Segment

PATHS = ("auto", "packed", "canvas")


def choose_path(path: str, sizes) -> str:
    """``"canvas"`` or ``"packed"`` for frames of ``sizes`` [(h, w), ...] under the setting ``path``."""
    if path not in PATHS:
        raise ValueError(f"path={path!r}: expected one of {PATHS}")
    if path != "auto":
        return path
    return "canvas" if len(set(sizes)) <= 1 else "packed"


def group_frames(sizes: list[tuple[int, int]]) -> tuple[list[tuple[tuple[int, int], int]], list[int]]:
    """Frames grouped by size (first-seen order): the groups [((h, w), frames)], and each frame's
    first row in the virtual canvas (groups one after the other, frames in input order inside)."""
    members: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(sizes):
        members.setdefault(s, []).append(i)
    start, row = [0] * len(sizes), 0
    for (h, w), idx in members.items():
        for i in idx:
            start[i], row = row, row + h * w
    return [(s, len(idx)) for s, idx in members.items()], start


def run_packed(tower, virtual: torch.Tensor, groups, *, prep=None, window=None, keep_states: bool = False):
    """The tower's blocks once over the virtual canvas ``virtual`` (T, C), as the originals run them over
    their packed sequence: ``input_code`` per group (each frame's own grid), ``prep`` (e.g. a pre-norm)
    and every block over all T tokens at once as (1, T, C); only attention is split, per size group
    (``PosContext.segments``: one ``Segment`` per group, its own ``PosContext((h, w))``; ``window(shape)``:
    {block: its ``attn_mask``} inside a frame of that shape, e.g. Qwen2.5-VL's windows as ``TokenGroups``).
    Returns the output (T, C) and, with ``keep_states``, the input and every block's output (each (T, C),
    virtual rows)."""
    xs, codes, segments, masks = [], [], [], []
    row = 0
    parts = virtual.split([frames * h * w for (h, w), frames in groups])  # views; one cat in backward
    for ((h, w), frames), part in zip(groups, parts):
        n = frames * h * w
        x, pos = tower.input_code(part.reshape(frames, h * w, -1), (h, w), None)  # (S_g, h*w, C)
        xs.append(x.reshape(n, -1))
        if pos is not None:
            codes.append(pos.expand(frames, -1, -1).reshape(n, -1))  # (S_g*h*w, C)
        segments.append(Segment(row, frames, PosContext((h, w), 0, None)))
        masks.append(window((h, w)) if window else {})
        row += n
    x = torch.cat(xs)[None]  # (1, T, C)
    if prep is not None:
        x = prep(x)
    ctx = PosContext(None, 0, None, torch.cat(codes)[None] if codes else None, segments=tuple(segments))
    blocks = {i for m in masks for i in m}
    attn_masks = {i: tuple(m.get(i) for m in masks) for i in blocks}  # {block: one mask per segment}
    seen: list[torch.Tensor] = []
    out = tower.run_blocks(x, ctx, attn_masks, (lambda s: seen.append(s[0])) if keep_states else None)
    return out[0], (seen if keep_states else None)
