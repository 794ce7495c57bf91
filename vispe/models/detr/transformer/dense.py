"""DETR's encoder-decoder transformer (post-norm), on ``vispe.attention.Attention``.

Layer by layer what DETR's ``models/transformer.py`` computes (``normalize_before=False``):

    encoder layer:  x = norm1(x + SelfAttn(q = k = x [+ pos], v = x))
                    x = norm2(x + FFN(x))
    decoder layer:  t = norm1(t + SelfAttn(q = k = t [+ query_pos], v = t))
                    t = norm2(t + CrossAttn(q = t [+ query_pos], k = memory [+ pos], v = memory))
                    t = norm3(t + FFN(t))
    decoder output: norm(t) after every layer (the auxiliary outputs) and after the last.

Where a position enters is the caller's ``PosContext``: ``ctx.pos`` is the additive code added to
q and k (every layer, DETR's default), a rotary or bias encoding sits in the encoder layers'
attention (``attn.pe``), and ``ctx.mask`` (B, h, w) hides padded keys. The attention weights
are one fused ``qkv`` Linear (rows q, k, v: ``nn.MultiheadAttention``'s ``in_proj_weight``)
and ``proj`` (its ``out_proj``); the FFN is timm's ``Mlp`` (``fc1``, ReLU, ``fc2``).

One decoder layer (``vispe.models.detr.transformer.decoder_layer``, the deformable detector's too) serves
every query design (``vispe.models.detr.queries.positioned``), built from a
``designs.LayerSpec``: ``decoupled`` gives its attentions separate position projections (``q_pos`` /
``k_pos``, Conditional DETR and DAB-DETR), ``query_pos`` whether its cross-attention's query takes
``p_q`` (``q_pos``), and ``cross`` the cross-attention: its operator (``CROSS_OPERATORS``: "dense",
``vispe.attention.Attention`` over every memory cell), its keys (an additive code through ``k_pos``
and the spatial part ``q_spatial`` for "concat"; a rotary encoding the model attaches for
"rotary"; nothing for "none") and a box bias from the anchors (BoxRPB). An operator is called as
the attention is, ``cross_attn(t, ctx=cross_ctx, memory=..., memory_ctx=..., bias=...)``, where
``cross_ctx.coords`` (when the strategy sets it) are the queries' anchor centres, unit (y, x): the
reference points a deformable operator would sample around.

The decoder loop asks the strategy for each layer's contexts and, between layers, for the next
anchors; with a ``relation`` (Relation-DETR, ``vispe.models.detr.transformer.relation``) it biases the
self-attention of layer i >= 1 by the boxes predicted after the layers before it.
``enc_pos_scale`` (DAB-DETR's encoder) scales the encoder's additive code by an MLP of the tokens
in every layer: ``pos_l = pos * MLP(x_l)``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from vispe import _checks
from vispe.attention import Attention, PosContext
from vispe.models.detr.design.specs import LayerSpec
from vispe.models.detr.init import xavier_matrices
from vispe.models.detr.mlp import ACTIVATIONS, MLP, ffn
from vispe.models.detr.transformer.decode import decode_loop
from vispe.models.detr.transformer.decoder_layer import (  # noqa: F401  (CROSS_OPERATORS re-exported)
    CROSS_OPERATORS,
    DecoderLayer,
    self_attention,
)


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, nheads: int, dim_feedforward: int, dropout: float, attn_dropout: float,
                 activation: str = "relu") -> None:
        super().__init__()
        self.self_attn = self_attention(d_model, nheads, dropout, attn_dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.mlp = ffn(d_model, dim_feedforward, dropout, activation)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor, ctx: PosContext) -> torch.Tensor:  # (B, N, d)
        x = self.norm1(x + self.self_attn(x, ctx=ctx))
        return self.norm2(x + self.mlp(x))


class Transformer(nn.Module):
    """``enc_layers`` encoder layers and a decoder with a final norm: ``dec_layers`` DETR layers, or one
    layer per ``LayerSpec`` of a design (``designs.Design.layers()``)."""

    def __init__(self, d_model: int = 256, nheads: int = 8, enc_layers: int = 6, dec_layers: int | Sequence[LayerSpec] = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, attn_dropout: float | None = None, *,
                 enc_pos_scale: bool = False, activation: str = "relu") -> None:
        super().__init__()
        _checks.choice("activation", activation, tuple(ACTIVATIONS))
        attn_dropout = dropout if attn_dropout is None else attn_dropout  # DETR: nn.MultiheadAttention(dropout=0.1)
        args = (d_model, nheads, dim_feedforward, dropout, attn_dropout, activation)
        specs = [LayerSpec()] * dec_layers if isinstance(dec_layers, int) else list(dec_layers)
        self.encoder = nn.ModuleList(EncoderLayer(*args) for _ in range(enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*args, spec=s) for s in specs)
        self.decoder_norm = nn.LayerNorm(d_model)
        self.enc_pos_scale = MLP(d_model, d_model, d_model, 2) if enc_pos_scale else None
        self.relation = None  # Relation-DETR's PositionRelation, set by create_detr (built last, own init)
        self.d_model, self.nheads = d_model, nheads
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """DETR's init: Xavier-uniform for every matrix of the transformer's own layers, zero attention
        biases (as nn.MultiheadAttention); encodings attached to its attentions keep their own."""
        xavier_matrices(self)
        for m in self.modules():
            if isinstance(m, Attention):
                nn.init.zeros_(m.qkv.bias)
                nn.init.zeros_(m.proj.bias)

    def encode(self, x: torch.Tensor, ctx: PosContext) -> torch.Tensor:  # (B, N, d) -> (B, N, d)
        for layer in self.encoder:
            scaled = self.enc_pos_scale is not None and ctx.pos is not None
            x = layer(x, replace(ctx, pos=ctx.pos * self.enc_pos_scale(x)) if scaled else ctx)
        return x

    def decode(self, t: torch.Tensor, embed: torch.Tensor, memory: torch.Tensor, memory_ctx: PosContext,
               queries, anchors=None, box_head: nn.Module | None = None, *, intermediate: bool = True,
               self_attn_mask: torch.Tensor | None = None):
        """Decoder outputs after every layer (``intermediate``) or the last only, and the anchors each
        layer's boxes add to (``queries``: a ``vispe.models.detr.queries.positioned`` strategy; the loop:
        ``vispe.models.detr.transformer.decode``).  # (L|1, B, Q, d), [anchors]"""
        def run(layer, t, p, anchors, self_bias):
            return layer(t, p, memory, self_bias=self_bias, self_attn_mask=self_attn_mask)

        outs, used = decode_loop(self.decoder, queries, t, embed, anchors, run, heads=lambda i: box_head,
                                 norm=self.decoder_norm, relation=self.relation, memory_ctx=memory_ctx,
                                 intermediate=intermediate)
        return torch.stack(outs), used
