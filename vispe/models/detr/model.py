"""A DETR-style detector (Carion et al., ECCV 2020) that takes any vispe encoding.

    model = create_detr(num_classes=91, backbone="resnet50", pe="sine")        # DETR R50
    model = create_detr(6, backbone="small_cnn", pe="rope_axial", dec_pe="sine", d_model=128)
    model = create_detr(91, decoder="conditional")                              # Conditional DETR
    model = create_detr(91, decoder="dab", pe_kwargs={"temperature": 20})       # DAB-DETR
    model = create_detr(6, backbone="small_cnn", decoder="dab", dec_pe="rope_mixed")  # 2D RoPE from anchors
    out = model(images, mask)  # images (B, 3, H, W), mask (B, H, W) bool, True = padding

Data flow (shapes for d = d_model, Q = num_queries, K = num_classes)::

    images, mask -> backbone -> features (B, C, h, w), mask (B, h, w) (nearest)
      -> input_proj (1x1 conv) -> (B, d, h, w) [+ PEG]  -> tokens (B, h*w, d) [+ 2D code at the input]
      -> encoder (2D code on q/k, or rotary/bias inside attention; padded keys masked) -> memory
      -> decoder: queries (B, Q, d) placed by a query strategy (``decoder``: DETR's learned vectors,
         Conditional DETR's reference points, DAB-DETR's anchor boxes; ``vispe.models.detr.queries.positioned``);
         cross-attention keys carry the memory's 2D code (or are rotated, or biased by the anchors'
         boxes); padded keys masked
      -> pred_logits (B, Q, K + 1) (last = "no object"; with ``class_head="sigmoid"``, (B, Q, K) for
         the focal loss), pred_boxes (B, Q, 4) sigmoid (cx, cy, w, h) normalised to each image's
         valid (unpadded) size (plus the anchor's inverse sigmoid for positioned queries), and
         aux_outputs per decoder layer.

Where position enters is ``pe_at`` / ``query_pos_at`` (``vispe.models.detr.design.placement``). Mask-free
batches (no padding anywhere) use the encodings' cached tables and unmasked attention.
Parameter names follow DETR's (``input_proj``, ``query_embed``, ``class_embed``,
``bbox_embed.layers.N``); ``load_detr`` maps DETR's and transformers' checkpoints onto them.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.attention import PosContext
from vispe.models.detr.backbone.cnn import build_backbone
from vispe.models.detr.backbone.inputs import (
    check_inputs as _check_inputs,
    eager_backbone as _eager_backbone,
    image_channels as _image_channels,
)
from vispe.models.detr.deformable_build import build_deformable
from vispe.models.detr.design.designs import CLASS_HEADS, Design, build_design, check_cross_rotary, fix_refpoints_xy
from vispe.models.detr.design.placement import parse_placement
from vispe.models.detr.design.rules import check_used
from vispe.models.detr.heads.outputs import outputs_dict, with_extra_queries
from vispe.models.detr.init import papers_init
from vispe.models.detr.load.upgrade import resolved_decoder_kwargs
from vispe.models.detr.mlp import MLP
from vispe.models.detr.transformer.dense import Transformer
from vispe.models.detr.transformer.relation import PositionRelation
from vispe.registry import build_in, get

BoxHead = MLP  # DETR's box MLP (``bbox_embed.layers.N``)


class DETR(nn.Module):
    """Backbone -> projection -> transformer with any encoding -> class and box heads.

    ``design`` (``vispe.models.detr.design.designs.Design``) is the query design: its strategy becomes
    ``self.queries`` (``vispe.models.detr.queries.positioned``), its keys decide where the encodings go.
    ``class_head`` "softmax" (K + 1 logits, DETR) or "sigmoid" (K logits for the focal loss,
    Conditional/DAB-DETR). Input checks are the ViT's (``vispe._checks.images``): a ValueError for a
    non-float or empty batch, a mask of another shape or an image that is all padding.
    """

    #: refuse NaN / inf pixels (opt-in, as the ViT's: costs one pass over the input per call)
    check_finite: bool = False
    #: let ``torch.compile`` trace the backbone too (opt-in). By default the backbone runs eagerly
    #: outside the graph, because Inductor fails on its convolutions at symbolic sizes (detection batches
    #: change size at every step; ``vispe.models.detr.backbone.inputs.eager_backbone``); at one fixed input size
    #: (``torch.compile(model, dynamic=False)``, batches padded to one size) it compiles
    #: (bench/compile_step.py, results/bench_compile.md)
    backbone_in_graph: bool = False

    def __init__(self, backbone: nn.Module, transformer: Transformer, design: Design, *, num_classes: int,
                 num_queries: int, pe: str, pe_kwargs: dict, placement, dec_pe: str | None, dec_pe_kwargs: dict,
                 grid=None, aux_loss: bool = True, class_head: str | None = None) -> None:
        super().__init__()
        d = transformer.d_model
        self.backbone, self.transformer = backbone, transformer
        self.in_chans = _image_channels(backbone)  # checked at the input (None: the backbone does not say)
        self.input_proj = nn.Conv2d(backbone.num_channels, d, kernel_size=1)
        self.queries = design.queries
        self.keys = design.cross.keys
        self.query_embed = nn.Embedding(num_queries, self.queries.query_dim or d)
        self.class_head = _checks.choice("class_head", class_head or design.class_head, CLASS_HEADS)
        self.class_embed = nn.Linear(d, num_classes + (self.class_head == "softmax"))
        self.bbox_embed = BoxHead(d, d, 4, 3)
        self.num_classes, self.num_queries, self.aux_loss = num_classes, num_queries, aux_loss
        self.placement = placement
        self.pe_name, self.dec_pe_name = pe, dec_pe
        self.pe_family = get(pe).family
        dec_family = get(dec_pe).family if dec_pe is not None else None
        context = dict(dim=d, num_heads=transformer.nheads, head_dim=d // transformer.nheads, num_prefix_tokens=0)
        if grid is not None:
            context["grid"] = _checks.grid_shape("grid", grid)
        self.pe = self.dec_pe = None
        check_used(pe, self.pe_family, placement, dec_pe, self.keys)
        if self.pe_family in ("additive", "conditional"):
            self.pe = build_in(pe, context, **pe_kwargs)
        elif self.pe_family in ("rotary", "bias") and placement.encoder == "attn":
            for layer in transformer.encoder:
                layer.self_attn.set_pe(build_in(pe, context, **pe_kwargs))
        elif pe_kwargs and self.pe_family == "none":
            raise ValueError(f"pe_kwargs={pe_kwargs!r}: the encoding {pe!r} takes no settings")
        if dec_pe is not None and dec_family == "additive":
            self.dec_pe = build_in(dec_pe, context, **dec_pe_kwargs)
        elif dec_pe_kwargs and (dec_pe is None or dec_family == "none"):
            raise ValueError(f"dec_pe_kwargs={dec_pe_kwargs!r}: there is no decoder encoding to take them "
                             f"(dec_pe={dec_pe!r})")
        if self.keys == "rotary":  # every cross-attention gets its own rotary encoding
            name, kw, arg = (dec_pe, dec_pe_kwargs, "dec_pe") if dec_pe is not None else (pe, pe_kwargs, "pe")
            for layer in transformer.decoder:
                layer.cross_attn.set_pe(build_in(name, context, **kw))
                check_cross_rotary(layer.cross_attn.pe, name, arg)

    # --- positions -----------------------------------------------------------------------------
    def _codes(self, x: torch.Tensor, mask: torch.Tensor | None):
        """Additive 2D codes for the encoder and the decoder keys, or None.  # (B|1, h*w, d) each"""
        shape, pl = tuple(x.shape[-2:]), self.placement
        rotary_keys = self.keys == "rotary"
        enc = dec = None
        if self.pe_family == "additive" and (pl.encoder != "none" or (pl.decoder != "none" and self.dec_pe is None
                                                                      and not rotary_keys)):
            enc = self.pe(shape, mask, device=x.device, dtype=x.dtype)
        if pl.decoder != "none" and not rotary_keys:
            dec = enc if self.dec_pe is None else self.dec_pe(shape, mask, device=x.device, dtype=x.dtype)
        return (enc if pl.encoder != "none" else None), dec

    # --- forward -----------------------------------------------------------------------------------
    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None, targets: list[dict] | None = None) -> dict:
        """Images (B, 3, H, W) and padding mask (B, H, W), True = padding -> DETR's output dict
        (``vispe.models.detr.heads.outputs``). ``targets`` (training only) go to the query strategy's
        ``extra_queries`` (denoising groups: ``dn_outputs``)."""
        mask = _check_inputs(images, mask, self.in_chans, self.check_finite)
        if self.backbone_in_graph:
            feats, fmask = self.backbone(images, mask)  # (B, C, h, w), (B, h, w)
        else:
            feats, fmask = _eager_backbone(self.backbone, images, mask)
        x = self.input_proj(feats)  # (B, d, h, w)
        B, d, h, w = x.shape
        grid_mask = fmask if bool(fmask.any()) else None  # no padding: cached tables, unmasked attention
        pl = self.placement
        if self.pe_family == "conditional":
            x = x + self.pe(x, grid_mask)
        tokens = x.flatten(2).transpose(1, 2)  # (B, h*w, d)
        enc_code, dec_code = self._codes(x, grid_mask)
        if pl.encoder == "input" and enc_code is not None:
            tokens = tokens + enc_code
        enc_ctx = PosContext((h, w), 0, grid_mask, enc_code if pl.encoder == "attn" else None)
        memory = self.transformer.encode(tokens, enc_ctx)  # (B, h*w, d)
        if pl.decoder == "input" and dec_code is not None:
            memory = memory + dec_code
        memory_ctx = PosContext((h, w), 0, grid_mask, dec_code if pl.decoder == "attn" else None)
        embed = self.query_embed.weight  # (Q, d | query_dim)
        t, anchors = self.queries.start(embed, B, tokens.dtype)  # (B, Q, d), (1, Q, 2|4) or None
        extra = self.queries.extra_queries(targets, B, d, tokens.dtype, tokens.device) if self.training else None
        t, anchors, attn_mask = with_extra_queries(t, anchors, extra)
        hs, used = self.transformer.decode(t, embed, memory, memory_ctx, self.queries, anchors, self.bbox_embed,
                                           intermediate=self.aux_loss, self_attn_mask=attn_mask)
        # hs (L, B, Q, d), used: [anchors of each layer]
        logits = self.class_embed(hs)  # (L, B, Q, K+1 | K)
        boxes = self.queries.boxes(self.bbox_embed(hs), used)  # (L, B, Q, 4)
        return outputs_dict(logits, boxes, self.class_head, self.aux_loss, extra)

    def param_groups(self, lr: float, lr_backbone: float, weight_decay: float) -> list[dict]:
        """DETR's optimiser groups: the backbone at ``lr_backbone``, the rest at ``lr``."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        return [{"params": [p for n, p in named if not n.startswith("backbone.")], "lr": lr, "weight_decay": weight_decay},
                {"params": [p for n, p in named if n.startswith("backbone.")], "lr": lr_backbone,
                 "weight_decay": weight_decay}]


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
        attention: the decoder's cross-attention operator: "dense" (this module's ``DETR``) or
            "deformable" (multi-scale deformable attention in encoder and decoder: Deformable DETR,
            ``vispe.models.detr.deformable_model``; designs ``decoder="deformable"`` or ``"dab"``, what
            each option means there: ``vispe.models.detr.design.rules``), with
            ``num_feature_levels`` (4), ``n_points`` (4, or (encoder, decoder)) and ``level_pe``
            ("learned", the default, or "none"), ``backbone_levels`` (how many levels the backbone
            gives, the rest extra stride-2 convolutions; default min(L, 3))
            (``vispe.models.detr.deformable_build``); these are refused with "dense".
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
