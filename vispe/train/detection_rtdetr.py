"""RT-DETR through train.py: ``detr.decoder=rtdetr`` builds ``RTDETR`` and its VFL criterion from the config.

Config keys read (``configs/shapes_rtdetr.yaml``): ``model.pe`` / ``model.pe_kwargs`` (AIFI's encoding, any
registered name; RT-DETR's own sin-cos is ``sincos2d``, transformers' layout, ``mask_aware: true`` to count
positions over each image's valid area), ``detr.backbone`` (``small_cnn``, the mask-aware CNN, its last
``num_feature_levels`` stages; or ``resnet50d`` / ``resnet101d``, RT-DETR's ResNet-vd as timm's, with
``detr.backbone_weights`` a local timm state_dict file or ``random``), ``detr.backbone_widths``, ``detr.num_queries`` (300), ``detr.d_model``,
``detr.nheads`` (AIFI and decoder), ``detr.enc_layers`` (AIFI's layers, 1), ``detr.dec_layers``,
``detr.dim_feedforward`` (1024), ``detr.dropout``, ``detr.num_feature_levels`` (3), ``detr.n_points`` (4),
``detr.grid`` (given to encodings with a grid-sized table, e.g. ``relbias``), ``detr.decoder_kwargs``
(``RTDETR``'s own: ``num_denoising``, ``label_noise_ratio``, ``box_noise_scale``, ``csp_blocks``,
``expansion``, ``aifi_ffn``, ``v2``, ``dfine`` (D-FINE's FDR / LQE decoder and fusion blocks,
``configs/shapes_dfine.yaml``) and ``vfl_alpha``, ``vfl_gamma``, D-FINE's ``weight_fgl`` (0.15), ``weight_ddf``
(1.5) for the loss), ``task.cost_*`` and
``task.focal_*`` (the matcher), ``task.weight_ce`` (VFL), ``task.weight_bbox``, ``task.weight_giou``. Any
other ``detr.*`` key changed from its default is refused by name (it would be ignored).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from vispe.models.detr.backbone.cnn import SmallCNN
from vispe.models.detr.heads.matcher import HungarianMatcher
from vispe.models.detr.realtime.backbone import ResNetVd
from vispe.models.detr.realtime.criterion import RealtimeCriterion
from vispe.models.detr.realtime.model import RTDETR

#: RT-DETR's ResNet-vd backbones by name: stage depths (timm's resnet50d / resnet101d)
RESNET_VD = {"resnet50d": (3, 4, 6, 3), "resnet101d": (3, 4, 23, 3)}
READ = ("backbone", "backbone_weights", "backbone_widths", "num_queries", "d_model", "nheads", "enc_layers", "dec_layers", "dim_feedforward",
        "dropout", "num_feature_levels", "n_points", "grid", "decoder", "decoder_kwargs", "aux_loss")
#: ``detr.decoder_kwargs`` keys that go to the criterion, and their names there
LOSS_KWARGS = {"vfl_alpha": "alpha", "vfl_gamma": "gamma", "weight_fgl": "weight_fgl", "weight_ddf": "weight_ddf"}


class CNNLevels(nn.Module):
    """The last ``num_levels`` stages of vispe's mask-aware ``SmallCNN`` as an RT-DETR backbone."""

    takes_mask = True

    def __init__(self, widths: tuple[int, ...], num_levels: int) -> None:
        super().__init__()
        if num_levels > len(widths):
            raise ValueError(f"detr.num_feature_levels={num_levels}: expected at most the CNN's {len(widths)} stages "
                             f"(detr.backbone_widths={list(widths)})")
        self.cnn = SmallCNN(tuple(widths))
        self.num_levels = num_levels
        self.channels = list(widths[-num_levels:])
        self.stride = 2 ** len(widths)

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        if mask is None:
            mask = torch.zeros(images.shape[0], *images.shape[-2:], dtype=torch.bool, device=images.device)
        return [f for f, _ in self.cnn.forward_levels(images, mask)[-self.num_levels:]]


