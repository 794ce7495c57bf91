"""The one decoder layer of every detector here; its cross-attention is an operator chosen by the design.

Post-norm, as DETR's ``TransformerDecoderLayer`` and Deformable DETR's ``DeformableTransformerDecoderLayer``::

    t = norm1(t + SelfAttn(q = k = t [+ p_q], v = t [, + Relation-DETR's bias]))      vispe.attention.Attention
    t = norm2(t + CrossAttn_operator(t, memory, the layer's positions))
    t = norm3(t + FFN(t))

The operator is ``LayerSpec.cross.operator`` (``vispe.models.detr.design.designs.Design.layers()``), looked
up in ``CROSS_OPERATORS``:

| operator | module (``cross_attn``) | what it reads |
|---|---|---|
| ``"dense"`` | ``vispe.attention.Attention`` over every memory cell (DETR); ``q_pos`` / ``k_pos`` / spatial part for the positioned designs' keys, a box bias (BoxRPB) from the anchors | ``p.cross_ctx`` (queries' code, anchors), ``p.memory_ctx`` (keys' code, mask) |
| ``"deformable"`` | ``vispe.deformable_attention.MSDeformAttn`` (Deformable DETR), then dropout | ``p.cross_ctx.pos`` (``p_q``, added to the query) and ``sampling``: the reference points (B, Q, L, 2\\|4) (y, x[, h, w]), the levels and the key padding |

A new operator is a ``CrossOperator`` (build the module from the layer's spec; call it) and one entry in
``CROSS_OPERATORS``; the layer, the decode loop (``decode``) and the heads stay as they are. The dense
operator's layers are initialised by their transformer (``dense.Transformer``); a deformable layer
initialises itself as the paper's ``DeformableTransformer._reset_parameters`` (Xavier-uniform on every
matrix, zero self-attention biases, then ``MSDeformAttn``'s own).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from vispe.attention import Attention
from vispe.kernels.deformable import Levels
from vispe.models.detr.design.specs import LayerSpec
from vispe.models.detr.mlp import ffn
from vispe.models.detr.queries.base import LayerPositions
from vispe.models.detr.transformer.box_bias import BoxRPB


@dataclass
class Sampling:
    """What a sampling operator (deformable) reads besides the memory: each query's reference points
    (B, Q, L, 2|4) unit (y, x[, h, w]) of every level, the levels, the key padding (B, N) or None."""

    reference: torch.Tensor
    levels: Levels
    key_padding_mask: torch.Tensor | None = None


def self_attention(d_model: int, nheads: int, dropout: float, attn_dropout: float, **kw) -> Attention:
    """The layers' attention (``qkv``: ``nn.MultiheadAttention``'s ``in_proj``; ``proj``: its ``out_proj``)."""
    return Attention(d_model, nheads, qkv_bias=True, attn_drop=attn_dropout, proj_drop=dropout, **kw)


@dataclass(frozen=True)
class CrossOperator:
    """A cross-attention operator: ``build(d_model, nheads, dropout, attn_dropout, spec) -> module``;
    ``call(layer, t, p, memory, bias, sampling) -> (B, Q, d)``; ``inits_itself``: the layer resets its own
    parameters when built (the deformable papers'), else its transformer does (DETR's); ``dropout_after``:
    the layer's ``dropout`` on the operator's output (the deformable papers'; dense: inside the attention)."""

    build: Callable[..., nn.Module]
    call: Callable[..., torch.Tensor]
    inits_itself: bool = False
    dropout_after: bool = False


def _dense_build(d_model, nheads, dropout, attn_dropout, spec: LayerSpec) -> nn.Module:
    keys = spec.cross.keys
    return self_attention(d_model, nheads, dropout, attn_dropout, q_pos=spec.decoupled and spec.query_pos,
                          k_pos=spec.decoupled and keys == "concat", spatial=keys == "concat")


def _dense_call(layer, t, p: LayerPositions, memory, bias, sampling):
    return layer.cross_attn(t, ctx=p.cross_ctx, memory=memory, memory_ctx=p.memory_ctx, bias=bias)


def _deformable_build(d_model, nheads, dropout, attn_dropout, spec: LayerSpec) -> nn.Module:
    from vispe.deformable_attention import MSDeformAttn

    return MSDeformAttn(d_model, nheads, spec.cross.levels, spec.cross.points)


def _deformable_call(layer, t, p: LayerPositions, memory, bias, sampling: Sampling):
    if sampling is None:
        raise ValueError("the deformable operator samples the memory at reference points: expected sampling=Sampling(...)")
    s = sampling
    return layer.dropout(layer.cross_attn(t, s.reference, memory, s.levels, s.key_padding_mask,
                                          query_pos=p.cross_ctx.pos))


#: cross-attention operators by ``CrossSpec.operator`` (module docstring)
CROSS_OPERATORS: dict[str, CrossOperator] = {
    "dense": CrossOperator(_dense_build, _dense_call),
    "deformable": CrossOperator(_deformable_build, _deformable_call, inits_itself=True, dropout_after=True),
}


class DecoderLayer(nn.Module):
    """One post-norm decoder layer whose cross-attention is ``spec.cross.operator`` (module docstring).

    ``attn_dropout``: dropout of the attention weights (default ``dropout``, as ``nn.MultiheadAttention``).
    """

    def __init__(self, d_model: int, nheads: int, dim_feedforward: int, dropout: float,
                 attn_dropout: float | None = None, activation: str = "relu", spec: LayerSpec | None = None) -> None:
        super().__init__()
        spec = spec or LayerSpec()
        attn_dropout = dropout if attn_dropout is None else attn_dropout
        self.operator = spec.cross.operator
        op = CROSS_OPERATORS[self.operator]
        # the box bias is built first and registered last: the random draws of vispe's layers before
        # issue 35, so that init="legacy" reproduces them
        box_bias = BoxRPB(nheads, **spec.cross.box_bias) if spec.cross.box_bias is not None else None
        self.self_attn = self_attention(d_model, nheads, dropout, attn_dropout, q_pos=spec.decoupled,
                                        k_pos=spec.decoupled)
        self.norm1 = nn.LayerNorm(d_model)
        self.cross_attn = op.build(d_model, nheads, dropout, attn_dropout, spec)
        if op.dropout_after:
            self.dropout = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = ffn(d_model, dim_feedforward, dropout, activation)
        self.norm3 = nn.LayerNorm(d_model)
        self.box_bias = box_bias
        if op.inits_itself:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """The deformable papers' (module docstring); the FFN biases keep PyTorch's Linear init."""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        nn.init.zeros_(self.self_attn.qkv.bias)
        nn.init.zeros_(self.self_attn.proj.bias)
        self.cross_attn.reset_parameters()

    def forward(self, t: torch.Tensor, p: LayerPositions, memory: torch.Tensor, *,
                self_bias: torch.Tensor | None = None, self_attn_mask: torch.Tensor | None = None,
                sampling: Sampling | None = None) -> torch.Tensor:
        """``p``: the strategy's contexts for this layer; ``memory`` (B, N, d); ``self_bias`` (B, heads, Q, Q) on
        the self-attention, ``self_attn_mask`` (Q, Q) True = blocked (denoising groups); ``sampling`` what a
        sampling operator reads (module docstring).  # (B, Q, d)"""
        bias = None
        if self.box_bias is not None:
            bias = self.box_bias(p.anchors, p.memory_ctx.shape, p.memory_ctx.mask).to(t.dtype)  # (B, heads, Q, h*w)
        t = self.norm1(t + self.self_attn(t, attn_mask=self_attn_mask, ctx=p.self_ctx, bias=self_bias))
        t = self.norm2(t + CROSS_OPERATORS[self.operator].call(self, t, p, memory, bias, sampling))
        return self.norm3(t + self.mlp(t))
