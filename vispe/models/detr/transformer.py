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

One decoder layer serves every query design (``vispe.models.detr.queries``): ``decoupled=True``
gives its attentions separate position projections (``q_pos`` / ``k_pos``, Conditional DETR and
DAB-DETR), ``spatial=True`` the cross-attention's spatial part (``q_spatial``), ``cross_pe`` a
rotary encoding in the cross-attention, ``box_bias`` a bias from the anchors (BoxRPB). The
decoder loop asks the strategy for each layer's contexts and lets it refine the anchors.
``enc_pos_scale`` (DAB-DETR's encoder) scales the encoder's additive code by an MLP of the tokens
in every layer: ``pos_l = pos * MLP(x_l)``.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from timm.layers import Mlp
from torch import nn

from vispe.attention import Attention, PosContext
from vispe.models.detr.mlp import MLP


def _attention(d_model: int, nheads: int, dropout: float, attn_dropout: float, **kw) -> Attention:
    return Attention(d_model, nheads, qkv_bias=True, attn_drop=attn_dropout, proj_drop=dropout, **kw)


ACTIVATIONS = {"relu": nn.ReLU, "prelu": nn.PReLU, "gelu": nn.GELU}  # FFN activation (DAB-DETR: prelu)


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, nheads: int, dim_feedforward: int, dropout: float, attn_dropout: float,
                 activation: str = "relu") -> None:
        super().__init__()
        self.self_attn = _attention(d_model, nheads, dropout, attn_dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.mlp = Mlp(d_model, dim_feedforward, act_layer=ACTIVATIONS[activation], drop=dropout)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor, ctx: PosContext) -> torch.Tensor:  # (B, N, d)
        x = self.norm1(x + self.self_attn(x, ctx=ctx))
        return self.norm2(x + self.mlp(x))


class DecoderLayer(nn.Module):
    """DETR's post-norm decoder layer; the options place the positions of positioned queries (module docstring)."""

    def __init__(self, d_model: int, nheads: int, dim_feedforward: int, dropout: float, attn_dropout: float,
                 activation: str = "relu", *, decoupled: bool = False, cross_query_pos: bool = True, spatial: bool = False,
                 cross_pe=None, box_bias: nn.Module | None = None) -> None:
        super().__init__()
        self.self_attn = _attention(d_model, nheads, dropout, attn_dropout, q_pos=decoupled, k_pos=decoupled)
        self.norm1 = nn.LayerNorm(d_model)
        self.cross_attn = _attention(d_model, nheads, dropout, attn_dropout, q_pos=decoupled and cross_query_pos,
                                     k_pos=decoupled, spatial=spatial, pe=cross_pe)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = Mlp(d_model, dim_feedforward, act_layer=ACTIVATIONS[activation], drop=dropout)
        self.norm3 = nn.LayerNorm(d_model)
        self.box_bias = box_bias

    def forward(self, t: torch.Tensor, query_ctx: PosContext, memory: torch.Tensor, memory_ctx: PosContext, *,
                cross_ctx: PosContext | None = None, anchors: torch.Tensor | None = None) -> torch.Tensor:  # (B, Q, d)
        bias = None
        if self.box_bias is not None:
            bias = self.box_bias(anchors, memory_ctx.shape, memory_ctx.mask).to(t.dtype)  # (B, heads, Q, h*w)
        t = self.norm1(t + self.self_attn(t, ctx=query_ctx))
        t = self.norm2(t + self.cross_attn(t, ctx=query_ctx if cross_ctx is None else cross_ctx, memory=memory,
                                           memory_ctx=memory_ctx, bias=bias))
        return self.norm3(t + self.mlp(t))


class Transformer(nn.Module):
    """``enc_layers`` encoder layers and ``dec_layers`` decoder layers with a final decoder norm."""

    def __init__(self, d_model: int = 256, nheads: int = 8, enc_layers: int = 6, dec_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, attn_dropout: float | None = None, *,
                 layer_kwargs=None, enc_pos_scale: bool = False, activation: str = "relu") -> None:
        """``layer_kwargs(i)`` gives decoder layer i's options (``DecoderLayer``); None: DETR's layers."""
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r}: expected one of {', '.join(map(repr, ACTIVATIONS))}")
        attn_dropout = dropout if attn_dropout is None else attn_dropout  # DETR: nn.MultiheadAttention(dropout=0.1)
        args = (d_model, nheads, dim_feedforward, dropout, attn_dropout, activation)
        self.encoder = nn.ModuleList(EncoderLayer(*args) for _ in range(enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(*args, **(layer_kwargs(i) if layer_kwargs else {}))
                                     for i in range(dec_layers))
        self.decoder_norm = nn.LayerNorm(d_model)
        self.enc_pos_scale = MLP(d_model, d_model, d_model, 2) if enc_pos_scale else None
        self.d_model, self.nheads = d_model, nheads
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """DETR's init: Xavier-uniform for every matrix, zero attention biases (as nn.MultiheadAttention)."""
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
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
               queries, anchors=None, box_head: nn.Module | None = None, *, intermediate: bool = True):
        """Decoder outputs after every layer (``intermediate``) or the last only, and the anchors each
        layer used (``queries``: a ``vispe.models.detr.queries`` strategy).  # (L|1, B, Q, d), [anchors]"""
        outs, used = [], []
        for i, layer in enumerate(self.decoder):
            p = queries.layer(i, t, embed, anchors, memory_ctx)
            t = layer(t, p.self_ctx, memory, p.memory_ctx, cross_ctx=p.cross_ctx, anchors=p.anchors)
            if intermediate or i == len(self.decoder) - 1:
                outs.append(self.decoder_norm(t))
                used.append(anchors)
            anchors = queries.refine(i, t, anchors, box_head)
        return torch.stack(outs), used
