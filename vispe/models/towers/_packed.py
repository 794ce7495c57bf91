"""The packed path of the converted towers (private): frames of different sizes run without a canvas.

A packed batch (Qwen's ``grid_thw`` sequence, Pixtral's images of several sizes) is regrouped by
frame size: the frames of one (h, w) form one group, stacked as (S_g, h*w, C) in raster order with
no padding, and every group runs the tower's blocks on its own (norms and MLPs per token, attention
batched over the group's frames: each frame attends within itself only, the original's
block-diagonal attention). The encodings see each frame's own grid (``PosContext(shape=(h, w))``,
no mask), so a frame's output does not depend on the other frames, and it costs what the frame
costs, not what the largest frame costs. The groups lie one after the other in a "virtual canvas"
(T, C) with no empty cell: a tower gives, for every packed token, its row there (``cells``), as on
the canvas path (``_common.to_canvas``), so tokens and positions move together by construction.

Which path runs is the tower's ``path``: ``"canvas"``, ``"packed"``, or ``"auto"`` (the default:
the canvas when every frame has one size, as in an equal-size batch or a fixed-size export, the
packed path otherwise); ``last_path`` says which one the last call took.
"""
from __future__ import annotations

import torch

from vispe.attention import PosContext

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


def run_groups(tower, virtual: torch.Tensor, groups, *, prep=None, window=None, keep_states: bool = False):
    """The tower's blocks over each group of the virtual canvas ``virtual`` (T, C): ``input_code``
    (the frame's own grid), ``prep`` (e.g. a pre-norm), the blocks (``window(shape)``: {block: its
    ``attn_mask``} inside a frame of that shape, e.g. Qwen2.5-VL's windows as ``TokenGroups``). Returns the output (T, C) and, with ``keep_states``, the
    input and every block's output (each (T, C), virtual rows)."""
    outs: list[torch.Tensor] = []
    states: list[list[torch.Tensor]] = []
    row = 0
    for (h, w), frames in groups:
        n = frames * h * w
        x = virtual[row:row + n].reshape(frames, h * w, -1)  # (S_g, h*w, C)
        row += n
        x, pos = tower.input_code(x, (h, w), None)
        if prep is not None:
            x = prep(x)
        seen: list[torch.Tensor] = []
        x = tower.run_blocks(x, PosContext((h, w), 0, None, pos), window((h, w)) if window else None,
                             (lambda s: seen.append(s.reshape(n, -1))) if keep_states else None)
        outs.append(x.reshape(n, -1))
        states.append(seen)
    out = torch.cat(outs)  # (T, C)
    if not keep_states:
        return out, None
    return out, [torch.cat([s[k] for s in states]) for k in range(len(states[0]))]
