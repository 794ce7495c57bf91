"""Builds the multi-scale detector for ``create_detr(attention="deformable", ...)`` and initialises it as
Deformable DETR's code does (fundamentalvision/Deformable-DETR ``models/deformable_detr.py`` and
``deformable_transformer.py``).

The options (besides ``create_detr``'s own; what each design accepts: ``rules``):

* ``num_feature_levels`` (4): levels L; the backbone gives ``backbone_levels`` of them (default
  ``multiscale.backbone_levels(L)``: min(L, 3), 1 for one level; its last ones: a ResNet's C3-C5, C5
  alone for one level; small_cnn's last stages; a ViT's simple pyramid) and ``InputProjection``'s 3x3
  stride-2 convolutions the rest (``backbone_levels=1``: one backbone map and L - 1 extra levels).
* ``n_points`` (4): sampling points per head and level, one number or (encoder, decoder).
* ``level_pe``: "learned" (the papers' level embedding, default) or "none".
* The input projections' GroupNorm is mask-aware (statistics over each image's valid cells, padding
  zeroed) when the backbone is: small_cnn and ViTs always, a ResNet with ``backbone_mask_aware=True``;
  a ResNet without it is the papers' configuration (GroupNorm over the padded map).

The papers' initialisation (``deformable_init``): the transformer's matrices Xavier-uniform (each
encoder / decoder layer resets itself, ``MSDeformAttn`` its own), the level embedding N(0, 1), the
class heads' bias at the focal prior ``-log((1 - 0.01) / 0.01)`` (sigmoid heads), every box head's last
layer zero, and for Deformable DETR's single-stage queries the first box head's size bias -2 (boxes
start small around the reference points); ``reference_points`` Xavier-uniform with zero bias, the
strategy's other matrices (DAB's ``ref_point_head``, the two-stage ``enc_output`` / ``pos_trans``)
Xavier-uniform with PyTorch's default biases, the input projections Xavier-uniform with zero biases.
With one head per layer, the heads start as copies of one (the papers' ``_get_clones``).
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn

from vispe import _checks
from vispe.models.detr.backbone.cnn import RESNETS
from vispe.models.detr.deformable_model import DeformableDecoder, DeformableDETR
from vispe.models.detr.design.designs import CLASS_HEADS, fix_refpoints_xy
from vispe.models.detr.design.rules import check_heads, check_level_pe
from vispe.models.detr.init import PRIOR_PROB, xavier_matrices
from vispe.models.detr.neck.level_pos import LEVEL_PES, LevelPositions
from vispe.models.detr.neck.multiscale import InputProjection, build_multiscale_backbone
from vispe.models.detr.transformer.decoder_layer import DecoderLayer
from vispe.models.detr.transformer.deformable_encoder import DeformableEncoder
from vispe.models.detr.transformer.relation import PositionRelation
from vispe.registry import build_in, get


def _points(n_points) -> tuple[int, int]:
    """``n_points`` as (encoder, decoder)."""
    pair = tuple(n_points) if isinstance(n_points, (tuple, list)) else (n_points, n_points)
    if len(pair) != 2 or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in pair):
        raise ValueError(f"n_points={n_points!r}: expected a positive integer or (encoder, decoder) positive integers")
    return pair


def build_deformable(num_classes: int, *, design, placement, backbone, backbone_weights, dilation, train_backbone,
                     backbone_widths, backbone_kwargs, backbone_mask_aware, pe, pe_kwargs, dec_pe_kwargs, grid,
                     num_queries, d_model, nheads, enc_layers, dec_layers, dim_feedforward, dropout, attn_dropout,
                     aux_loss, class_head, activation, num_feature_levels, n_points, level_pe,
                     backbone_levels=None) -> DeformableDETR:
    """The detector (module docstring); ``design`` from ``designs.build_design(attention="deformable")``."""
    L = _checks.positive_int("num_feature_levels", 4 if num_feature_levels is None else num_feature_levels)
    enc_points, dec_points = _points(4 if n_points is None else n_points)
    level_pe = _checks.choice("level_pe", check_level_pe(level_pe, placement), LEVEL_PES)
    check_heads(design.queries, aux_loss)
    if dec_pe_kwargs:
        raise ValueError(f"dec_pe_kwargs={dec_pe_kwargs!r} with attention='deformable': there is no decoder key "
                         "encoding to take them")
    net = build_multiscale_backbone(backbone, L, weights=backbone_weights, dilation=dilation,
                                    train_backbone=train_backbone, mask_aware=backbone_mask_aware,
                                    widths=backbone_widths, kwargs=backbone_kwargs, from_backbone=backbone_levels)
    aware = backbone_mask_aware or not (isinstance(backbone, str) and backbone in RESNETS)
    proj = InputProjection(net.num_channels, d_model, L, mask_aware=aware)
    context = dict(dim=d_model, num_heads=nheads, head_dim=d_model // nheads, num_prefix_tokens=0)
    if grid is not None:
        context["grid"] = _checks.grid_shape("grid", grid)
    family, code, peg = get(pe).family, None, None
    if family == "additive":
        code = build_in(pe, context, **pe_kwargs)
    elif family == "conditional":
        peg = build_in(pe, context, **pe_kwargs)
    elif pe_kwargs:
        raise ValueError(f"pe_kwargs={pe_kwargs!r}: the encoding {pe!r} takes no settings")
    level_pos = LevelPositions(code, d_model, L, level_pe if level_pe == "learned" else None)
    if enc_layers == 0 and placement.encoder == "attn" and (code is not None or level_pe == "learned"):
        raise ValueError(f"enc_layers=0 with pe_at encoder='attn': the tokens' code ({pe!r} and the level embedding "
                         f"level_pe={level_pe!r}) enters only the encoder's layers, so it would be used nowhere; "
                         "expected pe_at encoder='input' (added to the memory), or pe='none' and level_pe='none'")
    encoder = DeformableEncoder(d_model, nheads, enc_layers, dim_feedforward, dropout, L, enc_points, activation)
    design.cross = replace(design.cross, levels=L, points=dec_points)  # what the sampling operator reads
    decoder = DeformableDecoder((DecoderLayer(d_model, nheads, dim_feedforward, dropout, attn_dropout, activation, spec)
                                 for spec in design.layers()),
                                nn.LayerNorm(d_model) if design.queries.decoder_norm else None)
    head = _checks.choice("class_head", class_head or design.class_head, getattr(design.queries, "class_heads", CLASS_HEADS))
    model = DeformableDETR(net, proj, level_pos, encoder, decoder, design, num_classes=num_classes,
                           num_queries=num_queries, placement=placement, pe=peg, aux_loss=aux_loss, class_head=head)
    if design.queries.random_refpoints_xy:
        fix_refpoints_xy(model.query_embed.weight)
    if design.relation is not None:
        decoder.relation = PositionRelation(nheads, **design.relation)
    deformable_init(model)
    return model


def _unique(modules) -> list[nn.Module]:
    seen, out = set(), []
    for m in modules:
        if id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


def deformable_init(model: DeformableDETR) -> None:
    """Deformable DETR's initialisation of the heads and the query strategy (module docstring); the layers,
    input projections and level embedding initialise themselves when built."""
    q = model.queries
    with torch.no_grad():
        if model.class_head == "sigmoid":
            for head in _unique(model.class_embed):
                nn.init.constant_(head.bias, -math.log((1 - PRIOR_PROB) / PRIOR_PROB))
        for box in _unique(model.bbox_embed):
            nn.init.zeros_(box.layers[-1].weight)
            nn.init.zeros_(box.layers[-1].bias)
        if q.design == "deformable" and not q.two_stage:
            nn.init.constant_(model.bbox_embed[0].layers[-1].bias[2:], -2.0)
        xavier_matrices(q)
        if hasattr(q, "reset_proposal_heads"):  # a strategy's own proposal heads (DINO's) start as the heads do
            q.reset_proposal_heads()
        if getattr(q, "reference_points", None) is not None:
            nn.init.zeros_(q.reference_points.bias)
