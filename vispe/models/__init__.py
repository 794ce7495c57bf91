"""Models: timm ViTs (vit.py), DeiT distilled (deit.py) and the Eva family (eva.py) with any vispe
encoding. Importing this package registers vispe's presets as timm models (timm_models.py).
"""
from vispe.models import timm_models  # noqa: F401  (registers vispe_pico ... vispe_small with timm)
