"""A DETR-style detector that takes any vispe encoding (see ``vispe.models.detr.model``).

    from vispe.models.detr import create_detr, load_detr, SetCriterion, to_coco_results

``create_detr(attention="deformable", ...)`` builds the multi-scale ``DeformableDETR``
(``vispe.models.detr.deformable_model``).
"""
from vispe.models.detr.deformable_model import DeformableDETR
from vispe.models.detr.design.placement import PLACES, Placement
from vispe.models.detr.heads.criterion import SetCriterion, check_targets
from vispe.models.detr.heads.matcher import HungarianMatcher
from vispe.models.detr.heads.postprocess import postprocess, to_coco_results
from vispe.models.detr.load.detr import load_detr
from vispe.models.detr.model import DETR, create_detr

__all__ = ["DETR", "DeformableDETR", "HungarianMatcher", "PLACES", "Placement", "SetCriterion", "check_targets", "create_detr",
           "load_detr", "postprocess", "to_coco_results"]
