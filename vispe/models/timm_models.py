"""vispe and timm, both ways: timm models (and their pretrained weights) as vispe ViTs, and vispe's
presets as timm models.

* ``create_from_timm`` (behind ``create_vit(timm_name, ...)``): timm builds the model (its defaults,
  its pretrained weights from the local cache or a file), then ``convert_vit`` gives it the
  encoding. ``timm_kind`` says which timm classes convert and refuses the others with the reason.
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

from pathlib import Path

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.deit import VisionTransformerDistilled
from timm.models.eva import Eva
from timm.models.vision_transformer import VisionTransformer

from vispe.models.vit import PRESETS, VispeViT

#: timm modules whose models convert (entry point module -> what it builds)
CONVERTIBLE = ("vision_transformer", "deit", "eva")

_NAFLEX = ("NaFlexVit is refused: it embeds patches of variable aspect ratio with per-patch coordinates "
           "and a validity mask (sequence packing), not an (h, w) grid per image, which every vispe encoding "
           "needs. Use the classic VisionTransformer of the same weights (timm.create_model(name) without "
           "use_naflex) and convert that.")


def timm_kind(model) -> str:
    """"vit", "distilled" or "eva" for a timm model vispe converts; a ValueError with the reason otherwise."""
    if type(model) is VisionTransformer:
        return "vit"
    if type(model) is VisionTransformerDistilled:
        return "distilled"
    if type(model) is Eva:
        return "eva"
    name = type(model).__name__
    if name == "NaFlexVit":
        raise ValueError(f"model is a NaFlexVit: {_NAFLEX}")
    raise ValueError(f"model is a {name}: expected a timm VisionTransformer, VisionTransformerDistilled (DeiT) "
                     "or Eva (EVA, EVA-02, timm's RoPE ViTs)")


def create_from_timm(name: str, *, pe=None, img_size=None, patch_size=None, num_classes=None, in_chans=3,
                     pe_kwargs=None, pe_at="input", peg_blocks=(0,), pretrained=False, checkpoint=None,
                     keep_abs_pos=None, **timm_kwargs):
    """timm's ``name`` (its own defaults for every size not given), with its pretrained weights if
    asked, converted to a vispe encoding (``pe=None``: the checkpoint's own).

    ``checkpoint``: a timm state_dict file (.pth, .bin, .safetensors) to load instead of timm's
    source (implies ``pretrained``); it is read by timm's loader, so its filter resamples the patch
    embedding and absolute table to ``img_size`` / ``patch_size`` and drops a classifier of another
    ``num_classes``. With another ``pe``, the checkpoint's position encoding is dropped (a
    ``learned_abs`` takes the absolute table over) and everything else is kept.
    """
    import timm
    from timm.models import model_entrypoint

    from vispe.models.vit import convert_vit

    if not isinstance(name, str) or not timm.is_model(name):
        raise ValueError(f"name={name!r}: expected a vispe preset ({', '.join(PRESETS)}) or a timm model name")
    module = model_entrypoint(name).__module__.rsplit(".", 1)[-1]
    if module == "naflexvit":
        raise ValueError(f"name={name!r}: {_NAFLEX}")
    if module not in CONVERTIBLE:
        raise ValueError(f"name={name!r} is a timm {module} model: expected a VisionTransformer, DeiT or Eva name")
    if not isinstance(pretrained, bool):
        raise ValueError(f"pretrained={pretrained!r}: expected True or False")
    kw = dict(timm_kwargs, in_chans=in_chans)
    for key, value in (("img_size", img_size), ("patch_size", patch_size), ("num_classes", num_classes)):
        if value is not None:
            kw[key] = value
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_file():
            raise ValueError(f"checkpoint={str(checkpoint)!r}: no such file (expected a timm state_dict)")
        if "pretrained_cfg_overlay" in kw:
            raise ValueError("checkpoint and pretrained_cfg_overlay both given: set the file once")
        pretrained = True
        kw["pretrained_cfg_overlay"] = dict(file=str(path))
    model = timm.create_model(name, pretrained=pretrained, **kw)
    return convert_vit(model, pe, pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks, keep_abs_pos=keep_abs_pos)


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
