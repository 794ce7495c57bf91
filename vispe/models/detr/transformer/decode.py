"""The one decode loop of every detector here, whatever its cross-attention operator (dense, deformable).

For decoder layer i (``layers[i]``), given the queries ``t`` (B, Q, d) and their anchors (or None)::

    p     = strategy.layer(i, t, embed, anchors, memory_ctx)     the layer's position contexts
    t     = run(layer, t, p, anchors, self_bias)                 the operator's layer (its memory, masks)
    out_i = norm(t)  (or t where the design has no decoder norm: Deformable DETR)
    [relation]  self_bias = relation(boxes before layer i - 1, boxes after layer i)   (no gradient)
    [refine]    new = strategy.refine(i, t, anchors, head_i);  anchors = new.detach()
                layer i + 1's boxes add to ``new`` itself under look-forward-twice (DINO), else to the
                detached anchors

and returns every layer's ``out_i`` (or the last only, ``intermediate=False``) with the anchors its boxes
add to. The heads are ``heads(i)``: one module for every layer, or one per layer (the strategy's
``shared_heads``). ``self_attn_mask`` (Q', Q') (True = blocked) reaches every layer's self-attention
through ``run`` (denoising groups: ``queries.ExtraQueries``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn


def decode_loop(layers: Sequence[nn.Module], queries, t: torch.Tensor, embed, anchors, run: Callable, *,
                heads: Callable[[int], nn.Module], norm: nn.Module | None = None, relation: nn.Module | None = None,
                memory_ctx=None, intermediate: bool = True) -> tuple[list[torch.Tensor], list]:
    """Every layer's output (or the last only) and the anchors its boxes add to (module docstring).
    # [(B, Q, d)], [(B|1, Q, 2|4) or None]"""
    outs, used = [], []
    last = len(layers) - 1
    self_bias, before = None, anchors  # the relation's boxes before the previous layer
    box_anchors = anchors  # what layer i's boxes add to (look-forward-twice: not detached)
    for i, layer in enumerate(layers):
        p = queries.layer(i, t, embed, anchors, memory_ctx)
        t = run(layer, t, p, anchors, self_bias)
        keep = intermediate or i == last
        out = norm(t) if norm is not None and (keep or relation is not None) else t
        if keep:
            outs.append(out)
            used.append(box_anchors)
        if i == last:
            break
        if relation is not None:
            with torch.no_grad():
                boxes = queries.boxes(heads(i)(out)[None], [anchors])[0]  # (B, Q, 4) layer i's predictions
            self_bias = relation(before, boxes).to(t.dtype)  # (B, heads, Q, Q)
            before = boxes
        new = queries.refine(i, t, anchors, heads(i))
        if queries.refines:  # the papers detach the refined anchors before the next layer
            anchors = new.detach()
            box_anchors = new if queries.look_forward_twice else anchors
        else:
            anchors = box_anchors = new
    return outs, used
