"""Where DETR's object queries are: the positioned query sources (Conditional DETR, DAB-DETR) beside DETR's
own (``vispe.models.detr.queries.base``), for one decoder.

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

How the anchors meet the memory in cross-attention is the design's ``keys``
(``vispe.models.detr.design.designs``): ``"concat"`` (the papers' spatial part, against the keys' additive
grid code), ``"rotary"`` (a rotary encoding in the cross-attention: queries rotated at the anchor
centre, keys at their cells; no spatial part), ``"none"`` (keys without position: ``p_q`` only),
``"sampled"`` (the deformable operator: the memory is sampled around the anchors, which are its
reference points; keys carry no code, and ``p_q`` enters every layer's query, from which the
sampling offsets and weights are predicted).
In every case ``p_q`` is added to the cross-attention's query where ``query_pos_in_cross(i)`` says
so (Conditional: the first layer; DAB: the first, or every layer with ``keep_query_pos``), the one
rule the decoder layers are built from as well. A box bias (``vispe.models.detr.transformer.box_bias``) and a
box relation (``vispe.models.detr.transformer.relation``) need anchor boxes before the first layer
(``anchor_boxes``).

A new strategy is a subclass with ``design``, ``OPTIONS`` and ``build(options, context)`` and one
line in ``designs.STRATEGIES``; ``designs.build_design`` checks the options and builds it (the contract:
``vispe.models.detr.queries.base``).
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from vispe.attention import PosContext
from vispe.models.detr.mlp import MLP, inverse_sigmoid
from vispe.models.detr.queries.base import (  # noqa: F401  (re-exported: the contract's names)
    KEYS,
    ExtraQueries,
    LayerPositions,
    QueryPositions,
    StrategyContext,
    option_bool as _bool,
    option_maybe_bool as _maybe_bool,
)
from vispe.registry import build_in

#: DAB on the deformable operator: "dino" (DINO's: learned content, shared heads, decoder norm; the default) or
#: "legacy" (vispe's before issue 46: zero content, one head per layer under refinement, no decoder norm)
FORMULATIONS = ("dino", "legacy")



def build_anchor_pe(name: str, kwargs: dict, d_model: int):
    """``A`` of the positioned designs: an additive encoding evaluated at the anchors' unit coordinates
    with no grid beside them (box sizes have none), checked here by one evaluation, so that an option
    needing a grid (``center=True``, ``coords`` other than "centered", ...) is refused at build."""
    anchor_pe = build_in(name, dict(dim=d_model, num_prefix_tokens=0), **kwargs)
    if anchor_pe.family != "additive" or not anchor_pe.supports_coords:
        raise ValueError(f"anchor_pe={name!r}: expected an additive encoding that can be evaluated at continuous "
                         f"coordinates (e.g. 'sine'); {name!r} cannot: {anchor_pe.coords_refusal()}")
    try:
        with torch.no_grad():
            anchor_pe.at(torch.full((1, 1, 2), 0.5))
    except ValueError as e:
        raise ValueError(f"anchor_pe={name!r} with anchor_pe_kwargs={kwargs!r}: the anchors' code is evaluated at unit "
                         f"coordinates without a grid beside them (the boxes' widths and heights have none), and "
                         f"this encoding needs one: {e}") from e
    return anchor_pe


class PositionedQueries(QueryPositions):
    """Shared by Conditional DETR and DAB-DETR: anchor code, spatial query, per-layer contexts.

    Args:
        d_model: width.
        anchor_pe: an additive encoding module with ``supports_coords`` (``A`` of the module docstring).
        keys: "concat", "rotary" or "none" (module docstring).
        keep_query_pos: add ``p_q`` to the cross-attention's q (and the keys' code to k) in every layer,
            not only the first (DAB's ``keep_query_pos``; Conditional: first layer only).
        query_scale: build Conditional's ``T`` (``query_scale``), the FFN that scales the spatial query
            from layer 1 on: only with "concat" keys and more than one decoder layer (else it would be a
            parameter no step uses, which stops DDP).
    """

    positioned = True

    decoupled = True
    class_head = "sigmoid"
    OPTIONS = frozenset({"anchor_pe", "anchor_pe_kwargs", "keep_query_pos"})

    def __init__(self, d_model: int, anchor_pe: nn.Module, *, keys: str = "concat", keep_query_pos: bool = False,
                 query_scale: bool = True) -> None:
        super().__init__(d_model)
        if keys not in KEYS[1:]:
            raise ValueError(f"keys={keys!r}: expected one of {', '.join(map(repr, KEYS[1:]))}")
        self.anchor_pe, self.keys, self.keep_query_pos = anchor_pe, keys, keep_query_pos
        self.query_scale = MLP(d_model, d_model, d_model, 2) if query_scale and keys == "concat" else None

    @staticmethod
    def _common(options: dict, c: StrategyContext) -> dict:
        """Options every positioned design takes, popped from ``options``: anchor code, keep_query_pos."""
        anchor_pe = build_anchor_pe(options.pop("anchor_pe", "sine"), options.pop("anchor_pe_kwargs", {}), c.d_model)
        keep = _bool("keep_query_pos", options.pop("keep_query_pos", False))
        return dict(keys=c.keys, keep_query_pos=keep, query_scale=c.num_layers > 1), anchor_pe

    def query_pos_in_cross(self, i: int) -> bool:
        """The papers' rule: ``p_q`` on the cross-attention's query in the first layer, or in every layer
        with ``keep_query_pos`` (the decoder layers build their ``q_pos`` projection from it too); every
        layer with "sampled" keys (the deformable operator predicts its offsets from it, as DINO)."""
        return i == 0 or self.keep_query_pos or self.keys == "sampled"

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
        first = self.query_pos_in_cross(i)
        self_ctx = PosContext(pos=pos)
        if self.keys == "sampled":  # deformable: p_q on the query of every layer, the anchors are the references
            return LayerPositions(self_ctx, PosContext(pos=pos), memory_ctx, anchors)
        if self.keys == "rotary":  # rotated at the anchor centre; keys rotated on their grid
            # p_q on q in the first layer, as the papers: there the content is still zero, and a zero
            # query has nothing to rotate
            cross = PosContext(pos=pos if first else None, coords=anchors[..., [1, 0]].float())
            mem = replace(memory_ctx, pos=None, spatial=None)
        elif self.keys == "none":  # keys without position (pe="none"): the queries' p_q only
            cross = PosContext(pos=pos if first else None)
            mem = replace(memory_ctx, pos=None, spatial=None)
        else:
            cross = PosContext(pos=pos if first else None, spatial=spatial)
            mem = replace(memory_ctx, pos=memory_ctx.pos if first else None, spatial=memory_ctx.pos)
        return LayerPositions(self_ctx, cross, mem, anchors)

    def start(self, embed: torch.Tensor, B: int, dtype: torch.dtype):
        return embed.new_zeros(B, embed.shape[0], self.d_model, dtype=dtype), None


class ConditionalQueries(PositionedQueries):
    """Conditional DETR: reference points ``sigmoid(ref_point_head(p_q))``, fixed for every layer."""

    design = "conditional"

    def __init__(self, d_model: int, anchor_pe: nn.Module, *, keys: str = "concat", keep_query_pos: bool = False,
                 query_scale: bool = True) -> None:
        super().__init__(d_model, anchor_pe, keys=keys, keep_query_pos=keep_query_pos, query_scale=query_scale)
        self.ref_point_head = MLP(d_model, d_model, 2, 2)  # p_q -> (cx, cy) before the sigmoid

    @classmethod
    def build(cls, options, c):
        kw, anchor_pe = cls._common(options, c)
        return cls(c.d_model, anchor_pe, **kw)

    def start(self, embed, B, dtype):
        t, _ = super().start(embed, B, dtype)
        return t, self.ref_point_head(embed[None]).sigmoid()  # (1, Q, 2) unit (cx, cy)

    def layer(self, i, t, embed, anchors, memory_ctx) -> LayerPositions:
        pos = embed[None].to(t.dtype)  # (1, Q, d)
        spatial = self.spatial(i, t, self.code(anchors)) if self.keys == "concat" else None
        return self.contexts(i, t, pos, spatial, anchors, memory_ctx)

    def boxes(self, raw, anchors):
        ref = inverse_sigmoid(anchors[0])  # (1, Q, 2): the same reference in every layer
        return torch.cat([raw[..., :2] + ref, raw[..., 2:]], -1).sigmoid()


class DabQueries(PositionedQueries):
    """DAB-DETR: learned anchors ``sigmoid(query_embed)``, ``p_q = ref_point_head(A(anchor))``.

    Args (besides ``PositionedQueries``'): ``query_dim`` 4 (boxes) or 2 (points); ``modulate_hw``
    (width/height-modulated attention, needs boxes and the spatial part of "concat" keys; default:
    on where it applies); ``iter_refine`` (anchors updated by the box head between layers, detached
    as the paper); ``random_refpoints_xy``, ``enc_pos_scale``: read by the model (``designs``).
    """

    design = "dab"
    OPTIONS = PositionedQueries.OPTIONS | {"query_dim", "modulate_hw", "iter_refine", "random_refpoints_xy",
                                           "enc_pos_scale", "look_forward_twice", "formulation"}

    def __init__(self, d_model: int, anchor_pe: nn.Module, *, query_dim: int = 4, modulate_hw: bool | None = None,
                 iter_refine: bool = True, keys: str = "concat", keep_query_pos: bool = False,
                 query_scale: bool = True, random_refpoints_xy: bool = False, enc_pos_scale: bool | None = None,
                 look_forward_twice: bool = False, formulation: str | None = None, num_queries: int = 100) -> None:
        super().__init__(d_model, anchor_pe, keys=keys, keep_query_pos=keep_query_pos, query_scale=query_scale)
        if look_forward_twice and not iter_refine:
            raise ValueError("decoder_kwargs['look_forward_twice']=True with iter_refine=False: it lets layer i + 1's "
                             "boxes reach layer i's refinement, and there is none; expected iter_refine=True")
        if formulation is not None and keys != "sampled":
            raise ValueError(f"decoder_kwargs['formulation']={formulation!r} with attention='dense': an option of DAB "
                             "on the deformable operator (DINO's query formulation or vispe's before issue 46); "
                             "expected it unset")
        formulation = "dino" if formulation is None else formulation
        if formulation not in FORMULATIONS:
            raise ValueError(f"decoder_kwargs['formulation']={formulation!r}: expected one of "
                             f"{', '.join(map(repr, FORMULATIONS))}")
        self.look_forward_twice = bool(look_forward_twice)
        dino = keys == "sampled" and formulation == "dino"
        self.formulation = formulation if keys == "sampled" else None
        # DINO (deformable operator): learned content queries, heads shared by the layers, the decoder norm.
        # vispe's before issue 46 ("legacy"): zero content, one head per layer under refinement, no norm
        self.tgt_embed = nn.Embedding(num_queries, d_model) if dino else None  # (Q, d) the queries' content
        if keys == "sampled":
            self.shared_heads = dino or not iter_refine
            self.decoder_norm = dino
        if query_dim not in (2, 4):
            raise ValueError(f"query_dim={query_dim!r}: expected 4 (anchor boxes cx, cy, w, h) or 2 (points cx, cy)")
        if modulate_hw and query_dim != 4:
            raise ValueError("modulate_hw=True with query_dim=2: width/height modulation needs anchor boxes (query_dim=4)")
        if modulate_hw and keys != "concat":
            raise ValueError(f"modulate_hw=True with {keys!r} keys: width/height modulation scales the spatial part of "
                             "the query, which only keys with an additive code have (rotary keys are rotated at the "
                             "anchor centre, keys without position have none, the deformable operator's are only sampled); "
                             "expected modulate_hw=False or None")
        modulate_hw = query_dim == 4 and keys == "concat" if modulate_hw is None else modulate_hw
        self.query_dim, self.modulate_hw, self.iter_refine = query_dim, bool(modulate_hw), bool(iter_refine)
        self.refines = self.iter_refine
        self.anchor_boxes = query_dim == 4
        self.random_refpoints_xy, self.enc_pos_scale = random_refpoints_xy, enc_pos_scale
        self.ref_point_head = MLP(query_dim // 2 * d_model, d_model, d_model, 2)  # A(anchor) -> p_q
        self.ref_anchor_head = MLP(d_model, d_model, 2, 2) if self.modulate_hw else None  # t -> (w_ref, h_ref)

    @classmethod
    def build(cls, options, c):
        kw, anchor_pe = cls._common(options, c)
        return cls(c.d_model, anchor_pe, query_dim=options.pop("query_dim", 4),
                   modulate_hw=_maybe_bool("modulate_hw", options.pop("modulate_hw", None)),
                   iter_refine=_bool("iter_refine", options.pop("iter_refine", True)),
                   random_refpoints_xy=_bool("random_refpoints_xy", options.pop("random_refpoints_xy", False)),
                   enc_pos_scale=_maybe_bool("enc_pos_scale", options.pop("enc_pos_scale", None)),
                   look_forward_twice=_bool("look_forward_twice", options.pop("look_forward_twice", False)),
                   formulation=options.pop("formulation", None), num_queries=c.num_queries, **kw)

    def start(self, embed, B, dtype):
        t, _ = super().start(embed, B, dtype)
        if self.tgt_embed is not None:  # DINO's learned content
            t = self.tgt_embed.weight[None].to(dtype).expand(B, -1, -1)  # (B, Q, d)
        return t, embed[None].float().sigmoid()  # (1, Q, query_dim)

    def layer(self, i, t, embed, anchors, memory_ctx) -> LayerPositions:
        code = self.code(anchors)  # (B|1, Q, query_dim/2 * d)
        pos = self.ref_point_head(code.to(t.dtype))  # (B|1, Q, d)
        spatial = None
        if self.keys == "concat":
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
        return new.sigmoid()

    def boxes(self, raw, anchors):
        qd = self.query_dim
        ref = torch.stack([inverse_sigmoid(a).expand(raw.shape[1], -1, -1) for a in anchors])  # (L, B, Q, qd)
        return torch.cat([raw[..., :qd] + ref, raw[..., qd:]], -1).sigmoid()
