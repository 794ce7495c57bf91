"""The detector's one builder: ``create_detr`` checks the options, builds the design (``design.designs``), and
assembles the detector of its cross-attention operator: ``DETR`` (dense) or ``DeformableDETR`` (deformable,
its initialisation as Deformable DETR's code: ``init.deformable_init``).

The deformable operator's options (besides ``create_detr``'s own; what each design accepts: ``rules``):

* ``num_feature_levels`` (4): levels L; the backbone gives ``backbone_levels`` of them (default
  ``multiscale.backbone_levels(L)``: min(L, 3), 1 for one level; its last ones: a ResNet's C3-C5, C5
  alone for one level; small_cnn's last stages; a ViT's simple pyramid) and ``InputProjection``'s 3x3
  stride-2 convolutions the rest (``backbone_levels=1``: one backbone map and L - 1 extra levels).
* ``n_points`` (4): sampling points per head and level, one number or (encoder, decoder).
* ``level_pe``: "learned" (the papers' level embedding, default) or "none".
* The input projections' GroupNorm is mask-aware (statistics over each image's valid cells, padding
  zeroed) when the backbone is: small_cnn and ViTs always, a ResNet with ``backbone_mask_aware=True``;
  a ResNet without it is the papers' configuration (GroupNorm over the padded map).
"""
from __future__ import annotations

from dataclasses import replace

from torch import nn

from vispe import _checks
from vispe.models.detr.backbone.cnn import RESNETS, build_backbone
from vispe.models.detr.deformable_model import DeformableDecoder, DeformableDETR
from vispe.models.detr.design.designs import CLASS_HEADS, build_design, fix_refpoints_xy
from vispe.models.detr.design.placement import parse_placement
from vispe.models.detr.design.rules import check_heads, check_level_pe
from vispe.models.detr.init import deformable_init, papers_init
from vispe.models.detr.load.upgrade import resolved_decoder_kwargs
from vispe.models.detr.model import DETR
from vispe.models.detr.neck.level_pos import LEVEL_PES, LevelPositions
from vispe.models.detr.neck.multiscale import InputProjection, build_multiscale_backbone
from vispe.models.detr.transformer.decoder_layer import DecoderLayer
from vispe.models.detr.transformer.deformable_encoder import DeformableEncoder
from vispe.models.detr.transformer.dense import Transformer
from vispe.models.detr.transformer.relation import PositionRelation
from vispe.registry import build_in, get


