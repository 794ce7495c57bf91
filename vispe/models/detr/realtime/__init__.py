"""The real-time DETRs (issue 48): RT-DETR (Zhao et al., CVPR 2024), RT-DETRv2, D-FINE and DEIMv2 as vispe modules.

    from vispe.models.detr.realtime import RTDETR, load_rtdetr   # or vispe.models.detr.load_detr(hf_model)

* ``sincos``: AIFI's 2D sin-cos in transformers' and the original (width-first) layouts;
* ``aifi``: AIFI, dense self-attention on the top level, with any vispe encoding (``set_encoding``);
* ``ccfm``: the convolutional cross-scale fusion; ``hybrid_encoder``: projection + AIFI + CCFM;
* ``selection``: anchors and top-k query selection; ``denoising``: RT-DETR's contrastive groups;
* ``decoder``: Deformable DETR's layer with the box-MLP ``query_pos_head`` and per-layer heads;
* ``deform_v2``: RT-DETRv2's operator (per-level points, discrete sampling; D-FINE's without projections);
* ``dfine_neck``, ``dfine_decoder``: D-FINE's fusion blocks and its FDR / LQE decoder;
* ``backbone``: ResNet-vd as timm's ``resnet*d``; ``hgnetv2``: transformers' backbone wrapped (D-FINE);
* ``deimv2``, ``deimv2_neck``, ``deimv2_decoder``, ``deimv2_backbone``, ``deimv2_lite``: DEIMv2 (its fusion blocks,
  decoder layers, DINOv3 + spatial tuning adapter backbone, the Atto / Femto / Pico models' lite encoder);
* ``model``: ``RTDETR``; ``load``: transformers' RT-DETR, RT-DETRv2, D-FINE, DEIMv2 (``load_deimv2``), the original
  layouts (``load_original``: lyuwenyu; ``load_original_dfine``: D-FINE / DEIM, DEIMv2); ``criterion``: VFL;
  ``train``: train.py.
"""
from vispe.models.detr.realtime.aifi import AIFI
from vispe.models.detr.realtime.backbone import ResNetVd
from vispe.models.detr.realtime.deimv2 import DEIMv2
from vispe.models.detr.realtime.hybrid_encoder import HybridEncoder
from vispe.models.detr.realtime.load import load_rtdetr
from vispe.models.detr.realtime.model import RTDETR
from vispe.models.detr.realtime.sincos import aifi_sincos, original_table

__all__ = ["AIFI", "DEIMv2", "HybridEncoder", "RTDETR", "ResNetVd", "aifi_sincos", "load_rtdetr", "original_table"]
