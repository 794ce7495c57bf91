"""A DETR-style detector that takes any vispe encoding (see ``vispe.models.detr.model``).

    from vispe.models.detr import create_detr, load_detr, SetCriterion, to_coco_results

``create_detr`` (``vispe.models.detr.build``) builds ``DETR`` or, with ``attention="deformable"``, the
multi-scale ``DeformableDETR`` (``vispe.models.detr.deformable_model``), a ``DETR`` with the same stages.
The stages are folders: ``design/``, ``backbone/``, ``neck/``, ``transformer/``, ``queries/``, ``heads/``,
``load/`` (docs/detection.md).
"""
from vispe.models.detr.build import create_detr
from vispe.models.detr.deformable_model import DeformableDETR
from vispe.models.detr.design.placement import PLACES, Placement
from vispe.models.detr.heads.criterion import SetCriterion, check_targets
from vispe.models.detr.heads.matcher import HungarianMatcher
from vispe.models.detr.heads.postprocess import postprocess, to_coco_results
from vispe.models.detr.load.detr import load_detr
from vispe.models.detr.model import DETR

__all__ = ["DETR", "DeformableDETR", "HungarianMatcher", "PLACES", "Placement", "SetCriterion", "check_targets", "create_detr",
           "load_detr", "postprocess", "to_coco_results"]
