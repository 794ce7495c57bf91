"""The detector's query designs as one typed object: ``create_detr(decoder=..., decoder_kwargs=..., ...)``.

| ``decoder`` | ``decoder_kwargs`` (each paper's ablations; anything else is refused) |
|---|---|
| ``"detr"`` | none (the object queries' placement is ``query_pos_at`` / ``pe_at["queries"]``) |
| ``"conditional"`` | ``anchor_pe`` ("sine"), ``anchor_pe_kwargs``, ``keep_query_pos`` (False) |
| ``"dab"`` | ``anchor_pe``, ``anchor_pe_kwargs``, ``query_dim`` (4 boxes or 2 points), ``modulate_hw`` (default: on with boxes and additive keys), ``iter_refine`` (True), ``random_refpoints_xy`` (False: the anchors' (cx, cy) drawn uniformly and kept fixed), ``keep_query_pos`` (False), ``enc_pos_scale`` (default: on where the encoder adds an additive code at its attention layers: DAB's encoder scales that code by an MLP of the tokens), ``look_forward_twice`` (False; DINO's: the next layer's boxes reach this layer's refinement), ``formulation`` (deformable operator only: "dino", the default, or "legacy") |

How anchors meet the keys (``Design.cross.keys``) follows from the decoder's key encoding (``dec_pe``,
else ``pe``): an additive one gives the papers' concatenated spatial part ("concat"); a rotary one
(``rope_axial``, ``rope_mixed``) rotates queries at their anchor centres and keys at their cells
("rotary"; the encoding's train-time augmentations are refused there: they move the keys and not the
anchors); none gives keys without position ("none"). Modules a combination does not use are not built
(``query_scale`` and ``ref_anchor_head`` without additive keys, ``k_pos`` / ``q_spatial`` without key
positions, ``enc_pos_scale`` without an additive code in the encoder's attention), and options that
would need them are refused with the reason, so every parameter gets a gradient (DDP requires it).

``box_bias="boxrpb"`` (``box_bias_kwargs``: ``hidden`` 512, ``transform`` "linear" | "abs_log8",
``stride`` = the backbone's) adds Plain-DETR's box bias to every cross-attention;
``query_relation="relation"`` (``query_relation_kwargs``: ``num_feats`` 16, ``temperature`` 10000,
``scale`` 100) adds Relation-DETR's box-to-box bias to the self-attention of decoder layers 1, 2, ...
(``vispe.models.detr.transformer.relation``). Both need anchor boxes before the first layer (``"dab"``,
``query_dim=4``). ``class_head``: "softmax" (DETR's K + 1 logits) or "sigmoid" (K logits and the focal
loss, the default of the positioned designs, as their papers).

``init`` (``vispe.models.detr.init``): "papers" (default; the Conditional DETR / DAB-DETR code's
initialisation for the positioned designs) or "legacy" (vispe's before issue 35). DETR's design has
one initialisation, DETR's own, under either name.

A cross-attention operator is ``CrossSpec.operator`` (``create_detr(attention=...)``): "dense"
(``transformer.CROSS_OPERATORS``: every query against every memory cell) or "deformable" (Deformable
DETR's multi-scale sampling at each query's reference point, ``vispe.models.detr.deformable_model``;
its checks: ``vispe.models.detr.design.rules``). A query strategy is a ``queries.QueryPositions``
subclass in ``STRATEGIES`` (here): "detr", "conditional", "dab", and "deformable" (Deformable DETR's
own, ``vispe.models.detr.queries.deformable``). On the deformable operator the designs are
"deformable" and "dab" (DAB's anchors become the reference points: DINO's query formulation, without
denoising); the design is the one place that combines strategy, operator, keys and options.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vispe.models.detr.design import rules
from vispe.models.detr.design.placement import Placement
from vispe.models.detr.design.specs import CrossSpec, LayerSpec
from vispe.models.detr.queries.base import QueryPositions, StrategyContext
from vispe.models.detr.queries.deformable import DeformableQueries
from vispe.models.detr.queries.dino import DinoQueries
from vispe.models.detr.queries.positioned import ConditionalQueries, DabQueries
from vispe.registry import get

#: ``create_detr(decoder=...)``: the query-position strategy of each design
STRATEGIES = {"detr": QueryPositions, "conditional": ConditionalQueries, "dab": DabQueries,
              "deformable": DeformableQueries, "dino": DinoQueries}
BUILT_IN = tuple(STRATEGIES)

CLASS_HEADS = ("softmax", "sigmoid")
BOX_BIASES = ("boxrpb",)
RELATIONS = ("relation",)
INITS = ("papers", "legacy")
OPERATORS = ("dense", "deformable")  # create_detr(attention=...)
RELATION_KWARGS = ("num_feats", "temperature", "scale")
BOX_BIAS_KWARGS = ("hidden", "transform", "stride")


def register_strategy(cls: type[QueryPositions], *, operators: tuple[str, ...] = ("dense",)) -> type[QueryPositions]:
    """Make ``cls`` (a ``QueryPositions`` subclass: ``design``, ``OPTIONS``, ``build``) the design
    ``create_detr(decoder=cls.design)`` on the cross-attention ``operators`` it names (the rule the
    builders check, ``rules.DESIGN_OPERATORS``). A new design is its strategy file and this call."""
    if not (isinstance(cls, type) and issubclass(cls, QueryPositions)):
        raise ValueError(f"cls={cls!r}: expected a QueryPositions subclass (vispe.models.detr.queries.base)")
    name = cls.design
    if name in STRATEGIES:
        raise ValueError(f"decoder={name!r} is registered already ({STRATEGIES[name].__name__}): expected a new name")
    ops = tuple(operators)
    if not ops or any(op not in OPERATORS for op in ops):
        raise ValueError(f"operators={operators!r}: expected some of {', '.join(map(repr, OPERATORS))}")
    STRATEGIES[name] = cls
    rules.DESIGN_OPERATORS[name] = ops
    return cls


def unregister_strategy(name: str) -> None:
    """Remove a design added by ``register_strategy`` (the built-in ones stay)."""
    if name in BUILT_IN:
        raise ValueError(f"decoder={name!r} is built in: expected a design added by register_strategy")
    STRATEGIES.pop(name, None)
    rules.DESIGN_OPERATORS.pop(name, None)


@dataclass
class Design:
    """A query design, typed: the strategy (a built module), the decoder's cross-attention, the depth,
    the self-attention relation, the encoder's code scaling, the initialisation scheme."""

    queries: QueryPositions
    cross: CrossSpec
    num_layers: int
    relation: dict | None = None  # Relation-DETR's PositionRelation kwargs, or None
    enc_pos_scale: bool = False
    init: str = "papers"

    @property
    def name(self) -> str:
        return self.queries.design

    @property
    def class_head(self) -> str:
        """The design's default class head (its paper's)."""
        return self.queries.class_head

    def layers(self) -> list[LayerSpec]:
        """One spec per decoder layer; ``p_q`` placement is the strategy's ``query_pos_in_cross``."""
        q = self.queries
        # the sampling operator's layers (the deformable papers') add p_q to the self-attention's q and k
        # through the shared projections: no separate position projections there
        decoupled = q.decoupled and self.cross.operator == "dense"
        return [LayerSpec(decoupled=decoupled, query_pos=q.query_pos_in_cross(i), cross=self.cross)
                for i in range(self.num_layers)]