def load_resnet_vd(backbone: ResNetVd, path: str) -> None:
    """A timm ``resnet50d`` / ``resnet101d`` state_dict file (its classifier ``fc`` dropped) into ``backbone``."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state.get("model", state)) if isinstance(state, dict) else state
    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    missing, unexpected = backbone.body.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"detr.backbone_weights={path!r} does not fit the ResNet-vd: missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}")


def build_for_task(cfg: DictConfig, num_classes: int) -> tuple[RTDETR, RealtimeCriterion]:
    """(model, criterion) of a train.py config with ``detr.decoder=rtdetr`` (module docstring)."""
    from vispe.train.schema import DetrModelConfig

    d = OmegaConf.to_container(cfg.detr, resolve=True)
    assert isinstance(d, dict)
    defaults = {f.name: (f.default_factory() if callable(f.default_factory) else f.default)  # type: ignore[misc]
                for f in fields(DetrModelConfig)}
    changed = sorted(k for k, v in d.items() if k not in READ and k in defaults and v != defaults[k])
    if changed:
        raise ValueError(f"config keys {', '.join('detr.' + k for k in changed)} with detr.decoder=rtdetr: RT-DETR does "
                         "not read them (its own options go in detr.decoder_kwargs)")
    kw: dict[str, Any] = dict(d.get("decoder_kwargs") or {})
    loss_kw = {name: kw.pop(k) for k, name in LOSS_KWARGS.items() if k in kw}
    fdr_only = sorted(k for k in ("weight_fgl", "weight_ddf") if k in loss_kw)
    if fdr_only and kw.get("dfine") is None:
        raise ValueError(f"detr.decoder_kwargs.{fdr_only[0]}={loss_kw[fdr_only[0]]}: D-FINE's loss weights need "
                         "detr.decoder_kwargs.dfine (D-FINE's decoder); RT-DETR has no FGL / DDF terms")
    levels = d["num_feature_levels"] or 3
    widths = tuple(d["backbone_widths"] or (32, 64, 128, 256))
    backbone: nn.Module
    if d["backbone"] in RESNET_VD:
        backbone = ResNetVd(RESNET_VD[d["backbone"]], out_indices=(2, 3, 4))
        if d.get("backbone_weights") not in (None, "random"):
            load_resnet_vd(backbone, d["backbone_weights"])
    elif d["backbone"] == "small_cnn":
        backbone = CNNLevels(widths, levels)
    else:
        raise ValueError(f"detr.backbone={d['backbone']!r} with detr.decoder=rtdetr: expected 'small_cnn' or one of "
                         f"{', '.join(map(repr, RESNET_VD))} (timm's ResNet-vd, RT-DETR's PResNet)")
    pe_kwargs = dict(cfg.model.pe_kwargs)
    if d["grid"] is not None:
        pe_kwargs.setdefault("grid", tuple(d["grid"]))
    model = RTDETR(backbone, num_classes, num_queries=d["num_queries"] or 300, d_model=d["d_model"],
                   encoder_dim=d["d_model"], aifi_heads=d["nheads"], aifi_layers=d["enc_layers"],
                   decoder_layers=d["dec_layers"], decoder_heads=d["nheads"],
                   decoder_ffn=d["dim_feedforward"] or 1024, dropout=d["dropout"], num_levels=levels,
                   num_points=d["n_points"] or 4, pe=cfg.model.pe, pe_kwargs=pe_kwargs,
                   **{"aifi_ffn": d["dim_feedforward"] or 1024, **kw})
    t = cfg.task
    matcher = HungarianMatcher(t.cost_class, t.cost_bbox, t.cost_giou, focal_alpha=t.focal_alpha, focal_gamma=t.focal_gamma)
    criterion = RealtimeCriterion(num_classes, matcher, weight_vfl=t.weight_ce, weight_bbox=t.weight_bbox,
                                  weight_giou=t.weight_giou, **loss_kw)
    return model, criterion