def create_detr(num_classes: int, *, backbone: str | nn.Module = "resnet50", backbone_weights=None,
                dilation: bool = False, train_backbone: bool = True, backbone_widths=None,
                backbone_kwargs: dict | None = None, backbone_mask_aware: bool = False, pe: str = "sine", pe_kwargs: dict | None = None,
                pe_at="attn", query_pos_at: str = "attn", dec_pe: str | None = None,
                dec_pe_kwargs: dict | None = None, grid=None, num_queries: int | None = None, d_model: int = 256,
                nheads: int = 8, enc_layers: int = 6, dec_layers: int = 6, dim_feedforward: int | None = None,
                dropout: float = 0.1, attn_dropout: float | None = None, aux_loss: bool = True,
                decoder: str | None = None, decoder_kwargs: dict | None = None, box_bias: str | None = None,
                box_bias_kwargs: dict | None = None, query_relation: str | None = None,
                query_relation_kwargs: dict | None = None, class_head: str | None = None, activation: str = "relu",
                init: str = "papers", attention: str = "dense", num_feature_levels: int | None = None,
                n_points=None, level_pe: str | None = None, backbone_levels: int | None = None) -> DETR:
    """A DETR-style detector with encoding ``pe``; the defaults are DETR R50's.

    Args:
        num_classes: K class ids (labels in [0, K)); the class head has K + 1 outputs, the last
            is "no object" (DETR on COCO: 91), or K with ``class_head="sigmoid"``.
        backbone: "resnet18", "resnet34", "resnet50", "resnet101" (torchvision, frozen batch norm;
            ``backbone_weights`` a local file, ``dilation`` for DC5, ``train_backbone``) or
            "small_cnn" (mask-aware, for CPU-scale runs; ``backbone_widths``), or a vispe ViT:
            a preset name ("vit_pico", ...; ``backbone_kwargs`` go to ``create_vit``, plus
            ``layers``: sum of the last k blocks, default 1) or a module from
            ``create_vit``/``convert_vit`` (``vispe.models.detr.backbone.vit``), or any module
            with ``num_channels``, ``stride`` and ``forward(images, mask)``.
        backbone_mask_aware: ResNets only: zero the padded area after every normalisation, so
            padding does not leak into the features (off by default: DETR/transformers parity).
        pe: the encoding (any registered name).
        pe_kwargs: its settings.
        pe_at: where position enters (``vispe.models.detr.design.placement``): a place ("none", "input",
            "attn") for encoder and decoder, or {"encoder": ..., "decoder": ..., "queries": ...}.
            DETR's default: "attn" everywhere.
        query_pos_at: where the learned query positions enter, a place as ``pe_at``.
        dec_pe: another encoding for the decoder's keys (default: the encoder's own module when it
            is additive, shared as in DETR); with a positioned ``decoder`` it may be rotary (queries
            rotated at their anchors).
        dec_pe_kwargs: its settings.
        grid: the feature grid (h, w) that encodings with grid-sized tables (learned_abs,
            relbias) are built for; others recompute at any grid.
        num_queries: the number of object queries (default: the paper's, DETR's 100 with dense attention,
            Deformable DETR's 300 with ``attention="deformable"``).
        d_model: DETR's transformer width.
        nheads: DETR's attention heads.
        enc_layers: DETR's encoder layers.
        dec_layers: DETR's decoder layers.
        dim_feedforward: the FFN width (default: DETR's 2048, Deformable DETR's 1024 with deformable
            attention). With ``attention="deformable"`` and ``pe="sine"``, ``pe_kwargs`` default to
            Deformable DETR's cell centres (``offset=-0.5``; ``level_pos.DEFORMABLE_SINE``) unless given.
        dropout: DETR's dropout; ``attn_dropout`` on attention weights (default ``dropout``, as
            nn.MultiheadAttention).
        aux_loss: also return the outputs of every decoder layer (``aux_outputs``).
        decoder: the query design ("detr", "conditional", "dab"; ``vispe.models.detr.design.designs``; default
            "detr", or "deformable" with ``attention="deformable"``).
        decoder_kwargs: its options.
        box_bias: Plain-DETR's box bias ("boxrpb") or None.
        box_bias_kwargs: its options.
        query_relation: "relation" for Relation-DETR's box-to-box bias on the decoder's
            self-attention (``vispe.models.detr.transformer.relation``; decoder="dab" with boxes).
        query_relation_kwargs: its options.
        class_head: "softmax" (K + 1) or "sigmoid" (K, focal loss); default by design.
        activation: the FFNs' "relu" (DETR, Conditional DETR), "prelu" (DAB-DETR) or "gelu".
        init: "papers" (the Conditional DETR / DAB-DETR code's initialisation, default) or "legacy"
            (vispe's before issue 35); DETR's design has one, DETR's own (``vispe.models.detr.init``).
        attention: the decoder's cross-attention operator: "dense" (``vispe.models.detr.model.DETR``) or
            "deformable" (multi-scale deformable attention in encoder and decoder: Deformable DETR,
            ``vispe.models.detr.deformable_model``; designs ``decoder="deformable"`` or ``"dab"``, what
            each option means there: ``vispe.models.detr.design.rules``), with
            ``num_feature_levels`` (4), ``n_points`` (4, or (encoder, decoder)) and ``level_pe``
            ("learned", the default, or "none"), ``backbone_levels`` (how many levels the backbone
            gives, the rest extra stride-2 convolutions; default min(L, 3))
            (``build_deformable`` below); these are refused with "dense".
    """
    deformable = attention == "deformable"
    decoder = ("deformable" if deformable else "detr") if decoder is None else decoder  # the papers' own queries
    num_queries = (300 if deformable else 100) if num_queries is None else num_queries  # the papers'
    dim_feedforward = (1024 if deformable else 2048) if dim_feedforward is None else dim_feedforward
    if deformable and pe == "sine" and "offset" not in (pe_kwargs or {}):
        pe_kwargs = {"offset": -0.5, **(pe_kwargs or {})}  # Deformable DETR's cell centres
    for name, value in (("num_classes", num_classes), ("num_queries", num_queries), ("d_model", d_model),
                        ("nheads", nheads), ("enc_layers", enc_layers), ("dec_layers", dec_layers),
                        ("dim_feedforward", dim_feedforward)):
        _checks.positive_int(name, value, allow_zero=name == "enc_layers")
    if d_model % nheads:
        raise ValueError(f"d_model={d_model}: expected a multiple of nheads={nheads}")
    for name, value in (("dropout", dropout), ("attn_dropout", attn_dropout)):
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value < 1):
            raise ValueError(f"{name}={value!r}: expected a probability in [0, 1)")
    if not isinstance(aux_loss, bool):
        raise ValueError(f"aux_loss={aux_loss!r}: expected True or False")
    placement = parse_placement(pe_at, query_pos_at)
    if attention != "deformable":
        for name, value in (("num_feature_levels", num_feature_levels), ("n_points", n_points), ("level_pe", level_pe),
                            ("backbone_levels", backbone_levels)):
            if value is not None:
                raise ValueError(f"{name}={value!r} with attention={attention!r}: an option of the multi-scale "
                                 f"deformable detector; expected attention='deformable' or {name}=None")
    common = dict(placement=placement, backbone=backbone, backbone_weights=backbone_weights, dilation=dilation,
                  train_backbone=train_backbone, backbone_widths=backbone_widths, backbone_kwargs=backbone_kwargs,
                  backbone_mask_aware=backbone_mask_aware, pe=pe, pe_kwargs=dict(pe_kwargs or {}),
                  dec_pe_kwargs=dict(dec_pe_kwargs or {}), grid=grid, num_queries=num_queries, d_model=d_model,
                  nheads=nheads, enc_layers=enc_layers, dec_layers=dec_layers, dim_feedforward=dim_feedforward,
                  dropout=dropout, attn_dropout=attn_dropout, aux_loss=aux_loss, class_head=class_head,
                  activation=activation)
    design_kw = dict(decoder=decoder, decoder_kwargs=dict(decoder_kwargs or {}), box_bias=box_bias,
                     box_bias_kwargs=dict(box_bias_kwargs or {}), query_relation=query_relation,
                     query_relation_kwargs=dict(query_relation_kwargs or {}), init=init, d_model=d_model,
                     num_layers=dec_layers, placement=placement, pe=pe, dec_pe=dec_pe, enc_layers=enc_layers,
                     num_queries=num_queries, num_classes=num_classes)
    if attention == "deformable":
        model = build_deformable(num_classes, design=build_design(**design_kw, attention=attention), **common,
                                 num_feature_levels=num_feature_levels, n_points=n_points, level_pe=level_pe,
                                 backbone_levels=backbone_levels)
    else:
        model = _build_dense(num_classes, design_kw, dec_pe=dec_pe, attention=attention, **common)
    model.config = dict(num_classes=num_classes, backbone=backbone if isinstance(backbone, str) else type(backbone).__name__,
                        backbone_kwargs=dict(backbone_kwargs or {}), backbone_mask_aware=backbone_mask_aware,
                        dilation=dilation, backbone_widths=backbone_widths,
                        pe=pe, pe_kwargs=dict(pe_kwargs or {}), pe_at=pe_at if isinstance(pe_at, str) else dict(pe_at),
                        query_pos_at=query_pos_at, dec_pe=dec_pe, dec_pe_kwargs=dict(dec_pe_kwargs or {}), grid=grid,
                        num_queries=num_queries, d_model=d_model, nheads=nheads, enc_layers=enc_layers,
                        dec_layers=dec_layers, dim_feedforward=dim_feedforward, dropout=dropout,
                        attn_dropout=attn_dropout, aux_loss=aux_loss, decoder=decoder,
                        decoder_kwargs=resolved_decoder_kwargs(model.queries, decoder_kwargs), box_bias=box_bias,
                        box_bias_kwargs=dict(box_bias_kwargs or {}), query_relation=query_relation,
                        query_relation_kwargs=dict(query_relation_kwargs or {}), class_head=model.class_head,
                        activation=activation, init=init, attention=attention,
                        **({} if attention != "deformable" else dict(num_feature_levels=num_feature_levels, n_points=n_points,
                                                                     level_pe=level_pe, backbone_levels=backbone_levels)))
    return model


