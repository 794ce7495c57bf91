"""timm's ``weight_init`` for a ViT built from scratch, and vispe's one added mode, ``"torch"``.

timm (1.0.2x and later) creates a ViT's prefix tokens and absolute table with ``torch.empty`` and fills
them in ``init_weights``; ``weight_init="skip"`` skips that call, so they stay uninitialised memory
(garbage, or NaN: on ``vit_pico`` with relbias one training run in two stopped with a NaN loss). timm
means "skip" for weights loaded afterwards. So vispe:

- refuses ``"skip"`` for a model built from scratch (a vispe preset, or a timm name without
  ``pretrained`` / ``checkpoint``), naming the tokens it would leave unset;
- adds ``"torch"``: the modules keep PyTorch's own initialisation (what timm's "skip" leaves:
  Kaiming-uniform weights and non-zero biases in ``nn.Linear``), and the tokens get timm's (absolute
  table and DeiT's distillation token trunc-normal 0.02, class and register tokens normal 1e-6),
  which is what "PyTorch's default initialisation" means for a ViT.

Every other value goes to timm unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

TOKENS = ("pos_embed", "cls_token", "reg_token", "dist_token")  # what timm's init_weights fills itself


def timm_weight_init(kwargs: dict[str, Any], *, loads_weights: bool) -> tuple[dict[str, Any], bool]:
    """``kwargs`` for timm and whether to call ``init_tokens`` on the built model."""
    mode = kwargs.get("weight_init", "")
    if mode == "skip" and not loads_weights:
        raise ValueError("weight_init='skip': timm then leaves the model's tokens (" + ", ".join(TOKENS) +
                         ") as uninitialised memory, which is meant for weights loaded afterwards (a timm name with pretrained=True "
                         "or checkpoint=...); expected 'torch' for PyTorch's module initialisation with the tokens "
                         "initialised, or one of timm's modes ('', 'jax', 'jax_nlhb', 'moco')")
    if mode == "torch":
        return dict(kwargs, weight_init="skip"), True
    return kwargs, False


@torch.no_grad()
def init_tokens(model: nn.Module) -> nn.Module:
    """timm's initialisation of the tokens only; the modules keep theirs."""
    for name in ("pos_embed", "dist_token"):  # DeiT's distillation token as its absolute table
        table = getattr(model, name, None)
        if isinstance(table, nn.Parameter):
            nn.init.trunc_normal_(table, std=0.02)
    for name in ("cls_token", "reg_token"):
        token = getattr(model, name, None)
        if isinstance(token, nn.Parameter):
            nn.init.normal_(token, std=1e-6)
    return model
