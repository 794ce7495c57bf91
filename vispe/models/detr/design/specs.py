"""What one decoder layer is built from: its cross-attention (``CrossSpec``) and the layer (``LayerSpec``),
as ``vispe.models.detr.design.designs.Design.layers()`` gives them to ``transformer.decoder_layer.DecoderLayer``."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CrossSpec:
    """Every decoder layer's cross-attention: the operator, how its keys carry position, its box bias."""

    operator: str = "dense"  # designs.OPERATORS (transformer.decoder_layer.CROSS_OPERATORS)
    keys: str = "add"  # queries.base.KEYS
    box_bias: dict | None = None  # BoxRPB's kwargs (vispe.models.detr.transformer.box_bias), or None
    levels: int = 1  # feature levels the operator reads (deformable: num_feature_levels)
    points: int = 4  # sampling points per head and level (deformable: the decoder's n_points)


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: separate position projections (``decoupled``), ``p_q`` on its cross-attention's
    query (``query_pos``), and the cross-attention (``cross``)."""

    decoupled: bool = False
    query_pos: bool = True
    cross: CrossSpec = field(default_factory=CrossSpec)
