"""The query-source contract of the detector, and its simplest source, DETR's learned queries.

A query source (a "strategy", ``queries_at`` below) turns the model's learned query embedding
(``query_embed.weight``) or the encoder's proposals into the decoder's queries, and gives every decoder
layer the contexts of its two attentions (``LayerPositions``): ``start`` (the first queries and anchors),
``layer(i, ...)`` (layer i's contexts), ``refine`` (the next layer's anchors), ``boxes`` (box predictions
from the head's raw outputs), ``extra_queries`` (queries run before the matching ones: DINO's denoising
groups, ``ExtraQueries``). Its class attributes say what the rest of the detector builds for it
(``decoupled`` projections, ``shared_heads``, ``decoder_norm``, ``refines``, ``from_proposals``, ...).

``QueryPositions`` is the base and DETR's own design (``decoder="detr"``: learned vectors ``p_q`` added
to q/k of self-attention and to q of cross-attention); the anchored designs (Conditional DETR, DAB-DETR)
are in ``positioned``, Deformable DETR's in ``deformable``, DINO's in ``dino``. A new source is one
subclass with ``design``, ``OPTIONS`` and ``build(options, context)`` and one line in
``vispe.models.detr.design.designs.STRATEGIES`` (or ``register_strategy``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vispe.attention import PosContext

KEYS = ("add", "concat", "rotary", "none", "sampled")  # how the cross-attention's keys carry position (module docstring)


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy is built for: width, decoder depth, the keys' position and where DETR's queries go."""

    d_model: int
    num_layers: int
    keys: str = "add"  # KEYS
    queries_at: str = "attn"  # DETR's learned query positions: "attn" | "input"
    num_queries: int = 100  # Q (a strategy with learned content per query sizes its table by it)
    num_classes: int | None = None  # K (a strategy with a class table of its own: DINO's label embedding)


@dataclass
class ExtraQueries:
    """Queries a strategy adds before the matching ones (DN-DETR / DINO's denoising groups), for one batch.

    ``content`` (B, D, d) and ``anchors`` (B, D, 4) unit (cx, cy, w, h) go first in the decoder, before the
    Q matching queries; ``attn_mask`` (D + Q, D + Q) bool, True = query i may not attend to query j, is the
    decoder self-attention's; ``meta`` rides along to the loss (``out["dn_outputs"]["meta"]``)."""

    content: torch.Tensor
    anchors: torch.Tensor
    attn_mask: torch.Tensor | None = None
    meta: dict | None = None


@dataclass
class LayerPositions:
    """The contexts of one decoder layer's two attentions, and its anchor boxes (or None)."""

    self_ctx: PosContext
    cross_ctx: PosContext
    memory_ctx: PosContext
    anchors: torch.Tensor | None = None  # (B|1, Q, 2|4) unit (cx, cy[, w, h])


def option_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"decoder_kwargs[{name!r}]={value!r}: expected True or False")
    return value


def option_maybe_bool(name: str, value) -> bool | None:
    return None if value is None else option_bool(name, value)


class QueryPositions(nn.Module):
    """Base: DETR's learned query positions (``design="detr"``). ``queries_at`` "attn" | "input"."""

    design = "detr"
    OPTIONS: frozenset = frozenset()  # the design's decoder_kwargs
    decoupled = False  # the decoder's attentions project positions with their own weights (q_pos / k_pos)
    #: anchored queries: on the dense operator the keys' position meets the anchors' ("concat" / "rotary" /
    #: "none", ``designs``) and the queries take position at every attention (False: DETR's "add" keys)
    positioned = False
    anchor_boxes = False  # anchors are boxes (cx, cy, w, h) before the first layer
    class_head = "softmax"  # the paper's class head
    query_dim: int | None = None  # width of the learned query embedding (None: d_model)
    enc_pos_scale: bool | None = False  # DAB-DETR's encoder scales its additive code by an MLP of the tokens
    #: (None: where the encoder has an additive code at its attention layers, ``designs``)
    random_refpoints_xy = False
    refines = False  # the anchors are refined between layers (``refine`` returns new anchors; the loop detaches them)
    from_proposals = False  # the queries come from the encoder's proposals (two-stage), not an embedding
    shared_heads = True  # one class and one box head for every layer (False: one per layer, the papers' clones)
    decoder_norm = True  # the decoder's LayerNorm on every layer's output before the heads (DETR, DINO)
    look_forward_twice = False  # DINO: layer i + 1's boxes add to layer i's refined anchors before the detach

    def __init__(self, d_model: int, *, queries_at: str = "attn") -> None:
        super().__init__()
        self.d_model, self.queries_at = d_model, queries_at

    @classmethod
    def build(cls, options: dict, c: StrategyContext) -> QueryPositions:
        """The strategy for ``c`` from ``options`` (decoder_kwargs, checked against ``OPTIONS``; popped)."""
        return cls(c.d_model, queries_at=c.queries_at)

    def query_pos_in_cross(self, i: int) -> bool:
        """Whether layer i's cross-attention query gets ``p_q`` (DETR: every layer, when at "attn")."""
        return self.queries_at == "attn"

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
        """The anchors of layer i + 1 (called between layers only); with ``refines`` not yet detached (the
        decode loop detaches them, and keeps them attached for the boxes under ``look_forward_twice``)."""
        return anchors

    def extra_queries(self, targets: list[dict] | None, B: int, d: int, dtype: torch.dtype,
                      device: torch.device) -> ExtraQueries | None:
        """Queries to run before the matching ones in this forward (denoising groups built from ``targets``),
        or None (every strategy here; DINO's returns its groups in training)."""
        return None

    def boxes(self, raw: torch.Tensor, anchors: list) -> torch.Tensor:
        """Box predictions (L, B, Q, 4) from the box head's raw outputs and each layer's anchors."""
        return raw.sigmoid()
