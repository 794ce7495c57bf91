"""AIFI, RT-DETR's attention-based intra-scale feature interaction: dense self-attention over the top level.

One or more post-norm transformer encoder layers (``vispe.models.detr.transformer.dense.EncoderLayer``:
``x = norm1(x + SelfAttn(q = k = x [+ pos], v = x)); x = norm2(x + FFN(x))``, GELU in transformers'
RT-DETR) over the tokens of one feature map (B, C, h, w), which come back as a map. Because the
attention is dense, any vispe encoding applies, chosen by name (``set_encoding``, also after a
checkpoint is loaded):

* additive (``sincos2d`` / AIFI's own sin-cos in either layout, ``vispe.models.detr.realtime.sincos``,
  ``sine``, learned tables...): added to the inputs of q and k in every layer, as RT-DETR;
* rotary (``rope_mixed``, ``rope_axial``, ...) and bias (``relbias``, ...): set on every layer's
  attention (``Attention.set_pe``), each layer its own instance;
* ``none``: no position.

The position is always computed at the grid the layer is given. transformers' ``RTDetrAIFILayer``
instead passes no position at all in eval mode when ``config.eval_size`` is set (``pos_embed =
None``), and the original code reads a table built for ``eval_spatial_size`` (other sizes fail):
vispe does neither.

Padding: with a mask (B, h, w) (True = padding) the attention ignores padded keys and a mask-aware
encoding counts positions over each image's valid area, so the AIFI output on an image's valid area
is the same alone and padded in a batch (the convolutions around AIFI see the padding, as in
RT-DETR). transformers' RT-DETR passes no mask to AIFI.
"""
from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from vispe import _checks
from vispe.attention import PosContext
from vispe.encoding import AdditiveEncoding, PositionEncoding
from vispe.models.detr.realtime.sincos import LAYOUTS, aifi_sincos
from vispe.models.detr.transformer.dense import EncoderLayer
from vispe.registry import build_in, get

#: AIFI's default encoding: RT-DETR's sin-cos (``layout`` chooses transformers' or the original's order)
SINCOS = "rtdetr_sincos"


class AIFI(nn.Module):
    """``num_layers`` encoder layers over one level with a swappable encoding (module docstring)."""

    def __init__(self, dim: int = 256, num_heads: int = 8, ffn_dim: int = 1024, num_layers: int = 1, *,
                 dropout: float = 0.0, activation: str = "gelu", pe: str = SINCOS,
                 pe_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        _checks.positive_int("num_layers", num_layers)
        self.dim, self.num_heads = dim, num_heads
        self.layers = nn.ModuleList(EncoderLayer(dim, num_heads, ffn_dim, dropout, dropout, activation)
                                    for _ in range(num_layers))
        self.pe: AdditiveEncoding | None = None
        self.pe_name = pe
        self.set_encoding(pe, **(pe_kwargs or {}))

    def set_encoding(self, name: str, **kwargs: Any) -> None:
        """Use the encoding ``name`` (a registered vispe encoding, or ``"rtdetr_sincos"`` with
        ``layout`` / ``temperature`` / ``mask_aware`` / ``float64``) with settings ``kwargs`` from now on."""
        for layer in self.encoder_layers:
            layer.self_attn.set_pe(None)
        self.pe = None
        if name == SINCOS:
            unknown = set(kwargs) - {"layout", "temperature", "mask_aware", "float64"}
            if unknown:
                raise ValueError(f"pe_kwargs {sorted(unknown)} for {SINCOS!r}: it takes layout "
                                 f"({', '.join(LAYOUTS)}), temperature, mask_aware and float64")
            self.pe = aifi_sincos(self.dim, **kwargs)
        else:
            family = get(name).family
            context = dict(dim=self.dim, num_heads=self.num_heads, head_dim=self.dim // self.num_heads,
                           num_prefix_tokens=0)
            if family == "additive":
                pe = build_in(name, context, **kwargs)
                assert isinstance(pe, AdditiveEncoding)
                self.pe = pe
            elif family in ("rotary", "bias"):
                for layer in self.encoder_layers:
                    layer.self_attn.set_pe(build_in(name, context, **kwargs))
            elif family == "none":
                if kwargs:
                    raise ValueError(f"pe_kwargs={kwargs!r}: the encoding {name!r} takes no settings")
            else:
                raise ValueError(f"pe={name!r} is a {family} encoding: AIFI takes an additive, rotary or bias one")
        self.pe_name = name

    @property
    def encoder_layers(self) -> list[EncoderLayer]:
        """``layers`` as their class (typed iteration)."""
        return [cast(EncoderLayer, layer) for layer in self.layers]

    @property
    def encodings(self) -> list[PositionEncoding]:
        """The encodings in use: the additive one, or each layer's rotary / bias one."""
        if self.pe is not None:
            return [self.pe]
        return [layer.self_attn.pe for layer in self.encoder_layers if layer.self_attn.pe is not None]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:  # (B, C, h, w)
        """Feature map ``x`` (B, C, h, w), optional padding ``mask`` (B, h, w), True = padding."""
        B, C, h, w = x.shape
        if C != self.dim:
            raise ValueError(f"x has {C} channels: this AIFI was built for dim={self.dim}")
        mask = _checks.mask_for("mask", mask, (h, w))
        tokens = x.flatten(2).transpose(1, 2)  # (B, h*w, C)
        pos = None if self.pe is None else self.pe((h, w), mask, device=x.device, dtype=x.dtype)  # (B|1, h*w, C)
        ctx = PosContext(shape=(h, w), mask=mask, pos=pos)
        for layer in self.layers:
            tokens = layer(tokens, ctx)
        return tokens.transpose(1, 2).reshape(B, C, h, w)
