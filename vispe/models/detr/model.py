"""A DETR-style detector (Carion et al., ECCV 2020) that takes any vispe encoding.

    model = create_detr(num_classes=91, backbone="resnet50", pe="sine")        # DETR R50
    model = create_detr(6, backbone="small_cnn", pe="rope_axial", dec_pe="sine", d_model=128)
    model = create_detr(91, decoder="conditional")                              # Conditional DETR
    model = create_detr(91, decoder="dab", pe_kwargs={"temperature": 20})       # DAB-DETR
    model = create_detr(6, backbone="small_cnn", decoder="dab", dec_pe="rope_mixed")  # 2D RoPE from anchors
    out = model(images, mask)  # images (B, 3, H, W), mask (B, H, W) bool, True = padding

``create_detr`` is the one builder (``vispe.models.detr.build``); ``DETR.forward`` is the anatomy in one
method, the same stages for every operator (``DeformableDETR`` overrides the ones it does differently).

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
from vispe.models.detr.backbone.inputs import (
    check_inputs as _check_inputs,
    eager_backbone as _eager_backbone,
    image_channels as _image_channels,
)
from vispe.models.detr.design.designs import CLASS_HEADS, Design, check_cross_rotary
from vispe.models.detr.design.rules import check_used
from vispe.models.detr.heads.outputs import outputs_dict, with_extra_queries
from vispe.models.detr.mlp import MLP
from vispe.models.detr.transformer.dense import Transformer
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

    #: what ``create`` fixes for this class's name: none for ``DETR`` (``create_detr``'s defaults; any operator),
    #: the deformable operator for ``DeformableDETR``
    DEFAULTS: dict = {}
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

    @classmethod
    def create(cls, num_classes: int, **kwargs) -> DETR:
        """``create_detr(num_classes, **kwargs)`` with this class's ``DEFAULTS`` (``DeformableDETR.create(...)``
        is ``create_detr(..., attention="deformable")``); a keyword that contradicts them is refused."""
        from vispe.models.detr.build import create_detr

        for k, v in cls.DEFAULTS.items():
            if k in kwargs and kwargs[k] != v:
                raise ValueError(f"{k}={kwargs[k]!r} with {cls.__name__}.create: expected {v!r} (or create_detr)")
        return create_detr(num_classes, **{**kwargs, **cls.DEFAULTS})

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

    # --- forward: the anatomy in one method ---------------------------------------------------------
    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None, targets: list[dict] | None = None) -> dict:
        """Images (B, 3, H, W) and padding mask (B, H, W), True = padding -> DETR's output dict
        (``vispe.models.detr.heads.outputs``). ``targets`` (training only) go to the query strategy's
        ``extra_queries`` (denoising groups: ``dn_outputs``). Every detector runs these stages; an operator's
        detector (``DeformableDETR``) overrides the stages it does differently."""
        mask = _check_inputs(images, mask, self.in_chans, self.check_finite)
        memory, reads, dtype = self.run_encoder(images, mask)  # (B, N, d), what the decoder's operator reads
        t, embed, anchors, enc = self.first_queries(memory, reads, dtype)  # (B, Q, d), embed, (B|1, Q, 2|4) | None
        B, d = memory.shape[0], memory.shape[-1]
        extra = self.queries.extra_queries(targets, B, d, dtype, memory.device) if self.training else None
        t, anchors, attn_mask = with_extra_queries(t, anchors, extra)
        hs, used = self.run_decoder(t, embed, memory, reads, anchors, attn_mask)  # every layer's output, anchors
        out = self.predict(hs, used, extra)
        if enc is not None:
            out["enc_outputs"] = {**enc, "class_head": self.class_head}
        return out

    def run_encoder(self, images: torch.Tensor, mask: torch.Tensor):
        """Backbone, projection, the tokens' codes, the encoder -> (memory (B, h*w, d), the decoder keys'
        ``PosContext``, the tokens' dtype)."""
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
        return memory, PosContext((h, w), 0, grid_mask, dec_code if pl.decoder == "attn" else None), tokens.dtype

    def first_queries(self, memory: torch.Tensor, reads, dtype: torch.dtype):
        """The query source's first queries: (t (B, Q, d), the embedding, anchors or None, proposals or None)."""
        embed = self.query_embed.weight  # (Q, d | query_dim)
        t, anchors = self.queries.start(embed, memory.shape[0], dtype)  # (B, Q, d), (1, Q, 2|4) or None
        return t, embed, anchors, None

    def run_decoder(self, t, embed, memory, reads, anchors, attn_mask):
        """The decoder layers -> (every layer's output (L, B, Q, d) or the last, the anchors each adds to)."""
        return self.transformer.decode(t, embed, memory, reads, self.queries, anchors, self.bbox_embed,
                                       intermediate=self.aux_loss, self_attn_mask=attn_mask)

    def predict(self, hs, used: list, extra) -> dict:
        """The heads on the decoder's outputs -> the output dict."""
        logits = self.class_embed(hs)  # (L, B, Q, K+1 | K)
        boxes = self.queries.boxes(self.bbox_embed(hs), used)  # (L, B, Q, 4)
        return outputs_dict(logits, boxes, self.class_head, self.aux_loss, extra)

    def param_groups(self, lr: float, lr_backbone: float, weight_decay: float) -> list[dict]:
        """DETR's optimiser groups: the backbone at ``lr_backbone``, the rest at ``lr``."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        return [{"params": [p for n, p in named if not n.startswith("backbone.")], "lr": lr, "weight_decay": weight_decay},
                {"params": [p for n, p in named if n.startswith("backbone.")], "lr": lr_backbone,
                 "weight_decay": weight_decay}]
