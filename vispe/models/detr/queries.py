"""Where DETR's object queries are: one decoder, three query-position strategies.

A strategy turns the model's learned query embedding (``query_embed.weight``) into, for every
decoder layer, the contexts of its two attentions (``vispe.attention.PosContext``):

| strategy | query position |
|---|---|
| ``"detr"`` | DETR (Carion et al., 2020): learned vectors ``p_q`` added to q/k of self-attention and to q of cross-attention (shared projections); no 2D position. |
| ``"conditional"`` | Conditional DETR (Meng et al., ICCV 2021): a reference point ``r = sigmoid(MLP(p_q))`` per query (fixed across layers); the cross-attention's spatial query is the anchor code ``A(r)`` scaled elementwise by ``FFN(t)`` of the decoder embedding (1 in layer 0), appended per head to q while the keys' code is appended to k (``PosContext.spatial``). |
| ``"dab"`` | DAB-DETR (Liu et al., ICLR 2022): learned anchor boxes ``sigmoid(query_embed)`` (cx, cy, w, h) or points (``query_dim=2``), refined after every layer by the box head (``iter_refine``, the new anchor detached); ``p_q = MLP(A(anchor))``; the spatial query as Conditional's, with the y / x halves scaled by ``h_ref / h`` / ``w_ref / w`` (``modulate_hw``). |

Anchors are boxes in DETR's box format, (cx, cy[, w, h]) in unit coordinates of each image's valid
area, because their inverse sigmoid is added to the box head's output; they reach the encodings as
(y, x) = (cy, cx) (``PositionEncoding.at``). ``A`` is ``anchor_pe``, any additive encoding with
``supports_coords`` (default: ``sine`` at temperature 10000, the papers' ``gen_sineembed_for_position``;
DAB's feature-map sine uses 20, its anchor sine 10000: DAB-DETR#21). For 4D anchors
``A(cx, cy, w, h) = [A((cy, cx)), A((w, h))]`` ([y, x, w, h], the papers' order).

How the anchors meet the memory in cross-attention (``cross``): ``"concat"`` (the papers' spatial
part, against the keys' additive grid code), ``"rotary"`` (a rotary encoding in the cross-attention:
queries rotated at the anchor centre, keys at their cells; no spatial part; ``p_q`` is added to the
first layer's query as in the papers, since the content is still zero there), and optionally a box bias
(``vispe.models.detr.box_bias``) on top, computed by the decoder layer from the anchors.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from vispe.attention import PosContext
from vispe.models.detr.mlp import MLP, inverse_sigmoid

DESIGNS = ("detr", "conditional", "dab")
CROSS = ("add", "concat", "rotary")


@dataclass
class LayerPositions:
    """The contexts of one decoder layer's two attentions, and its anchor boxes (or None)."""

    self_ctx: PosContext
    cross_ctx: PosContext
    memory_ctx: PosContext
    anchors: torch.Tensor | None = None  # (B|1, Q, 2|4) unit (cx, cy[, w, h])


class QueryPositions(nn.Module):
    """Base: DETR's learned query positions (``design="detr"``). ``queries_at`` "attn" | "input"."""

    design = "detr"

    def __init__(self, d_model: int, *, queries_at: str = "attn") -> None:
        super().__init__()
        self.d_model, self.queries_at = d_model, queries_at
        self.cross = "add"

    def start(self, embed: torch.Tensor, B: int, dtype: torch.dtype):
        """(initial decoder input (B, Q, d), initial anchors or None) from the query embedding."""
        pos = embed[None].to(dtype)  # (1, Q, d)
        if self.queries_at == "input":
            return pos.expand(B, -1, -1), None
        return pos.new_zeros(B, embed.shape[0], self.d_model), None

    def layer(self, i: int, t: torch.Tensor, embed: torch.Tensor, anchors, memory_ctx: PosContext) -> LayerPositions:
        ctx = PosContext(pos=embed[None].to(t.dtype)) if self.queries_at == "attn" else PosContext()
        return LayerPositions(ctx, ctx, memory_ctx)

    def refine(self, i: int, t: torch.Tensor, anchors, box_head: nn.Module):
        return anchors

    def boxes(self, raw: torch.Tensor, anchors: list) -> torch.Tensor:
        """Box predictions (L, B, Q, 4) from the box head's raw outputs and each layer's anchors."""
        return raw.sigmoid()


