"""RT-DETR (Zhao et al., CVPR 2024, "DETRs Beat YOLOs on Real-time Object Detection") as vispe modules.

The one detector's stages with RT-DETR's choice at each::

    backbone   images (B, 3, H, W) -> maps at strides 8, 16, 32 (``ResNetVd`` or any module with
               ``forward(images) -> [maps]`` and ``channels``)
    neck       ``HybridEncoder``: projection, AIFI (dense self-attention on the top level, any vispe
               encoding, ``set_encoding``), CCFM
    levels     ``decoder_input_proj`` (1x1 conv + BN per level; extra levels by 3x3 stride-2 convs)
    queries    ``QuerySelection``: top-k encoder proposals (training: + ``denoising_groups`` in front)
    decoder    ``RealtimeDecoder``: deformable cross-attention, ``query_pos_head`` MLP of the box
    heads      per layer ``class_embed`` (sigmoid classes), ``bbox_embed`` (box refinement)

RT-DETRv2 is the same model with ``v2={"num_points": int | [per level], "offset_scale": 0.5,
"method": "default" | "discrete"}``: the decoder's cross-attention becomes ``MSDeformAttnV2``. D-FINE is
``dfine={...}`` (``DFineDecoder``'s options: ``num_bins``, ``reg_scale``, ``up``, ``offset_scale``, ``method``,
``lqe_*``): D-FINE's fusion blocks (``dfine_neck``) and its FDR / LQE decoder (``dfine_decoder``); in
training its outputs have the pre-box head's at the front of ``aux_outputs``.

Output (dict): "pred_logits" (B, Q, K), "pred_boxes" (B, Q, 4) unit (cx, cy, w, h) from the last layer;
"aux_outputs" the same for the layers before; "enc_outputs" the selected encoder proposals; in
training with ``targets`` and ``num_denoising > 0``: "dn_outputs" (per layer, the denoising queries'
logits and boxes) and "dn_meta" (``Groups``: positives per image, group count). The padding ``mask``
(B, H, W) (True = padding) reaches AIFI (key padding and a mask-aware encoding) and a backbone that
takes it (``takes_mask``); RT-DETR's anchors, references and boxes are in units of the whole padded
canvas (it resizes every image to one size and never pads), so with padding the targets are brought
into those units (denoising) and every output box back into each image's own (cx / r_x, cy / r_y,
w / r_x, h / r_y, r = the valid fraction), the units of the targets and of COCO. Without padding
nothing changes (transformers' numbers).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from vispe.coords import valid_extent
from vispe.kernels.deformable import Levels
from vispe.models.detr.realtime.aifi import SINCOS
from vispe.models.detr.realtime.decoder import RealtimeDecoder
from vispe.models.detr.realtime.deimv2_lite import LiteEncoder
from vispe.models.detr.realtime.denoising import denoising_groups
from vispe.models.detr.realtime.dfine_decoder import DFineDecoder
from vispe.models.detr.realtime.hybrid_encoder import HybridEncoder
from vispe.models.detr.realtime.selection import QuerySelection


class RTDETR(nn.Module):
    def __init__(self, backbone: nn.Module, num_classes: int, *, num_queries: int = 300, d_model: int = 256,
                 encoder_dim: int = 256, aifi_levels: tuple[int, ...] = (2,), aifi_heads: int = 8, aifi_ffn: int = 1024,
                 aifi_layers: int = 1, aifi_activation: str = "gelu", ccfm_activation: str | None = "silu",
                 expansion: float = 1.0, csp_blocks: int = 3, num_levels: int = 3, decoder_layers: int = 6,
                 decoder_heads: int = 8, decoder_ffn: int = 1024, num_points: int = 4, decoder_activation: str = "relu",
                 dropout: float = 0.0, num_denoising: int = 100, label_noise_ratio: float = 0.5,
                 box_noise_scale: float = 1.0, learn_initial_query: bool = False, layer_norm_eps: float = 1e-5,
                 batch_norm_eps: float = 1e-5, pe: str = SINCOS, pe_kwargs: dict[str, Any] | None = None,
                 v2: dict[str, Any] | None = None, dfine: dict[str, Any] | None = None) -> None:
        super().__init__()
        channels = list(getattr(backbone, "channels", []))
        if not channels:
            raise ValueError("backbone has no 'channels': expected a module with forward(images) -> [maps] and "
                             "channels, the maps' channel counts")
        if num_levels < len(channels):
            raise ValueError(f"num_levels={num_levels}: expected at least the backbone's {len(channels)} levels")
        self.backbone = backbone
        self.encoder: HybridEncoder | LiteEncoder  # DEIMv2's lite encoder (deimv2_lite) replaces it there
        self.encoder = HybridEncoder(channels, encoder_dim, aifi_levels=aifi_levels, num_heads=aifi_heads,
                                     ffn_dim=aifi_ffn, aifi_layers=aifi_layers, dropout=dropout,
                                     aifi_activation=aifi_activation, ccfm_activation=ccfm_activation,
                                     expansion=expansion, csp_blocks=csp_blocks, eps=batch_norm_eps, pe=pe,
                                     pe_kwargs=pe_kwargs, fusion="dfine" if dfine is not None else "rtdetr")
        if dfine is not None and num_levels != len(channels):
            raise ValueError(f"num_levels={num_levels} with dfine: vispe's D-FINE uses the backbone's {len(channels)} levels")
        projs: list[nn.Module] = [
            nn.Identity() if dfine is not None and d_model == encoder_dim else
            nn.Sequential(nn.Conv2d(encoder_dim, d_model, 1, bias=False), nn.BatchNorm2d(d_model, eps=batch_norm_eps))
            for _ in channels]
        cin = encoder_dim
        for _ in range(num_levels - len(channels)):
            projs.append(nn.Sequential(nn.Conv2d(cin, d_model, 3, 2, 1, bias=False), nn.BatchNorm2d(d_model, eps=batch_norm_eps)))
            cin = d_model
        self.decoder_input_proj = nn.ModuleList(projs)
        self.selection = QuerySelection(d_model, num_classes, num_queries, learn_initial_query=learn_initial_query,
                                        eps=layer_norm_eps)
        self.denoising_class_embed = nn.Embedding(num_classes + 1, d_model, padding_idx=num_classes) \
            if num_denoising > 0 else None
        self.decoder: nn.Module
        if dfine is not None:
            self.decoder = DFineDecoder(d_model, decoder_heads, decoder_ffn, decoder_layers, num_classes=num_classes,
                                        num_levels=num_levels, num_points=num_points, **dfine)
        else:
            self.decoder = RealtimeDecoder(d_model, decoder_heads, decoder_ffn, decoder_layers, num_classes=num_classes,
                                           num_levels=num_levels, num_points=num_points, dropout=dropout,
                                           activation=decoder_activation, v2=v2)
        self.num_classes, self.num_queries = num_classes, num_queries
        self.num_denoising, self.label_noise_ratio, self.box_noise_scale = num_denoising, label_noise_ratio, box_noise_scale

    @property
    def stride(self) -> int:
        """The backbone's coarsest stride (images are padded to a multiple of it)."""
        return int(getattr(self.backbone, "stride", None) or max(getattr(self.backbone, "strides", [32])))

    def param_groups(self, lr: float, lr_backbone: float, weight_decay: float) -> list[dict[str, Any]]:
        """The backbone at ``lr_backbone``, the rest at ``lr`` (train.py's detection task)."""
        groups: dict[str, list[nn.Parameter]] = {"backbone": [], "rest": []}
        for n, p in self.named_parameters():
            if p.requires_grad:
                groups["backbone" if n.startswith("backbone.") else "rest"].append(p)
        lrs = {"rest": lr, "backbone": lr_backbone}
        return [{"params": groups[k], "lr": lrs[k], "weight_decay": weight_decay} for k in lrs if groups[k]]

    def set_encoding(self, name: str, **kwargs: Any) -> None:
        """AIFI's encoding by name (``vispe.models.detr.realtime.aifi``), e.g. "rope_mixed" or "relbias"."""
        self.encoder.set_encoding(name, **kwargs)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None,
                targets: list[dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:
        feats = self.backbone(images, mask) if getattr(self.backbone, "takes_mask", False) else self.backbone(images)
        maps = self.encoder(feats, mask)  # [(B, enc_dim, h_l, w_l)] finest first
        srcs = [proj(m) for proj, m in zip(self.decoder_input_proj, maps)]
        for proj in list(self.decoder_input_proj)[len(maps):]:  # extra levels, each from the coarsest map (transformers)
            srcs.append(proj(maps[-1]))
        levels = Levels.of(srcs)
        memory = levels.flatten(srcs)  # (B, N, d)
        sel = self.selection(memory, levels)
        scale = _valid_scale(mask, images.shape[-2:])  # (B, 1, 4) or None: image units -> the whole map's
        groups = None
        if self.training and targets is not None and self.denoising_class_embed is not None:
            if scale is not None:
                targets = [{**t, "boxes": t["boxes"].to(scale) * scale[b]} for b, t in enumerate(targets)]
            groups = denoising_groups(targets, self.denoising_class_embed, num_classes=self.num_classes,
                                      num_queries=self.num_queries, num_denoising=self.num_denoising,
                                      label_noise_ratio=self.label_noise_ratio, box_noise_scale=self.box_noise_scale)
        content, ref, attn_mask, P = sel.content, sel.box_logits, None, 0
        if groups is not None:
            content = torch.cat([groups.content, content], 1)  # (B, P + Q, d)
            ref = torch.cat([groups.box_logits, ref], 1)
            attn_mask, P = groups.attn_mask, groups.pad_size
        logits, boxes, *fdr = self.decoder(content, ref, memory, levels, attn_mask)  # (B, layers, P + Q, K|4)
        enc_boxes = sel.enc_boxes
        if scale is not None:  # the whole map's units -> each image's (the targets' and COCO's)
            boxes, enc_boxes = boxes / scale[:, None], enc_boxes / scale
        layer = _layer_outputs(logits, boxes, fdr, scale)
        out: dict[str, Any] = {
            **layer(-1, slice(P, None)),
            "aux_outputs": [layer(i, slice(P, None)) for i in range(logits.shape[1] - 1)],
            "enc_outputs": {"pred_logits": sel.enc_logits, "pred_boxes": enc_boxes},
            "class_head": "sigmoid",
        }
        if fdr:  # D-FINE's losses read W(n)'s parameters (vispe.models.detr.realtime.dfine_loss)
            out["up"], out["reg_scale"] = self.decoder.up, self.decoder.reg_scale
        if groups is not None:
            out["dn_outputs"] = [layer(i, slice(None, P)) for i in range(logits.shape[1])]
            out["dn_meta"] = groups
        return out


def _layer_outputs(logits: torch.Tensor, boxes: torch.Tensor, fdr: list[torch.Tensor],
                   scale: torch.Tensor | None) -> Callable[[int, slice], dict[str, Any]]:
    """``layer(i, queries)``: layer i's output dict; with D-FINE's ``fdr = [corners, b0]`` also its edge
    distributions ``pred_corners`` and initial boxes ``ref_points`` (in the boxes' units), but for the pre-box
    head's entry (the first of ``logits`` when it has one more layer than ``corners``)."""
    corners, initial = fdr if fdr else (None, None)
    first = logits.shape[1] - corners.shape[1] if corners is not None else 0
    if initial is not None and scale is not None:
        initial = initial / scale

    def layer(i: int, q: slice) -> dict[str, Any]:
        d = {"pred_logits": logits[:, i, q], "pred_boxes": boxes[:, i, q]}
        j = i % logits.shape[1] - first
        if corners is not None and initial is not None and j >= 0:
            d["pred_corners"], d["ref_points"] = corners[:, j, q], initial[:, q]
        return d
    return layer


def _valid_scale(mask: torch.Tensor | None, shape: Sequence[int]) -> torch.Tensor | None:
    """Each image's valid fraction of the padded canvas as (cx, cy, w, h) factors, or None when nothing is
    padded.  # (B, 1, 4)"""
    if mask is None or not bool(mask.any()):
        return None
    n = valid_extent(mask, (shape[0], shape[1]), device=mask.device)  # (B, 2) valid (h, w) in pixels
    ry, rx = n[:, 0] / shape[0], n[:, 1] / shape[1]
    return torch.stack([rx, ry, rx, ry], -1)[:, None]  # (B, 1, 4)