def _build_dense(num_classes, design_kw: dict, *, placement, backbone, backbone_weights, dilation, train_backbone,
                 backbone_widths, backbone_kwargs, backbone_mask_aware, pe, pe_kwargs, dec_pe, dec_pe_kwargs, grid,
                 num_queries, d_model, nheads, enc_layers, dec_layers, dim_feedforward, dropout, attn_dropout, aux_loss,
                 class_head, activation, attention) -> DETR:
    """The single-scale detector with dense cross-attention (``create_detr``'s default); the backbone is
    built first (the random draws of every run before the deformable operator)."""
    net = build_backbone(backbone, weights=backbone_weights, dilation=dilation, train_backbone=train_backbone,
                         widths=backbone_widths, kwargs=backbone_kwargs, mask_aware=backbone_mask_aware)
    design = build_design(**design_kw, stride=net.stride, attention=attention)
    transformer = Transformer(d_model, nheads, enc_layers, design.layers(), dim_feedforward, dropout, attn_dropout,
                              enc_pos_scale=design.enc_pos_scale, activation=activation)
    model = DETR(net, transformer, design, num_classes=num_classes, num_queries=num_queries, pe=pe, pe_kwargs=pe_kwargs,
                 placement=placement, dec_pe=dec_pe, dec_pe_kwargs=dec_pe_kwargs, grid=grid, aux_loss=aux_loss,
                 class_head=class_head)
    if design.queries.random_refpoints_xy:
        fix_refpoints_xy(model.query_embed.weight)
    if design.relation is not None:  # built last: at one seed, every other weight is the run's without it
        transformer.relation = PositionRelation(nheads, **design.relation)
    if design.init == "papers":
        papers_init(model)
    return model


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