class PositionedQueries(QueryPositions):
    """Shared by Conditional DETR and DAB-DETR: anchor code, spatial query, per-layer contexts.

    Args:
        d_model: width.
        anchor_pe: an additive encoding module with ``supports_coords`` (``A`` of the module docstring).
        cross: "concat" or "rotary" (module docstring).
        keep_query_pos: add ``p_q`` to the cross-attention's q (and the keys' code to k) in every layer,
            not only the first (DAB's ``keep_query_pos``; Conditional: first layer only).
    """

    def __init__(self, d_model: int, anchor_pe: nn.Module, *, cross: str = "concat", keep_query_pos: bool = False,
                 num_layers: int = 2) -> None:
        super().__init__(d_model)
        self.anchor_pe, self.cross, self.keep_query_pos = anchor_pe, cross, keep_query_pos
        # FFN(t) of the spatial query (Conditional's T), used from layer 1 on: none for a one-layer decoder
        # (a parameter no step uses would stop DDP)
        self.query_scale = MLP(d_model, d_model, d_model, 2) if num_layers > 1 else None

    def code(self, anchors: torch.Tensor) -> torch.Tensor:
        """``A`` of unit (cx, cy[, w, h]) anchors: [A(cy, cx)] or [A(cy, cx), A(w, h)].  # (B|1, Q, d or 2d)"""
        parts = [self.anchor_pe.at(anchors[..., [1, 0]])]  # (B|1, Q, d): y channels, then x
        if anchors.shape[-1] == 4:
            parts.append(self.anchor_pe.at(anchors[..., 2:]))  # (B|1, Q, d): w channels, then h
        return torch.cat(parts, -1)

    def spatial(self, i: int, t: torch.Tensor, code: torch.Tensor) -> torch.Tensor:  # (B, Q, d)
        code = code[..., :self.d_model].to(t.dtype)
        return code if i == 0 else code * self.query_scale(t)

    def contexts(self, i: int, t: torch.Tensor, pos: torch.Tensor, spatial, anchors, memory_ctx) -> LayerPositions:
        first = i == 0 or self.keep_query_pos
        self_ctx = PosContext(pos=pos)
        if self.cross == "rotary":  # rotated at the anchor centre; keys rotated on their grid
            # p_q on q in the first layer, as the papers: there the content is still zero, and a zero
            # query has nothing to rotate
            cross = PosContext(pos=pos if first else None, coords=anchors[..., [1, 0]].float())
            mem = replace(memory_ctx, pos=None, spatial=None)
        elif memory_ctx.pos is None:  # keys without position (pe="none"): the queries' p_q only
            cross = PosContext(pos=pos if first else None)
            mem = memory_ctx
        else:
            cross = PosContext(pos=pos if first else None, spatial=spatial)
            mem = replace(memory_ctx, pos=memory_ctx.pos if first else None, spatial=memory_ctx.pos)
        return LayerPositions(self_ctx, cross, mem, anchors)

    def start(self, embed: torch.Tensor, B: int, dtype: torch.dtype):
        return embed.new_zeros(B, embed.shape[0], self.d_model, dtype=dtype), None


class ConditionalQueries(PositionedQueries):
    """Conditional DETR: reference points ``sigmoid(ref_point_head(p_q))``, fixed for every layer."""

    design = "conditional"

    def __init__(self, d_model: int, anchor_pe: nn.Module, *, cross: str = "concat", keep_query_pos: bool = False,
                 num_layers: int = 2) -> None:
        super().__init__(d_model, anchor_pe, cross=cross, keep_query_pos=keep_query_pos, num_layers=num_layers)
        self.ref_point_head = MLP(d_model, d_model, 2, 2)  # p_q -> (cx, cy) before the sigmoid

    def start(self, embed, B, dtype):
        t, _ = super().start(embed, B, dtype)
        return t, self.ref_point_head(embed[None]).sigmoid()  # (1, Q, 2) unit (cx, cy)

    def layer(self, i, t, embed, anchors, memory_ctx) -> LayerPositions:
        pos = embed[None].to(t.dtype)  # (1, Q, d)
        spatial = self.spatial(i, t, self.code(anchors)) if self.cross == "concat" else None
        return self.contexts(i, t, pos, spatial, anchors, memory_ctx)

    def boxes(self, raw, anchors):
        ref = inverse_sigmoid(anchors[0])  # (1, Q, 2): the same reference in every layer
        return torch.cat([raw[..., :2] + ref, raw[..., 2:]], -1).sigmoid()


