"""Deformable DETR's decoder layer and its two-stage helpers (Zhu et al., ICLR 2021).

``DeformableDecoderLayer`` is the detector's one ``DecoderLayer`` (``decoder_layer``) with the "deformable"
cross-attention operator (post-norm, as fundamentalvision/Deformable-DETR's
``DeformableTransformerDecoderLayer`` and transformers' ``DeformableDetrDecoderLayer``)::

    t = norm1(t + SelfAttn(q = k = t + query_pos, v = t))            vispe.attention.Attention
    t = norm2(t + MSDeformAttn(query = t + query_pos, reference, value = memory, key padding))
    t = norm3(t + FFN(t))

``reference`` (B, Q, L, 2|4) is each query's point (y, x) or box (cy, cx, h, w) in unit coordinates of
every level's map (``vispe.coords.points_at_levels`` of the valid-area anchors and the valid ratios;
``vispe.kernels.deformable.swap_xy`` turns DETR's (cx, cy, w, h) into (cy, cx, h, w)). The decoder loop
(where the reference points come from, their refinement, the query designs) is the detector's.

Two-stage Deformable DETR (the paper's A.4): every encoder token proposes a box.

* ``encoder_proposals(memory, key_padding_mask, levels)``: each valid token's box, centred on its
  cell in unit coordinates of the image's valid area, of side 0.05 * 2^l on level l, as logits
  (inverse sigmoid), in DETR's box format (cx, cy, w, h); tokens that are padding or whose box
  reaches within 0.01 of the valid area's border get +inf and a zeroed memory row (transformers'
  ``gen_encoder_output_proposals`` without its ``enc_output`` projection, which is a parameter of
  the detector).
* ``proposal_sine(logits, num_feats)``: the sine code of the top-k proposals that becomes the
  queries' position (``get_proposal_pos_embed``): per coordinate of ``sigmoid(logits) * 2 pi``,
  ``num_feats`` channels [sin(p w_0), cos(p w_0), ...], w_k = 10000^(-2k / num_feats), coordinates
  in the box's order (cx, cy, w, h): (B, Q, 4 * num_feats) (the papers' 128 per coordinate at
  d_model 256; transformers uses d_model / 2).
"""
from __future__ import annotations

import math

import torch

from vispe.attention import PosContext
from vispe.axis.sinusoidal import sinusoidal
from vispe.coords import float32_math, valid_extent
from vispe.kernels.deformable import Levels
from vispe.models.detr.design.specs import CrossSpec, LayerSpec
from vispe.models.detr.queries.base import LayerPositions
from vispe.models.detr.transformer.decoder_layer import DecoderLayer, Sampling


class DeformableDecoderLayer(DecoderLayer):
    """The one ``DecoderLayer`` with the deformable operator, built and called in the paper's terms (module
    docstring): a name for tests, benchmarks and DINO's reference loop; the detector builds ``DecoderLayer``
    from its design's ``LayerSpec``s, which is the same layer.

    ``attn_dropout``: dropout of the self-attention's weights (default ``dropout``, the paper's
    ``nn.MultiheadAttention(dropout=dropout)``; transformers: 0).
    """

    def __init__(self, d_model: int = 256, nheads: int = 8, dim_feedforward: int = 1024, dropout: float = 0.1,
                 num_levels: int = 4, num_points: int = 4, activation: str = "relu",
                 attn_dropout: float | None = None) -> None:
        spec = LayerSpec(cross=CrossSpec("deformable", "sampled", levels=num_levels, points=num_points))
        super().__init__(d_model, nheads, dim_feedforward, dropout, attn_dropout, activation, spec)

    def forward(self, t: torch.Tensor, query_pos: torch.Tensor | None, reference: torch.Tensor,  # type: ignore[override]
                memory: torch.Tensor, levels: Levels, key_padding_mask: torch.Tensor | None = None, *,
                self_ctx: PosContext | None = None, self_attn_mask: torch.Tensor | None = None,
                self_bias: torch.Tensor | None = None) -> torch.Tensor:
        """Queries ``t`` (B, Q, d) at ``query_pos`` (B|1, Q, d), ``reference`` (B, Q, L, 2|4), ``memory``
        (B, N, d) of ``levels`` with ``key_padding_mask`` (B, N). ``self_ctx`` replaces the
        self-attention's context (default: ``PosContext(pos=query_pos)``); ``self_attn_mask`` (Q, Q)
        masks query pairs (denoising groups); ``self_bias`` (B|1, heads, Q, Q) is added to the
        self-attention's logits (Relation-DETR's box relation).  # (B, Q, d)"""
        p = LayerPositions(self_ctx if self_ctx is not None else PosContext(pos=query_pos), PosContext(pos=query_pos),
                           PosContext())
        return super().forward(t, p, memory, self_bias=self_bias, self_attn_mask=self_attn_mask,
                               sampling=Sampling(reference, levels, key_padding_mask))


def encoder_proposals(memory: torch.Tensor, key_padding_mask: torch.Tensor | None,
                      levels: Levels) -> tuple[torch.Tensor, torch.Tensor]:
    """(memory with padded and border tokens zeroed (B, N, d), proposal logits (B, N, 4) as (cx, cy, w, h),
    +inf where there is no proposal) (module docstring)."""
    B, N, _ = memory.shape
    if N != levels.num_tokens:
        raise ValueError(f"memory has {N} tokens: levels {list(levels.shapes)} have {levels.num_tokens}")
    dev, dtype = memory.device, memory.dtype
    props = []
    for l, ((h, w), s) in enumerate(zip(levels.shapes, levels.start)):
        m = None if key_padding_mask is None else key_padding_mask[:, s:s + h * w].view(B, h, w)
        n = valid_extent(m, (h, w), device=dev).to(dtype).expand(B, 2)  # (B, 2) valid (h, w) in cells
        iy, ix = torch.meshgrid(torch.arange(h, device=dev, dtype=dtype), torch.arange(w, device=dev, dtype=dtype),
                                indexing="ij")
        cy = (iy.flatten() + 0.5)[None] / n[:, :1]  # (B, h*w)
        cx = (ix.flatten() + 0.5)[None] / n[:, 1:]  # (B, h*w)
        side = torch.full_like(cx, 0.05 * 2.0 ** l)
        props.append(torch.stack([cx, cy, side, side], -1))  # (B, h*w, 4) as (cx, cy, w, h)
    props = torch.cat(props, 1)  # (B, N, 4)
    keep = ((props > 0.01) & (props < 0.99)).all(-1, keepdim=True)  # (B, N, 1)
    logits = torch.log(props / (1 - props))  # inverse sigmoid
    if key_padding_mask is not None:
        keep = keep & ~key_padding_mask[..., None]
    logits = logits.masked_fill(~keep, float("inf"))
    return memory.masked_fill(~keep, 0.0), logits


def proposal_sine(logits: torch.Tensor, num_feats: int = 128, temperature: float = 10000.0,
                  scale: float = 2 * math.pi) -> torch.Tensor:
    """The two-stage queries' position code of proposal ``logits`` (B, Q, 4), float32 math, cast to
    their dtype (module docstring).  # (B, Q, 4 * num_feats)"""
    if logits.shape[-1] != 4:
        raise ValueError(f"logits has shape {tuple(logits.shape)}: expected (..., 4) box logits (cx, cy, w, h)")
    with float32_math(logits.device):
        p = logits.float().sigmoid() * scale  # (B, Q, 4)
        return sinusoidal(p, num_feats, temperature, "interleaved").flatten(-2).to(logits.dtype)  # (B, Q, 4 * num_feats)
