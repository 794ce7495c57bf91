"""DINO's decoder loop with look-forward-twice (Zhang et al., ICLR 2023, section 3.5; IDEA-Research/DINO
``TransformerDecoder.forward`` and the box loop of ``DINO.forward``).

Layer i takes the (detached) reference box ``b_{i-1}`` and gives ``t_i``; then::

    b_i'  = sigmoid(box_head_i(t_i) + inverse_sigmoid(b_{i-1}))        the next reference, undetached
    b_i   = b_i'.detach()                                               what layer i + 1 samples around
    box_i = sigmoid(box_head_i(norm(t_i)) + inverse_sigmoid(b_{i-1}'))  layer i's predicted box

Deformable DETR refines with the detached ``b_{i-1}`` in ``box_i`` ("look forward once": layer i's box
loss reaches only layer i's parameters); DINO uses the undetached ``b_{i-1}'`` (with ``b_{-1}' =
b_{-1}``, the initial anchors), so the loss of layer i also trains layer i - 1's box head and output
("look forward twice"). ``look_forward_twice=False`` gives the former (DINO's
``use_detached_boxes_dec_out=True``).

As the reference, the references come from ``box_head_i`` of the layer's output before the decoder's
final ``norm`` and the predicted boxes after it (``norm`` is applied to every layer's output that the
heads read: the reference's ``intermediate``); pass ``nn.Identity()`` for a decoder without one.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vispe.models.detr.queries.dn.common import inv_sigmoid

#: one decoder layer: (layer index, queries (B, T, d), detached reference boxes (B, T, 4)) -> (B, T, d)
Layer = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


def look_forward_twice(t: torch.Tensor, anchors: torch.Tensor, layers: Layer, num_layers: int,
                       box_heads, norm: nn.Module, *,
                       look_forward_twice: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Queries ``t`` (B, T, d), initial ``anchors`` (B, T, 4) unit (cx, cy, w, h), ``box_heads[i]`` the box
    head of layer i -> (every layer's normed output [(B, T, d)], the boxes the heads add to [(B, T, 4)]:
    ``b_{i-1}'`` for layer i (module docstring))."""
    ref = anchors.detach()
    refs, hs = [ref], []
    for i in range(num_layers):
        t = layers(i, t, ref)
        new = (box_heads[i](t) + inv_sigmoid(ref)).sigmoid()  # (B, T, 4) undetached
        ref = new.detach()
        refs.append(new if look_forward_twice else ref)
        hs.append(norm(t))
    return hs, refs[:-1]


def layer_boxes(hs: list[torch.Tensor], refs: list[torch.Tensor], box_heads) -> torch.Tensor:
    """Every layer's predicted boxes ``sigmoid(box_head_i(hs_i) + inverse_sigmoid(refs_i))``.  # (L, B, T, 4)"""
    return torch.stack([(box_heads[i](h) + inv_sigmoid(r)).sigmoid() for i, (h, r) in enumerate(zip(hs, refs))])
