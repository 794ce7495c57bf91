"""DeiT's distilled ViT (Touvron et al., 2021; timm's ``VisionTransformerDistilled``) with any vispe
encoding: two prefix tokens, class then distillation, and the distillation head.

``VispeViTDistilled`` is ``VispeViT`` over timm's ``VisionTransformerDistilled``: the same weights
and state_dict keys (``dist_token``, ``head_dist``; with ``learned_abs`` the table under timm's
``pos_embed`` key with its two prefix rows), the distilled head (the mean of both heads in eval,
both logits in distillation training). Every family's prefix rule applies to both tokens.
Reached through ``convert_vit`` and ``create_vit("deit_*_distilled_*")``.
"""
from __future__ import annotations

from timm.models.deit import VisionTransformerDistilled

from vispe.models._vit_model import VispeViT


class VispeViTDistilled(VispeViT, VisionTransformerDistilled):
    """VispeViT with DeiT's class + distillation tokens and heads (module docstring)."""

    def __init__(self, **kwargs) -> None:
        if kwargs.get("reg_tokens"):
            raise ValueError(f"reg_tokens={kwargs['reg_tokens']!r}: DeiT's distilled ViT has no register tokens")
        super().__init__(**kwargs)
        self.pos_embed = None  # timm's distilled __init__ makes one; the encoding owns positions

    def _prefix_params(self):
        return (self.cls_token, self.dist_token)
