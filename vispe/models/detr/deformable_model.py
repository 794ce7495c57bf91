"""The multi-scale detector: Deformable DETR (Zhu et al., ICLR 2021) with any additive vispe encoding
and the positioned-query designs on top (``create_detr(attention="deformable", ...)``).

Data flow (d = d_model, L levels, N tokens of all levels, Q queries, K classes)::

    images, mask -> multi-scale backbone -> [(B, C_l, h_l, w_l), mask_l]   (vispe.models.detr.neck.multiscale)
      -> input_proj (1x1 conv + GroupNorm per level, extra 3x3 stride-2 levels) -> maps [(B, d, h_l, w_l)]
         [+ PEG per level, for a conditional encoding at the input]
      -> tokens (B, N, d); their code pos = concat_l [pe(level l, mask_l) + level_embed_l]   (level_pos)
      -> encoder: deformable self-attention at each token's valid cell centre (reference points scaled
         by the valid ratios), pos on its query (pe_at encoder "attn") or on the tokens once ("input")
      -> queries: the strategy's (``decoder``): Deformable DETR's (content, p_q, reference points from
         p_q; or two-stage proposals) or DAB's anchors (p_q = MLP(A(anchor)))
      -> decoder layers: self-attention (q = k = t + p_q [+ Relation-DETR's bias]), deformable
         cross-attention sampling the memory around the anchors (``points_at_levels`` of the anchors in
         the valid area, (cx, cy) -> (y, x) by ``swap_xy``), FFN; anchors refined between layers
      -> per layer: pred_logits (B, Q, K) (sigmoid; K + 1 with ``class_head="softmax"``) from
         class_embed[i], pred_boxes (B, Q, 4) sigmoid(bbox_embed[i](t) + inverse_sigmoid(anchors));
         aux_outputs for the layers before the last; "enc_outputs" (every token's proposal) when two-stage.

The strategy decides the decoder norm and the heads (``decode.decode_loop`` is the loop of both operators):
Deformable DETR's design has no decoder norm (the papers' post-norm layers end with one) and, with
``with_box_refine``, one head per layer (the paper's clones), else one class and one box head shared by
the layers (and by the two-stage proposals); DAB on this operator is DINO's: the decoder norm on every
layer's output and heads shared by the layers (``formulation="legacy"``: vispe's earlier per-layer
heads, no norm). ``forward(images, mask, targets)`` runs a strategy's extra queries (``outputs``). Parameter
names follow transformers' and the papers' (``input_proj.{l}.{0,1}``, ``level_pos.level_embed``,
``encoder.layers.{i}``, ``decoder.layers.{i}``, ``class_embed.{i}``, ``bbox_embed.{i}.layers.{j}``,
``queries.reference_points``, ``queries.enc_output``, ...); ``load_detr`` maps theirs onto them.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from vispe.coords import points_at_levels, valid_ratios
from vispe.kernels.deformable import Levels, swap_xy
from vispe.models.detr.backbone.inputs import (
    check_inputs as _check_inputs,
    eager_backbone as _eager_backbone,
    image_channels as _image_channels,
)
from vispe.models.detr.design.designs import Design
from vispe.models.detr.heads.outputs import outputs_dict, with_extra_queries
from vispe.models.detr.mlp import MLP
from vispe.models.detr.transformer.decode import decode_loop
from vispe.models.detr.transformer.decoder_layer import Sampling

#: the paper's learning-rate factor of the sampling offsets and reference points (``lr_linear_proj_mult``)
LINEAR_PROJ_MULT = 0.1
LINEAR_PROJ_NAMES = ("sampling_offsets", "reference_points")


class DeformableDecoder(nn.Module):
    """The decoder's layers (``layers.{i}``, ``DecoderLayer`` with the deformable operator), the norm on every layer's output
    (``norm``: DINO's; None for Deformable DETR's design) and Relation-DETR's relation (or None)."""

    def __init__(self, layers, norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.relation = None  # vispe.models.detr.transformer.relation.PositionRelation, set by the builder


class DeformableDETR(nn.Module):
    """Multi-scale backbone -> input projections -> deformable encoder / decoder -> per-layer heads.

    Built by ``create_detr(attention="deformable", ...)`` (``vispe.models.detr.deformable_build``);
    ``forward(images, mask)`` returns DETR's output dict (module docstring). ``pe`` is a conditional
    encoding (PEG) applied to every level's map, or None (additive codes live in ``level_pos``).
    """

    check_finite: bool = False

    def __init__(self, backbone: nn.Module, input_proj: nn.Module, level_pos: nn.Module, encoder: nn.Module,
                 decoder: DeformableDecoder, design: Design, *, num_classes: int, num_queries: int, placement,
                 pe: nn.Module | None = None, aux_loss: bool = True, class_head: str = "sigmoid") -> None:
        super().__init__()
        d = encoder.d_model
        self.backbone, self.input_proj, self.level_pos, self.pe = backbone, input_proj, level_pos, pe
        self.encoder, self.decoder = encoder, decoder
        self.in_chans = _image_channels(backbone)
        self.queries = design.queries
        self.keys = design.cross.keys
        self.placement = placement
        q = self.queries
        self.query_embed = None if q.from_proposals else nn.Embedding(num_queries, q.query_dim or d)
        self.class_head = class_head
        n = len(decoder.layers) + q.from_proposals  # the two-stage proposals take the last heads
        cls, box = nn.Linear(d, num_classes + (class_head == "softmax")), MLP(d, d, 4, 3)
        per_layer = not q.shared_heads  # the papers' clones under refinement
        self.class_embed = nn.ModuleList([cls] + [copy.deepcopy(cls) for _ in range(n - 1)] if per_layer else [cls] * n)
        self.bbox_embed = nn.ModuleList([box] + [copy.deepcopy(box) for _ in range(n - 1)] if per_layer else [box] * n)
        self.num_classes, self.num_queries, self.aux_loss = num_classes, num_queries, aux_loss
        self.d_model, self.num_levels = d, len(input_proj)
        strides = list(getattr(backbone, "strides", [getattr(backbone, "stride", 1)]))
        self.stride = strides[-1]  # the backbone's coarsest: what batches are padded to (extra levels halve it)

    # --- forward -----------------------------------------------------------------------------------
    def encode(self, images: torch.Tensor, mask: torch.Tensor):
        """(memory (B, N, d), levels, key padding (B, N) or None, valid ratios (B, L, 2))."""
        feats = _eager_backbone(self.backbone, images, mask)  # [(B, C_l, h_l, w_l), (B, h_l, w_l)]
        maps, masks = self.input_proj(feats, mask)  # [(B, d, h_l, w_l)], [(B, h_l, w_l)]
        padded = bool(mask.any())  # no padding: cached tables, no masking
        if self.pe is not None:  # conditional (PEG): on every level's map
            maps = [x + self.pe(x, m if padded else None) for x, m in zip(maps, masks)]
        levels = Levels.of(maps)
        x = levels.flatten(maps)  # (B, N, d)
        pos = self.level_pos(levels, masks if padded else None, device=x.device, dtype=x.dtype)  # (B|1, N, d) | None
        if pos is not None and self.placement.encoder == "input":
            x, pos = x + pos, None
        if self.placement.encoder == "none":  # no code enters the encoder (the builder builds none to learn)
            pos = None
        pad = levels.flatten(masks) if padded else None  # (B, N)
        ratios = valid_ratios(masks) if padded else x.new_ones(x.shape[0], len(levels), 2, dtype=torch.float32)
        return self.encoder(x, levels, pos, ratios, pad), levels, pad, ratios

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None, targets: list[dict] | None = None) -> dict:
        """Images (B, 3, H, W) and padding mask (B, H, W), True = padding -> DETR's output dict. ``targets``
        (training only) go to the query strategy's ``extra_queries`` (denoising groups: ``dn_outputs``)."""
        mask = _check_inputs(images, mask, self.in_chans, self.check_finite)
        memory, levels, pad, ratios = self.encode(images, mask)
        B, q = memory.shape[0], self.queries
        enc = None
        if q.from_proposals:
            embed, anchors, enc = q.propose(memory, pad, levels, self.class_embed[-1], self.bbox_embed[-1],
                                            self.num_queries, class_head_kind=self.class_head)  # (B, Q, 2d), (B, Q, 4)
            t = embed[..., self.d_model:]  # (B, Q, d)
        else:
            embed = self.query_embed.weight  # (Q, 2d | query_dim)
            t, anchors = q.start(embed, B, memory.dtype)  # (B, Q, d), (1, Q, 2|4)
        extra = q.extra_queries(targets, B, self.d_model, memory.dtype, memory.device) if self.training else None
        t, anchors, attn_mask = with_extra_queries(t, anchors, extra)
        hs, used = self.decode(t, embed, memory, levels, pad, ratios, anchors, self_attn_mask=attn_mask)
        which = range(len(hs)) if self.aux_loss else [len(hs) - 1]
        logits = [self.class_embed[i](hs[i]) for i in which]  # [(B, Q, K | K+1)]
        boxes = q.boxes(torch.stack([self.bbox_embed[i](hs[i]) for i in which]), [used[i] for i in which])
        out = outputs_dict(logits, boxes, self.class_head, self.aux_loss, extra)
        if enc is not None:
            out["enc_outputs"] = {**enc, "class_head": self.class_head}
        return out

    def decode(self, t, embed, memory, levels: Levels, pad, ratios, anchors, *, self_attn_mask=None):
        """Every layer's output and the anchors its boxes add to (``vispe.models.detr.transformer.decode``).
        # [(B, Q, d)], [(B|1, Q, 2|4)]"""
        def run(layer, t, p, anchors, self_bias):
            reference = points_at_levels(swap_xy(anchors), ratios).to(t.dtype)  # (B, Q, L, 2|4) (y, x[, h, w])
            return layer(t, p, memory, self_bias=self_bias, self_attn_mask=self_attn_mask,
                         sampling=Sampling(reference, levels, pad))

        return decode_loop(self.decoder.layers, self.queries, t, embed, anchors, run, heads=lambda i: self.bbox_embed[i],
                           norm=self.decoder.norm, relation=self.decoder.relation)

    def param_groups(self, lr: float, lr_backbone: float, weight_decay: float) -> list[dict]:
        """Deformable DETR's optimiser groups: the backbone at ``lr_backbone``, the sampling offsets and
        reference points at ``lr * LINEAR_PROJ_MULT`` (the paper's 0.1), the rest at ``lr``."""
        groups = {"backbone": [], "linear_proj": [], "rest": []}
        for n, p in self.named_parameters():
            if p.requires_grad:
                key = "backbone" if n.startswith("backbone.") else \
                    "linear_proj" if any(k in n for k in LINEAR_PROJ_NAMES) else "rest"
                groups[key].append(p)
        lrs = {"rest": lr, "backbone": lr_backbone, "linear_proj": lr * LINEAR_PROJ_MULT}
        return [{"params": groups[k], "lr": lrs[k], "weight_decay": weight_decay} for k in lrs if groups[k]]