def build_design(decoder: str, decoder_kwargs: dict, *, box_bias: str | None = None,
                 box_bias_kwargs: dict | None = None, query_relation: str | None = None,
                 query_relation_kwargs: dict | None = None, init: str = "papers",
                 d_model: int, num_layers: int, placement: Placement, pe: str, dec_pe: str | None = None,
                 enc_layers: int = 1, stride: float = 16.0, attention: str = "dense", num_queries: int = 100,
                 num_classes: int | None = None) -> Design:
    """Check every option against the design, the operator and the encodings, and build the typed design."""
    if attention not in OPERATORS:
        raise ValueError(f"attention={attention!r}: expected one of {', '.join(map(repr, OPERATORS))}")
    if decoder not in STRATEGIES:
        raise ValueError(f"decoder={decoder!r}: expected one of {', '.join(map(repr, STRATEGIES))}")
    cls = STRATEGIES[decoder]
    kw = dict(decoder_kwargs)
    unknown = sorted(set(kw) - cls.OPTIONS)
    if unknown:
        allowed = ", ".join(sorted(cls.OPTIONS)) or "none"
        raise ValueError(f"decoder_kwargs has {unknown} for decoder={decoder!r}: expected some of {allowed}")
    if init not in INITS:
        raise ValueError(f"init={init!r}: expected one of {', '.join(map(repr, INITS))}")
    _check_choice("box_bias", box_bias, BOX_BIASES, box_bias_kwargs)
    _check_choice("query_relation", query_relation, RELATIONS, query_relation_kwargs)
    if attention == "deformable":
        rules.check(decoder, kw, placement=placement, pe=pe, dec_pe=dec_pe, box_bias=box_bias, init=init)
    else:
        rules.check_operator(decoder, attention)
        rules.check_family(pe, get(pe).family, placement, dec_pe, get(dec_pe).family if dec_pe is not None else None,
                           design=decoder, positioned=cls.positioned)
    if cls.positioned and placement.queries != "attn":
        raise ValueError(f"pe_at['queries']={placement.queries!r} with decoder={decoder!r}: positioned queries take "
                         "their positions at every attention layer; expected 'attn'")
    keys = "sampled" if attention == "deformable" else _positioned_keys(pe, dec_pe, placement) if cls.positioned \
        else "add"
    queries = cls.build(kw, StrategyContext(d_model, num_layers, keys, placement.queries, num_queries, num_classes))
    for name, value in (("box_bias", box_bias), ("query_relation", query_relation)):
        if value is not None and not queries.anchor_boxes:
            detail = ", query_dim=2" if decoder == "dab" else ""
            raise ValueError(f"{name}={value!r} with decoder={decoder!r}{detail}: it needs anchor boxes before the "
                             "first decoder layer (decoder='dab', query_dim=4)")
    if query_relation is not None and num_layers < 2:
        raise ValueError(f"query_relation={query_relation!r} with dec_layers={num_layers}: the relation biases layer "
                         "i >= 1 by the boxes of the layers before it; expected dec_layers >= 2")
    for name, kwargs, allowed in (("query_relation_kwargs", query_relation_kwargs, RELATION_KWARGS),
                                  ("box_bias_kwargs", box_bias_kwargs, BOX_BIAS_KWARGS)):
        bad = sorted(set(kwargs or {}) - set(allowed))
        if bad:
            raise ValueError(f"{name} has {bad}: expected some of {', '.join(allowed)}")
    relation = dict(query_relation_kwargs or {}) if query_relation is not None else None
    bias = {"stride": float(stride), **(box_bias_kwargs or {})} if box_bias is not None else None
    enc_scale = False if attention == "deformable" else _enc_pos_scale(queries, placement, pe, enc_layers)
    return Design(queries, CrossSpec(attention, keys, bias), num_layers, relation, enc_scale, init)


