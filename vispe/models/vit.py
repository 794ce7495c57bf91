"""Build or convert a ViT with any vispe encoding: ``create_vit`` and ``convert_vit``.

    model = create_vit("vit_cifar", pe="rope_mixed", img_size=32, patch_size=4, num_classes=10)
    model = convert_vit(timm.create_model("vit_small_patch16_224"), pe="rope_axial")

The model class and where each encoding family goes: ``vispe.models._vit_model.VispeViT``
(re-exported here with ``VispeBlock`` and ``PRESETS``). ``convert_vit`` takes timm's
``VisionTransformer``, DeiT's distilled ViT (``vispe.models.deit``), the ``Eva`` family (EVA,
EVA-02, RoPE ViTs, DINOv3: ``vispe.models.eva``, ``vispe.models.dinov3``), ``NaFlexVit``
(``vispe.models.naflex``) and transformers' ``DINOv3ViTModel``; ``create_vit`` builds a vispe
preset or any of those timm names (``create_from_timm``).

Imports go one way: this module imports ``_vit_model``, ``deit``, ``eva``, ``naflex``,
``dinov3``; none of them imports it (``timm_models``, the presets as timm models, sits above).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from timm.layers import Attention as TimmAttention, Format
from timm.models.deit import VisionTransformerDistilled
from timm.models.eva import Eva
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from vispe import _checks
from vispe.attention import Attention
from vispe.models._vit_model import PE_AT, PRESETS, VispeBlock, VispeViT  # noqa: F401  (re-exported)
from vispe.models._weight_init import init_tokens, timm_weight_init
from vispe.models.deit import VispeViTDistilled
from vispe.models.dinov3 import convert_hf_dinov3
from vispe.models.eva import VispeEva, convert_eva
from vispe.models.naflex import convert_naflex
from vispe.models.towers import converter_for, convertible

#: timm modules whose models convert (entry point module -> what it builds)
_LOG = logging.getLogger(__name__)
CONVERTIBLE = ("vision_transformer", "deit", "eva", "naflexvit")
#: what create_vit / convert_vit return: a VispeViT (DeiT: its subclass), or a VispeEva for the Eva family
VispeModel = VispeViT | VispeEva


def timm_kind(model: nn.Module) -> str:
    """"vit", "distilled", "eva" or "naflex" for a timm model vispe converts; a ValueError with the reason otherwise."""
    if type(model) is VisionTransformer:
        return "vit"
    if type(model) is VisionTransformerDistilled:
        return "distilled"
    if type(model) is Eva:
        return "eva"
    if type(model).__name__ == "NaFlexVit":
        return "naflex"
    raise ValueError(f"model is a {type(model).__name__}: expected a timm VisionTransformer, VisionTransformerDistilled "
                     "(DeiT), Eva (EVA, EVA-02, timm's RoPE ViTs, DINOv3) or NaFlexVit, transformers' DINOv3ViTModel, "
                     f"or a vision tower: {', '.join(convertible())}")


def create_from_timm(name: str, *, pe: str | None = None, img_size: int | tuple[int, int] | None = None,
                     patch_size: int | None = None, num_classes: int | None = None, in_chans: int = 3,
                     pe_kwargs: dict[str, Any] | None = None, pe_at: str = "input",
                     peg_blocks: tuple[int, ...] = (0,), pretrained: bool = False, checkpoint: str | Path | None = None,
                     keep_abs_pos: bool | None = None, **timm_kwargs: Any) -> VispeModel:
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

    if not isinstance(name, str) or not timm.is_model(name):
        raise ValueError(f"name={name!r}: expected a vispe preset ({', '.join(PRESETS)}) or a timm model name")
    module = model_entrypoint(name).__module__.rsplit(".", 1)[-1]
    if module not in CONVERTIBLE:
        raise ValueError(f"name={name!r} is a timm {module} model: expected a VisionTransformer, DeiT, Eva or NaFlexVit name")
    if not isinstance(pretrained, bool):
        raise ValueError(f"pretrained={pretrained!r}: expected True or False")
    kw: dict[str, Any] = dict(timm_kwargs, in_chans=in_chans)
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
    kw, tokens = timm_weight_init(kw, loads_weights=pretrained)
    model = timm.create_model(name, pretrained=pretrained, **kw)
    if tokens:
        init_tokens(model)
    return convert_vit(model, pe, pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks, keep_abs_pos=keep_abs_pos)



def create_vit(name: str = "vit_cifar", *, pe: str | None = None, img_size: int | tuple[int, int] | None = None,
               patch_size: int | None = None, num_classes: int | None = None, in_chans: int = 3,
               pe_kwargs: dict[str, Any] | None = None, pe_at: str = "input", peg_blocks: tuple[int, ...] = (0,),
               pretrained: bool = False, checkpoint: str | Path | None = None, keep_abs_pos: bool | None = None,
               **timm_kwargs: Any) -> VispeModel:
    """A ViT with encoding ``pe``: ``name`` is a vispe preset (``PRESETS``) or a timm model name.

    Without ``pe``, a preset gets ``pe="learned_abs"`` (said once in the log, logger ``vispe.models.vit``
    at INFO); a timm name keeps the model's own encoding.
    Presets: ``img_size`` 32, ``patch_size`` 4, ``num_classes`` 10 by default.
    A timm name (VisionTransformer, DeiT's distilled ViT, the Eva family) is built by timm with
    its own defaults for what is not given, then converted (``convert_vit``; ``pe=None`` keeps the
    model's own encoding). ``pretrained=True`` loads timm's pretrained weights (timm's source: the
    local Hugging Face cache, downloading when missing unless ``HF_HUB_OFFLINE=1``), or the file
    ``checkpoint`` (a timm state_dict); everything but the position encoding is kept when ``pe``
    differs from the checkpoint's (``create_from_timm``).
    ``timm_kwargs`` (embed_dim, depth, num_heads, class_token, reg_tokens, global_pool, ...)
    override the preset and go to timm; ``weight_init`` is timm's (``""``, ``"jax"``, ...), plus
    ``"torch"``: PyTorch's module initialisation with the tokens initialised as timm does; timm's
    ``"skip"`` leaves the tokens uninitialised and is refused unless weights are loaded
    (``vispe.models._weight_init``).
    """
    if name not in PRESETS:
        return create_from_timm(name, pe=pe, img_size=img_size, patch_size=patch_size, num_classes=num_classes,
                                in_chans=in_chans, pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks,
                                pretrained=pretrained, checkpoint=checkpoint, keep_abs_pos=keep_abs_pos,
                                **timm_kwargs)
    if pretrained or checkpoint is not None or keep_abs_pos is not None:
        raise ValueError(f"name={name!r} is a vispe preset: pretrained, checkpoint and keep_abs_pos apply to timm "
                         "names (load a preset's own checkpoint with model.load_state_dict)")
    img_size = 32 if img_size is None else img_size
    patch_size = 4 if patch_size is None else patch_size
    h, w = _checks.grid_shape("img_size", img_size)
    _checks.positive_int("patch_size", patch_size)
    if h % patch_size or w % patch_size:
        raise ValueError(f"img_size={img_size!r}: expected multiples of patch_size={patch_size}")
    args: dict[str, Any] = dict(PRESETS[name])
    args.update(img_size=(h, w), patch_size=patch_size, num_classes=10 if num_classes is None else num_classes,
                in_chans=in_chans)
    args.update(timm_kwargs)
    dim, heads = args.get("embed_dim", 768), args.get("num_heads", 12)
    if dim % heads:
        raise ValueError(f"embed_dim={dim}: expected a multiple of num_heads={heads}")
    if pe is None:
        _LOG.info("create_vit(%r): no pe given, the preset's default pe='learned_abs' (a learned absolute table)", name)
    return VispeViT(pe=pe or "learned_abs", pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks, **args)


def convert_vit(model: nn.Module, pe: str | None = None, *, pe_kwargs: dict[str, Any] | None = None,
                pe_at: str = "input", peg_blocks: tuple[int, ...] = (0,),
                keep_abs_pos: bool | None = None) -> VispeModel:
    """Give an existing timm model a vispe encoding, in place (weights and state_dict keys kept).

    In place, on purpose: the model passed in *is* the converted model afterwards (same object,
    same parameter tensors; its class, blocks and position encoding change), and it is returned for
    chaining. A pretrained ViT-L is 1.2 GB in float32: a copy would hold it twice, and references
    already taken to the model or its parameters (an optimiser, hooks, ``.to()`` done before) stay
    valid. To keep the original, convert ``copy.deepcopy(model)``. Two conversions build a new
    model instead (their layout differs): transformers' ``DINOv3ViTModel`` (weights copied, the
    original untouched) and timm's ``NaFlexVit`` (the new model takes over its blocks, norms and
    head, shared and converted in place: do not use the NaFlexVit afterwards).

    A ``VisionTransformer`` (or DeiT's ``VisionTransformerDistilled``): its blocks and attention
    layers become vispe's subclasses (no new weights), the image size becomes dynamic, and its
    ``pos_embed`` becomes the ``learned_abs`` table if ``pe="learned_abs"`` (dropped otherwise);
    ``pe=None`` keeps its own (``learned_abs`` with timm's resampling rule, ``antialias="always"``, so
    that the converted model equals timm's at every size; or ``none`` without a table). Only plain timm blocks
    (``Block`` + ``Attention``) are accepted. An ``Eva`` goes to ``vispe.models.eva.convert_eva``
    (``keep_abs_pos`` applies there; timm's ``vit_*_dinov3`` are Evas); transformers'
    ``DINOv3ViTModel`` becomes a new ``VispeEva`` with its weights (``vispe.models.dinov3``, not in
    place); timm's ``NaFlexVit`` a new ``VispeViT`` with its modules (``vispe.models.naflex``, which
    also runs NaFlex's packed inputs); the vision towers registered in ``vispe.models.towers``
    (``convertible()``) a new model by their own converter; other models are refused with the reason.
    """
    tower = converter_for(model)  # a multimodal model's vision tower (vispe.models.towers): a new model
    if tower is not None:
        return tower(model, pe, pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks, keep_abs_pos=keep_abs_pos)
    if type(model).__name__ == "DINOv3ViTModel":  # transformers': a new VispeEva with its weights
        if pe is not None or pe_kwargs or keep_abs_pos is not None:
            raise ValueError("a transformers DINOv3ViTModel converts with its own RoPE: pass no pe / pe_kwargs / "
                             "keep_abs_pos (call setup_pe on the result to change the encoding)")
        return convert_hf_dinov3(model)
    kind = timm_kind(model)  # "vit", "distilled", "eva" or "naflex"; anything else is refused
    if kind == "naflex":  # a new VispeViT with its modules (vispe.models.naflex)
        if keep_abs_pos is not None:
            raise ValueError(f"keep_abs_pos={keep_abs_pos!r}: applies to Eva models (a NaFlexVit has one table)")
        return convert_naflex(model, pe, pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks)
    if kind == "eva":
        assert isinstance(model, Eva)
        return convert_eva(model, pe, pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks,
                           keep_abs_pos=keep_abs_pos)
    if keep_abs_pos is not None:
        raise ValueError(f"keep_abs_pos={keep_abs_pos!r}: applies to Eva models (a ViT has one position encoding)")
    assert isinstance(model, VisionTransformer)
    blocks: list[Any] = list(model.blocks)  # timm Blocks, converted in place below
    for i, blk in enumerate(blocks):
        if type(blk) is not Block or type(blk.attn) is not TimmAttention or blk.attn.gate is not None:
            raise ValueError(f"model.blocks[{i}] is a {type(blk).__name__} with {type(blk.attn).__name__}: "
                             "expected timm's Block with its plain (ungated) Attention")
    old_pos = model.pos_embed
    old_grid = tuple(model.patch_embed.grid_size)
    if pe is None and old_pos is not None:  # its own table, resampled by timm's rule (antialias also when growing)
        pe, pe_kwargs = "learned_abs", {"antialias": "always", **(pe_kwargs or {})}
    pe = pe or "none"
    for blk in blocks:
        blk.__class__ = VispeBlock
        Attention.adopt(blk.attn)
        blk.attn.pe = None
    model.__class__ = VispeViTDistilled if kind == "distilled" else VispeViT
    vit: Any = model  # a VispeViT from here on (timm declares some of these attributes Final)
    vit.pos_embed = None
    vit.dynamic_img_size = True
    patch_embed: Any = vit.patch_embed
    patch_embed.strict_img_size = False
    if patch_embed.output_fmt == Format.NCHW and not patch_embed.flatten:
        patch_embed.flatten = True
    vit.setup_pe(pe, pe_kwargs or {}, pe_at=pe_at, peg_blocks=peg_blocks)
    if old_pos is not None and pe == "learned_abs":
        vit.load_pos_embed(old_pos.detach(), old_grid)
    return vit