class DabQueries(PositionedQueries):
    """DAB-DETR: learned anchors ``sigmoid(query_embed)``, ``p_q = ref_point_head(A(anchor))``.

    Args (besides ``PositionedQueries``'): ``query_dim`` 4 (boxes) or 2 (points); ``modulate_hw``
    (width/height-modulated attention, needs boxes); ``iter_refine`` (anchors updated by the box head
    after every layer, detached as the paper).
    """

    design = "dab"

    def __init__(self, d_model: int, anchor_pe: nn.Module, *, query_dim: int = 4, modulate_hw: bool | None = None,
                 iter_refine: bool = True, cross: str = "concat", keep_query_pos: bool = False,
                 num_layers: int = 2) -> None:
        super().__init__(d_model, anchor_pe, cross=cross, keep_query_pos=keep_query_pos, num_layers=num_layers)
        if query_dim not in (2, 4):
            raise ValueError(f"query_dim={query_dim!r}: expected 4 (anchor boxes cx, cy, w, h) or 2 (points cx, cy)")
        modulate_hw = query_dim == 4 if modulate_hw is None else modulate_hw
        if modulate_hw and query_dim != 4:
            raise ValueError("modulate_hw=True with query_dim=2: width/height modulation needs anchor boxes (query_dim=4)")
        self.query_dim, self.modulate_hw, self.iter_refine = query_dim, bool(modulate_hw), bool(iter_refine)
        self.ref_point_head = MLP(query_dim // 2 * d_model, d_model, d_model, 2)  # A(anchor) -> p_q
        self.ref_anchor_head = MLP(d_model, d_model, 2, 2) if self.modulate_hw else None  # t -> (w_ref, h_ref)

    def start(self, embed, B, dtype):
        t, _ = super().start(embed, B, dtype)
        return t, embed[None].float().sigmoid()  # (1, Q, query_dim)

    def layer(self, i, t, embed, anchors, memory_ctx) -> LayerPositions:
        code = self.code(anchors)  # (B|1, Q, query_dim/2 * d)
        pos = self.ref_point_head(code.to(t.dtype))  # (B|1, Q, d)
        spatial = None
        if self.cross == "concat":
            spatial = self.spatial(i, t, code)  # (B, Q, d): y channels, then x
            if self.modulate_hw:
                ref = self.ref_anchor_head(t).sigmoid()  # (B, Q, 2) as (w_ref, h_ref)
                half = self.d_model // 2
                scale = torch.cat([(ref[..., 1] / anchors[..., 3])[..., None].expand(-1, -1, half),
                                   (ref[..., 0] / anchors[..., 2])[..., None].expand(-1, -1, half)], -1)
                spatial = spatial * scale.to(spatial.dtype)  # y half by h_ref / h, x half by w_ref / w
        return self.contexts(i, t, pos, spatial, anchors, memory_ctx)

    def refine(self, i, t, anchors, box_head):
        if not self.iter_refine:
            return anchors
        qd = self.query_dim
        new = box_head(t)[..., :qd] + inverse_sigmoid(anchors)  # (B, Q, qd)
        return new.sigmoid().detach()

    def boxes(self, raw, anchors):
        qd = self.query_dim
        ref = torch.stack([inverse_sigmoid(a).expand(raw.shape[1], -1, -1) for a in anchors])  # (L, B, Q, qd)
        return torch.cat([raw[..., :qd] + ref, raw[..., qd:]], -1).sigmoid()
