"""Attention inside groups of tokens given as index sets (the windows of a frame), without a mask.

``TokenGroups(sets, length)`` describes a partition of a sequence of ``length`` tokens into groups:
``sets`` is a list of (n, s) integer tensors, each row the token indices of one group of s tokens
(groups of one size stacked together, e.g. the full windows of a frame, its right-edge windows, ...);
every token lies in exactly one group. Passed as ``attn_mask`` to ``vispe.attention.Attention`` (after
the encodings: rotary angles are those of each token's own cell), each token attends to the tokens
of its own group only, as Qwen2.5-VL's window attention does with ``cu_window_seqlens``.

``impl``:

* ``"gather"`` (what ``"auto"`` runs, on every device): for each size s, q, k and v of the groups of
  that size are gathered into (B * n, heads, s, hd), SDPA runs on them with no mask (its fused
  kernel), and the outputs go back to their tokens by the inverse permutation. Every query scores
  s keys instead of the whole sequence's L (a masked SDPA over the frame scores all L).
* ``"flex"``: ``torch.nn.attention.flex_attention`` over the whole sequence with a document mask
  (``mask_mod``: same group id), its ``BlockMask`` skipping the blocks of other groups; compiled on
  CUDA (opt-in there, not verified on a GPU by this project yet: ``bench/gpu_check.py`` runs
  ``tests/test_gpu_towers_packed.py``). On the CPU torch runs it eagerly, forward only (it has no
  CPU backward): refused with a gradient.

The kernel report (``vispe.kernels.explain``) names the SDPA kernel the gathered windows run (the fused
"flash" one on the CPU, no mask) and "flex" for the flex path (its ``vispe::flex_attention`` range).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from vispe import _checks

GROUP_IMPLS = ("auto", "gather", "flex")


class TokenGroups:
    """A partition of ``length`` tokens into groups given as index sets (module docstring)."""

    def __init__(self, sets: list[torch.Tensor], length: int, *, impl: str = "auto") -> None:
        self.impl = _checks.choice("impl", impl, GROUP_IMPLS)
        if not sets or any(not isinstance(s, torch.Tensor) or s.dim() != 2 or s.is_floating_point() or s.numel() == 0
                           for s in sets):
            raise ValueError("sets: expected a non-empty list of non-empty (n, s) integer tensors of token indices")
        self.sets = [s.long() for s in sets]
        self.perm = torch.cat([s.flatten() for s in self.sets])  # (L,) tokens in group order
        count = torch.bincount(self.perm.clamp(0, length), minlength=length + 1)  # (L+1,)
        if self.perm.numel() != length or self.perm.min() < 0 or self.perm.max() >= length or (count[:length] != 1).any():
            raise ValueError(f"sets cover {self.perm.numel()} token slots: expected every index in [0, {length}) "
                             "exactly once (a partition of the sequence)")
        self.length = length
        self.inverse = torch.argsort(self.perm)  # (L,) each token's place in group order
        self.identity = len(self.sets) == 1 and self.sets[0].shape[0] == 1 and bool(
            (self.perm == torch.arange(length, device=self.perm.device)).all())  # one group, in order: plain SDPA
        self._group_id: torch.Tensor | None = None

    def group_id(self) -> torch.Tensor:
        """Each token's group number.  # (L,)"""
        if self._group_id is None:
            ids, first = [], 0
            for s in self.sets:
                ids.append(torch.arange(first, first + s.shape[0], device=s.device).repeat_interleave(s.shape[1]))
                first += s.shape[0]
            self._group_id = torch.empty_like(self.perm).index_copy_(0, self.perm, torch.cat(ids))
        return self._group_id

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float = 0.0) -> torch.Tensor:
        """Attention of q, k, v (B, heads, L, hd) inside each group.  # (B, heads, L, hd)"""
        if q.shape[-2] != self.length or k.shape[-2] != self.length:
            raise ValueError(f"q has {q.shape[-2]} tokens, k {k.shape[-2]}: expected {self.length} (the groups' sequence)")
        impl = "gather" if self.impl == "auto" else self.impl
        if self.identity:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        if impl == "flex":
            if dropout_p > 0:
                raise ValueError(f"impl='flex' with dropout_p={dropout_p}: expected 0 (use impl='gather')")
            if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                                        or v.requires_grad):
                raise ValueError("impl='flex' on the CPU needs torch.no_grad(): torch has no CPU backward for "
                                 "flex_attention (use impl='gather' to train on the CPU)")
            with record_function("vispe::flex_attention"):
                return _flex(q, k, v, self.group_id().to(q.device))
        with record_function("vispe::grouped_attention"):
            return self._gather(q, k, v, dropout_p)

    def _gather(self, q, k, v, dropout_p):
        B, H, _, D = q.shape
        outs = []
        for s in self.sets:
            n, size = s.shape
            idx = s.flatten().to(q.device)  # (n*s,)

            def take(t):  # one copy: every (item, head, group) a batch entry of one head, a view
                return t.index_select(2, idx).view(B * H * n, 1, size, D)

            o = F.scaled_dot_product_attention(take(q), take(k), take(v), dropout_p=dropout_p)  # (B*H*n, 1, s, D)
            outs.append(o.view(B, H, n * size, D))
        return torch.cat(outs, dim=2).index_select(2, self.inverse.to(q.device))  # (B, H, L, D) token order


_compiled_flex = None


def _flex(q, k, v, group_id):
    """flex_attention with the document mask of ``group_id`` (L,); compiled on CUDA."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def same_group(b, h, qi, ki):
        return group_id[qi] == group_id[ki]

    L = q.shape[-2]
    block = create_block_mask(same_group, None, None, L, L, device=q.device)
    fn = flex_attention
    if q.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        fn = _compiled_flex
    return fn(q, k, v, block_mask=block)


def windows(shape: tuple[int, int], size: int, *, device=None) -> list[torch.Tensor]:
    """The windows of ``size`` x ``size`` cells tiled from the top-left of an (h, w) raster grid, as index
    sets: one (n, s) tensor per window shape (full windows, right edge, bottom edge, corner), windows
    row-major inside each, cells row-major inside a window."""
    h, w = shape
    _checks.positive_int("size", size)
    cells = torch.arange(h * w, device=device).reshape(h, w)
    sets = []
    for ys in ((0, h - h % size), (h - h % size, h)):
        for xs in ((0, w - w % size), (w - w % size, w)):
            part = cells[ys[0]:ys[1], xs[0]:xs[1]]  # (hh, ww), whole windows of one shape
            if part.numel() == 0:
                continue
            wh, ww = min(size, part.shape[0]), min(size, part.shape[1])
            grid = part.reshape(part.shape[0] // wh, wh, part.shape[1] // ww, ww).transpose(1, 2)
            sets.append(grid.reshape(-1, wh * ww))  # (windows, wh*ww)
    return sets