def _check_choice(name: str, value, choices: tuple, kwargs) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{name}={value!r}: expected None or one of {', '.join(map(repr, choices))}")
    if value is None and kwargs:
        raise ValueError(f"{name}_kwargs={kwargs!r} with {name}=None: there is nothing to take them")


def _positioned_keys(pe: str, dec_pe: str | None, placement: Placement) -> str:
    """How the positioned queries' cross-attention keys carry position (``queries.KEYS``)."""
    family = key_family(pe, dec_pe)
    if family == "none" or placement.decoder == "none":
        return "none"
    return "rotary" if family == "rotary" else "concat"


def _enc_pos_scale(queries: QueryPositions, placement: Placement, pe: str, enc_layers: int) -> bool:
    """DAB's encoder scaling: built where the encoder adds an additive code at its attention layers."""
    wanted = queries.enc_pos_scale
    applies = enc_layers > 0 and placement.encoder == "attn" and get(pe).family == "additive"
    if wanted and not applies:
        why = ("there are no encoder layers" if enc_layers == 0 else
               f"pe={pe!r} is a {get(pe).family} encoding" if placement.encoder == "attn" else
               f"pe_at encoder={placement.encoder!r}")
        raise ValueError(f"decoder_kwargs['enc_pos_scale']=True: it scales the additive code the encoder adds at its "
                         f"attention layers, and {why}; expected enc_pos_scale=False (or leave it unset)")
    return applies if wanted is None else bool(wanted)


def key_family(pe: str, dec_pe: str | None) -> str:
    """Family of the encoding the decoder's keys get: ``dec_pe``'s, else ``pe``'s."""
    return get(dec_pe if dec_pe is not None else pe).family


def check_cross_rotary(pe, name: str, arg: str) -> None:
    """A rotary encoding in cross-attention rotates the keys on their grid and the queries at ``at()``:
    options that ``at()`` cannot follow are refused here, at build, not at the first forward."""
    moving = pe.augmentations() if hasattr(pe, "augmentations") else ()
    if moving:
        raise ValueError(f"{arg}={name!r} with {', '.join(moving)} in the decoder's cross-attention: these train-time "
                         "augmentations move the keys' coordinates and not the anchors' (queries are rotated at "
                         "their anchors, at() takes no augmentation), which adds noise to every anchor-to-key offset; "
                         "keep them in the encoder and give the decoder its own rotary encoding without them "
                         "(dec_pe=..., dec_pe_kwargs=...)")
    try:
        with torch.no_grad():
            pe.at(torch.full((1, 1, 2), 0.5), torch.tensor([[2.0, 3.0]]))
    except ValueError as e:
        raise ValueError(f"{arg}={name!r} in the decoder's cross-attention: queries are rotated at their anchors "
                         f"(at()), and this encoding cannot be: {e}") from e


def fix_refpoints_xy(weight, generator=None) -> None:
    """DAB-DETR's ``random_refpoints_xy``: anchor centres drawn uniformly in (0, 1) and kept fixed.

    DAB-DETR's code sets ``requires_grad = False`` on a slice of the weight, which PyTorch ignores
    (the centres then train); here their gradient is zeroed by a hook, so they stay where drawn
    (weight decay, if the optimiser applies it to ``query_embed``, still shrinks them slightly).
    """
    from vispe.models.detr.mlp import inverse_sigmoid

    with torch.no_grad():
        weight[:, :2] = inverse_sigmoid(torch.rand(weight.shape[0], 2, generator=generator))

    def zero_xy(grad):
        grad = grad.clone()
        grad[:, :2] = 0
        return grad

    weight.register_hook(zero_xy)

