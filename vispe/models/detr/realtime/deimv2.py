"""DEIMv2 (Huang et al., 2025, "Real-Time Object Detection Meets DINOv3") as vispe's ``RTDETR``: D-FINE with
DEIMv2's fusion blocks (``deimv2_neck``) and decoder layers (``deimv2_decoder``), on transformers' HGNetV2
(``hgnetv2.TransformersBackbone``) or on DINOv3 with its spatial tuning adapter (``deimv2_backbone``).

``DEIMv2(backbone, num_classes, deimv2={...}, dfine={...}, **RTDETR's arguments)``; ``deimv2`` options:
``use_gateway`` (True), ``share_bbox_head`` (False), ``trailing_conv`` (True: the CSP layers' 3x3 conv,
HGNetV2 variants; False: DINOv3 variants), ``encoder`` ("hybrid": AIFI + the fusion; "lite": the Atto / Femto /
Pico models' ``LiteEncoder`` of two levels, ``deimv2_lite``, which has no attention, so AIFI's arguments
(``pe``, ``pe_kwargs``, ``aifi_*``) are refused with it). ``set_encoding(name, part="aifi" | "backbone")``: AIFI's encoding,
or the DINOv3 backbone's RoPE (``rope_axial`` with DINOv3's settings when loaded; any vispe encoding by name).
The forward, outputs and mask handling are ``RTDETR``'s.
"""
from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from vispe import _checks
from vispe.models.detr.realtime.deimv2_decoder import DEIMv2Decoder
from vispe.models.detr.realtime.deimv2_lite import LiteEncoder
from vispe.models.detr.realtime.deimv2_neck import DEIMv2CCFM
from vispe.models.detr.realtime.hybrid_encoder import HybridEncoder
from vispe.models.detr.realtime.model import RTDETR

OPTIONS: dict[str, Any] = {"use_gateway": True, "share_bbox_head": False, "trailing_conv": True, "encoder": "hybrid"}
#: RTDETR's arguments that only AIFI reads (refused with the lite encoder)
AIFI_ARGS = ("pe", "pe_kwargs", "aifi_levels", "aifi_heads", "aifi_ffn", "aifi_layers", "aifi_activation")
_DEFAULTS = {k: p.default for k, p in inspect.signature(RTDETR.__init__).parameters.items()
             if p.default is not inspect.Parameter.empty}


class DEIMv2(RTDETR):
    def __init__(self, backbone: nn.Module, num_classes: int, *, deimv2: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        opts = {**OPTIONS, **(deimv2 or {})}
        unknown = sorted(set(opts) - set(OPTIONS))
        if unknown:
            raise ValueError(f"deimv2 options {unknown}: expected some of {sorted(OPTIONS)}")
        if kwargs.get("v2") is not None:
            raise ValueError("v2=... with DEIMv2: its decoder is D-FINE's (pass dfine={...})")
        lite = _checks.choice("deimv2 encoder", opts["encoder"], ("hybrid", "lite")) == "lite"
        if lite and set(kwargs) & set(AIFI_ARGS):
            raise ValueError(f"{sorted(set(kwargs) & set(AIFI_ARGS))} with deimv2 encoder='lite': the lite encoder has "
                             "no AIFI (no attention, no position encoding)")
        a = {**_DEFAULTS, "dfine": {}, **kwargs, **({"aifi_levels": ()} if lite else {})}
        super().__init__(backbone, num_classes, **{k: v for k, v in a.items() if k != "self"})
        assert isinstance(self.encoder, HybridEncoder)  # RTDETR's; the lite encoder replaces it
        neck = {"num_blocks": a["csp_blocks"], "expansion": a["expansion"], "eps": a["batch_norm_eps"],
                "trailing_conv": bool(opts["trailing_conv"])}
        if lite:
            self.encoder = LiteEncoder(self.encoder.in_channels, a["encoder_dim"], act=a["ccfm_activation"] or "silu",
                                       **neck)
        else:
            self.encoder.ccfm = DEIMv2CCFM(a["encoder_dim"], len(self.encoder.in_channels), act=a["ccfm_activation"],
                                           **neck)
        self.decoder = DEIMv2Decoder(a["d_model"], a["decoder_heads"], a["decoder_ffn"], a["decoder_layers"],
                                     num_classes=num_classes, num_levels=a["num_levels"], num_points=a["num_points"],
                                     use_gateway=bool(opts["use_gateway"]),
                                     share_bbox_head=bool(opts["share_bbox_head"]), **a["dfine"])

    def set_encoding(self, name: str, *, part: str = "aifi", **kwargs: Any) -> None:
        """AIFI's encoding (``part="aifi"``) or the DINOv3 backbone's (``part="backbone"``) by name."""
        if part == "aifi":
            self.encoder.set_encoding(name, **kwargs)
        elif part == "backbone":
            swap = getattr(self.backbone, "set_encoding", None)
            if swap is None:
                raise ValueError(f"part='backbone': this DEIMv2's backbone ({type(self.backbone).__name__}) has no "
                                 "position encoding to swap (the DINOv3 backbone has)")
            swap(name, **kwargs)
        else:
            raise ValueError(f"part={part!r}: expected 'aifi' or 'backbone'")
