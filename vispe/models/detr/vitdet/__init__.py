"""The ViT real-time DETRs, LW-DETR and RF-DETR: a windowed ViT backbone (``vit``, rectangular ``windows``,
the resampled ``table``), the C2f ``projector``, Group-DETR two-stage ``queries``, the lite ``decoder``,
the detector (``model``), its builder (``build``) and transformers' loader (``load``)."""
from vispe.models.detr.vitdet.build import create_vit_detr, from_hf_config
from vispe.models.detr.vitdet.load import is_vit_detr, load_vit_detr
from vispe.models.detr.vitdet.model import ViTDETR

__all__ = ["ViTDETR", "create_vit_detr", "from_hf_config", "is_vit_detr", "load_vit_detr"]
