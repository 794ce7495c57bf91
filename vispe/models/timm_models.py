"""vispe's presets as timm models (timm models as vispe ViTs: ``vispe.models.vit.create_from_timm``,
behind ``create_vit(timm_name, ...)``, and ``timm_kind``, re-exported here where they used to live).

* Registered timm models ``vispe_pico``, ``vispe_nano``, ``vispe_cifar``, ``vispe_tiny``,
  ``vispe_small`` (the presets of ``vispe.models.vit.PRESETS``; 32 px, patch 4, 10 classes unless
  given). After ``import vispe.models`` (or any vispe.models module), timm names them:

      timm.create_model("vispe_cifar", pe="rope_mixed", num_classes=100)
      timm.create_model("vispe_cifar", pe="sine", features_only=True, out_indices=(2, 5))
      timm.create_model("vispe_cifar", pretrained=True, pretrained_cfg_overlay=dict(file="ckpt.pth"))

  ``features_only`` uses timm's ``FeatureGetterNet`` over ``forward_intermediates``. vispe
  publishes no weights: ``pretrained=True`` needs a file (``pretrained_cfg_overlay``).
"""
from __future__ import annotations

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from vispe.models._vit_model import PRESETS, VispeViT
from vispe.models.vit import CONVERTIBLE, create_from_timm, timm_kind  # noqa: F401  (their former home)


# --- vispe's presets as timm models ----------------------------------------------------------------
def _cfg(**kwargs) -> dict:
    return dict(url="", num_classes=10, input_size=(3, 32, 32), pool_size=None, crop_pct=1.0,
                interpolation="bicubic", mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
                first_conv="patch_embed.proj", classifier="head", license="apache-2.0", **kwargs)


default_cfgs = generate_default_cfgs({f"vispe_{k[4:]}": _cfg() for k in PRESETS})


def _create(variant: str, pretrained: bool, **kwargs) -> VispeViT:
    overlay = kwargs.get("pretrained_cfg_overlay") or {}
    if pretrained and not (overlay.get("file") or overlay.get("state_dict")):
        raise ValueError(f"{variant}: vispe publishes no pretrained weights; pass "
                         "pretrained_cfg_overlay=dict(file=...) to load a checkpoint of your own")
    args = dict(PRESETS["vit_" + variant[len("vispe_"):]], patch_size=4)
    args.update(kwargs)
    return build_model_with_cfg(VispeViT, variant, pretrained,
                                feature_cfg=dict(out_indices=3, feature_cls="getter"), **args)


@register_model
def vispe_pico(pretrained: bool = False, **kwargs) -> VispeViT:
    """vispe's ``vit_pico`` (64 wide, 4 blocks, 4 heads) with any encoding: ``pe=...``."""
    return _create("vispe_pico", pretrained, **kwargs)


@register_model
def vispe_nano(pretrained: bool = False, **kwargs) -> VispeViT:
    """vispe's ``vit_nano`` (96 wide, 6 blocks, 3 heads) with any encoding: ``pe=...``."""
    return _create("vispe_nano", pretrained, **kwargs)


@register_model
def vispe_cifar(pretrained: bool = False, **kwargs) -> VispeViT:
    """vispe's ``vit_cifar`` (192 wide, 6 blocks, 3 heads) with any encoding: ``pe=...``."""
    return _create("vispe_cifar", pretrained, **kwargs)


@register_model
def vispe_tiny(pretrained: bool = False, **kwargs) -> VispeViT:
    """vispe's ``vit_tiny`` (192 wide, 12 blocks, 3 heads) with any encoding: ``pe=...``."""
    return _create("vispe_tiny", pretrained, **kwargs)


@register_model
def vispe_small(pretrained: bool = False, **kwargs) -> VispeViT:
    """vispe's ``vit_small`` (384 wide, 12 blocks, 6 heads) with any encoding: ``pe=...``."""
    return _create("vispe_small", pretrained, **kwargs)
